"""The gpus kind end to end: the CLI as a user runs it, the real pynvml bindings loading a fake
libnvidia-ml.so.1 (built here with gcc), real processes holding the fake "GPU memory", and the
namespaced systemd for units. Results are checked with /proc, systemctl and pynvml itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gpu_support as gs
from cli_support import cli_env, reconcile_argv, report_of

VLLM_UNIT = "vllm-kimi-k25-int4.service"
EXTRACT_UNIT = "eagle3-extract.service"
SEED_HOLD_MIB = 72289  # ~75.8 GB, what the vLLM service held on each GPU in the seed


write_state, gpus_report, cli = gs.write_state, gs.gpus_report, gs.cli


def probe(lib: Path, config: Path) -> list[dict]:
    """Each fake GPU's used/total MiB and PIDs, as pynvml itself reads them."""
    env = {**os.environ, **gs.nvml_env(lib, config)}
    out = subprocess.run(gs.pynvml_probe_argv(), env=env, capture_output=True, text=True, timeout=30, check=True)
    return gs.parse_probe(out.stdout)


# --- processes on this host ----------------------------------------------------------------------

def test_stray_processes_terminated_even_one_ignoring_sigterm(tmp_path, fake_lib, holders):
    tag_a, tag_b = gs.new_tag(), gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), holders=[
        gs.FakeHolder(mib=30000, gpus=[0], cmdline=tag_a),
        gs.FakeHolder(mib=20000, gpus=[0, 1], cmdline=tag_b),
    ]).write(tmp_path / "nvml.conf")
    polite = holders.start("vllm-stray", tag_a)
    stubborn = holders.start("python-stuck", tag_b, ignore_term=True)
    # stop_units off: on a CI host these test processes may sit in the runner's own service.
    state = write_state(tmp_path, """
        gpus:
          count: 2
          max_memory_used: 0MiB
          free_with: {stop_units: false, kill: ["vllm*", "python*"], grace: 1s}
          settle: 5s
        """)

    plan = gpus_report(cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json"))
    assert plan["status"] == "drift"
    descriptions = [a["description"] for a in plan["actions"]]
    assert f"terminate {polite.pid} (vllm-stray) holding 30000MiB on GPU 0" in descriptions
    assert f"terminate {stubborn.pid} (python-stuck) holding 20000MiB each on GPUs 0,1" in descriptions
    assert gs.proc_alive(polite.pid) and gs.proc_alive(stubborn.pid)  # diff changed nothing

    code, doc, err = gs.cli_json(tmp_path, fake_lib, config, "apply", str(state))
    assert code == 0, (doc, err)
    gpus = gs.gpus_of(doc)
    assert gpus["status"] == "ok"
    results = {a["target"]: a for a in gpus["actions"]}
    assert results[f"pid {polite.pid}"]["result"] == "done"
    assert "after SIGTERM" in results[f"pid {polite.pid}"]["message"]
    assert "SIGKILL" in results[f"pid {stubborn.pid}"]["message"]
    assert polite.wait(timeout=10) == -15 and stubborn.wait(timeout=10) == -9
    assert [g["used_mib"] for g in probe(fake_lib, config)] == [0, 0]
    assert "GPU0 0MiB / 97887MiB, GPU1 0MiB / 97887MiB" in gpus["summary"]
    journal = [e for line in (tmp_path / "journal.jsonl").read_text().splitlines()
               if (e := json.loads(line)).get("event") == "result"]
    assert {e["action"] for e in journal} == {"terminate"} and all(e["result"] == "done" for e in journal)


def test_holder_outside_kill_list_is_blocked_and_left_alive(tmp_path, fake_lib, holders):
    tag_ok, tag_other = gs.new_tag(), gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), holders=[
        gs.FakeHolder(mib=1000, gpus=[0], cmdline=tag_ok),
        gs.FakeHolder(mib=5000, gpus=[0], cmdline=tag_other),
    ]).write(tmp_path / "nvml.conf")
    killable = holders.start("vllm-stray", tag_ok)
    other = holders.start("train-job", tag_other)
    state = write_state(tmp_path, """
        gpus:
          max_memory_used: 0MiB
          free_with: {kill: ["vllm*"], grace: 1s}
          settle: 1s
        """)
    code, doc, err = gs.cli_json(tmp_path, fake_lib, config, "apply", str(state))
    assert code == 2, (doc, err)
    gpus = gs.gpus_of(doc)
    assert gpus["status"] == "blocked"
    assert f"{other.pid} (train-job) holding 5000MiB on GPU 0" in gpus["message"]
    assert "nothing was signalled" in gpus["message"]
    assert [a["target"] for a in gpus["actions"]] == [f"pid {killable.pid}"]
    assert killable.wait(timeout=10) == -15
    assert gs.proc_alive(other.pid) and other.poll() is None
    assert probe(fake_lib, config)[0] == {"used_mib": 5000, "total_mib": gs.SEED_TOTAL_MIB, "pids": [other.pid]}


