"""Slurm's drain and resume (`reconcile slurm-health`, doors/slurm.py): the sink that judges a
finished run and tells Slurm. A resource `blocked` or `error`, or a refused run, or no verdict
within the deadline → `scontrol update nodename=NODE state=drain reason="reconcile: <resource>:
<why>"`; the node converged again, and drained with a reason reconcile set → `state=resume`.

A reason is reconcile's when it starts with `reconcile:`, the ownership prefix LBNL NHC uses as
"NHC:" (nhc `nhc_mark_offline`/`nhc_mark_online`): a node drained by anyone else is never
resumed, and its reason never overwritten. `converging` (a job running towards its target)
and plain `drift` (what `apply` would fix) never drain. Slurm stores a reason as given,
newlines included, at any length: the reason is made one line and cut here.

The fleet guard (`--max-drained`, docs/slurm.md "The fleet guard"): before a node in service is
drained, every node's state is read from Slurm (`scontrol --all show node -o`); when, in any
partition of the node, as many other nodes as the limit are already out of service (drained,
down, failing, not responding or rebooting: by anyone), the drain is withheld and said so
("would drain, but N of M ..."): the node stays up. A limit reached in one partition is enough
(the strictest), and partitions that cannot be read withhold the drain too, as NVSentinel's
fault-quarantine halts when its breaker cannot count nodes.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import SinkError

if TYPE_CHECKING:
    from ...pipeline.runs import Finished

OWNER = "reconcile:"
MAX_REASON = 200  # ours: Slurm takes any length; NHC's reasons are of this order
BAD_STATUSES = ("blocked", "error")


# --- the verdict and the decision: plain data, tested without Slurm ------------------------

def one_line(text: str, limit: int = MAX_REASON) -> str:
    """Control characters (newlines included) to spaces, runs of spaces to one, cut to `limit`."""
    flat = re.sub(r"\s+", " ", re.sub(r"[\x00-\x1f\x7f]", " ", text)).strip()
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    reason: str = ""  # the drain reason when not healthy, with the ownership prefix
    problems: tuple[str, ...] = ()  # the resource ids (or "state file", "internal error") found bad
    timed_out: bool = False  # no verdict within the deadline
    gate: str = ""  # why the validation gate has not passed in this boot ("" when it has)


def verdict_of(doc: dict[str, Any]) -> Verdict:
    """Judge a report (its JSON form): any resource blocked or error makes the node unhealthy."""
    bad = [r for r in doc.get("resources", []) if r.get("status") in BAD_STATUSES]
    if not bad:
        return Verdict(True, gate=gate_pending(doc))
    first = bad[0]
    why = next((line for line in (first.get("message") or "").splitlines() if line.strip()), first["status"])
    why = why.strip().rstrip(";").rstrip()  # the plan joins its parts with "; "
    more = f" (+{len(bad) - 1} more: {', '.join(r['id'] for r in bad[1:])})" if len(bad) > 1 else ""
    return Verdict(False, reason_text(f"{first['id']}: {why}", more), tuple(r["id"] for r in bad))


def reason_text(what: str, tail: str = "") -> str:
    """`reconcile: WHAT TAIL`, one line, at most MAX_REASON characters; the tail (how many more
    resources) survives the cut."""
    tail = one_line(tail, MAX_REASON // 2)
    tail = f" {tail}" if tail else ""
    return one_line(f"{OWNER} {what}", MAX_REASON - len(tail)) + tail


# What the fleet guard counts as out of service: scontrol's State= words (a base state and its
# flags joined by "+") under which Slurm gives a node no new work, per sinfo(1) "NODE STATE
# CODES": DRAIN (sinfo's DRAINING and DRAINED), DOWN, FAIL (FAIL, FAILING), NOT_RESPONDING (the
# `*` suffix: "will not be allocated any new work"), REBOOT_ISSUED (`^`: rebooting now) and
# INVALID_REG (sinfo's INVAL: registered with less than configured). Not counted: UNKNOWN (every
# node, until it registers after slurmctld starts), REBOOT_REQUESTED alone (it runs jobs until
# the reboot; `scontrol reboot ASAP` adds DRAIN), POWERED_DOWN and POWERING_* (power saving:
# Slurm powers them up for a job), MAINT and RESERVED (reservations), PLANNED, COMPLETING.
FLEET_OUT_OF_SERVICE = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING",
                                  "REBOOT_ISSUED", "INVALID_REG", "INVAL"})


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # as scontrol shows it: IDLE, IDLE+DRAIN, MIXED+DRAIN, DOWN+NOT_RESPONDING, ...
    reason: str = ""  # without the " [user@time]" scontrol appends
    partitions: tuple[str, ...] = ()  # scontrol's Partitions= (none for a node in no partition)

    @property
    def flags(self) -> set[str]:
        return set(self.state.upper().replace("*", "").split("+"))

    @property
    def out_of_service(self) -> bool:
        """Drained, draining or down: whose drain it is decides what reconcile may do."""
        return bool({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL"} & self.flags)

    @property
    def takes_no_jobs(self) -> bool:
        """Out of service as the fleet guard counts it (FLEET_OUT_OF_SERVICE)."""
        return bool(FLEET_OUT_OF_SERVICE & self.flags)

    @property
    def rebooting(self) -> bool:
        """Slurm is rebooting it: the reboot handed to slurmd (REBOOT_ISSUED, `^` in sinfo), or requested
        ASAP (REBOOT_REQUESTED, `@`, with the DRAIN `scontrol reboot ASAP` sets: no new jobs until the
        reboot). slurmctld clears them when the node registers from its new boot (sinfo(1) NODE STATE
        CODES, scontrol(1) `reboot`). A reboot requested without ASAP runs jobs until the node is idle:
        not this; an unhealthy node is drained as any other."""
        flags = self.flags
        return "REBOOT_ISSUED" in flags or ("REBOOT_REQUESTED" in flags and "DRAIN" in flags)

    @property
    def ours(self) -> bool:
        return self.reason.startswith(OWNER)


@dataclass(frozen=True)
class Decision:
    action: str  # "drain", "resume", "none", or "withheld" (a drain the fleet guard stopped)
    why: str


def decide(verdict: Verdict, node: NodeState) -> Decision:
    if node.rebooting:
        # Its drain and reason are the reboot's (`scontrol reboot ASAP ... reason=`): a drain would
        # replace the reason, a resume would hand the node to jobs before the reboot and the gate.
        return Decision("none", f"Slurm is rebooting it ({node.state}"
                                + (f", reason: {node.reason}" if node.reason else "") + "): left alone")
    if not verdict.healthy:
        if node.out_of_service and not node.ours:
            if node.reason:
                return Decision("none", f"already out of service, by someone else ({node.reason}): left alone")
            return Decision("none", f"already {node.state} without a reason: left alone")
        if node.out_of_service and node.reason == verdict.reason:
            return Decision("none", "already drained for this reason")
        return Decision("drain", verdict.reason)
    if node.out_of_service and node.ours and verdict.gate:  # the validation gate below
        return Decision("none", f"converged, but {verdict.gate}: not resumed until it passes (`reconcile apply` "
                                f"runs it); the drain is reconcile's ({node.reason})")
    if node.out_of_service and node.ours:
        return Decision("resume", f"converged again; the drain was reconcile's ({node.reason})")
    if node.out_of_service:
        return Decision("none", f"healthy, but out of service by someone else ({node.reason or node.state}): "
                                "not resumed")
    return Decision("none", "healthy")


# --- a node reconcile drained returns only once the validation gate passed in this boot ---

# The gpus kind's drift field until the gate passed (reconcilers/gpus/gate.py FIELD; a kind is not imported
# from here, tests/test_layers.py; tests/test_slurm_gate.py holds the two equal).
GATE_FIELD = "validated"


def gate_pending(doc: dict[str, Any]) -> str:
    """Why `gpus.validate` has not passed in this boot, from the run's report; "" when it has, or none is
    declared. The gpus kind derives that drift from the gate's per-boot record (gate.read_result, this
    boot's id) and the journal's recoveries (a reset or reboot since the last pass), so the record is read
    in one place; a failed gate is `blocked`, which the verdict already counts as unhealthy."""
    for r in doc.get("resources", []):
        for d in r.get("drift") or ():
            if d.get("field") == GATE_FIELD:
                return f"the validation gate has not passed in this boot ({d.get('have')})"
    return ""

# --- end of the validation gate ---------------------------------------------------------------------------


_STATE = re.compile(r"(?:^| )State=(\S+)")
_PARTITIONS = re.compile(r"(?:^| )Partitions=(\S+)")
_REASON = re.compile(r" Reason=(.*?)(?: \[[^\]\s]*@[^\]\s]*\])?$")


def parse_node(name: str, line: str) -> NodeState:
    """One line of `scontrol show node NAME -o`; Reason is its last field, with ` [user@time]`
    (the fields before it are read from the part before it: a reason may say anything)."""
    line = line.rstrip("\n")
    head = line.split(" Reason=", 1)[0]
    state = _STATE.search(head)
    if not state:
        raise ValueError(f"no State= in scontrol's answer: {line[:200]!r}")
    reason = _REASON.search(line)
    partitions = _PARTITIONS.search(head)
    return NodeState(name, state.group(1), reason.group(1) if reason else "",
                     tuple(p for p in partitions.group(1).split(",") if p) if partitions else ())


_NODE_NAME = re.compile(r"NodeName=(\S+)")


def parse_nodes(text: str) -> list[NodeState]:
    """Every node of `scontrol --all show node -o`, one line each."""
    nodes = []
    for line in text.splitlines():
        name = _NODE_NAME.match(line)
        if name:
            nodes.append(parse_node(name.group(1), line))
    if not nodes:
        raise ValueError(f"no node in scontrol's answer: {text[:200]!r}")
    return nodes


# --- the fleet guard: plain data too ------------------------------------------------------

@dataclass(frozen=True)
class MaxDrained:
    """`--max-drained`: a count of nodes (`3`) or a share of each partition (`10%`)."""

    text: str  # as given: said back in every report
    count: int | None = None
    percent: float | None = None

    def limit(self, nodes: int) -> int:
        """How many out-of-service nodes of a partition of `nodes` stop a drain: the count, or
        the share rounded up, as NVSentinel's breaker rounds (fault-quarantine/pkg/breaker,
        `math.Ceil(totalNodes * TripPercentage / 100)`), so the first sick node of a small
        partition can still be drained under a small share."""
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return math.ceil(round(nodes * self.percent / 100, 9))


def parse_max_drained(text: str) -> MaxDrained:
    """`N` (nodes, 0 or more) or `P%` (0 to 100); ValueError with what is wrong otherwise."""
    value = text.strip()
    if re.fullmatch(r"\d+", value):
        return MaxDrained(value, count=int(value))
    share = re.fullmatch(r"(\d+(?:\.\d+)?)%", value)
    if share and float(share.group(1)) <= 100:
        return MaxDrained(value, percent=float(share.group(1)))
    raise ValueError(f"invalid value {text!r}: a count of nodes (e.g. 3) or a share of the partition "
                     "from 0% to 100% (e.g. 10%)")


@dataclass(frozen=True)
class PartitionCount:
    partition: str
    nodes: int  # M: the partition's nodes, this one included
    out_of_service: int  # N: its other nodes that take no jobs (FLEET_OUT_OF_SERVICE)
    limit: int  # MaxDrained.limit(nodes)

    @property
    def tripped(self) -> bool:
        return self.out_of_service >= self.limit

    def fields(self) -> dict[str, Any]:
        return {"partition": self.partition, "nodes": self.nodes, "out_of_service": self.out_of_service,
                "limit": self.limit}


def count_partitions(node: NodeState, fleet: list[NodeState], max_drained: MaxDrained) -> list[PartitionCount]:
    """For each partition of `node`, its size and how many of its other nodes are out of service."""
    counts = []
    for part in node.partitions:
        members = [n for n in fleet if part in n.partitions and n.name != node.name]
        size = len(members) + 1
        counts.append(PartitionCount(part, size, sum(n.takes_no_jobs for n in members), max_drained.limit(size)))
    return counts


def fleet_guard(decision: Decision, counts: list[PartitionCount] | None, max_drained: MaxDrained,
          unread: str = "") -> Decision:
    """A drain withheld when a partition of the node is at its limit (any one: the strictest),
    or when the partitions could not be read (`counts` None, `unread` saying why)."""
    if decision.action != "drain":
        return decision
    if counts is None:
        return Decision("withheld", f"would drain, but how many nodes of its partitions are out of service "
                                    f"cannot be read from Slurm ({unread}): left in service")
    tripped = [c for c in counts if c.tripped]
    if not tripped:
        return decision
    said = " and ".join(f"{c.out_of_service} of {c.nodes} in partition {c.partition}" for c in tripped)
    limits = ", ".join(f"{c.limit} in {c.partition}" for c in tripped)
    return Decision("withheld", f"would drain, but {said} are already drained or down "
                                f"(--max-drained {max_drained.text}: {limits}): left in service")


def judge(run: Finished) -> Verdict:
    """A finished run's verdict: its report judged (verdict_of); a refused run is not healthy,
    since nothing was judged (unknown is never ok), with the refusal's reason as its problem."""
    refusal = run.refusal
    if refusal is None:
        return verdict_of(dict(run.doc))
    if refusal.reason == "state-file":  # a state file that cannot be read says nothing about the node
        first = refusal.problems[0] if refusal.problems else refusal.message
        return Verdict(False, reason_text(f"state file: {first}"), ("state file",))
    # Another machine (hostname glob, or the pinned machine-id): the refusal's reason
    # (host-mismatch, machine-mismatch) is what the journal records as the problem.
    return Verdict(False, reason_text(f"state file: {refusal.message}"), (refusal.reason,))


