"""GPU settings end to end: the CLI sets them through the real pynvml on the fake libnvidia-ml
(tests/fakenvml/fakenvml_settings.c), and the test reads them back through pynvml itself, in a
process of its own: the driver's answer, not reconcile's. The fake's call log proves the actions
minimal: no setter is called for a value that already holds. Per-GPU failures (no permission,
NOT_SUPPORTED, a GPU lost mid-apply, a setter that never returns) are one line each while the
other GPUs go on; MIG/ECC changes stay pending until the test resets the GPU or reboots the host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import gpu_support as gs
import pytest
from cli_support import cli_env, reconcile_argv

BOOT = ("[    0.000000] Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org)\n"
        "[    4.212001] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  590.48.01  Thu Nov 20 2025\n")


class Rig:
    """One test's fake GPUs, state file, kernel log and journal."""

    def __init__(self, tmp: Path, lib: Path, gpus: list[gs.FakeGpu], driver: str = "590.48.01"):
        self.tmp, self.lib = tmp, lib
        self.config = gs.FakeConfig(gpus=gpus, driver=driver).write(tmp / "nvml.conf")
        self.klog = tmp / "kern.log"
        self.klog.write_text(BOOT)

    def run(self, command: str, body: str, *extra: str) -> tuple[int, dict]:
        state = gs.write_state(self.tmp, body)
        code, doc, stderr = gs.cli_json(self.tmp, self.lib, self.config, command, str(state), *extra,
                                        RECONCILE_KERNEL_LOG=str(self.klog))
        assert doc is not None, stderr
        return code, gs.gpus_of(doc)

    def calls(self) -> list[tuple[str, int, str, str]]:
        return gs.setter_calls(self.config)

    def nvml(self) -> list[dict]:
        return gs.nvml_settings(self.lib, self.config)


def results(report: dict) -> dict[str, tuple[str, str]]:
    return {a["target"]: (a["result"], a.get("message", "")) for a in report["actions"]}


STATE = """
gpus:
  count: 4
  settings:
    persistence_mode: true
    power_limit: 600W
    compute_mode: default
    mig: disabled
    ecc: enabled
    per_gpu:
      0: {locked_clocks: {min: 1500MHz, max: 1980MHz}}
"""


def test_apply_sets_what_differs_pynvml_reads_it_back_and_a_second_apply_calls_nothing(tmp_path, fake_lib):
    gpus = gs.seed_gpus(4)
    gpus[0].persistence = 0
    gpus[1].settings = {"power_limit_mw": 450000}
    gpus[2].settings = {"compute_mode": 3}
    host = Rig(tmp_path, fake_lib, gpus)

    code, report = host.run("diff", STATE)
    assert code == 2 and report["status"] == "drift"
    assert {d["field"]: (d["want"], d["have"]) for d in report["drift"]} == {
        "gpu0.persistence_mode": (True, False), "gpu0.locked_clocks": ("1500-1980 MHz", "unknown"),
        "gpu1.power_limit": ("600 W", "450 W"), "gpu2.compute_mode": ("default", "exclusive_process")}
    assert host.calls() == []  # diff sets nothing

    code, report = host.run("apply", STATE)
    assert code == 0 and report["status"] == "ok", report
    assert host.calls() == [
        ("nvmlDeviceSetPersistenceMode", 0, "1", "ok"),
        ("nvmlDeviceSetComputeMode", 2, "0", "ok"),
        ("nvmlDeviceSetPowerManagementLimit", 1, "600000", "ok"),
        ("nvmlDeviceSetGpuLockedClocks", 0, "1500,1980", "ok"),
    ]
    assert results(report)["gpu1.power_limit"] == ("done", "GPU 1: power limit 600 W (reads back 600 W)")
    nvml = host.nvml()
    assert [g["persistence_mode"] for g in nvml] == [1] * 4
    assert [g["power_limit_mw"] for g in nvml] == [600000] * 4
    assert [g["compute_mode"] for g in nvml] == [0] * 4
    assert nvml[0]["graphics_clock"] == 1500  # the lock holds the clock in its range
    journal = [e for line in (tmp_path / "journal.jsonl").read_text().splitlines()
               if (e := json.loads(line))["event"] == "result"]
    assert [(e["resource"], e["action"], e["target"], e["result"]) for e in journal] == [
        ("gpus", "set", t, "done") for t in ("gpu0.persistence_mode", "gpu2.compute_mode", "gpu1.power_limit",
                                             "gpu0.locked_clocks")]

    code, report = host.run("apply", STATE)
    assert code == 0 and report["status"] == "ok" and report["actions"] == []
    assert len(host.calls()) == 4  # not one setter more


