"""The README's whole GPU-host recovery as one state file and one command.

One namespace holds the story: a real systemd (PID 1) running `vllm-kimi-k25-int4.service`
(Restart=always, enabled) that holds 8 fake GPUs at ~75.8 GB each through the real pynvml
bindings; the GPUs as the reboot left them (persistence mode off, nvidia-persistenced installed
but not enabled, and a stray 450 W power limit on GPU 5 of the 600 W RTX PRO 6000s); `/data` a
tmpfs mounted in that namespace; a SpecForge-layout extraction stopped half way with one file
cut off by the "crash", and `eagle3-extract.service` to resume it.
The samples are SpecForge's, written by the real torch.save (tests/torch_support.py); one,
written just before the crash, has a page that reads back as zeros with its size kept (what
delayed allocation leaves after a VM crash): only its CRC-32 shows it. The state is
`states/kpro6-recovery.yaml`, changed only where the test needs it (paths, totals, the /data
device and its free-space floor). Results are checked with systemctl, pynvml, torch.load and
the file system directly.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import gpu_support as gs
import pytest
import torch_support as ts
from cli_support import cli_env, reconcile_argv, reconcile_json
from extraction_support import FAKE_EXTRACT

REPO = Path(__file__).resolve().parent.parent
VLLM = "vllm-kimi-k25-int4.service"
PERSISTENCED = "nvidia-persistenced.service"
EXTRACT = "eagle3-extract.service"
HOLD_MIB = 72289  # ~75.8 GB per GPU, as in the seed
TOTAL, DONE, GROUP = 120, 60, 20  # "18,400 of 37,312" scaled down: half done
CUT = DONE - 1  # the sample being written when the VM died
ZEROED = DONE - 2  # written just before: a page of it never reached the disk
BOOT_LOG = ("[    0.000000] Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org)\n"
            "[    4.212001] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  590.48.01  Thu Nov 20 2025\n")
# Every query on a GPU that fell off the bus answers GPU_IS_LOST (its handle and PCI identity are still known).
LOST_CALLS = ("memory", "processes", "temp", "power", "ecc", "retired", "remap", "fields", "clocks", "pcie",
              "nvlink", "vbios", "persistence", "mig", "minor", "power_limit", "compute", "ecc_mode")


def recovery_state(tmp: Path, data: Path, edit=None) -> Path:
    """states/kpro6-recovery.yaml with the test's paths and totals (and EDIT(doc) applied)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    doc = yaml.load((REPO / "states" / "kpro6-recovery.yaml").read_text())
    mount = doc["mounts"].pop("/data")
    mount["source"] = "tmpfs"  # the test's /data is a tmpfs, not /dev/nvme1n1
    mount["min_free"] = "8MiB"  # a 64 MiB tmpfs cannot have 4 TB free
    doc["mounts"][str(data)] = mount
    ex = doc["extractions"]["eagle3-hidden-states"]
    ex["dir"] = str(data / "hidden_states")
    ex["total"] = ex["min_done"] = TOTAL
    ex["needs"] = ["gpus", f"mount:{data}"]
    if edit is not None:
        edit(doc)
    out = tmp / "kpro6-recovery.yaml"
    buf = io.StringIO()
    yaml.dump(doc, buf)
    out.write_text(buf.getvalue())
    return out


class Scenario:
    def __init__(self, nsd, tmp: Path, lib: Path):
        self.nsd, self.tmp, self.lib = nsd, tmp, lib
        self.data = tmp / "data"
        self.journal = tmp / "journal.jsonl"
        self.config = tmp / "nvml.conf"
        # This boot's kernel log, as the test wrote it (not the machine's own dmesg).
        self.kernel_log = tmp / "kern.log"
        self.kernel_log.write_text(BOOT_LOG)

    def env(self) -> dict[str, str]:
        return {**cli_env(self.tmp), "RECONCILE_STATE_DIR": str(self.tmp / "state"),
                **gs.nvml_env(self.lib, self.config), "RECONCILE_KERNEL_LOG": str(self.kernel_log)}

    def cli(self, *args: str) -> tuple[int, dict, str]:
        code, doc, stderr = reconcile_json(self.tmp, *args, runner=self.nsd, timeout=180, **self.env())
        assert doc is not None, stderr
        return code, doc, stderr

    def gpu_memory(self) -> list[int]:
        out = self.nsd.run(gs.pynvml_probe_argv(), env={**os.environ, **gs.nvml_env(self.lib, self.config)},
                           check=True)
        return [g["used_mib"] for g in gs.parse_probe(out.stdout)]