def test_allowed_holder_not_counted(tmp_path, fake_lib, holders):
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), holders=[gs.FakeHolder(mib=18000, gpus=[0, 1], cmdline=tag)]
                           ).write(tmp_path / "nvml.conf")
    # `allow`'s name globs match the program a process runs, installed by root: a copy here.
    extraction = holders.start("eagle3-extract", tag, program=gs.program_copy(tmp_path, "eagle3-extract"))
    state = write_state(tmp_path, """
        gpus:
          count: 2
          max_memory_used: 0MiB
          allow: ["eagle3*"]
          free_with: {kill: ["*"]}
        """)
    proc = cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert gpus_report(proc)["status"] == "ok"
    assert "GPU0 18000MiB / 97887MiB" in gpus_report(proc)["summary"]
    assert extraction.poll() is None
    # Without the allow entry the same holder is drift, and `kill: ["*"]` would terminate it.
    state.write_text(state.read_text().replace('allow: ["eagle3*"]', "allow: []"))
    plan = gpus_report(cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json"))
    assert plan["status"] == "drift"
    assert {d["field"]: d["have"] for d in plan["drift"]} == {"gpu0.memory_used": "18000MiB",
                                                              "gpu1.memory_used": "18000MiB"}


def test_device_file_holder_hidden_from_nvml_is_found(tmp_path, fake_lib, holders):
    """NVML in a container lists PIDs of another namespace; /proc/PID/fd still shows who holds the GPU."""
    devdir = tmp_path / "dev"
    devdir.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (devdir / name).write_bytes(b"")
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), holders=[gs.FakeHolder(mib=40000, gpus=[1], cmdline=tag,
                                                                        hidden=True)]).write(tmp_path / "nvml.conf")
    hidden = holders.start("vllm-worker", tag, hold=devdir / "nvidia1")
    # nvidia-smi as root installs it (its program, in root's folders): never a holder
    monitor = holders.start("nvidia-smi", gs.new_tag(), hold=devdir / "nvidia0",
                            program=gs.program_copy(tmp_path, "nvidia-smi"))
    state = write_state(tmp_path, """
        gpus:
          max_memory_used: 0MiB
          free_with: {kill: ["vllm*", "nvidia*"], grace: 1s}
          settle: 5s
        """)
    glob = {"RECONCILE_NVIDIA_DEV_GLOB": str(devdir / "nvidia*")}
    plan = gpus_report(cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json", **glob))
    assert [a["description"] for a in plan["actions"]] == [
        f"terminate {hidden.pid} (vllm-worker) holding {devdir}/nvidia1 on GPU 1 (memory not reported by NVML)"]
    code, doc, err = gs.cli_json(tmp_path, fake_lib, config, "apply", str(state), **glob)
    assert code == 0, (doc, err)
    assert hidden.wait(timeout=10) == -15
    assert monitor.poll() is None
    assert [g["used_mib"] for g in probe(fake_lib, config)] == [0, 0]


# --- health and count ----------------------------------------------------------------------------

def test_unhealthy_gpu_blocked_and_unsupported_queries_not_signals(tmp_path, fake_lib):
    gpus = gs.seed_gpus(3)
    gpus[1].ecc_volatile = 2
    gpus[2].unsupported = ("ecc", "retired", "remap", "temp", "power")  # a GeForce board has none of these
    config = gs.FakeConfig(gpus=gpus).write(tmp_path / "nvml.conf")
    klog = tmp_path / "kern.log"
    klog.write_text("[  12.1] NVRM: Xid (PCI:0000:21:00): 48, pid=1234, name=python, An uncorrectable double bit "
                    "error (DBE) has been detected on GPU.\n"
                    "[  13.0] NVRM: Xid (PCI:0000:11:00): 13, pid=99, Graphics Exception\n")
    state = write_state(tmp_path, "gpus:\n  count: 3\n  healthy: true\n")
    proc = cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json", RECONCILE_KERNEL_LOG=str(klog))
    assert proc.returncode == 2
    report = gpus_report(proc)
    assert report["status"] == "blocked"
    assert report["drift"] == [{"field": "gpu1.healthy", "want": True, "have": False}]
    assert "GPU 1 (00000000:21:00.0) must not run jobs: reset the GPU" in report["message"]
    assert "2 volatile uncorrected ECC errors" in report["message"]
    assert "Xid 48 at [  12.1]: An uncorrectable double bit error" in report["message"]
    # Xid 13 is the application's (RESTART_APP): listed, not a reason to keep jobs off GPU 0.
    assert "Xid 13 at [  13.0]: Graphics Exception [Xid 13: RESTART_APP: restart the application]" in report["message"]
    observed = report["observed"]["gpus"]
    assert [g["health"] for g in observed] == ["healthy", "unhealthy", "healthy"]
    assert observed[2]["ecc_uncorrected_volatile"] is None and observed[2]["temperature_c"] is None
    assert observed[0]["power_w"] == 84.0
    assert report["actions"] == []
    # The text report says it without -v.
    text = cli(tmp_path, fake_lib, config, "diff", str(state), RECONCILE_KERNEL_LOG=str(klog))
    assert text.returncode == 2 and "GPU 1 (00000000:21:00.0) must not run jobs: reset the GPU" in text.stdout


def test_count_mismatch_blocked(tmp_path, fake_lib):
    config = gs.FakeConfig(gpus=gs.seed_gpus(7)).write(tmp_path / "nvml.conf")
    state = write_state(tmp_path, "gpus:\n  count: 8\n  max_memory_used: 0MiB\n")
    code, doc, _ = gs.cli_json(tmp_path, fake_lib, config, "apply", str(state))
    assert code == 2
    report = gs.gpus_of(doc)
    assert report["status"] == "blocked"
    assert {"field": "count", "want": 8, "have": 7} in report["drift"]
    assert "expected 8 GPUs, found 7" in report["message"]


def test_old_driver_without_v3_and_memory_v2(tmp_path, holders):
    """Drivers < 510: no _v3 process queries, no v2 memory info; pynvml raises FunctionNotFound."""
    lib = gs.build_fake_nvml(tmp_path / "oldlib", old_driver=True)
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(1, reserved_mib=0),
                           holders=[gs.FakeHolder(mib=1234, gpus=[0], cmdline=tag)]).write(tmp_path / "nvml.conf")
    p = holders.start("python3", tag)
    proc = cli(tmp_path, lib, config, "diff", str(write_state(tmp_path, "gpus:\n  max_memory_used: 0MiB\n")),
               "--format", "json")
    report = gpus_report(proc)
    assert report["drift"] == [{"field": "gpu0.memory_used", "want": "<= 0MiB", "have": "1234MiB"}]
    assert f"{p.pid} (python3) holding 1234MiB on GPU 0" in report["message"]


