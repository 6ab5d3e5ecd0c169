"""Slurm's drain and resume (`reconcile slurm-health`, doors/slurm.py): the sink that judges a
finished run and tells Slurm. A resource `blocked` or `error`, or a refused run, or no verdict
within the deadline → `scontrol update nodename=NODE state=drain reason="reconcile: <resource>:
<why>"`; the node converged again, and drained with a reason reconcile set → `state=resume`.

A reason is reconcile's when it starts with `reconcile:`, the ownership prefix LBNL NHC uses as
"NHC:" (nhc `nhc_mark_offline`/`nhc_mark_online`): a node drained by anyone else is never
resumed, and its reason never overwritten. `converging` (a job running towards its target)
and plain `drift` (what `apply` would fix) never drain. Slurm stores a reason as given,
newlines included, at any length: the reason is made one line and cut here.
"""

from __future__ import annotations

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
    gate: str = ""  # issue 33 §2: why the validation gate has not passed in this boot ("" when it has)


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


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # as scontrol shows it: IDLE, IDLE+DRAIN, MIXED+DRAIN, DOWN+NOT_RESPONDING, ...
    reason: str = ""  # without the " [user@time]" scontrol appends

    @property
    def flags(self) -> set[str]:
        return set(self.state.upper().replace("*", "").split("+"))

    @property
    def out_of_service(self) -> bool:
        """Drained, draining or down: takes no new jobs."""
        return bool({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL"} & self.flags)

    @property
    def ours(self) -> bool:
        return self.reason.startswith(OWNER)


@dataclass(frozen=True)
class Decision:
    action: str  # "drain", "resume" or "none"
    why: str


def decide(verdict: Verdict, node: NodeState) -> Decision:
    if not verdict.healthy:
        if node.out_of_service and not node.ours:
            if node.reason:
                return Decision("none", f"already out of service, by someone else ({node.reason}): left alone")
            return Decision("none", f"already {node.state} without a reason: left alone")
        if node.out_of_service and node.reason == verdict.reason:
            return Decision("none", "already drained for this reason")
        return Decision("drain", verdict.reason)
    if node.out_of_service and node.ours and verdict.gate:  # issue 33 §2
        return Decision("none", f"converged, but {verdict.gate}: not resumed until it passes (`reconcile apply` "
                                f"runs it); the drain is reconcile's ({node.reason})")
    if node.out_of_service and node.ours:
        return Decision("resume", f"converged again; the drain was reconcile's ({node.reason})")
    if node.out_of_service:
        return Decision("none", f"healthy, but out of service by someone else ({node.reason or node.state}): "
                                "not resumed")
    return Decision("none", "healthy")


# --- issue 33 §2: a node reconcile drained returns only once the validation gate passed in this boot ---

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

# --- end of issue 33 §2 ---------------------------------------------------------------------------


_STATE = re.compile(r"(?:^| )State=(\S+)")
_REASON = re.compile(r" Reason=(.*?)(?: \[[^\]\s]*@[^\]\s]*\])?$")


def parse_node(name: str, line: str) -> NodeState:
    """One line of `scontrol show node NAME -o`; Reason is its last field, with ` [user@time]`."""
    state = _STATE.search(line)
    if not state:
        raise ValueError(f"no State= in scontrol's answer: {line[:200]!r}")
    reason = _REASON.search(line.rstrip("\n"))
    return NodeState(name, state.group(1), reason.group(1) if reason else "")


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

    def update(self, name: str, state: str, reason: str | None = None) -> None:
        args = ["update", f"nodename={name}", f"state={state}"]
        if reason is not None:
            args.append(f"reason={reason}")
        self._run(*args)


class SlurmNode:
    """Drains or resumes NODE through `scontrol` by what a run found; `fields`, what it saw and
    did, go to the health check's journal line (node_state, node_reason, action, reason|why)."""

    OPTIONS = ()  # made by `reconcile slurm-health` itself (doors/slurm.py), with its own options

    def __init__(self, node: str, scontrol: Scontrol):
        self.node = node
        self.scontrol = scontrol
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
        if decision.action == "drain":
            self.scontrol.update(self.node, "drain", decision.why)
        elif decision.action == "resume":
            self.scontrol.update(self.node, "resume")
        self.fields["action"] = decision.action
        self.fields["reason" if decision.action == "drain" else "why"] = decision.why
        return decision
