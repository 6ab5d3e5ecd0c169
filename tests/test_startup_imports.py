"""What a `reconcile diff` imports in its own process (docs/benchmark.md#start-up).

The GPUs are observed in a forked child (pipeline/engine.py observe_to_pipe): the readers only it
needs (the kernel log, NVML, /proc, the containers' cgroups) are imported there, and what only a
declared `recover`, `validate` or `settings` needs (recovery, the gate, settings, setters) is not
imported at all without them. The observation still crosses the pipe whole: the report is the
child's reading through the fake libnvidia-ml (the real pynvml), planned in the parent."""

from __future__ import annotations

import json
import subprocess
import sys

import gpu_support as gs
import pytest

PKG = "reconcile_host.reconcilers"
# The module names of this process (not its forked children's), written to FILE at the exit the
# command takes (commands.exit_now: os._exit, after the report is printed).
RECORD = ("import json, os, sys\n"
          "import reconcile_host.commands as c\n"
          "from reconcile_host.__main__ import main\n"
          "me = os.getpid()\n"
          "def leave(code):\n"
          "    if os.getpid() == me:\n"
          "        with open(os.environ['RECORD_MODULES'], 'w') as f:\n"
          "            json.dump(sorted(sys.modules), f)\n"
          "    sys.stdout.flush(); os._exit(code)\n"
          "c.exit_now = leave\n"
          "sys.argv[0] = 'reconcile'; main()\n")
CHILD_ONLY = {f"{PKG}.gpus.kernel_log", f"{PKG}.gpus.fold", f"{PKG}.gpus.nvml", f"{PKG}.gpus.nvml_settings",
              f"{PKG}.gpus.procfs", f"{PKG}.gpus.smi", f"{PKG}.containers", f"{PKG}.containers.refs", "pynvml"}
DECLARED_ONLY = {f"{PKG}.gpus.recovery", f"{PKG}.gpus.gate", f"{PKG}.gpus.settings", f"{PKG}.gpus.setters"}


def diff_modules(tmp, lib, config, body: str) -> tuple[dict, set[str]]:
    """The JSON report of `reconcile diff` and the modules its own process imported."""
    state = gs.write_state(tmp, body)
    record = tmp / "modules.json"
    env = gs.fake_nvml_env(tmp, lib, config, RECORD_MODULES=str(record))
    from cli_support import cli_env

    argv = [sys.executable, "-c", RECORD, "diff", str(state), "--format", "json"]
    for _ in range(2):  # the second run takes the validation cache's path, as a repeated diff does
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp, env=cli_env(tmp, **env), timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout), set(json.loads(record.read_text()))


@pytest.mark.system
def test_a_diff_of_count_and_memory_imports_neither_the_observers_readers_nor_undeclared_features(
        tmp_path, fake_lib, holders):
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), holders=[gs.FakeHolder(mib=30000, gpus=[0, 1], cmdline=tag)]
                           ).write(tmp_path / "nvml.conf")
    holder = holders.start("vllm-stray", tag)
    report, modules = diff_modules(tmp_path, fake_lib, config, """
        gpus:
          count: 2
          max_memory_used: 0MiB
          free_with: {stop_units: false, kill: ["vllm*"]}
        """)
    gpus = gs.gpus_of(report)
    # The child's reading, planned here: NVML's memory and the holder it found in /proc.
    assert gpus["status"] == "drift", gpus
    assert "via NVML" in gpus["summary"]
    assert [a["description"] for a in gpus["actions"]] == [
        f"terminate {holder.pid} (vllm-stray) holding 30000MiB each on GPUs 0,1"]
    assert {f"{PKG}.gpus", f"{PKG}.gpus.observed", f"{PKG}.gpus.health", f"{PKG}.gpus.memory"} <= modules
    assert (CHILD_ONLY | DECLARED_ONLY) & modules == set()


@pytest.mark.system
def test_recover_validate_and_settings_bring_their_modules_in(tmp_path, fake_lib):
    config = gs.FakeConfig(gpus=gs.seed_gpus(2)).write(tmp_path / "nvml.conf")
    report, modules = diff_modules(tmp_path, fake_lib, config, """
        gpus:
          count: 2
          settings: {compute_mode: default}
          recover: {reset: true}
          validate: {command: ["true"], after: [recover]}
        """)
    gpus = gs.gpus_of(report)
    # Read and planned with what was declared: the settings, the recovery's host, the gate.
    assert gpus["status"] == "ok", gpus
    assert gpus["observed"]["recovery"]["boot_id"] and gpus["observed"]["settings_host"]["boot_id"]
    assert [g["settings"]["compute_mode"] for g in gpus["observed"]["gpus"]] == ["default", "default"]
    assert {f"{PKG}.gpus.recovery", f"{PKG}.gpus.gate", f"{PKG}.gpus.settings"} <= modules
    readers = CHILD_ONLY - {f"{PKG}.gpus.nvml_settings"}  # the setters' table: recovery resets through them
    assert readers & modules == set()  # still read in the child


def test_a_diff_without_gpus_imports_no_gpus_module(tmp_path):
    point = tmp_path / "not-mounted"
    point.mkdir()
    report, modules = diff_modules(tmp_path, None, None, f"""
        mounts:
          {point}:
            mounted: true
        """)
    assert [r["id"] for r in report["resources"]] == [f"mount:{point}"]
    assert {m for m in modules if m.startswith(f"{PKG}.gpus") or m.startswith(f"{PKG}.containers")} == set()
