"""GPU recovery as declared state (`gpus.recover`) and the validation gate (`gpus.validate`), end to
end: the CLI on the fake libnvidia-ml (the only double: it learnt what a real reset does and refuses),
the nvidia-smi stand-in that resets through it, real gate commands, and the journal the caps count
from. What the GPUs are after a reset is read back through pynvml in a process of the test's own.

No test here may reboot anything: `recover.reboot` is only ever planned (`apply --dry-run`), and a
`systemctl` first on PATH refuses `reboot` (and records that it was asked) whatever a test does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import gpu_support as gs

BOOT = ("[    0.000000] Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org)\n"
        "[    4.212001] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  590.48.01  Thu Nov 20 2025\n")
SMI_BIN = Path(__file__).resolve().parent / "fakenvml" / "bin"

HEALTH_PROBE = textwrap.dedent("""
    import json, pynvml as n
    n.nvmlInit()
    out = []
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        def get(fn, *a):
            try:
                return fn(h, *a)
            except n.NVMLError as exc:
                return "error: " + str(exc)
        rows = get(n.nvmlDeviceGetRemappedRows)
        out.append({"uuid": get(n.nvmlDeviceGetUUID), "persistence": get(n.nvmlDeviceGetPersistenceMode),
                    "ecc_volatile": get(n.nvmlDeviceGetTotalEccErrors, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                        n.NVML_VOLATILE_ECC),
                    "remap_pending": rows if isinstance(rows, str) else bool(rows[2])})
    n.nvmlShutdown()
    print(json.dumps(out))
""")


class Rig:
    """One test's fake GPUs, boot id, kernel log, journal, state directory and PATH."""

    def __init__(self, tmp: Path, lib: Path, gpus: list[gs.FakeGpu]):
        self.tmp, self.lib = tmp, lib
        self.config = gs.FakeConfig(gpus=gpus).write(tmp / "nvml.conf")
        self.klog = tmp / "kern.log"
        self.klog.write_text(BOOT)
        self.boot_file = tmp / "boot_id"
        self.new_boot()
        self.journal = tmp / "journal.jsonl"
        guard = tmp / "guard"
        guard.mkdir()
        self.reboot_asked = tmp / "reboot-asked"
        (guard / "systemctl").write_text(f"#!/bin/sh\nif [ \"$1\" = reboot ]; then echo \"$@\" >> {self.reboot_asked}; "
                                         "echo 'refused by the test' >&2; exit 1; fi\nexec /bin/systemctl \"$@\"\n")
        (guard / "systemctl").chmod(0o755)
        self.path = f"{guard}:{SMI_BIN}:{gs.path_without(['nvidia-smi'])}"
        self.env = {"RECONCILE_KERNEL_LOG": str(self.klog), "RECONCILE_BOOT_ID_FILE": str(self.boot_file),
                    "PATH": self.path, "RECONCILE_NVSWITCH_GLOB": str(tmp / "no-nvswitch*")}

    def new_boot(self) -> str:
        boot = str(uuid.uuid4())
        self.boot_file.write_text(boot + "\n")
        return boot

    def run(self, command: str, body: str, *extra: str, **env: str) -> tuple[int, dict]:
        state = gs.write_state(self.tmp, body)
        args = [command, str(state), "--format", "json", *extra]
        if command == "apply":
            args += ["--journal", str(self.journal)]
        proc = gs.cli(self.tmp, self.lib, self.config, *args, **{**self.env, **env})
        return proc.returncode, gs.gpus_report(proc)

    def ack(self, *args: str) -> subprocess.CompletedProcess:
        from cli_support import run_cli

        return run_cli(self.tmp, "ack", "--journal", str(self.journal), *args, **self.env)

    def lines(self) -> list[dict]:
        return [json.loads(x) for x in self.journal.read_text().splitlines()] if self.journal.exists() else []

    def resets(self) -> list[tuple[int, str]]:
        return [(gpu, result) for call, gpu, _, result in gs.setter_calls(self.config) if call == "reset"]

    def health(self) -> list[dict]:
        proc = subprocess.run([sys.executable, "-c", HEALTH_PROBE], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **gs.nvml_env(self.lib, self.config)}, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])


