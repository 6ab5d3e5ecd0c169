"""Slurm reboots: `gpus.recover: {reboot: true, reboot_with: slurm}` reboots a node run by Slurm
through Slurm's own queue (`scontrol reboot ASAP nextstate=DOWN reason=… NODE`), never `systemctl
reboot`. The authority is a real slurmctld + slurmd + munge (slurm_support) whose slurm.conf
RebootProgram only records that slurmd ran it; the GPU driver is the fake NVML (test_gpus_recovery's
Rig, whose `systemctl` first on PATH refuses `reboot` and records being asked). Nothing is rebooted."""

from __future__ import annotations

import subprocess
import time

import pytest
from slurm_support import SlurmCluster, missing_prerequisites
from test_gpus_recovery import Rig, gpus, state

pytestmark = pytest.mark.skipif(missing_prerequisites() is not None, reason=str(missing_prerequisites()))

SLURM_RECOVER = "{reboot: true, reboot_with: slurm, max_reboots: 2, window: 24h}"


def flags(st: str) -> set[str]:
    return set(st.replace("*", "").split("+"))


def test_a_lost_gpu_under_slurm_is_rebooted_through_scontrol_once(tmp_path, fake_lib):
    asked = tmp_path / "reboot-program-ran"
    program = tmp_path / "reboot-program"
    program.write_text(f"#!/bin/sh\necho \"ran $$ args=[$*]\" >> {asked}\n")
    program.chmod(0o755)
    rig = Rig(tmp_path, fake_lib, gpus(error="lost", error_on=("all",)))
    with SlurmCluster(node="rnode1", extra=f"RebootProgram={program}\nResumeTimeout=600") as cluster:
        env = {"SLURM_CONF": str(cluster.conf), "SLURMD_NODENAME": cluster.node}
        code, report = rig.run("apply", state(recover=SLURM_RECOVER), **env)
        done = [(a["action"], a["target"], a["result"]) for a in report["actions"]]
        assert ("reboot", "node", "done") in done, report
        assert not rig.reboot_asked.exists(), "systemctl reboot was called"

        # What Slurm now says about the node: marked for a reboot (requested, or already issued to
        # slurmd), drained meanwhile (ASAP), with reconcile's reason.
        line = cluster.node_line()
        st = cluster.state()
        assert flags(st) & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}, line
        assert "DRAIN" in flags(st) or "REBOOT_ISSUED" in flags(st), line
        assert cluster.reason().startswith("reconcile: gpus: GPU 1"), line
        assert "NextState=DOWN" in line or "REBOOT_ISSUED" in flags(st), line

        # The node is idle, so slurmctld hands the reboot to slurmd, which runs RebootProgram
        # (bounded wait; slurmctld checks its reboot queue on its own timer).
        deadline = time.monotonic() + 150
        while not asked.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert asked.exists(), f"RebootProgram did not run within 150s; state {cluster.state()}\n{cluster.log_tail()}"
        assert len(asked.read_text().splitlines()) == 1

        # A second apply in the same boot (the node still up: the reboot did not happen, the
        # stand-in only recorded it) does not ask Slurm again: the reboot is pending.
        code2, report2 = rig.run("apply", state(recover=SLURM_RECOVER), **env)
        assert code2 != 0 and report2["status"] == "blocked", report2
        assert "waiting for the reboot requested" in report2["message"], report2["message"]
        assert not [a for a in report2["actions"] if a["action"] == "reboot"], report2["actions"]
        intents = [e for e in rig.lines() if e.get("event") == "intent" and e.get("action") == "reboot"]
        assert len(intents) == 1, intents
        assert len(asked.read_text().splitlines()) == 1
        assert not rig.reboot_asked.exists()


