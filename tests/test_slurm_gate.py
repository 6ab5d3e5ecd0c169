"""`reconcile slurm-health` and the validation gate: a node reconcile drained for a GPU
fault is resumed only once `gpus.validate` has passed in this boot, against a real Slurm (tests/
slurm_support.py: Slurm's own state, read with scontrol, is the answer). The GPUs are the fake NVML's;
the gate is a real command run by a real `reconcile apply`, and its record is the one it writes."""

from __future__ import annotations

import subprocess
import uuid

import pytest
from cli_support import cli_env, reconcile_argv
from gpu_support import nvml_env
from slurm_support import SlurmCluster, running_cluster
from test_slurm import runs, write_gpus

STATE = """version: 1
gpus:
  count: 2
  healthy: true
  observe_timeout: 20s
  validate: {command: [sh, -c, 'echo gate ran; test -e %s'], timeout: 30s, after: [boot]}
"""


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster()


def test_the_sink_reads_the_gate_field_the_gpus_kind_writes():
    from reconcile_host.doors.sinks import slurm_node
    from reconcile_host.reconcilers.gpus import gate

    assert slurm_node.GATE_FIELD == gate.FIELD


def drained(cluster: SlurmCluster) -> bool:
    return "DRAIN" in cluster.state().upper()


def test_a_drained_node_is_resumed_only_once_the_gate_passed_in_this_boot(tmp_path, cluster, fake_lib):
    config, state, journal = tmp_path / "gpus.conf", tmp_path / "state.yaml", tmp_path / "journal.jsonl"
    passes = tmp_path / "gate-passes"  # the gate's command passes while this file exists
    boot_file = tmp_path / "boot_id"
    boot_file.write_text(f"{uuid.uuid4()}\n")
    state.write_text(STATE % passes)
    env = cli_env(tmp_path, SLURM_CONF=str(cluster.conf), RECONCILE_BOOT_ID_FILE=str(boot_file),
                  **nvml_env(fake_lib, config))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(reconcile_argv(*args), capture_output=True, text=True, env=env, timeout=90,
                              cwd=tmp_path)

    def health() -> dict:
        proc = cli("slurm-health", str(state), "--node", cluster.node, "--journal", str(journal))
        assert "Traceback" not in proc.stderr, proc.stderr
        return runs(journal)[-1]

    try:
        # A GPU fault: drained by reconcile.
        write_gpus(config, bad_gpu=1)
        line = health()
        assert line["action"] == "drain" and drained(cluster) and cluster.reason().startswith("reconcile: gpus: ")

        # The GPU reads healthy again, but the gate has not run in this boot: still drained.
        write_gpus(config)
        line = health()
        assert line["verdict"] == "healthy" and line["action"] == "none"
        assert "the validation gate has not passed in this boot (not run after this boot)" in line["why"]
        assert drained(cluster) and cluster.reason().startswith("reconcile: gpus: ")

        # The gate runs (a real apply) and fails: blocked with its tail, the node stays drained.
        proc = cli("apply", str(state), "--journal", str(journal), "--format", "json")
        assert proc.returncode != 0 and "gate ran" in proc.stdout
        line = health()
        assert line["verdict"] == "unhealthy" and drained(cluster)
        assert cluster.reason().startswith("reconcile: gpus: the validation gate ")

        # The gate passes (after a person's ack, it runs again): resumed, by Slurm's own account.
        passes.touch()
        assert cli("ack", "--journal", str(journal), "--reason", "gate fixed", "--by", "test").returncode == 0
        proc = cli("apply", str(state), "--journal", str(journal), "--format", "json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        line = health()
        assert line["action"] == "resume" and not drained(cluster)

        # A new boot: the gate's record is another boot's; the node is not drained for that alone.
        boot_file.write_text(f"{uuid.uuid4()}\n")
        line = health()
        assert line["action"] == "none" and not drained(cluster)
    finally:
        cluster.scontrol("update", f"nodename={cluster.node}", "state=resume", check=False)