def gpus(n: int = 2, **faulty) -> list[gs.FakeGpu]:
    """N idle GPUs with persistence off (persistence mode refuses a reset), GPU 1 with FAULTY's values."""
    out = gs.seed_gpus(n, persistence=0)
    for k, v in faulty.items():
        setattr(out[1], k, v)
    return out


def state(recover: str = "{reset: true}", validate: str = "{command: [sh, -c, 'echo gate ok'], after: [recover]}",
          extra: str = "") -> str:
    return f"""
gpus:
  count: 2
  recover: {recover}
  validate: {validate}
{extra}"""


def actions(report: dict) -> list[tuple[str, str, str]]:
    return [(a["action"], a["target"], a["result"]) for a in report["actions"]]


def gpu_uuid(i: int) -> str:
    return f"GPU-{uuid.UUID(int=i + 1)}"


def test_a_gpu_with_volatile_ecc_and_a_pending_remap_is_freed_reset_and_validated(tmp_path, fake_lib, holders):
    tag = gs.new_tag()
    rig = Rig(tmp_path, fake_lib, gpus(ecc_volatile=2, remap_pending=1))
    gs.FakeConfig(gpus=gpus(ecc_volatile=2, remap_pending=1),
                  holders=[gs.FakeHolder(mib=4000, gpus=[1], cmdline=tag)]).write(rig.config)
    stray = holders.start("python-stray", tag)
    before = rig.health()
    assert before[1]["ecc_volatile"] == 2 and before[1]["remap_pending"] is True  # the driver's own answer

    body = state(extra="  free_with: {kill: ['python*']}\n")
    code, report = rig.run("apply", body)
    assert code == 0, report
    assert report["status"] == "ok"
    assert actions(report) == [("terminate", f"pid {stray.pid}", "done"), ("reset", gpu_uuid(1), "done"),
                               ("validate", "gpus", "done")]
    assert not gs.proc_alive(stray.pid)
    assert rig.resets() == [(1, "ok")]
    after = rig.health()
    assert after[1]["ecc_volatile"] == 0 and after[1]["remap_pending"] is False  # the reset did it, per NVML
    assert "GPU 00000000:21:00.0 was successfully reset." in rig.klog.read_text()
    boot = rig.boot_file.read_text().strip()
    reset_lines = [e for e in rig.lines() if e.get("action") == "reset"]
    assert [e["event"] for e in reset_lines] == ["intent", "result"] and {e["boot"] for e in reset_lines} == {boot}
    gate = [e for e in rig.lines() if e.get("action") == "validate" and e["event"] == "result"]
    assert gate[0]["result"] == "done" and "gate ok" in gate[0]["message"]

    # Kept for the boot: the next apply has nothing to do, and does not run the gate again.
    code, again = rig.run("apply", body)
    assert code == 0 and again["actions"] == []
    assert rig.reboot_asked.exists() is False


def test_an_allowed_holder_blocks_the_reset_naming_it(tmp_path, fake_lib, holders):
    tag = gs.new_tag()
    rig = Rig(tmp_path, fake_lib, gpus())
    gs.FakeConfig(gpus=gpus(ecc_volatile=1), holders=[gs.FakeHolder(mib=4000, gpus=[1], cmdline=tag)]).write(rig.config)
    server = holders.start("vllm-server", tag, program=gs.program_copy(tmp_path, "vllm-server"))
    code, report = rig.run("apply", state(extra="  allow: ['vllm*']\n"))
    assert code == 2 and report["status"] == "blocked"
    assert f"cannot be reset while {server.pid} (vllm-server)" in report["message"]
    assert "(in gpus.allow)" in report["message"]
    assert rig.resets() == [] and gs.proc_alive(server.pid)