def by_id(report: dict) -> dict[str, dict]:
    return {r["id"]: r for r in report["resources"]}


def sample(out: Path, idx: int) -> Path:
    g = idx // GROUP * GROUP
    return out / f"rows_{g}-{g + GROUP}" / f"data_{idx}.ckpt"


@pytest.fixture
def scenario(nsystemd, tmp_path, fake_lib):
    python = ts.need(ts.torch_python(), "torch 2.x interpreter")
    s = Scenario(nsystemd, tmp_path, fake_lib)
    s.python = python
    nsystemd.set_hostname("kpro6-ct129")
    tag = gs.new_tag()
    # As the reboot left the GPUs: persistence mode off, and GPU 5 with a stray 450 W power limit.
    gpus = gs.seed_gpus(8, persistence=0)
    gpus[5].settings = {"power_limit_mw": 450000}
    gs.FakeConfig(gpus=gpus, holders=[gs.FakeHolder(mib=HOLD_MIB, gpus=range(8), cmdline=tag)]).write(s.config)
    s.tag = tag
    # nvidia-persistenced installed but neither enabled nor running.
    nsystemd.write_unit(PERSISTENCED, gs.persistenced_unit(fake_lib, s.config))
    # /data: a tmpfs inside the namespace only (private propagation: the host never sees it).
    s.data.mkdir()
    nsystemd.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(s.data)], check=True)
    out = s.data / "hidden_states"
    # Written through the namespace's view of the file system: the tmpfs is mounted only there.
    s.ns_out = nsystemd.root / str(out).lstrip("/")
    spec = []
    for i in range(DONE):  # SpecForge's samples, as fake_extract.py --torch writes them
        sample(s.ns_out, i).parent.mkdir(parents=True, exist_ok=True)
        spec.append({"path": str(sample(s.ns_out, i)), "fmt": "ckpt", "t": 63, "h": 256, "dtype": "bf16", "seed": i})
    ts.write(python, spec, tmp_path)
    cut = sample(s.ns_out, CUT)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    zeroed = sample(s.ns_out, ZEROED)
    data = bytearray(zeroed.read_bytes())
    aux = next(i for i in zipfile.ZipFile(zeroed).infolist() if i.filename.endswith("/data/2"))
    page = (aux.header_offset + 4096 * 4) // 4096 * 4096  # a page in the middle of aux_hidden_state
    data[page:page + 4096] = bytes(4096)
    zeroed.write_bytes(bytes(data))
    assert zeroed.stat().st_size == len(data)
    old = time.time() - 3600  # written before the crash, an hour ago, at the job's pace
    for i in range(DONE):
        os.utime(sample(s.ns_out, i), (old + i / 15, old + i / 15))
    s.cut, s.zeroed = cut, zeroed
    # The vLLM service that auto-started after the reboot, holding every GPU.
    nsystemd.write_unit(VLLM, (
        f"[Unit]\nDescription=vLLM Kimi-K2.5 INT4\n[Service]\n"
        f"ExecStart={sys.executable} {gs.HOLDER} vllm {tag}\nRestart=always\nRestartSec=100ms\n"
        "[Install]\nWantedBy=multi-user.target\n"), enable=True)
    nsystemd.systemctl("start", VLLM, check=True)
    nsystemd.wait_active(VLLM)
    # The extraction job, resumable: skips every index whose file exists (SpecForge's resume).
    nsystemd.write_unit(EXTRACT, (
        f"[Unit]\nDescription=EAGLE-3 hidden-state extraction\n[Service]\nType=exec\n"
        f"ExecStart={python} {FAKE_EXTRACT} --torch --out {out} --total {TOTAL} --rate 15 --group-size {GROUP}\n"))
    s.state = recovery_state(tmp_path, s.data)
    yield s
    nsystemd.systemctl("stop", EXTRACT, VLLM, PERSISTENCED)
    nsystemd.run(["umount", "-l", str(s.data)])


