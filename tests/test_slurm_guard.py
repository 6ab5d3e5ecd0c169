"""The fleet guard of `reconcile slurm-health` (`--max-drained`): against a real Slurm of five
configured nodes in two partitions (tests/slurm_support.py: one slurmd, the others at its
address, their states set with `scontrol update` as an administrator would), a node the fake
GPU driver makes unhealthy is drained below the limit and left in service at it, and says so in
the stdout line, the journal line and the textfile. How many nodes are out of service comes from
Slurm's own `sinfo` (the code reads `scontrol`), what the GPUs are from the fake NVML; the alert
rule is unit-tested with the real promtool on series named as a real run wrote them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv
from gpu_support import nvml_env
from promtool_support import needs_promtool, promtool, rule_tests_with
from reconcile_host.doors import slurm
from slurm_support import running_cluster
from test_slurm import GPU_STATE, runs, write_gpus

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "contrib" / "prometheus" / "reconcile-slurm.rules.yml"
RULES_TEST = ROOT / "contrib" / "prometheus" / "reconcile-slurm.rules.test.yml"

NODE = "rnode1"  # the one with slurmd, under test
OTHERS = ("rnode2", "rnode3", "rnode4", "rnode5")
PARTITIONS = {"batch": [NODE, *OTHERS], "gpu": [NODE, "rnode2"]}

# sinfo(1)'s own words for a node that takes no new work ("NODE STATE CODES"), and the suffixes
# `*` (not responding) and `^` (reboot issued).
SINFO_OUT = {"drained", "draining", "down", "fail", "failing", "inval", "reboot_issued"}


@pytest.fixture(scope="module")
def fleet():
    yield from running_cluster(node=NODE, others=OTHERS, partitions=PARTITIONS)


@pytest.fixture
def cluster(fleet):
    yield fleet
    for name in (NODE, *OTHERS):  # every node back in service for the next test
        fleet.scontrol("update", f"nodename={name}", "state=resume", check=False)
    for name in (NODE, *OTHERS):
        fleet.wait_for(lambda st: st == "IDLE", f"{name} back to IDLE", node=name)


@pytest.fixture
def gpus(tmp_path, fake_lib):
    """The fake driver (GPU 1 with uncorrected ECC errors: the node must not run jobs) and a state."""
    config, state = tmp_path / "gpus.conf", tmp_path / "state.yaml"
    write_gpus(config, bad_gpu=1)
    state.write_text(GPU_STATE)
    return fake_lib, config, state


def take_out(cluster, node: str, how: str, reason: str) -> None:
    """What an administrator does: `scontrol update nodename=NODE state=drain|down|fail reason=...`."""
    cluster.scontrol("update", f"nodename={node}", f"state={how}", f"reason={reason}")
    cluster.wait_for(lambda st: st != "IDLE", f"{node} out of service", node=node)


def sinfo_counts(cluster, partition: str) -> tuple[int, int]:
    """(nodes, others out of service) of a partition, as sinfo lists them."""
    out = subprocess.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N %T"], capture_output=True, text=True,
                         env=cluster.env, timeout=30, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    out_of_service = sum(1 for name, state in rows if name != NODE
                         and (state.rstrip("*^") in SINFO_OUT or state.endswith(("*", "^"))))
    return len(rows), out_of_service


def health(tmp_path, cluster, gpus, *args: str) -> subprocess.CompletedProcess:
    lib, config, state = gpus
    env = cli_env(tmp_path, SLURM_CONF=str(cluster.conf), **nvml_env(lib, config))
    return subprocess.run(reconcile_argv("slurm-health", str(state), "--node", NODE, "--journal",
                                         str(tmp_path / "journal.jsonl"), *args),
                          capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)


def textfile_samples(directory: Path) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families((directory / slurm.TEXTFILE_NAME).read_text()):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


# --- the guard against the real Slurm -------------------------------------------------------

def test_a_count_drains_below_the_limit_and_withholds_at_it_in_every_format(tmp_path, cluster, gpus):
    take_out(cluster, "rnode3", "drain", "admin: swapping a disk")
    take_out(cluster, "rnode4", "down", "admin: PSU")
    nodes, out = sinfo_counts(cluster, "batch")
    assert (nodes, out) == (5, 2)

    # At the limit (as many out as --max-drained): not drained, and said so everywhere.
    textdir = tmp_path / "prom"
    textdir.mkdir()
    proc = health(tmp_path, cluster, gpus, "--max-drained", str(out), "--textfile", str(textdir))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == ""
    assert "DRAIN" not in cluster.state() and cluster.reason() == ""
    (line,) = runs(tmp_path / "journal.jsonl")
    assert line["verdict"] == "unhealthy" and line["action"] == "withheld", line
    assert line["reason"].startswith("reconcile: gpus: GPU 1 ")  # what the drain would have said
    assert line["why"] == (f"would drain, but {out} of {nodes} in partition batch are already drained or down "
                           f"(--max-drained {out}: {out} in batch): left in service")
    assert line["max_drained"] == str(out)
    counted = {p["partition"]: (p["nodes"], p["out_of_service"]) for p in line["partitions"]}
    assert counted == {part: sinfo_counts(cluster, part) for part in PARTITIONS}
    assert proc.stdout == (f"reconcile slurm-health: node {NODE}: verdict=unhealthy action=withheld: "
                           f"{line['why']}; the drain would say: {line['reason']}\n")
    metrics = textfile_samples(textdir)
    assert metrics[("reconcile_slurm_health_drain_withheld", frozenset({("node", NODE)}))] == 1
    for part, (n, o) in counted.items():
        labels = frozenset({("node", NODE), ("partition", part)})
        assert metrics[("reconcile_slurm_health_partition_nodes", labels)] == n
        assert metrics[("reconcile_slurm_health_partition_out_of_service_nodes", labels)] == o

    # One below the limit: drained as before, and the textfile says nothing is withheld.
    proc = health(tmp_path, cluster, gpus, "--max-drained", str(out + 1), "--textfile", str(textdir))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cluster.wait_for(lambda st: "DRAIN" in st, "the drain")
    assert cluster.reason() == runs(tmp_path / "journal.jsonl")[-1]["reason"]
    assert runs(tmp_path / "journal.jsonl")[-1]["action"] == "drain"
    assert textfile_samples(textdir)[("reconcile_slurm_health_drain_withheld", frozenset({("node", NODE)}))] == 0
    # The others are as the administrator left them.
    assert cluster.reason("rnode3") == "admin: swapping a disk" and cluster.reason("rnode4") == "admin: PSU"


def test_a_share_trips_when_reached_and_not_below(tmp_path, cluster, gpus):
    take_out(cluster, "rnode3", "drain", "admin: a")
    take_out(cluster, "rnode4", "fail", "admin: b")
    nodes, out = sinfo_counts(cluster, "batch")
    share = 100 * out // nodes  # 2 of 5: 40 %, reached
    proc = health(tmp_path, cluster, gpus, "--max-drained", f"{share}%")
    assert proc.returncode == 1
    assert runs(tmp_path / "journal.jsonl")[-1]["action"] == "withheld"
    assert "DRAIN" not in cluster.state()
    proc = health(tmp_path, cluster, gpus, "--max-drained", f"{share + 10}%")  # 50 % of 5: 3 nodes
    assert proc.returncode == 1
    cluster.wait_for(lambda st: "DRAIN" in st, "the drain")
    assert runs(tmp_path / "journal.jsonl")[-1]["action"] == "drain"


def test_the_strictest_partition_decides(tmp_path, cluster, gpus):
    """rnode2 failing: 1 of 5 in batch is far from half, 1 of 2 in gpu is half: withheld, naming gpu."""
    take_out(cluster, "rnode2", "fail", "admin: fan")
    assert sinfo_counts(cluster, "batch") == (5, 1) and sinfo_counts(cluster, "gpu") == (2, 1)
    proc = health(tmp_path, cluster, gpus)  # the default, 50 %
    assert proc.returncode == 1
    line = runs(tmp_path / "journal.jsonl")[-1]
    assert line["action"] == "withheld" and line["max_drained"] == slurm.DEFAULT_MAX_DRAINED
    assert "1 of 2 in partition gpu" in line["why"] and "batch" not in line["why"], line["why"]
    assert "DRAIN" not in cluster.state()


def test_the_guard_leaves_ownership_as_it_was(tmp_path, cluster, gpus):
    config = gpus[1]
    # The node drained by reconcile, then others go out to the limit: fixed, it is still resumed.
    proc = health(tmp_path, cluster, gpus, "--max-drained", "2")
    assert proc.returncode == 1
    cluster.wait_for(lambda st: "DRAIN" in st, "the drain")
    take_out(cluster, "rnode3", "drain", "admin: a")
    take_out(cluster, "rnode4", "down", "admin: b")
    # Still bad, for a new reason: reconcile's own drain is re-worded (not a new drain, not withheld).
    write_gpus(config, bad_gpu=0)
    proc = health(tmp_path, cluster, gpus, "--max-drained", "2")
    assert runs(tmp_path / "journal.jsonl")[-1]["action"] == "drain"
    assert cluster.reason().startswith("reconcile: gpus: GPU 0 ")
    write_gpus(config)
    proc = health(tmp_path, cluster, gpus, "--max-drained", "2")
    assert proc.returncode == 0, proc.stdout
    cluster.wait_for(lambda st: "DRAIN" not in st, "the resume")
    assert runs(tmp_path / "journal.jsonl")[-1]["action"] == "resume"

    # Drained by someone else, at the limit and unhealthy: left alone, not "withheld", reason kept.
    take_out(cluster, NODE, "drain", "admin: reseating GPUs")
    write_gpus(config, bad_gpu=1)
    proc = health(tmp_path, cluster, gpus, "--max-drained", "2")
    last = runs(tmp_path / "journal.jsonl")[-1]
    assert last["action"] == "none" and "left alone" in last["why"] and "partitions" not in last
    assert cluster.reason() == "admin: reseating GPUs"
    # Neither a guard nor a healthy run ever resumes it, nor the others.
    write_gpus(config)
    health(tmp_path, cluster, gpus, "--max-drained", "2")
    assert "DRAIN" in cluster.state() and cluster.reason() == "admin: reseating GPUs"
    assert cluster.reason("rnode3") == "admin: a" and "DRAIN" in cluster.state("rnode3")


def test_rule_series_are_those_a_real_withheld_run_writes(tmp_path, cluster, gpus):
    take_out(cluster, "rnode2", "drain", "admin: x")
    textdir = tmp_path / "prom"
    textdir.mkdir()
    health(tmp_path, cluster, gpus, "--max-drained", "1", "--textfile", str(textdir))
    written = textfile_samples(textdir)
    labels_of: dict[str, set[str]] = {}
    for name, labels in written:
        labels_of.setdefault(name, set()).update(k for k, _ in labels)
    used = set(re.findall(r"\breconcile_[a-z_]+", RULES.read_text()))
    assert used and used <= set(labels_of), used - set(labels_of)
    for name, body in re.findall(r"series: '(reconcile_[a-z_]+)\{([^}]*)\}'", RULES_TEST.read_text()):
        keys = {kv.split("=")[0] for kv in body.split(",")} - {"instance", "job"}  # added by the scrape
        assert keys == labels_of[name], (name, keys, labels_of[name])


# --- the command line -----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["10 %", "-1", "101%", "ten", "1.5", "%", ""])
def test_a_bad_max_drained_is_one_line_and_exit_1(tmp_path, value):
    proc = subprocess.run(reconcile_argv("slurm-health", "x.yaml", "--max-drained", value), capture_output=True,
                          text=True, env=cli_env(tmp_path), timeout=30)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (f"reconcile: error: --max-drained: invalid value {value!r}: a count of nodes (e.g. 3) "
                           "or a share of the partition from 0% to 100% (e.g. 10%)\n")


def test_a_textfile_directory_that_is_not_there_is_one_line(tmp_path):
    proc = subprocess.run(reconcile_argv("slurm-health", "x.yaml", "--textfile", str(tmp_path / "nope")),
                          capture_output=True, text=True, env=cli_env(tmp_path), timeout=30)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith(f"reconcile: error: --textfile {tmp_path / 'nope'}: no such directory")


# --- the rule, without Slurm ---------------------------------------------------------------

@pytest.mark.parametrize("text, nodes, limit", [
    ("0", 10, 0), ("3", 10, 3), ("3", 2, 3),
    ("10%", 4, 1), ("10%", 10, 1), ("10%", 11, 2), ("50%", 5, 3), ("40%", 5, 2), ("0%", 8, 0), ("100%", 7, 7),
    ("12.5%", 8, 1), ("33.3%", 3, 1),
])
def test_the_limit_is_the_count_or_the_share_rounded_up(text, nodes, limit):
    assert slurm.parse_max_drained(text).limit(nodes) == limit


def line(name: str, state: str, partitions: str, reason: str = "") -> str:
    """A line shaped as the real `scontrol show node -o` above printed it."""
    parts = f" Partitions={partitions}" if partitions else ""
    tail = f" Reason={reason} [root@2026-12-01T10:30:59]" if reason else ""
    return f"NodeName={name} Arch=x86_64 CoresPerSocket=1 State={state} ThreadsPerCore=1{parts} BootTime=None{tail}"


def test_which_states_count_as_out_of_service():
    counted = ["IDLE+DRAIN", "MIXED+DRAIN", "DOWN", "DOWN+NOT_RESPONDING", "IDLE+FAIL", "ALLOCATED+FAIL",
               "IDLE+NOT_RESPONDING", "IDLE+REBOOT_ISSUED", "DOWN+DRAIN+INVALID_REG", "DOWN*"]
    not_counted = ["IDLE", "MIXED", "ALLOCATED", "UNKNOWN", "IDLE+REBOOT_REQUESTED", "IDLE+CLOUD+POWERED_DOWN",
                   "IDLE+POWERING_UP", "IDLE+MAINTENANCE+RESERVED", "MIXED+COMPLETING", "IDLE+PLANNED"]
    for state in counted:
        assert slurm.NodeState("n", state).takes_no_jobs, state
    for state in not_counted:
        assert not slurm.NodeState("n", state).takes_no_jobs, state


def test_partitions_are_read_from_the_fields_not_from_a_reason():
    node = slurm.parse_node("n1", line("n1", "IDLE", "", reason="moved Partitions=gpu State=DOWN"))
    assert node.partitions == () and node.state == "IDLE"
    nodes = slurm.parse_nodes("\n".join([line("n1", "IDLE", "batch,gpu"), line("n2", "IDLE+DRAIN", "batch", "x")]))
    assert [(n.name, n.partitions) for n in nodes] == [("n1", ("batch", "gpu")), ("n2", ("batch",))]


def test_the_guard_decides_on_the_strictest_partition_and_never_on_anything_but_a_drain():
    fleet = slurm.parse_nodes("\n".join([
        line("n1", "IDLE", "batch,gpu"), line("n2", "IDLE+DRAIN", "batch,gpu", "admin: x"),
        line("n3", "IDLE", "batch"), line("n4", "DOWN+NOT_RESPONDING", "batch", "Not responding"),
        line("n5", "IDLE", "batch"), line("n6", "IDLE", "other")]))
    me = fleet[0]
    half = slurm.parse_max_drained("50%")
    counts = slurm.count_partitions(me, fleet, half)
    assert [c.fields() for c in counts] == [
        {"partition": "batch", "nodes": 5, "out_of_service": 2, "limit": 3},
        {"partition": "gpu", "nodes": 2, "out_of_service": 1, "limit": 1}]
    drain = slurm.Decision("drain", "reconcile: gpus: bad")
    withheld = slurm.fleet_guard(drain, counts, half)
    assert withheld == slurm.Decision("withheld", "would drain, but 1 of 2 in partition gpu are already drained "
                                                  "or down (--max-drained 50%: 1 in gpu): left in service")
    assert slurm.fleet_guard(drain, slurm.count_partitions(me, fleet, slurm.parse_max_drained("3")),
                             slurm.parse_max_drained("3")) == drain
    for other in (slurm.Decision("resume", "converged"), slurm.Decision("none", "left alone")):
        assert slurm.fleet_guard(other, counts, half) == other
    # A node in no partition takes no jobs: nothing to keep up, the drain stands.
    assert slurm.fleet_guard(drain, [], half) == drain


def test_partitions_that_cannot_be_read_withhold_the_drain():
    """Unknown is never ok: a drain decided blind is how a fleet gets drained (NVSentinel halts
    quarantining when its breaker cannot count nodes; medik8s remediates nothing on an error)."""
    decision = slurm.fleet_guard(slurm.Decision("drain", "reconcile: gpus: bad"), None,
                                 slurm.parse_max_drained("10%"), "`scontrol --all show` failed: timeout")
    assert decision.action == "withheld"
    assert decision.why == ("would drain, but how many nodes of its partitions are out of service cannot be read "
                            "from Slurm (`scontrol --all show` failed: timeout): left in service")


# --- the alert ------------------------------------------------------------------------------

@needs_promtool
def test_the_rule_is_valid_and_its_unit_tests_pass():
    check = promtool("check", "rules", str(RULES), timeout=30)
    assert check.returncode == 0 and "SUCCESS: 1 rules found" in check.stdout, check.stdout + check.stderr
    test = promtool("test", "rules", str(RULES_TEST))
    assert test.returncode == 0, test.stdout + test.stderr


@needs_promtool
@pytest.mark.parametrize("old, new", [("drain_withheld == 1", "drain_withheld == 0"),
                                      ("drain_withheld == 1\n", "drain_withheld == 1\n        for: 5m\n")])
def test_the_rule_tests_catch_a_broken_rule(tmp_path, old, new):
    test = rule_tests_with(RULES, RULES_TEST, old, new, tmp_path)
    assert test.returncode == 1 and "ReconcileSlurmDrainWithheld" in test.stdout + test.stderr