def test_persistence_mode_is_turned_off_for_the_reset_and_on_again_after(tmp_path, fake_lib):
    g = gpus(ecc_volatile=1)
    g[0].persistence = g[1].persistence = 1  # as nvidia-persistenced leaves them on a real host
    rig = Rig(tmp_path, fake_lib, g)
    assert [x["persistence"] for x in rig.health()] == [1, 1]  # the driver's own answer
    code, report = rig.run("apply", state())
    assert code == 0, report
    reset = [a for a in report["actions"] if a["action"] == "reset"][0]
    assert reset["result"] == "done" and "persistence mode off for it through NVML" in reset["description"]
    # In the driver's order: off on that GPU only, the reset, on again.
    calls = [(call, gpu, args, result) for call, gpu, args, result in gs.setter_calls(rig.config)]
    assert calls == [("nvmlDeviceSetPersistenceMode", 1, "0", "ok"), ("reset", 1, "", "ok"),
                     ("nvmlDeviceSetPersistenceMode", 1, "1", "ok")]
    after = rig.health()
    assert [x["persistence"] for x in after] == [1, 1] and after[1]["ecc_volatile"] == 0
    # Journaled: the reset's result line says what was done to persistence mode.
    result = [e for e in rig.lines() if e.get("action") == "reset" and e["event"] == "result"][0]
    assert result["result"] == "done" and "persistence mode was on" in result["message"]


def test_persistence_mode_that_cannot_be_turned_off_blocks_the_reset_with_the_step(tmp_path, fake_lib):
    g = gpus(ecc_volatile=1)
    g[1].persistence = 1
    g[1].fail = {"set_persistence": "no_permission"}
    rig = Rig(tmp_path, fake_lib, g)
    code, report = rig.run("apply", state())
    assert code != 0 and report["status"] != "ok"
    failed = [a for a in report["actions"] if a["action"] == "reset"][0]
    assert failed["result"] == "failed"
    assert "not reset: persistence mode is on and could not be turned off" in failed["message"]
    assert "nvidia-smi --gpu-reset -i" in failed["message"]
    assert [c for c in gs.setter_calls(rig.config) if c[0] == "reset"] == []  # never tried
    assert rig.health()[1]["ecc_volatile"] == 1 and rig.health()[1]["persistence"] == 1


def test_a_gpu_that_comes_back_just_as_broken_is_reset_once_then_needs_a_reboot(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus(ecc_volatile=3, broken=True))
    code, report = rig.run("apply", state())
    assert code == 2 and report["status"] == "blocked"
    assert rig.resets() == [(1, "ok")]
    assert rig.health()[1]["ecc_volatile"] == 3
    assert "recover.reboot is off" in report["message"]
    # The next apply in the same boot does not reset it again: a reset in this boot did not help.
    code, report = rig.run("apply", state())
    assert rig.resets() == [(1, "ok")] and code == 2
    # With reboot declared, the plan is the reboot (planned only: --dry-run), naming why.
    code, plan = rig.run("apply", state(recover="{reset: true, reboot: true}"), "--dry-run",
                         "--journal", str(rig.journal))
    reboot = [a for a in plan["actions"] if a["action"] == "reboot"]
    assert reboot and reboot[0]["result"] == "planned"
    assert "escalation: after the reset at" in reboot[0]["description"]
    assert "which did not clear the fault" in reboot[0]["description"]
    assert not rig.reboot_asked.exists()