def test_seed_recovery_end_to_end(scenario):
    s = scenario
    assert s.gpu_memory() == [HOLD_MIB] * 8

    # 1. The audit: every drift listed, nothing changed.
    code, report, _ = s.cli("diff", str(s.state))
    assert code == 2
    res = by_id(report)
    assert res[f"unit:{VLLM}"]["drift"] == [{"field": "active", "want": False, "have": True},
                                           {"field": "enabled", "want": False, "have": True}]
    assert res["gpus"]["status"] == "drift"
    # Exactly the fields that are wrong: memory, persistence on every GPU, GPU 5's power limit.
    assert {d["field"] for d in res["gpus"]["drift"]} == {
        *(f"gpu{i}.memory_used" for i in range(8)), *(f"gpu{i}.persistence_mode" for i in range(8)),
        "gpu5.power_limit"}
    assert {"field": "gpu5.power_limit", "want": "600 W", "have": "450 W"} in res["gpus"]["drift"]
    assert f"freed by unit:{VLLM}" in res["gpus"]["message"]
    assert [(a["action"], a["target"]) for a in res["gpus"]["actions"]] == [
        ("enable", PERSISTENCED), ("start", PERSISTENCED), ("set", "gpu5.power_limit")]
    assert res[f"mount:{s.data}"]["status"] == "ok"
    ext = res["extraction:eagle3-hidden-states"]
    assert {d["field"] for d in ext["drift"]} == {"damaged", "done"}
    assert [a["action"] for a in ext["actions"]] == ["quarantine", "start"]
    damaged = {d["path"].rsplit("/", 1)[1]: d["reason"] for d in ext["observed"]["damaged"]}
    assert set(damaged) == {s.cut.name, s.zeroed.name}, damaged
    assert "CRC-32" in damaged[s.zeroed.name]  # the size and the structure are as written
    assert s.nsd.show(VLLM, "ActiveState") == "active" and s.gpu_memory() == [HOLD_MIB] * 8

    # 2. The recovery: one command.
    code, report, err = s.cli("apply", str(s.state))
    assert code == 0, (report, err)
    res = by_id(report)
    assert [r["status"] for r in report["resources"]] == ["ok", "ok", "ok", "converging"], res
    # the unit is stopped and disabled (systemd's own word), and Restart=always did not revive it
    assert s.nsd.systemctl("is-active", VLLM).stdout.strip() == "inactive"
    assert s.nsd.systemctl("is-enabled", VLLM).stdout.strip() == "disabled"
    # the GPUs are free, as pynvml itself reads them
    assert s.gpu_memory() == [0] * 8
    # and set: nvidia-persistenced enabled and running (systemd's word) turned persistence on, GPU 5 is
    # back at 600 W (pynvml's word); the only setter called is GPU 5's power limit.
    assert s.nsd.systemctl("is-enabled", PERSISTENCED).stdout.strip() == "enabled"
    assert s.nsd.systemctl("is-active", PERSISTENCED).stdout.strip() == "active"
    nvml = gs.nvml_settings(s.lib, s.config)
    assert [g["persistence_mode"] for g in nvml] == [1] * 8 and [g["power_limit_mw"] for g in nvml] == [600000] * 8
    assert gs.setter_calls(s.config) == [("persistenced", -1, "1", "ok"),
                                         ("nvmlDeviceSetPowerManagementLimit", 5, "600000", "ok")]
    assert res["gpus"]["summary"].count("0MiB / 97887MiB") == 8
    # the cut-off and the zero-paged samples are in quarantine, not deleted
    for p in (s.cut, s.zeroed):
        assert len(list((s.ns_out / ".reconcile-quarantine").rglob(p.name))) == 1
    # the extraction runs
    assert s.nsd.show(EXTRACT, "ActiveState") in ("active", "inactive")

    # The journal is the recovery timeline, in order: the job started only after its needs were ok.
    journal = [e for line in s.journal.read_text().splitlines() if (e := json.loads(line))["event"] == "result"]
    assert [(e["resource"], e["action"], e["result"]) for e in journal] == [
        (f"unit:{VLLM}", "disable", "done"),
        (f"unit:{VLLM}", "stop", "done"),
        ("gpus", "enable", "done"),
        ("gpus", "start", "done"),
        ("gpus", "set", "done"),
        ("extraction:eagle3-hidden-states", "quarantine", "done"),
        ("extraction:eagle3-hidden-states", "start", "done"),
    ]
    assert [e["time"] for e in journal] == sorted(e["time"] for e in journal)

    # 3. A second apply right after does nothing.
    code, report, _ = s.cli("apply", str(s.state))
    assert code == 0 and report["summary"]["actions_done"] == 0
    results = [e for e in map(json.loads, s.journal.read_text().splitlines()) if e["event"] == "result"]
    assert len(results) == 7  # no action taken again
    assert len(gs.setter_calls(s.config)) == 2  # no setter called again

    # 4. Later diffs show progress, then exit 0 once the job is done.
    seen = []
    deadline = time.monotonic() + 90
    while True:
        code, report, _ = s.cli("diff", str(s.state))
        ext = by_id(report)["extraction:eagle3-hidden-states"]
        seen.append((ext["observed"]["counted"], ext["status"]))
        if code == 0:
            break
        assert time.monotonic() < deadline, seen
        time.sleep(0.5)
    counts = [c for c, _ in seen]
    assert counts == sorted(counts) and counts[-1] == TOTAL
    assert all(status == "ok" for status in [r["status"] for r in report["resources"]])
    # the regenerated samples are SpecForge's, as torch.load reads them
    ts.same(s.python, [{"path": str(p), "fmt": "ckpt", "t": 63, "h": 256, "dtype": "bf16", "seed": i}
                       for p, i in ((s.cut, CUT), (s.zeroed, ZEROED))], s.tmp)
    # the regenerated sample is whole
    assert zipfile.ZipFile(s.cut).testzip() is None


