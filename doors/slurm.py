"""`reconcile slurm-health`: Slurm's HealthCheckProgram. Drain a node that must not take jobs,
resume it when it is fixed.

Each run checks the node's state file (`diff`, or `apply` with `--apply`) and then:
- a resource `blocked` or `error`, or no verdict within the deadline → `scontrol update
  nodename=NODE state=drain reason="reconcile: <resource>: <why>"`;
- the node converged again, and drained with a reason reconcile set → `state=resume`.
A reason is reconcile's when it starts with `reconcile:`, the ownership prefix LBNL NHC uses as
"NHC:" (nhc `nhc_mark_offline`/`nhc_mark_online`): a node drained by anyone else is never
resumed, and its reason never overwritten. `converging` (a job running towards its target)
and plain `drift` (what `apply` would fix) never drain.

What slurmd gives a health check (observed with slurmd 22.05, man slurm.conf
HealthCheckProgram): it runs as root with only PWD and SLURMD_NODENAME in its environment (no
PATH, no SLURM_CONF: scontrol then reads /etc/slurm/slurm.conf); a non-zero exit is only
logged, so the program drains the node itself; it is killed after 60 s; and runs are not
serialised, a new one starts every HealthCheckInterval even while an old one runs. Hence a
non-blocking lock (a run that finds another one running leaves), and a whole-run deadline
(NHC's watchdog) that must stay below 60 s and the interval. Slurm stores a reason as given,
newlines included, at any length: the reason is made one line and cut here.

One line per run goes to reconcile's journal ({"event": "slurm-health", ...}) and to stdout
(which slurmd logs when the exit status is not 0).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from ..core.contract import utc_iso

OWNER = "reconcile:"
MAX_REASON = 200  # ours: Slurm takes any length; NHC's reasons are of this order
DEFAULT_DEADLINE = 45.0
SCONTROL = "/usr/bin/scontrol"
SANE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BAD_STATUSES = ("blocked", "error")

EXIT_HEALTHY, EXIT_UNHEALTHY = 0, 1


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


def verdict_of(doc: dict[str, Any]) -> Verdict:
    """Judge a report (its JSON form): any resource blocked or error makes the node unhealthy."""
    bad = [r for r in doc.get("resources", []) if r.get("status") in BAD_STATUSES]
    if not bad:
        return Verdict(True)
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
    if node.out_of_service and node.ours:
        return Decision("resume", f"converged again; the drain was reconcile's ({node.reason})")
    if node.out_of_service:
        return Decision("none", f"healthy, but out of service by someone else ({node.reason or node.state}): "
                                "not resumed")
    return Decision("none", "healthy")


_STATE = re.compile(r"(?:^| )State=(\S+)")
_REASON = re.compile(r" Reason=(.*?)(?: \[[^\]\s]*@[^\]\s]*\])?$")


def parse_node(name: str, line: str) -> NodeState:
    """One line of `scontrol show node NAME -o`; Reason is its last field, with ` [user@time]`."""
    state = _STATE.search(line)
    if not state:
        raise ValueError(f"no State= in scontrol's answer: {line[:200]!r}")
    reason = _REASON.search(line.rstrip("\n"))
    return NodeState(name, state.group(1), reason.group(1) if reason else "")


# --- the run ---------------------------------------------------------------------------

class SlurmError(Exception):
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


@dataclass
class Settings:
    state_file: str
    node: str
    journal_path: str | None = None
    deadline: float = DEFAULT_DEADLINE
    apply: bool = False
    scontrol: str = SCONTROL
    log: IO[str] | None = None


def check_budget(deadline: float) -> float:
    """Of the whole-run deadline, the part the check may take; the rest is for scontrol."""
    return deadline - min(10.0, deadline / 3)


def health_check(s: Settings) -> int:
    """One run of the health check; returns the exit status (0 healthy or skipped, 1 otherwise)."""
    from ..pipeline.journal import Journal, LockError, LockHeld

    t0, mono0 = time.time(), time.monotonic()
    out = s.log or sys.stdout
    journal = Journal.at(s.journal_path)
    line: dict[str, Any] = {"time": utc_iso(millis=True), "event": "slurm-health", "node": s.node,
                            "pid": os.getpid(), "state_file": s.state_file,
                            "command": "apply" if s.apply else "diff"}

    def finish(code: int, **fields: Any) -> int:
        line.update(fields, duration_s=round(time.time() - t0, 3), exit_code=code)
        try:
            journal(line)
        except OSError as exc:
            out.write(f"reconcile slurm-health: cannot write the journal {journal.path}: {exc.strerror}\n")
        words = [f"{k}={line[k]}" for k in ("verdict", "action") if k in line]
        detail = line.get("reason") or line.get("why") or ""
        out.write(f"reconcile slurm-health: node {s.node}: {' '.join(words)}{': ' + detail if detail else ''}\n")
        out.flush()
        return code

    from ..pipeline.journal import Lock

    # Runs overlap (slurmd starts one every interval, whatever is still running): one at a time.
    guard = Lock(journal.path.parent / "slurm-health.lock")
    try:
        guard.acquire(timeout=0)
    except LockHeld:
        return finish(EXIT_HEALTHY, verdict="skipped", action="none", why="another slurm-health run is in progress")
    except LockError as exc:
        return finish(EXIT_UNHEALTHY, verdict="error", action="none", why=str(exc))
    try:
        verdict, note = _run_check(s, mono0 + check_budget(s.deadline), journal)
        line.update(verdict="healthy" if verdict.healthy else "unhealthy", problems=list(verdict.problems))
        if note:
            line["note"] = note
        if verdict.timed_out:
            line["verdict"] = "timeout"
        scontrol = Scontrol(s.scontrol, mono0 + s.deadline)
        try:
            node = scontrol.node(s.node)
            decision = decide(verdict, node)
            line.update(node_state=node.state, node_reason=node.reason)
            if decision.action == "drain":
                scontrol.update(s.node, "drain", decision.why)
            elif decision.action == "resume":
                scontrol.update(s.node, "resume")
        except SlurmError as exc:
            return finish(EXIT_UNHEALTHY, action="failed", why=str(exc),
                          **({"reason": verdict.reason} if verdict.reason else {}))
        fields: dict[str, Any] = {"action": decision.action}
        if decision.action == "drain":
            fields["reason"] = decision.why
        else:
            fields["why"] = decision.why
        return finish(EXIT_HEALTHY if verdict.healthy else EXIT_UNHEALTHY, **fields)
    finally:
        guard.release()
        if line.get("verdict") == "timeout":
            _end_stuck_run(out)


def _run_check(s: Settings, by: float, journal: Any) -> tuple[Verdict, str]:
    """The check in a worker thread, waited for until `by` (time.monotonic()); past it the verdict
    is "no verdict", which drains: a node whose health cannot be told must not take jobs."""
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["verdict"] = _check(s, journal)
        except BaseException as exc:  # reported as the verdict, never a traceback in slurmd's log
            result["verdict"] = (Verdict(False, reason_text(f"internal error: {type(exc).__name__}: {exc}"),
                                         ("internal error",)), "")

    worker = threading.Thread(target=work, name="slurm-health-check", daemon=True)
    worker.start()
    worker.join(max(0.0, by - time.monotonic()))
    if worker.is_alive():
        budget = check_budget(s.deadline)
        return Verdict(False, reason_text(f"health check did not finish within {budget:g}s"), timed_out=True), ""
    return result["verdict"]


def _check(s: Settings, journal: Any) -> tuple[Verdict, str]:
    from ..pipeline.engine import Engine, HostMismatch
    from ..pipeline.journal import LockError
    from ..pipeline.report import to_json
    from ..pipeline.statefile import StateFileError, load

    try:
        state = load(s.state_file)
    except StateFileError as exc:
        # A state file that cannot be read says nothing about the node: unknown is never ok.
        return Verdict(False, reason_text(f"state file: {exc.problems[0] if exc.problems else 'invalid'}"),
                       ("state file",)), ""
    try:
        if not s.apply:
            return verdict_of(to_json(Engine(state).diff())), ""
        lock = journal.lock()
        try:
            lock.acquire(timeout=0)
        except LockError as exc:
            # Someone is applying by hand or `reconcile watch` is: judge what is there, change nothing.
            return verdict_of(to_json(Engine(state).diff(command="apply"))), f"not applied: {exc}"
        try:
            report = Engine(state, journal=journal).apply()
        finally:
            lock.release()
    except HostMismatch as exc:
        # Another machine (hostname glob, or the pinned machine-id): nothing was judged, so not
        # healthy; the refusal's reason (host-mismatch, machine-mismatch) is what the journal records.
        return Verdict(False, reason_text(f"state file: {exc}"), (exc.reason,)), ""
    return verdict_of(to_json(report)), ""


def _end_stuck_run(out: IO[str]) -> None:
    """Past the deadline the worker may sit in a call that never returns (a wedged GPU driver, a
    hung filesystem): kill what this run started (its own descendants only, which may be stuck
    in D-state and not die) and leave without the interpreter's teardown."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:  # never let the clean-up hide the verdict already given
        pass
    out.flush()
    os._exit(EXIT_UNHEALTHY)


def node_name(given: str | None) -> str:
    """--node, else SLURMD_NODENAME (what slurmd calls this node), else the short host name."""
    return given or os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".", 1)[0]


def prepare_environment() -> None:
    """slurmd starts the program without PATH: give the commands reconcile runs a sane one."""
    if not os.environ.get("PATH"):
        os.environ["PATH"] = SANE_PATH