def test_resets_are_capped_per_gpu_across_boots_until_a_person_acks(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus(ecc_volatile=2))
    body = state(recover="{reset: true, max_resets: 1, window: 24h}")

    def fault_again() -> None:  # the same GPU errs again after the next boot
        Path(f"{rig.config}.state").unlink()
        rig.new_boot()

    code, _ = rig.run("apply", body)
    assert code == 0 and rig.resets() == [(1, "ok")]
    fault_again()
    code, report = rig.run("apply", body)
    assert code == 2 and report["status"] == "blocked"
    assert "needs service: reset 1 time(s) in 24h (max_resets 1)" in report["message"]
    assert rig.resets() == [(1, "ok")]  # never a further attempt

    proc = rig.ack("--gpu", "00000000:21:00.0", "--reason", "reseated", "--by", "alice")
    assert proc.returncode == 0, proc.stderr
    acked = [e for e in rig.lines() if e["event"] == "ack"]
    assert acked[0]["by"] == "alice" and acked[0]["reason"] == "reseated" and acked[0]["gpu"] == "00000000:21:00.0"
    code, report = rig.run("apply", body)
    assert code == 0 and rig.resets() == [(1, "ok"), (1, "ok")]

    # `reconcile log` (text and json): the ack in its place among the runs, and each gate's result line,
    # as the journal file has them.
    from cli_support import run_cli

    lines = rig.lines()
    order: list[str] = []
    for e in lines:
        key = "ack" if e["event"] == "ack" else e.get("run") if e["event"] in ("intent", "result", "verified") else None
        if key and key not in order:
            order.append(key)
    proc = run_cli(tmp_path, "log", "--journal", str(rig.journal), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    events = json.loads(proc.stdout)["events"]
    assert [e["run"] if e["event"] == "run" else e["event"] for e in events] == order and "ack" in order
    ack_event = next(e for e in events if e["event"] == "ack")
    assert {k: ack_event[k] for k in ("by", "reason", "gpu", "boot")} == {k: acked[0][k] for k in ("by", "reason",
                                                                                                  "gpu", "boot")}
    gates = [e["message"] for e in lines if e.get("action") == "validate" and e["event"] == "result"]
    shown = [a["message"] for e in events if e["event"] == "run" for a in e["actions"] if a["action"] == "validate"]
    assert gates and shown == gates
    text = run_cli(tmp_path, "log", "--journal", str(rig.journal)).stdout
    assert "ack GPU 00000000:21:00.0 serviced, by alice: reseated" in text
    assert all(g in text for g in gates)


def test_a_replaced_gpu_starts_clean(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus(ecc_volatile=2))
    body = state(recover="{reset: true, max_resets: 1}")
    assert rig.run("apply", body)[0] == 0
    Path(f"{rig.config}.state").unlink()
    new = "GPU-99999999-0000-0000-0000-000000000002"
    rig.config.write_text(rig.config.read_text().replace(gpu_uuid(1), new))  # another board at the same bus id
    code, report = rig.run("apply", body)
    assert code == 0, report["message"]
    assert [a["target"] for a in report["actions"] if a["action"] == "reset"] == [new]


def test_a_lost_gpu_is_never_reset_and_no_reset_brings_it_back(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus(error="lost", error_on=("all",)))
    code, report = rig.run("apply", state())
    assert code == 2 and "reboot the node" in report["message"]
    assert rig.resets() == []
    # What nvidia-smi -r says to a lost GPU (the stand-in resets through the fake): nothing is reset.
    smi = subprocess.run([str(SMI_BIN / "nvidia-smi"), "--gpu-reset", "-i", "00000000:21:00.0"], capture_output=True,
                         text=True, env={**os.environ, **gs.nvml_env(rig.lib, rig.config)}, timeout=60)
    assert smi.returncode == 15 and "GPU is lost. Reboot the system" in smi.stdout
    assert rig.resets() == [(1, "lost")]


def test_nvswitch_systems_are_not_reset_one_gpu_at_a_time(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus(recovery=1))
    (tmp_path / "nvidia-nvswitch0").touch()
    code, report = rig.run("apply", state(), RECONCILE_NVSWITCH_GLOB=str(tmp_path / "nvidia-nvswitch*"))
    assert code == 2 and "has NVSwitches" in report["message"] and "fabric manager" in report["message"]
    assert rig.resets() == []


def test_recover_without_a_gate_after_it_is_refused_as_bad_input(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus())
    path = gs.write_state(tmp_path, "gpus:\n  count: 2\n  recover: {reset: true}\n")
    proc = gs.cli(tmp_path, fake_lib, rig.config, "diff", str(path), **rig.env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith(f"{path}:") and "gpus.recover needs gpus.validate" in proc.stderr


# --- the gate with real commands -----------------------------------------------------------------

def test_the_gate_runs_once_per_boot_and_again_after_a_new_boot(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus())
    body = "gpus:\n  count: 2\n  validate: {command: [sh, -c, 'echo diag level 1 passed'], after: [boot]}\n"
    code, report = rig.run("apply", body)
    assert code == 0 and actions(report) == [("validate", "gpus", "done")]
    assert rig.run("apply", body)[1]["actions"] == []
    rig.new_boot()
    code, report = rig.run("apply", "gpus:\n  count: 2\n  validate: {command: [sh, -c, 'echo diag level 1 passed'], "
                                    "after: [boot]}\n", "--dry-run")
    assert code == 2 and [d["field"] for d in report["drift"]] == ["validated"]
    assert report["drift"][0]["have"] == "not run after this boot"


def test_a_failing_gate_is_blocked_with_its_tail_kept_for_the_boot_until_an_ack(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus())
    marker = tmp_path / "runs"
    cmd = f"[sh, -c, 'echo run >> {marker}; echo checking NVLink; echo link 3 down >&2; exit 3']"
    body = f"gpus:\n  count: 2\n  validate: {{command: {cmd}, after: [boot]}}\n"
    code, report = rig.run("apply", body)
    assert code == 2 and report["status"] == "blocked"
    assert "failed" in report["message"] and "exit 3" in report["message"] and "link 3 down" in report["message"]
    result = [e for e in rig.lines() if e.get("action") == "validate" and e["event"] == "result"]
    assert result[0]["result"] == "failed" and "link 3 down" in result[0]["message"]
    code, report = rig.run("apply", body)
    assert code == 2 and report["actions"] == [] and marker.read_text().count("run") == 1  # not run again
    assert rig.ack("--reason", "NVLink cable reseated").returncode == 0
    rig.run("apply", body)
    assert marker.read_text().count("run") == 2


def test_a_gate_that_hangs_is_killed_at_its_timeout_and_blocked_with_what_it_printed(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus())
    pidfile = tmp_path / "gate.pid"
    cmd = f"[sh, -c, 'echo $$ > {pidfile}; echo starting NCCL all_reduce; exec sleep 600']"
    code, report = rig.run("apply", f"gpus:\n  count: 2\n  validate: {{command: {cmd}, timeout: 2s}}\n")
    assert code == 2 and report["status"] == "blocked"
    assert "timed out" in report["message"] and "starting NCCL all_reduce" in report["message"]
    assert not gs.proc_alive(int(pidfile.read_text()))


def test_without_recover_nothing_is_reset_the_step_is_named(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus(ecc_volatile=1))
    code, report = rig.run("apply", "gpus:\n  count: 2\n")
    assert code == 2 and "must not run jobs: reset the GPU" in report["message"]
    assert report["actions"] == [] and rig.resets() == []


def test_persistence_held_by_nvidia_persistenced_is_released_through_its_unit_and_restored(nsystemd, tmp_path,
                                                                                           fake_lib):
    """Where nvidia-persistenced runs (the stand-in daemon under the namespaced systemd, turning every
    GPU's persistence on as the real one does), the reset stops its unit and starts it again."""
    from cli_support import cli_env, reconcile_argv

    unit = "nvidia-persistenced.service"
    rig = Rig(tmp_path, fake_lib, gpus(ecc_volatile=1))
    nsystemd.write_unit(unit, gs.persistenced_unit(fake_lib, rig.config, pidfile=str(tmp_path / "persistenced.pid")))
    nsystemd.systemctl("start", unit, check=True)
    nsystemd.wait_active(unit)
    assert [x["persistence"] for x in rig.health()] == [1, 1]
    argv = reconcile_argv("apply", str(gs.write_state(tmp_path, state())), "--format", "json",
                          "--journal", str(rig.journal))
    proc = nsystemd.run(argv, env={**cli_env(tmp_path), **gs.nvml_env(fake_lib, rig.config), **rig.env}, timeout=180)
    report = gs.gpus_report(proc)
    assert proc.returncode == 0, report
    reset = [a for a in report["actions"] if a["action"] == "reset"][0]
    assert reset["result"] == "done" and f"by stopping {unit}" in reset["description"]
    # The daemon went (every GPU's persistence with it), the reset, the daemon again: per the fake's log.
    calls = [(call, args, result) for call, _, args, result in gs.setter_calls(rig.config)]
    assert calls == [("persistenced", "1", "ok"), ("persistenced", "0", "ok"), ("reset", "", "ok"),
                     ("persistenced", "1", "ok")]
    assert nsystemd.show(unit, "ActiveState") == "active"
    after = rig.health()
    assert [x["persistence"] for x in after] == [1, 1] and after[1]["ecc_volatile"] == 0
    assert not [c for c in calls if c[0] == "nvmlDeviceSetPersistenceMode"]  # not through NVML
    result = [e for e in rig.lines() if e.get("action") == "reset" and e["event"] == "result"][0]
    assert f"persistence mode was on: stopped {unit}, then started {unit}" in result["message"]