def test_seed_recovery_with_gpu_3_fallen_off_the_bus_after_boot(scenario):
    """The same host, but GPU 3 logged Xid 79 after this boot and NVML now calls it lost. apply
    still stops and disables the vLLM unit and frees the other seven GPUs; GPU 3 is blocked with the
    step NVIDIA's Xid catalogue gives for Xid 79 (RESTART_BM: reboot the node); exit 2; the extraction
    waits, since the GPUs it needs are not ok."""
    s = scenario
    gpus = gs.seed_gpus(8)
    gpus[3].error, gpus[3].error_on = "lost", LOST_CALLS
    gs.FakeConfig(gpus=gpus, holders=[gs.FakeHolder(mib=HOLD_MIB, gpus=range(8), cmdline=s.tag)]).write(s.config)
    pci = gs.pci_of(3)
    s.kernel_log.write_text(BOOT_LOG + (
        f"[ 8321.004512] NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        f"[ 8321.004530] NVRM: GPU {pci}.0: GPU has fallen off the bus.\n"
        "[ 8321.004601] NVRM: A GPU crash dump has been created. If possible, please run\n"
        "               NVRM: nvidia-bug-report.sh as root to collect this data before\n"
        "               NVRM: the NVIDIA kernel module is unloaded.\n"))
    before = s.gpu_memory()
    assert before == [HOLD_MIB] * 3 + [None] + [HOLD_MIB] * 4  # pynvml itself: GPU 3 is lost

    code, report, err = s.cli("apply", str(s.state))
    assert code == 2, (report, err)
    res = by_id(report)
    unit = res[f"unit:{VLLM}"]
    assert unit["status"] == "ok" and [(a["action"], a["result"]) for a in unit["actions"]] == [
        ("disable", "done"), ("stop", "done")]
    assert s.nsd.systemctl("is-active", VLLM).stdout.strip() == "inactive"
    assert s.nsd.systemctl("is-enabled", VLLM).stdout.strip() == "disabled"
    # The other seven GPUs are free, as pynvml reads them; GPU 3 still answers "GPU is lost".
    after = s.gpu_memory()
    assert after == [0] * 3 + [None] + [0] * 4
    gpus_ = res["gpus"]
    assert gpus_["status"] == "blocked"
    assert {d["field"] for d in gpus_["drift"]} == {"gpu3.healthy", "gpu3.memory_used"}
    bus = gs.bus_of(3)
    assert f"GPU 3 ({bus}) must not run jobs: reboot the node" in gpus_["message"]
    assert "Xid 79 at [ 8321.004512]" in gpus_["message"] and "Xid 79: RESTART_BM" in gpus_["message"]
    assert gpus_["message"].count("Xid 79 at") == 2  # the reason once, and the kernel-log line; the companion folded
    observed = gpus_["observed"]["gpus"]
    assert [g["health"] for g in observed] == ["healthy"] * 3 + ["unhealthy"] + ["healthy"] * 4
    # The job is not started on a host with a GPU that must not run jobs.
    ext = res["extraction:eagle3-hidden-states"]
    assert ext["status"] == "blocked" and "needs not ok (gpus is blocked)" in ext["message"]
    journal = [json.loads(line) for line in s.journal.read_text().splitlines()]
    assert [(e["resource"], e["action"]) for e in journal if e["event"] == "result"] == [
        (f"unit:{VLLM}", "disable"), (f"unit:{VLLM}", "stop")]
    # The text report names GPU 3 and the step without -v.
    proc = s.nsd.run(reconcile_argv("diff", str(s.state)), env=s.env(), timeout=180)
    assert proc.returncode == 2
    assert f"GPU 3 ({bus}) must not run jobs: reboot the node" in proc.stdout