def test_per_gpu_failures_are_one_line_each_and_the_other_gpus_go_on(tmp_path, fake_lib):
    gpus = gs.seed_gpus(4, settings={"power_limit_mw": 450000})
    gpus[0].fail = {"set_power": "no_permission"}
    gpus[1].fail = {"set_power": "not_supported"}
    gpus[2].lose_on = "set_power"  # falls off the bus when its power limit is set
    host = Rig(tmp_path, fake_lib, gpus)
    state = STATE.replace("      0: {locked_clocks", "      9999: {locked_clocks").replace(
        "    per_gpu:\n      9999: {locked_clocks: {min: 1500MHz, max: 1980MHz}}\n",
        "    locked_clocks: {min: 1500MHz, max: 1980MHz}\n")

    code, report = host.run("apply", state)
    assert code == 2
    got = results(report)
    assert got["gpu0.power_limit"] == ("failed", "GPU 0: nvmlDeviceSetPowerManagementLimit: Insufficient Permissions "
                                                 "(setting GPU settings needs root)")
    assert got["gpu1.power_limit"] == ("failed", "GPU 1: nvmlDeviceSetPowerManagementLimit: Not Supported (this GPU "
                                                 "or driver does not support it)")
    assert got["gpu2.power_limit"] == ("failed", "GPU 2: nvmlDeviceSetPowerManagementLimit: GPU is lost (the GPU fell "
                                                 "off the bus: reboot the node)")
    assert got["gpu2.locked_clocks"][0] == "failed" and "not tried: " in got["gpu2.locked_clocks"][1]
    assert all("\n" not in message for _, message in got.values())
    for target in ("gpu3.power_limit", "gpu0.locked_clocks", "gpu1.locked_clocks", "gpu3.locked_clocks"):
        assert got[target][0] == "done", target
    # The driver's own answer: GPU 3 set, GPU 0 and 1 left as they were, GPU 2 lost.
    nvml = host.nvml()
    assert [g["power_limit_mw"] for g in nvml] == [450000, 450000, "error: GPU is lost", 600000]
    # GPU 2 was not asked again after it was lost: one setter call, not two.
    assert [c for c in host.calls() if c[1] == 2] == [("nvmlDeviceSetPowerManagementLimit", 2, "600000", "lost")]
    # Verified by observing again: GPU 2 is lost (unhealthy, with its step); the others' drift is theirs.
    assert report["status"] == "blocked"
    assert "GPU 2 (" in report["message"] and "must not run jobs: reboot the node" in report["message"]
    assert {d["field"] for d in report["drift"]} >= {"gpu0.power_limit", "gpu1.power_limit", "gpu2.healthy"}


def test_constraints_are_each_gpus_own_and_a_value_outside_them_is_never_tried(tmp_path, fake_lib):
    gpus = gs.seed_gpus(3, settings={"power_limit_mw": 450000})
    gpus[1].settings = {"power_limit_mw": 450000, "power_min_mw": 100000, "power_max_mw": 500000}
    host = Rig(tmp_path, fake_lib, gpus)
    code, report = host.run("apply", "gpus:\n  settings:\n    power_limit: 600W\n")
    assert code == 2 and report["status"] == "blocked"
    assert "GPU 1: power_limit 600 W is outside what it supports: 100 W to 500 W " \
           "(nvmlDeviceGetPowerManagementLimitConstraints)" in report["message"]
    assert [a["target"] for a in report["actions"]] == ["gpu0.power_limit", "gpu2.power_limit"]
    assert [c[1] for c in host.calls()] == [0, 2]  # GPU 1's setter never called
    assert [g["power_limit_mw"] for g in host.nvml()] == [600000, 450000, 600000]