def test_wedged_driver_reported_within_observe_timeout_others_still_observed(tmp_path, fake_lib):
    """nvmlInit blocking for minutes (a GPU fallen off the bus) must not hang the audit: the GPUs
    are read in a child that is abandoned at `observe_timeout`, and the other kinds are reported."""
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), hang_init_s=60).write(tmp_path / "nvml.conf")
    state = write_state(tmp_path, """\
        gpus:
          count: 2
          observe_timeout: 1s
        mounts:
          /proc:
            fstype: proc
        """)
    t0 = time.monotonic()
    proc = cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert elapsed < 30, f"diff took {elapsed:.1f}s with a 1s observe_timeout"
    report = gpus_report(proc)
    assert report["status"] == "error"
    assert "observing gpus did not finish within 1s" in report["message"]
    pid = int(report["message"].rsplit("observer pid ", 1)[1].split()[0])
    mount = next(r for r in report_of(proc)["resources"] if r["id"] == "mount:/proc")
    assert mount["status"] == "ok"
    # The abandoned child was killed (it sleeps inside nvmlInit, so SIGKILL takes it at once).
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]


# --- without NVML ----------------------------------------------------------------------------------

def test_nvidia_smi_fallback(tmp_path):
    """No libnvidia-ml: the stand-in nvidia-smi answers from a real 8x RTX 4090 capture
    (tests/test_gpus_corpus.py replays the whole corpus)."""
    import smi_capture as sc

    cap = sc.load(sc.REAL / "gpud__8x-rtx-4090__535.154.05__3.q.txt")
    env = sc.install(cap, tmp_path)
    state = write_state(tmp_path, "gpus:\n  count: 8\n  healthy: true\n")
    proc = cli(tmp_path, None, None, "diff", str(state), "--format", "json", **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = gpus_report(proc)
    assert report["status"] == "ok" and report["observed"]["source"] == "nvidia-smi"
    assert report["summary"].count(" / 24564MiB") == 8
    text = cli(tmp_path, None, None, "diff", "-v", str(state), **env)
    last = cap.gpus[7]
    assert f"GPU7 {last['memory.used'].replace(' ', '')} / {last['memory.total'].replace(' ', '')}" in text.stdout


def test_neither_nvml_nor_nvidia_smi_is_a_clear_error(tmp_path):
    state = write_state(tmp_path, "gpus:\n  count: 8\n")
    proc = cli(tmp_path, None, None, "diff", str(state), PATH=gs.path_without(["nvidia-smi"]))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "NVML is unavailable" in proc.stdout and "nvidia-smi is not installed" in proc.stdout
    report = gpus_report(cli(tmp_path, None, None, "diff", str(state), "--format", "json",
                             PATH=gs.path_without(["nvidia-smi"])))
    assert report["status"] == "error"


# --- the seed: a Restart=always vLLM unit on the namespaced systemd ---------------------------------

def holder_unit(tag: str, name: str) -> str:
    return textwrap.dedent(f"""\
        [Unit]
        Description=stand-in GPU server ({name})
        [Service]
        ExecStart={sys.executable} {gs.HOLDER} {name} {tag}
        Restart=always
        RestartSec=100ms
        [Install]
        WantedBy=multi-user.target
        """)


def ns_cli(nsd, tmp: Path, lib: Path, config: Path, *args: str):
    klog = tmp / "empty-kern.log"  # the test's kernel log, not this machine's dmesg
    klog.touch()
    env = {**cli_env(tmp), **gs.nvml_env(lib, config), "RECONCILE_KERNEL_LOG": str(klog)}
    return nsd.run(reconcile_argv(*args), env=env, timeout=120)


def ns_probe(nsd, lib: Path, config: Path) -> list[dict]:
    out = nsd.run(gs.pynvml_probe_argv(), env={**os.environ, **gs.nvml_env(lib, config)}, check=True)
    return gs.parse_probe(out.stdout)


def test_seed_vllm_unit_stopped_memory_freed_and_verified(nsystemd, tmp_path, fake_lib):
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(8), holders=[
        gs.FakeHolder(mib=SEED_HOLD_MIB, gpus=range(8), cmdline=tag)]).write(tmp_path / "nvml.conf")
    nsystemd.write_unit(VLLM_UNIT, holder_unit(tag, "vllm"), enable=True)
    nsystemd.systemctl("start", VLLM_UNIT, check=True)
    nsystemd.wait_active(VLLM_UNIT)
    before = ns_probe(nsystemd, fake_lib, config)
    assert [g["used_mib"] for g in before] == [SEED_HOLD_MIB] * 8 and all(len(g["pids"]) == 1 for g in before)
    state = write_state(tmp_path, f"""
        units:
          {VLLM_UNIT}: {{active: false, enabled: false}}
        gpus:
          count: 8
          max_memory_used: 0MiB
          allow: [unit:{EXTRACT_UNIT}]
          healthy: true
          free_with: {{stop_units: true, kill: ["python*", "vllm*", "sglang*"], grace: 10s}}
          settle: 30s
        """)

    plan = ns_cli(nsystemd, tmp_path, fake_lib, config, "diff", str(state), "--format", "json")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    gpus = gpus_report(plan)
    assert gpus["status"] == "drift" and gpus["actions"] == []  # the units declaration does the work
    assert f"freed by unit:{VLLM_UNIT}" in gpus["message"]
    assert "GPU 0: 72289MiB / 97887MiB" in gpus["message"]

    code, report, err = gs.cli_json(tmp_path, fake_lib, config, "apply", str(state), runner=nsystemd)
    assert code == 0, (report, err)
    unit = next(r for r in report["resources"] if r["id"] == f"unit:{VLLM_UNIT}")
    assert [(a["action"], a["result"]) for a in unit["actions"]] == [("disable", "done"), ("stop", "done")]
    gpus = gs.gpus_of(report)
    assert gpus["status"] == "ok" and gpus["actions"] == []
    assert gpus["summary"].count("0MiB / 97887MiB") == 8
    assert nsystemd.show(VLLM_UNIT, "ActiveState") == "inactive"
    assert nsystemd.systemctl("is-enabled", VLLM_UNIT).stdout.strip() == "disabled"
    assert [g["used_mib"] for g in ns_probe(nsystemd, fake_lib, config)] == [0] * 8