class SlurmError(SinkError):
    pass


class Scontrol:
    def __init__(self, path: str, deadline: float):
        self.path = path
        self.deadline = deadline  # time.monotonic() by which every call must be done

    def _run(self, *args: str) -> str:
        left = self.deadline - time.monotonic()
        if left <= 0.5:
            raise SlurmError(f"no time left for `scontrol {' '.join(args)}`")
        try:
            proc = subprocess.run([self.path, *args], capture_output=True, text=True, timeout=left,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"`scontrol {' '.join(args[:3])}` did not answer within {left:.0f}s") from None
        except OSError as exc:
            raise SlurmError(f"cannot run {self.path}: {exc.strerror}") from None
        if proc.returncode != 0:
            raise SlurmError(f"`scontrol {' '.join(args[:3])}` failed: "
                             f"{one_line(proc.stderr or proc.stdout or f'exit {proc.returncode}')}")
        return proc.stdout

    def node(self, name: str) -> NodeState:
        out = self._run("show", "node", name, "-o")
        line = next((ln for ln in out.splitlines() if ln.startswith(f"NodeName={name} ")), None)
        if line is None:
            raise SlurmError(f"scontrol does not know node {name!r}: {one_line(out)}")
        try:
            return parse_node(name, line)
        except ValueError as exc:
            raise SlurmError(str(exc)) from None

    def nodes(self) -> list[NodeState]:
        """Every node (`--all`: those of hidden partitions too)."""
        out = self._run("--all", "show", "node", "-o")
        try:
            return parse_nodes(out)
        except ValueError as exc:
            raise SlurmError(str(exc)) from None

    def update(self, name: str, state: str, reason: str | None = None) -> None:
        args = ["update", f"nodename={name}", f"state={state}"]
        if reason is not None:
            args.append(f"reason={reason}")
        self._run(*args)


