"""A reboot for a lost GPU, through the namespaced systemd (tests/nsystemd.py): the shipped boot unit's
apply journals the intent and runs `systemctl reboot`, which ends that systemd (never this machine: its
reboot(2) ends the PID namespace, and systemd-shutdown unmounts nothing in a container); the test boots
a new one over the same journal and state directory with a new boot id (the file the boot id is read
from); that boot's apply completes the journal's record (intent in boot A, result in boot B), and since
the GPU is still lost and max_reboots is 1, it is blocked as needing service — no reboot loop."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import gpu_support as gs
import pytest
from nsystemd import NamespacedSystemd
from test_gpus_boot import BOOT_UNIT, boot_unit, staged, wait_done

STATE = """gpus:
  count: 2
  recover: {reboot: true, max_reboots: 1, window: 24h}
  validate: {command: [/bin/true], after: [recover]}
"""


def binfmt_mounted() -> bool:
    """systemd-shutdown flushes binfmt_misc's rules when it is mounted, and those are the host's."""
    return any(" binfmt_misc " in line for line in Path("/proc/self/mountinfo").read_text().splitlines())


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not gs.proc_alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_lost_gpu_reboots_the_node_once_the_next_boot_completes_the_record_and_the_cap_holds(tmp_path, fake_lib):
    why = NamespacedSystemd.missing_prerequisites()
    if why:
        pytest.skip(f"namespaced systemd unavailable: {why}")
    if binfmt_mounted():
        pytest.skip("binfmt_misc is mounted: a namespaced systemd's shutdown would flush the host's rules")
    config = gs.FakeConfig(gpus=gs.seed_gpus(2, persistence=0)).write(tmp_path / "nvml.conf")
    config.write_text(config.read_text().replace(f"bus={gs.bus_of(1)}", f"bus={gs.bus_of(1)} error=lost error_on=all"))
    klog = tmp_path / "kern.log"
    klog.write_text("[    0.000000] Linux version 6.1.0-18-amd64\n"
                    "[    4.212001] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  590.48.01\n")
    boot_file = tmp_path / "boot_id"
    state = gs.write_state(tmp_path, STATE)
    unit = boot_unit(tmp_path, state, fake_lib, config, klog).replace(
        "Environment=RECONCILE_CACHE_DIR=", f"Environment=RECONCILE_BOOT_ID_FILE={boot_file} RECONCILE_CACHE_DIR=")
    journal = tmp_path / "journal.jsonl"

    def lines() -> list[dict]:
        return [json.loads(x) for x in journal.read_text().splitlines()] if journal.exists() else []

    boot_a = str(uuid.uuid4())
    boot_file.write_text(boot_a + "\n")
    # Boot A: the unit is started once this systemd is up (enabled, it would reboot before the test could see
    # the boot finish), then its apply reboots, and this systemd ends.
    nsd = NamespacedSystemd("nsd-reboot-a")
    nsd.write_unit(BOOT_UNIT, unit)
    with nsd:
        pid = nsd.pid
        nsd.systemctl("start", "--no-block", BOOT_UNIT, check=True)
        assert pid and gone_within(pid, 90), nsd.log_tail()
    intent = [e for e in lines() if e.get("action") == "reboot" and e["event"] == "intent"]
    assert len(intent) == 1 and intent[0]["boot"] == boot_a and intent[0]["resource"] == "gpus"
    assert "for GPU 1 " in intent[0]["description"] and "GPU is lost" in intent[0]["description"]

    # Boot B: the same journal and state directory, a new boot id; the GPU is still lost.
    boot_b = str(uuid.uuid4())
    boot_file.write_text(boot_b + "\n")
    assert gs.reboot(fake_lib, config) == 0
    with staged("nsd-reboot-b", {BOOT_UNIT: unit}) as nsd:
        assert wait_done(nsd, BOOT_UNIT) == "failed", (tmp_path / "boot.log").read_text()
        assert nsd.show(BOOT_UNIT, "ExecMainStatus") == "2"  # blocked: a person must act
        assert nsd.show("multi-user.target", "ActiveState") == "active"  # this boot went on: no second reboot
    done = [e for e in lines() if e["event"] == "rebooted"]
    assert len(done) == 1 and done[0]["intent_run"] == intent[0]["run"]
    assert done[0]["from_boot"] == boot_a and done[0]["boot"] == boot_b
    assert "gpus blocked" in done[0]["message"] and "needs service" in done[0]["message"]
    assert len([e for e in lines() if e.get("action") == "reboot" and e["event"] == "intent"]) == 1
    log = (tmp_path / "boot.log").read_text()
    assert "rebooted it 1 time(s) in 24h (max_reboots 1)" in log

    # `reconcile log` shows the completion after the run that asked for the reboot, in text and json.
    from cli_support import run_cli

    proc = run_cli(tmp_path, "log", "--journal", str(journal), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    events = json.loads(proc.stdout)["events"]
    kinds = [e["event"] for e in events]
    assert "rebooted" in kinds and kinds.index("rebooted") > kinds.index("run")
    shown = events[kinds.index("rebooted")]
    assert {k: shown[k] for k in ("intent_run", "from_boot", "boot", "message")} == \
        {k: done[0][k] for k in ("intent_run", "from_boot", "boot", "message")}
    text = run_cli(tmp_path, "log", "--journal", str(journal)).stdout
    assert f"rebooted up in boot {boot_b[:8]}" in text and done[0]["message"] in text
    assert f"by run {intent[0]['run']}" in text
