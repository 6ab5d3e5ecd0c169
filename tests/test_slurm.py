"""`reconcile slurm-health` against a real Slurm (Debian's slurmctld, slurmd and munge, started
here: tests/slurm_support.py). What the node's state is comes from Slurm itself (scontrol,
sinfo); what the GPUs are comes from the fake NVML, read back through the real pynvml.

The first test lets slurmd run the health check as its HealthCheckProgram (through
contrib/slurm/reconcile-health-check, in slurmd's empty environment); the others run the
command themselves against a cluster without one, so no periodic run interferes."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv, wait_for
from gpu_support import FakeConfig, nvml_env, seed_gpus
from reconcile_host.core.contract import utc_iso
from reconcile_host.doors import slurm
from slurm_support import SlurmCluster, missing_prerequisites, running_cluster

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = ROOT / "contrib" / "slurm" / "reconcile-health-check"

needs_slurm = pytest.mark.skipif(bool(missing_prerequisites()), reason=f"real Slurm unavailable: "
                                                                     f"{missing_prerequisites()}")

GPU_STATE = "version: 1\ngpus:\n  count: 2\n  healthy: true\n  observe_timeout: 20s\n"


def write_gpus(path: Path, bad_gpu: int | None = None, hang_init_s: int = 0) -> None:
    """The fake driver's configuration, replaced whole (a reader never sees half of it)."""
    gpus = seed_gpus(2)
    if bad_gpu is not None:
        gpus[bad_gpu].ecc_volatile = 2
    FakeConfig(gpus=gpus, hang_init_s=hang_init_s).write(path, whole=True)


def bus_id(lib: Path, config: Path, index: int) -> str:
    """GPU `index`'s PCI bus id as the driver (the fake, through the real pynvml) reports it."""
    probe = (f"import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex({index}); "
             "b = pynvml.nvmlDeviceGetPciInfo(h).busId; print(b.decode() if isinstance(b, bytes) else b)")
    env = {**os.environ, **nvml_env(lib, config)}
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True,
                          timeout=30).stdout.strip()


def runs(journal: Path) -> list[dict]:
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]


# --- slurmd runs it ----------------------------------------------------------------------

@needs_slurm
def test_slurmd_health_check_drains_resumes_and_leaves_a_manual_drain_alone(tmp_path, fake_lib):
    config, state, journal = tmp_path / "gpus.conf", tmp_path / "state.yaml", tmp_path / "journal.jsonl"
    write_gpus(config)
    state.write_text(GPU_STATE)
    defaults = tmp_path / "defaults"
    hc = tmp_path / "hc"
    hc.write_text(f"#!/bin/sh\nRECONCILE_HEALTH_DEFAULTS={defaults} exec /bin/sh {WRAPPER}\n")
    hc.chmod(0o755)
    cluster = SlurmCluster(health_check=str(hc), interval=2)
    # The settings file of contrib/slurm/reconcile-health-check; slurmd gives the program no
    # SLURM_CONF, and the fake driver is found through LD_LIBRARY_PATH.
    defaults.write_text(
        f'RECONCILE="{sys.executable} -m reconcile_host"\n'
        f"RECONCILE_STATE={state}\n"
        f'RECONCILE_HEALTH_ARGS="--deadline 20s --journal {journal}"\n'
        f"export SLURM_CONF={cluster.conf} LD_LIBRARY_PATH={fake_lib} FAKE_NVML_CONFIG={config} "
        f"RECONCILE_KERNEL_LOG={nvml_env(fake_lib, config)['RECONCILE_KERNEL_LOG']} "
        f"RECONCILE_SYSFS_PCI={nvml_env(fake_lib, config)['RECONCILE_SYSFS_PCI']} "
        f"RECONCILE_CACHE_DIR={tmp_path / 'cache'} RECONCILE_STATE_DIR={tmp_path / 'state-dir'}\n")

    def after_more_runs(n: int) -> list[dict]:
        """Wait until `n` runs that started from now on have written their line; return those lines.
        (A run already under way when something changes writes its line later, with what it saw
        before: its `time` is its start, so it is left out.)"""
        since = utc_iso(millis=True)

        def started_since() -> list[dict]:
            return [r for r in runs(journal) if r["time"] >= since]

        wait_for(lambda: len(started_since()) >= n, timeout=60, what=f"{n} more health-check runs")
        return started_since()

    with cluster:
        # Healthy: runs happen, the node takes jobs.
        first = after_more_runs(1)[-1]
        assert first["event"] == "slurm-health" and first["node"] == cluster.node, first
        assert first["verdict"] == "healthy" and first["action"] == "none", first
        assert "DRAIN" not in cluster.state()

        # GPU 1 reports uncorrected ECC errors: the node is drained with the reason.
        write_gpus(config, bad_gpu=1)
        cluster.wait_for(lambda st: "DRAIN" in st, "the drain")
        reason = cluster.reason()
        # The gpus kind's own verdict: the GPU, the step a person takes, and why.
        assert reason.startswith(f"reconcile: gpus: GPU 1 ({bus_id(fake_lib, config, 1)}) must not run jobs: "
                                 "reset the GPU. Why: 2 volatile uncorrected ECC errors"), reason
        assert "\n" not in reason and len(reason) <= slurm.MAX_REASON
        drained = [r for r in runs(journal) if r.get("action") == "drain"]
        assert drained and drained[0]["reason"] == reason and drained[0]["problems"] == ["gpus"]

        # Fixed: reconcile resumes the node it drained (a resumed node shows NOT_RESPONDING
        # until the next ping: poll).
        write_gpus(config)
        cluster.wait_for(lambda st: "DRAIN" not in st and "NOT_RESPONDING" not in st, "the resume")
        assert cluster.reason() == ""
        assert any(r.get("action") == "resume" for r in runs(journal))

        # Someone else drains it: reconcile never resumes it, nor overwrites the reason, even
        # when it finds a problem of its own.
        cluster.scontrol("update", f"nodename={cluster.node}", "state=drain", "reason=admin: swapping a disk")
        seen = after_more_runs(2)
        assert all(r["action"] == "none" and "not resumed" in r["why"] for r in seen), seen
        write_gpus(config, bad_gpu=0)
        seen = after_more_runs(2)
        assert seen[-1]["verdict"] == "unhealthy" and "left alone" in seen[-1]["why"], seen
        assert "DRAIN" in cluster.state() and cluster.reason() == "admin: swapping a disk"

    # One line per run: every run is its own process, and each wrote exactly one line.
    lines = runs(journal)
    assert len({r["pid"] for r in lines}) == len(lines)
    assert all(r["event"] == "slurm-health" for r in lines)