class SlurmNode:
    """Drains or resumes NODE through `scontrol` by what a run found; `fields`, what it saw and
    did, go to the health check's journal line (node_state, node_reason, action, reason|why, and
    with a fleet guard max_drained and the partitions counted)."""

    OPTIONS = ()  # made by `reconcile slurm-health` itself (doors/slurm.py), with its own options

    def __init__(self, node: str, scontrol: Scontrol, max_drained: MaxDrained | None = None):
        self.node = node
        self.scontrol = scontrol
        self.max_drained = max_drained
        self.fields: dict[str, Any] = {}

    @classmethod
    def from_options(cls, command: str, values: Any, **context: Any) -> SlurmNode | None:
        return None

    def take(self, run: Finished) -> None:
        self.act(judge(run))

    def act(self, verdict: Verdict) -> Decision:
        """Tell Slurm what the verdict means for the node; SlurmError when scontrol cannot be
        asked or refuses."""
        node = self.scontrol.node(self.node)
        decision = decide(verdict, node)
        self.fields.update(node_state=node.state, node_reason=node.reason)
        if decision.action == "drain" and not node.out_of_service and self.max_drained is not None:
            # A new drain (re-wording reconcile's own is not one): the guard counts first.
            self.fields["max_drained"] = self.max_drained.text
            counts, unread = None, ""
            try:
                counts = count_partitions(node, self.scontrol.nodes(), self.max_drained)
                self.fields["partitions"] = [c.fields() for c in counts]
            except SlurmError as exc:
                unread = str(exc)
            decision = fleet_guard(decision, counts, self.max_drained, unread)
        if decision.action == "drain":
            self.scontrol.update(self.node, "drain", decision.why)
        elif decision.action == "resume":
            self.scontrol.update(self.node, "resume")
        self.fields["action"] = decision.action
        if decision.action == "withheld":
            self.fields["reason"] = verdict.reason  # what the drain would have said
        self.fields["reason" if decision.action == "drain" else "why"] = decision.why
        return decision