def test_a_saved_plan_sets_what_it_lists(tmp_path, fake_lib):
    host = Rig(tmp_path, fake_lib, gs.seed_gpus(2, settings={"power_limit_mw": 450000}))
    state = gs.write_state(tmp_path, "gpus:\n  settings:\n    power_limit: 600W\n")
    plan = tmp_path / "plan.json"
    env = {"RECONCILE_KERNEL_LOG": str(host.klog)}
    proc = gs.cli(tmp_path, fake_lib, host.config, "diff", str(state), "--out", str(plan), **env)
    assert proc.returncode == 2, proc.stderr
    assert host.calls() == []
    proc = gs.cli(tmp_path, fake_lib, host.config, "apply", str(plan), "--journal", str(tmp_path / "j.jsonl"), **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(c[0], c[1]) for c in host.calls()] == [("nvmlDeviceSetPowerManagementLimit", 0),
                                                    ("nvmlDeviceSetPowerManagementLimit", 1)]


def test_not_root_every_setter_is_refused_one_line_per_gpu(fake_lib):
    """reconcile run as nobody: the driver refuses setters to anyone but root (NO_PERMISSION), and
    each GPU's action says so in one line; reading works."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run reconcile as another user")
    tmp = Path(tempfile.mkdtemp(prefix="reconcile-nobody-"))
    try:
        tmp.chmod(0o777)  # the other user's files: its cache, state directory and journal
        lib = tmp / "lib"
        lib.mkdir()
        shutil.copy(fake_lib / "libnvidia-ml.so.1", lib)
        config = gs.FakeConfig(gpus=gs.seed_gpus(2, settings={"power_limit_mw": 450000})).write(tmp / "nvml.conf")
        state = gs.write_state(tmp, "gpus:\n  settings:\n    power_limit: 600W\n")
        klog = tmp / "kern.log"
        klog.write_text(BOOT)
        for path in (lib, *lib.iterdir(), config, state, klog):
            path.chmod(0o755 if path.is_dir() else 0o644)
        env = cli_env(tmp, LD_LIBRARY_PATH=str(lib), FAKE_NVML_CONFIG=str(config), RECONCILE_KERNEL_LOG=str(klog),
                      RECONCILE_SYSFS_PCI=str(gs.pci_root(config)),
                      RECONCILE_STATE_DIR=str(tmp / "state"), HOME=str(tmp))
        argv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                *reconcile_argv("apply", str(state), "--format", "json", "--journal", str(tmp / "journal.jsonl"))]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp)
        assert "Traceback" not in proc.stderr, proc.stderr
        report = next(r for r in json.loads(proc.stdout)["resources"] if r["id"] == "gpus")
        assert proc.returncode == 2 and report["drift"] == [
            {"field": f"gpu{i}.power_limit", "want": "600 W", "have": "450 W"} for i in range(2)]
        assert results(report) == {f"gpu{i}.power_limit": (
            "failed", f"GPU {i}: nvmlDeviceSetPowerManagementLimit: Insufficient Permissions (setting GPU settings "
                      "needs root)") for i in range(2)}
        assert gs.setter_calls(config) == [("nvmlDeviceSetPowerManagementLimit", i, "600000", "no_permission")
                                           for i in range(2)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_setter_that_never_returns_is_abandoned_at_its_deadline(tmp_path, fake_lib):
    gpus = gs.seed_gpus(2, settings={"power_limit_mw": 450000})
    gpus[0].hang_on = "set_power"
    host = Rig(tmp_path, fake_lib, gpus)
    state = "gpus:\n  observe_timeout: 2s\n  settings:\n    power_limit: 600W\n"
    code, report = host.run("apply", state)
    got = results(report)
    assert got["gpu0.power_limit"][0] == "failed"
    assert got["gpu0.power_limit"][1].startswith("GPU 0: nvmlDeviceSetPowerManagementLimit did not return within 2s "
                                                 "(a wedged driver?); setter pid ")
    assert got["gpu1.power_limit"] == ("done", "GPU 1: power limit 600 W (reads back 600 W)")
    assert code == 2 and [g["power_limit_mw"] for g in host.nvml()] == [450000, 600000]


def test_mig_and_ecc_changes_stay_pending_until_the_gpu_is_reset_or_the_host_reboots(tmp_path, fake_lib):
    host = Rig(tmp_path, fake_lib, gs.seed_gpus(2))
    state = "gpus:\n  settings:\n    per_gpu:\n      0: {ecc: disabled}\n      1: {mig: enabled}\n"
    code, report = host.run("apply", state)
    assert code == 0 and report["status"] == "converging", report
    assert "GPU 0: ECC mode disabled is pending: reboot" in report["message"]
    assert "GPU 1: MIG mode enabled is pending: reset GPU 1" in report["message"]
    got = results(report)
    assert got["gpu1.mig"] == ("done", "GPU 1: MIG mode enabled pending: it takes effect when the GPU is reset "
                                       "(reads back pending enabled)")
    assert [g["ecc"] for g in host.nvml()] == [[1, 0], [1, 1]] and [g["mig"] for g in host.nvml()] == [[0, 0], [0, 1]]
    calls = host.calls()
    assert calls == [("nvmlDeviceSetEccMode", 0, "0", "ok"), ("nvmlDeviceSetMigMode", 1, "1", "ok")]

    # Pending is not done, and not redone: nothing is called again.
    code, report = host.run("apply", state)
    assert report["status"] == "converging" and report["actions"] == [] and host.calls() == calls

    # A reset (what `nvidia-smi -r -i 1` does) is refused while a process holds the GPU, then makes MIG current.
    holders = gs.Holders()
    try:
        tag = gs.new_tag()
        gs.FakeConfig(gpus=gs.seed_gpus(2), holders=[gs.FakeHolder(mib=100, gpus=[1], cmdline=tag)]).write(host.config)
        holders.start("python", tag)
        assert gs.reset_gpu(fake_lib, host.config, 1) == 19  # NVML_ERROR_IN_USE
    finally:
        holders.cleanup()
    # Persistence mode holds it too (NVIDIA/NVSentinel#1690: "In use by another client" until `nvidia-smi -pm 0`).
    assert gs.reset_gpu(fake_lib, host.config, 1) == 19
    gs.nvml_do(fake_lib, host.config, "n.nvmlDeviceSetPersistenceMode(h(1), 0)")
    assert gs.reset_gpu(fake_lib, host.config, 1) == 0
    assert host.nvml()[1]["mig"] == [1, 1]
    code, report = host.run("diff", state)
    assert [d["field"] for d in report["drift"]] == ["gpu0.ecc"] and report["status"] == "converging"

    # The reboot makes ECC current; nothing is left to do.
    assert gs.reboot(fake_lib, host.config) == 0
    code, report = host.run("diff", state)
    assert code == 0 and report["status"] == "ok" and host.nvml()[0]["ecc"] == [0, 0]


def test_mig_waits_for_a_holder_the_same_apply_terminates_then_is_set(tmp_path, fake_lib):
    tag = gs.new_tag()
    host = Rig(tmp_path, fake_lib, gs.seed_gpus(2))
    gs.FakeConfig(gpus=gs.seed_gpus(2), holders=[gs.FakeHolder(mib=2048, gpus=[0], cmdline=tag)]).write(host.config)
    holders = gs.Holders()
    try:
        proc = holders.start("python-job", tag)
        state = ("gpus:\n  max_memory_used: 0MiB\n  free_with: {kill: [\"python*\"], grace: 5s}\n"
                 "  settings:\n    per_gpu:\n      0: {mig: enabled}\n")
        code, report = host.run("diff", state)
        assert f"GPU 0: MIG mode is set once {proc.pid} (python-job) has let go of it (freed first)" \
            in report["message"]
        code, report = host.run("apply", state)
        assert [(a["action"], a["target"], a["result"]) for a in report["actions"]] == [
            ("terminate", f"pid {proc.pid}", "done"), ("set", "gpu0.mig", "done")]
        assert report["status"] == "converging" and "pending: reset GPU 0" in report["message"]
        assert not gs.proc_alive(proc.pid) and host.nvml()[0]["mig"] == [0, 1]
    finally:
        holders.cleanup()


def test_nvidia_persistenced_holding_every_device_file_does_not_block_mig(tmp_path, fake_lib):
    """The daemon keeps /dev/nvidia* open on every GPU; its comm is cut to 15 characters
    (`nvidia-persiste`), and it is still not a holder; a process of another name is."""
    host = Rig(tmp_path, fake_lib, gs.seed_gpus(2))
    dev = tmp_path / "dev"
    dev.mkdir()
    for n in range(2):
        (dev / f"nvidia{n}").write_bytes(b"")
    holders = gs.Holders()
    state = "gpus:\n  settings:\n    mig: enabled\n"
    try:
        # Root's program of that name (the exemption goes by /proc/PID/exe, never by the name a
        # process gives itself).
        holders.start("nvidia-persistenced", gs.new_tag(), hold=dev / "nvidia0",
                      program=gs.program_copy(tmp_path, "nvidia-persistenced"))
        other = holders.start("python-tool", gs.new_tag(), hold=dev / "nvidia1")
        proc = gs.cli(tmp_path, fake_lib, host.config, "diff", str(gs.write_state(tmp_path, state)), "--format",
                      "json", RECONCILE_KERNEL_LOG=str(host.klog), RECONCILE_NVIDIA_DEV_GLOB=str(dev / "nvidia*"))
        report = gs.gpus_report(proc)
        assert [a["target"] for a in report["actions"]] == ["gpu0.mig"]
        assert f"GPU 1: MIG mode cannot be changed while a process holds the GPU: {other.pid} (python-tool)" \
            in report["message"]
    finally:
        holders.cleanup()


def test_after_a_reboot_apply_sets_again_exactly_what_the_reboot_lost(tmp_path, fake_lib):
    host = Rig(tmp_path, fake_lib, gs.seed_gpus(2, settings={"power_limit_mw": 450000}))
    state = ("gpus:\n  settings:\n    persistence_mode: true\n    power_limit: 500W\n    compute_mode: prohibited\n"
             "    locked_clocks: {min: 1500MHz, max: 1980MHz}\n    mig: disabled\n")
    assert host.run("apply", state)[0] == 0
    first = len(host.calls())
    assert first == 6  # power limit, compute mode and locked clocks on each GPU; persistence was on
    assert gs.reboot(fake_lib, host.config) == 0
    host.klog.write_text(BOOT.replace("4.212001", "4.198334"))  # this boot's kernel log: another driver load
    code, report = host.run("diff", state)
    assert {d["field"] for d in report["drift"]} == {f"gpu{i}.{f}" for i in range(2) for f in (
        "persistence_mode", "power_limit", "compute_mode", "locked_clocks")}
    assert host.run("apply", state)[0] == 0
    again = [c[0] for c in host.calls()[first + 1:]]  # after the "reboot" line
    assert sorted(again) == sorted(["nvmlDeviceSetPersistenceMode", "nvmlDeviceSetComputeMode",
                                    "nvmlDeviceSetPowerManagementLimit", "nvmlDeviceSetGpuLockedClocks"] * 2)
    nvml = host.nvml()
    assert [(g["persistence_mode"], g["power_limit_mw"], g["compute_mode"]) for g in nvml] == [(1, 500000, 2)] * 2


def test_application_clocks_memory_first_on_a_535_driver_deprecated_on_590(tmp_path, fake_lib):
    host = Rig(tmp_path, fake_lib, gs.seed_gpus(2), driver="535.183.01")
    state = "gpus:\n  settings:\n    application_clocks: {memory: 14001MHz, graphics: 1980MHz}\n"
    code, report = host.run("apply", state)
    assert code == 0 and report["status"] == "ok"
    assert host.calls() == [("nvmlDeviceSetApplicationsClocks", i, "14001,1980", "ok") for i in range(2)]
    assert [g["application_clocks"] for g in host.nvml()] == [[14001, 1980]] * 2
    code, report = host.run("apply", state.replace("{memory: 14001MHz, graphics: 1980MHz}", "default"))
    assert code == 0 and [c[0] for c in host.calls()[2:]] == ["nvmlDeviceResetApplicationsClocks"] * 2
    assert [g["application_clocks"] for g in host.nvml()] == [[14001, 1590]] * 2

    # A memory clock the GPU does not have: blocked with those it has; nothing called.
    code, report = host.run("apply", state.replace("14001MHz", "9501MHz"))
    assert code == 2 and report["status"] == "blocked" and len(host.calls()) == 4
    assert "GPU 0: application_clocks memory 9501 MHz is not a memory clock it supports: 14001 MHz, 405 MHz" \
        in report["message"]

    # Driver 590: deprecated, as real 590+ drivers answer; blocked, never tried.
    (tmp_path / "590").mkdir()
    host590 = Rig(tmp_path / "590", fake_lib, gs.seed_gpus(1))
    code, report = host590.run("apply", state)
    assert code == 2 and report["drift"] == [{"field": "gpu0.application_clocks",
                                              "want": "memory 14001 MHz, graphics 1980 MHz", "have": "not supported"}]
    assert "GPU 0: application_clocks cannot be set: deprecated by this driver (NVML: Requested functionality has " \
           "been deprecated): declare locked_clocks instead" in report["message"]
    assert host590.calls() == [] and host590.nvml()[0]["application_clocks"][0].startswith("error: Requested")


def test_locked_clocks_nvml_cannot_read_back_are_recorded_and_held_against_the_clock(tmp_path, fake_lib):
    # A busy GPU runs at 2430 MHz unless locked.
    host = Rig(tmp_path, fake_lib, gs.seed_gpus(1, settings={"clock_gr": 2430}))
    state = "gpus:\n  settings:\n    locked_clocks: {min: 1500MHz, max: 1980MHz}\n"
    assert host.run("apply", state)[0] == 0
    record = json.loads((tmp_path / "state" / "gpu-locked-clocks.json").read_text())
    assert record["gpus"][f"GPU-{gs.uuid.UUID(int=1)}"]["locked"] == [1500, 1980]
    assert record["driver_load"].endswith("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  590.48.01  Thu Nov 20 2025")
    assert host.nvml()[0]["graphics_clock"] == 1980
    assert host.run("diff", state)[0] == 0  # the record, and a clock within the lock

    # Someone resets the lock (nvidia-smi -rgc): the busy GPU's clock shows it gone.
    gs.nvml_do(fake_lib, host.config, "n.nvmlDeviceResetGpuLockedClocks(h(0))")
    code, report = host.run("diff", state)
    assert code == 2 and report["drift"] == [{"field": "gpu0.locked_clocks", "want": "1500-1980 MHz",
                                              "have": "not in force (graphics clock 2430 MHz, above 1980 MHz)"}]
    assert host.run("apply", state)[0] == 0 and host.nvml()[0]["graphics_clock"] == 1980


def test_a_bad_value_is_one_line_with_its_position_in_every_format(tmp_path, fake_lib):
    host = Rig(tmp_path, fake_lib, gs.seed_gpus(1))
    state = gs.write_state(tmp_path, "gpus:\n  settings:\n    power_limit: 450\n")
    for fmt in ("text", "json"):
        proc = gs.cli(tmp_path, fake_lib, host.config, "diff", str(state), "--format", fmt)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert f"{state}:4:18: gpus.settings.power_limit: invalid power limit 450" in proc.stderr + proc.stdout