def test_mig_on_a_gpu_vllm_holds_is_blocked_until_the_unit_is_stopped(scenario):
    """MIG mode wanted on GPU 3 while the vLLM unit holds it: refused, naming the holder, when nothing
    is to stop the unit; in the full recovery state (units: vLLM active: false) the same apply stops
    the unit first and then sets MIG, which stays pending until the test resets GPU 3."""
    s = scenario
    # The GPUs otherwise as declared, so MIG is what this test is about.
    gs.FakeConfig(gpus=gs.seed_gpus(8), holders=[gs.FakeHolder(mib=HOLD_MIB, gpus=range(8), cmdline=s.tag)]
                  ).write(s.config)

    def mig_on_3(doc):
        doc["gpus"]["settings"]["per_gpu"] = {3: {"mig": "enabled"}}

    def only_gpus(doc):
        mig_on_3(doc)
        for key in ("units", "mounts", "extractions"):
            doc.pop(key)
        doc["gpus"].pop("free_with")
        doc["gpus"]["allow"].append(f"unit:{VLLM}")  # vLLM may hold memory; it still holds the GPU

    state = recovery_state(s.tmp, s.data, only_gpus)
    code, report, _ = s.cli("apply", str(state))
    gpus = by_id(report)["gpus"]
    assert code == 2 and gpus["status"] == "blocked"
    assert [d["field"] for d in gpus["drift"]] == ["gpu3.mig"]
    pid = s.nsd.main_pid(VLLM)  # reconcile runs in the namespace: its PIDs
    assert f"GPU 3: MIG mode cannot be changed while a process holds the GPU: {pid} (vllm) in {VLLM}" \
        in gpus["message"]
    assert not [c for c in gs.setter_calls(s.config) if c[0] == "nvmlDeviceSetMigMode"]
    assert s.nsd.show(VLLM, "ActiveState") == "active"

    # The recovery's state declares the unit stopped: one apply stops it, then sets MIG on the freed GPU.
    state = recovery_state(s.tmp, s.data, mig_on_3)
    code, report, _ = s.cli("apply", str(state))
    res = by_id(report)
    assert res[f"unit:{VLLM}"]["status"] == "ok" and s.nsd.show(VLLM, "ActiveState") == "inactive"
    gpus = res["gpus"]
    assert gpus["status"] == "converging", gpus
    assert "GPU 3: MIG mode enabled is pending: reset GPU 3" in gpus["message"]
    assert [(a["target"], a["result"]) for a in gpus["actions"]] == [("gpu3.mig", "done")]
    assert gs.nvml_settings(s.lib, s.config)[3]["mig"] == [0, 1]  # pending, as pynvml reads it
    # The extraction waits for ready GPUs: pending is not ready.
    ext = res["extraction:eagle3-hidden-states"]
    assert ext["status"] == "blocked" and "needs not ok (gpus is converging)" in ext["message"]

    # A person resets GPU 3 (nothing holds it now; persistence mode off first, or the driver refuses:
    # NVIDIA/NVSentinel#1690): MIG is current, the GPUs are ready.
    assert gs.reset_gpu(s.lib, s.config, 3) == 19
    gs.nvml_do(s.lib, s.config, "n.nvmlDeviceSetPersistenceMode(h(3), 0)")
    assert gs.reset_gpu(s.lib, s.config, 3) == 0
    gs.nvml_do(s.lib, s.config, "n.nvmlDeviceSetPersistenceMode(h(3), 1)")  # and back on, as before the reset
    code, report, _ = s.cli("diff", str(state))
    gpus = by_id(report)["gpus"]
    assert gpus["status"] == "ok" and gs.nvml_settings(s.lib, s.config)[3]["mig"] == [1, 1]