# --- run by hand against a cluster without a HealthCheckProgram -----------------------------

@pytest.fixture(scope="module")
def plain_cluster():
    yield from running_cluster()


@pytest.fixture
def cluster(plain_cluster):
    yield plain_cluster
    plain_cluster.scontrol("update", f"nodename={plain_cluster.node}", "state=resume", check=False)
    plain_cluster.wait_for(lambda st: "DRAIN" not in st, "the reset")


def health(tmp_path, cluster, lib, config, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = cli_env(tmp_path, SLURM_CONF=str(cluster.conf), **nvml_env(lib, config))
    return subprocess.run(reconcile_argv("slurm-health", *args, "--node", cluster.node, "--journal",
                                         str(tmp_path / "journal.jsonl")),
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=tmp_path)


def test_a_hung_driver_drains_within_the_deadline_and_leaves_nothing_behind(tmp_path, cluster, fake_lib):
    config, state = tmp_path / "gpus.conf", tmp_path / "state.yaml"
    write_gpus(config, hang_init_s=40)  # nvmlInit blocks, as on a wedged driver
    state.write_text(GPU_STATE)  # its own observe_timeout (20s) is longer than the run may take
    proc = health(tmp_path, cluster, fake_lib, config, str(state), "--deadline", "3s", timeout=30)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == ""
    budget = slurm.check_budget(3.0)
    assert cluster.reason() == f"reconcile: health check did not finish within {budget:g}s"
    (line,) = runs(tmp_path / "journal.jsonl")
    assert line["verdict"] == "timeout" and line["action"] == "drain" and line["duration_s"] < 40
    assert proc.stdout.strip() == f"reconcile slurm-health: node {cluster.node}: verdict=timeout action=drain: " \
                                  f"{line['reason']}"
    # The observer stuck in nvmlInit was ours: killed, not left to hold the driver.
    def holders() -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if str(config).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
        return found
    wait_for(lambda: not holders(), timeout=10, what="the stuck observer to be gone")

    # The driver answers again: the next run resumes the node it drained.
    write_gpus(config)
    proc = health(tmp_path, cluster, fake_lib, config, str(state))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cluster.wait_for(lambda st: "DRAIN" not in st, "the resume")
    assert runs(tmp_path / "journal.jsonl")[-1]["action"] == "resume"


def test_a_run_that_finds_another_running_leaves_at_once(tmp_path, cluster, fake_lib):
    config, state = tmp_path / "gpus.conf", tmp_path / "state.yaml"
    write_gpus(config, bad_gpu=1)
    state.write_text(GPU_STATE)
    with open(tmp_path / "slurm-health.lock", "w") as held:  # what a running check holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = health(tmp_path, cluster, fake_lib, config, str(state))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = runs(tmp_path / "journal.jsonl")
    assert line["verdict"] == "skipped" and line["why"] == "another slurm-health run is in progress"
    assert "DRAIN" not in cluster.state()  # the bad GPU was not even looked at


def test_the_reason_is_one_line_names_the_first_problem_and_counts_the_rest(tmp_path, cluster, fake_lib):
    config, state = tmp_path / "gpus.conf", tmp_path / "state.yaml"
    write_gpus(config, bad_gpu=1)
    # Two bad resources: a unit that cannot be started here (blocked where systemd runs: not
    # found; error where it does not) and the GPU; the gpus message spans several lines.
    state.write_text("version: 1\nunits:\n  reconcile-test-absent.service:\n    active: true\n"
                     "gpus:\n  count: 3\n  healthy: true\n")
    proc = health(tmp_path, cluster, fake_lib, config, str(state))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reason = cluster.reason()
    assert reason.startswith("reconcile: unit:reconcile-test-absent.service: "), reason
    assert reason.endswith(" (+1 more: gpus)") and "\n" not in reason and len(reason) <= slurm.MAX_REASON
    (line,) = runs(tmp_path / "journal.jsonl")
    assert line["problems"] == ["unit:reconcile-test-absent.service", "gpus"]


def test_apply_mode_judges_after_applying_and_only_reads_while_another_apply_runs(tmp_path, cluster, fake_lib):
    config, state = tmp_path / "gpus.conf", tmp_path / "state.yaml"
    write_gpus(config)
    state.write_text(GPU_STATE)
    proc = health(tmp_path, cluster, fake_lib, config, str(state), "--apply")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert runs(tmp_path / "journal.jsonl")[-1]["command"] == "apply"
    with open(tmp_path / "lock", "w") as held:  # the apply lock beside the journal
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        write_gpus(config, bad_gpu=0)
        proc = health(tmp_path, cluster, fake_lib, config, str(state), "--apply")
    assert proc.returncode == 1
    last = runs(tmp_path / "journal.jsonl")[-1]
    assert last["note"].startswith("not applied: ") and last["action"] == "drain"
    assert cluster.reason().startswith("reconcile: gpus: GPU 0 ")


def test_old_spellings_are_said_in_the_runs_line_and_journaled(tmp_path, cluster, fake_lib):
    data = tmp_path / "hs"
    data.mkdir()
    state = tmp_path / "state.yaml"
    state.write_text(f"version: 1\nextractions:\n  hs:\n    dir: {data}\n    total: 10\n    verify: all\n")
    said = [line for line in subprocess.run(reconcile_argv("validate", str(state)), capture_output=True, text=True,
                                            env=cli_env(tmp_path), timeout=60).stderr.splitlines()
            if ": warning: " in line]
    assert said and said[0].startswith(f"{state}:6:13: warning: extractions.hs.verify: 'all'"), said
    proc = health(tmp_path, cluster, fake_lib, tmp_path / "no-gpus.conf", str(state))
    (line,) = runs(tmp_path / "journal.jsonl")
    assert line["warnings"] == said, line
    (printed,) = proc.stdout.splitlines()
    assert printed.startswith(f"reconcile slurm-health: node {cluster.node}: verdict={line['verdict']} ")
    assert printed.endswith("; " + "; ".join(said)), printed
    # The warning is the run's, not Slurm's: the reason (when drained) is the verdict's alone.
    assert "warning:" not in cluster.reason()


def test_a_state_file_that_does_not_validate_drains_with_its_position(tmp_path, cluster, fake_lib):
    state = tmp_path / "state.yaml"
    state.write_text("version: 1\ngpus:\n  count: two\n")
    proc = health(tmp_path, cluster, fake_lib, None, str(state))
    assert proc.returncode == 1
    assert cluster.reason().startswith(f"reconcile: state file: {state}:3:10: ")


def test_slurm_unreachable_is_one_line_and_exit_1(tmp_path, fake_lib):
    """No controller: scontrol fails; the run says so in one line, in the journal too."""
    state = tmp_path / "state.yaml"
    state.write_text("version: 1\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=none\nSlurmctldHost=localhost\nSlurmctldPort=1\nAuthType=auth/none\n"
                    "NodeName=rnode1 State=UNKNOWN\nPartitionName=p Nodes=rnode1\n")
    env = cli_env(tmp_path, SLURM_CONF=str(conf))
    proc = subprocess.run(reconcile_argv("slurm-health", str(state), "--node", "rnode1", "--deadline", "3s",
                                         "--journal", str(tmp_path / "j.jsonl")),
                          capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 1
    assert len(proc.stdout.splitlines()) == 1 and "action=failed" in proc.stdout, proc.stdout
    assert runs(tmp_path / "j.jsonl")[-1]["action"] == "failed"


# --- the decision, without Slurm -------------------------------------------------------

def doc(*statuses: str, message: str = "") -> dict:
    return {"resources": [{"id": f"unit:u{i}.service", "status": st, "message": message}
                          for i, st in enumerate(statuses)]}


@pytest.mark.parametrize("statuses, healthy", [
    ((), True), (("ok",), True), (("ok", "drift"), True), (("converging",), True),
    (("ok", "blocked"), False), (("error",), False), (("converging", "error"), False),
])
def test_only_blocked_and_error_make_a_node_unhealthy(statuses, healthy):
    assert slurm.verdict_of(doc(*statuses)).healthy is healthy


MINE = "reconcile: gpus: GPU 1 is unhealthy"


@pytest.mark.parametrize("healthy, state, reason, action", [
    (False, "IDLE", "", "drain"),
    (False, "MIXED", "", "drain"),
    (False, "IDLE+DRAIN", MINE, "none"),  # the same reason: nothing to say again
    (False, "IDLE+DRAIN", "reconcile: gpus: an older problem", "drain"),  # ours: the reason is brought up to date
    (False, "IDLE+DRAIN", "admin: swapping a disk", "none"),
    (False, "DOWN+NOT_RESPONDING", "Not responding", "none"),
    (False, "DOWN", "", "none"),
    (True, "IDLE", "", "none"),
    (True, "IDLE+DRAIN", MINE, "resume"),
    (True, "MIXED+DRAIN", MINE, "resume"),  # draining, jobs still running
    (True, "DOWN+DRAIN", MINE, "resume"),
    (True, "IDLE+DRAIN", "admin: swapping a disk", "none"),
    (True, "IDLE+DRAIN", "NHC: check_fs_mount: /scratch", "none"),
    # Slurm is rebooting it (scontrol reboot ASAP: drained meanwhile, with the reboot's reason): left alone.
    (False, "IDLE+DRAIN+REBOOT_REQUESTED", "reconcile: gpus: an older problem", "none"),
    (True, "IDLE+DRAIN+REBOOT_REQUESTED", MINE, "none"),
    (False, "IDLE+REBOOT_REQUESTED", "", "drain"),  # no ASAP: it takes jobs until the reboot
    (False, "DOWN+REBOOT_ISSUED", MINE + " (reboot)", "none"),
    (True, "DOWN+DRAIN+REBOOT_ISSUED", MINE, "none"),
])
def test_decision(healthy, state, reason, action):
    verdict = slurm.Verdict(healthy, "" if healthy else MINE)
    assert slurm.decide(verdict, slurm.NodeState("n1", state, reason)).action == action


def test_reason_is_one_line_and_bounded():
    long = "GPU 1 is unhealthy:\n" + "x" * 500 + "\r\n\tmore"
    r = slurm.verdict_of({"resources": [{"id": "gpus", "status": "blocked", "message": long},
                                        {"id": "mount:/data", "status": "error", "message": "gone"}]}).reason
    assert r == slurm.reason_text("gpus: GPU 1 is unhealthy:", " (+1 more: mount:/data)")
    r = slurm.reason_text("gpus: " + "y" * 500 + "\nsecond line", " (+2 more: a, b)")
    assert len(r) == slurm.MAX_REASON and "\n" not in r and r.endswith("... (+2 more: a, b)")


def test_parse_node_takes_the_reason_without_scontrols_stamp():
    line = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=debug "
            "Reason=reconcile: gpus: x [y] z [root@2026-12-01T10:30:59]")
    node = slurm.parse_node("n1", line)
    assert (node.state, node.reason, node.ours) == ("IDLE+DRAIN", "reconcile: gpus: x [y] z", True)
    assert slurm.parse_node("n1", "NodeName=n1 State=IDLE Partitions=debug").reason == ""


def test_deadline_of_60s_or_more_is_refused(tmp_path):
    proc = subprocess.run(reconcile_argv("slurm-health", "x.yaml", "--deadline", "60s"), capture_output=True,
                          text=True, env=cli_env(tmp_path), timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("reconcile: error: --deadline must be at least 1s and below 60s "
                                   "(slurmd kills a health check after 60 s)")