def test_the_cap_counts_slurm_reboots_across_boots(tmp_path, fake_lib):
    """max_reboots 1: in the next boot (a new boot id, the GPU still lost), Slurm is not asked again.
    `scontrol` first on PATH records each call, then runs the real one."""
    rig = Rig(tmp_path, fake_lib, gpus(error="lost", error_on=("all",)))
    recorder = tmp_path / "recorder"
    recorder.mkdir()
    calls = tmp_path / "scontrol-calls"
    (recorder / "scontrol").write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\nexec /usr/bin/scontrol \"$@\"\n")
    (recorder / "scontrol").chmod(0o755)
    recover = "{reboot: true, reboot_with: slurm, max_reboots: 1}"
    with SlurmCluster(node="rnode1", extra=f"RebootProgram={tmp_path / 'absent-program'}") as cluster:
        env = {"SLURM_CONF": str(cluster.conf), "SLURMD_NODENAME": cluster.node, "PATH": f"{recorder}:{rig.path}"}
        rig.run("apply", state(recover=recover), **env)
        assert flags(cluster.state()) & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}, cluster.node_line()
        reboots = [c for c in calls.read_text().splitlines() if c.startswith("reboot ")]
        assert len(reboots) == 1 and reboots[0].startswith("reboot ASAP nextstate=DOWN reason=reconcile: ")
        assert reboots[0].endswith(f" {cluster.node}")
        rig.new_boot()
        code, report = rig.run("apply", state(recover=recover), **env)
        assert report["status"] == "blocked" and "max_reboots 1" in report["message"], report
        assert not [a for a in report["actions"] if a["action"] == "reboot"]
        assert [c for c in calls.read_text().splitlines() if c.startswith("reboot ")] == reboots
        assert not rig.reboot_asked.exists()


def test_slurm_health_leaves_a_node_slurm_is_rebooting_and_its_reason_alone(tmp_path, fake_lib):
    """A node waiting for its `scontrol reboot ASAP` (drained meanwhile, with the reboot's reason),
    then with the reboot handed to slurmd: `reconcile slurm-health` neither drains it again with its
    own reason (an unhealthy verdict) nor resumes it (a healthy one). Slurm's own answers decide."""
    from cli_support import cli_env, reconcile_argv
    from gpu_support import nvml_env
    from test_slurm import GPU_STATE, runs, write_gpus

    asked = tmp_path / "reboot-program-ran"
    program = tmp_path / "reboot-program"
    program.write_text(f"#!/bin/sh\necho ran >> {asked}\n")
    program.chmod(0o755)
    config, body, journal = tmp_path / "gpus.conf", tmp_path / "state.yaml", tmp_path / "journal.jsonl"
    body.write_text(GPU_STATE)
    reboot_reason = "reconcile: gpus: GPU 1 GPU-0001: Xid 79, fallen off the bus"
    with SlurmCluster(node="rnode1", extra=f"RebootProgram={program}\nResumeTimeout=600") as cluster:
        def health() -> dict:
            env = cli_env(tmp_path, SLURM_CONF=str(cluster.conf), **nvml_env(fake_lib, config))
            proc = subprocess.run(reconcile_argv("slurm-health", str(body), "--node", cluster.node, "--journal",
                                                 str(journal)), capture_output=True, text=True, env=env,
                                  timeout=60, cwd=tmp_path)
            assert "Traceback" not in proc.stderr, proc.stderr
            return runs(journal)[-1]

        cluster.scontrol("reboot", "ASAP", "nextstate=DOWN", f"reason={reboot_reason}", cluster.node)
        for bad_gpu in (1, None):  # unhealthy (a drain would re-word the reason), then healthy (a resume)
            write_gpus(config, bad_gpu=bad_gpu)
            before = cluster.state()
            line = health()
            assert flags(before) & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}, cluster.node_line()
            assert line["action"] == "none" and "Slurm is rebooting it" in line["why"], line
            # Slurm's reason, as Slurm keeps it (slurmctld adds " : reboot issued" once it hands the reboot
            # to slurmd), never reconcile's verdict in its place.
            assert reboot_reason in cluster.reason() and "must not run jobs" not in cluster.reason()
            assert flags(cluster.state()) & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}, cluster.node_line()
        # Handed to slurmd (RebootProgram ran; the node is not really rebooted): still left alone.
        deadline = time.monotonic() + 150
        while not asked.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert asked.exists(), f"RebootProgram did not run within 150s; state {cluster.state()}\n{cluster.log_tail()}"
        write_gpus(config, bad_gpu=1)
        before = cluster.state()
        line = health()
        if flags(before) & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}:
            assert line["action"] == "none" and "Slurm is rebooting it" in line["why"], (before, line)
            assert reboot_reason in cluster.reason() and "must not run jobs" not in cluster.reason()