def test_undeclared_unit_stopped_and_allowed_unit_kept(nsystemd, tmp_path, fake_lib):
    tag_vllm, tag_extract = gs.new_tag(), gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), holders=[
        gs.FakeHolder(mib=SEED_HOLD_MIB, gpus=[0, 1], cmdline=tag_vllm),
        gs.FakeHolder(mib=18000, gpus=[0, 1], cmdline=tag_extract),
    ]).write(tmp_path / "nvml.conf")
    nsystemd.write_unit(VLLM_UNIT, holder_unit(tag_vllm, "vllm"))
    nsystemd.write_unit(EXTRACT_UNIT, holder_unit(tag_extract, "python3"))
    for unit in (VLLM_UNIT, EXTRACT_UNIT):
        nsystemd.systemctl("start", unit, check=True)
        nsystemd.wait_active(unit)
    state = write_state(tmp_path, f"""
        gpus:
          count: 2
          max_memory_used: 0MiB
          allow: [unit:{EXTRACT_UNIT}]
          free_with: {{stop_units: true, kill: ["python*"]}}
          settle: 10s
        """)
    plan = gpus_report(ns_cli(nsystemd, tmp_path, fake_lib, config, "diff", str(state), "--format", "json"))
    assert [(a["action"], a["target"]) for a in plan["actions"]] == [("stop", VLLM_UNIT)]
    assert plan["actions"][0]["description"].startswith(f"stop unit {VLLM_UNIT} (")

    code, report, err = gs.cli_json(tmp_path, fake_lib, config, "apply", str(state), runner=nsystemd)
    assert code == 0, (report, err)
    gpus = gs.gpus_of(report)
    assert gpus["status"] == "ok"
    assert [a["result"] for a in gpus["actions"]] == ["done"]
    assert nsystemd.show(VLLM_UNIT, "ActiveState") == "inactive"
    assert nsystemd.show(EXTRACT_UNIT, "ActiveState") == "active"  # allowed: not touched, not counted
    assert [g["used_mib"] for g in ns_probe(nsystemd, fake_lib, config)] == [18000, 18000]
