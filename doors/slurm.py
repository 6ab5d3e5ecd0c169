"""`reconcile slurm-health`: Slurm's HealthCheckProgram. Drain a node that must not take jobs,
resume it when it is fixed.

Each run checks the node's state file (`diff`, or `apply` with `--apply`, both through
pipeline/runs.py, which takes the apply lock) and hands the finished run to the Slurm sink
(doors/sinks/slurm_node.py), which drains the node when a resource is `blocked` or `error`, the
run was refused, or no verdict came within the deadline, and resumes it when it converged
again and the drain was reconcile's.

What slurmd gives a health check (observed with slurmd 22.05, man slurm.conf
HealthCheckProgram): it runs as root with only PWD and SLURMD_NODENAME in its environment (no
PATH, no SLURM_CONF: scontrol then reads /etc/slurm/slurm.conf); a non-zero exit is only
logged, so the program drains the node itself; it is killed after 60 s; and runs are not
serialised, a new one starts every HealthCheckInterval even while an old one runs. Hence a
non-blocking lock (a run that finds another one running leaves), and a whole-run deadline
(NHC's watchdog) that must stay below 60 s and the interval.

One line per run goes to reconcile's journal ({"event": "slurm-health", ...}) and to stdout
(which slurmd logs when the exit status is not 0); with `--textfile DIR`, its metrics to
DIR/reconcile-slurm-health.prom (a drain the fleet guard withheld among them, for the alert).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from ..core.contract import utc_iso
from ..core.escape import escape_controls

# The verdict, the decision and scontrol: the sink's (names kept here for the tests and docs).
from .sinks.slurm_node import (  # noqa: F401
    BAD_STATUSES,
    FLEET_OUT_OF_SERVICE,
    MAX_REASON,
    OWNER,
    Decision,
    MaxDrained,
    NodeState,
    PartitionCount,
    Scontrol,
    SlurmError,
    SlurmNode,
    Verdict,
    count_partitions,
    decide,
    fleet_guard,
    judge,
    one_line,
    parse_max_drained,
    parse_node,
    parse_nodes,
    reason_text,
    verdict_of,
)

DEFAULT_DEADLINE = 45.0
DEFAULT_MAX_DRAINED = "50%"  # NVSentinel's breaker default (fault-quarantine circuitBreaker.percentage)
TEXTFILE_NAME = "reconcile-slurm-health.prom"  # beside the watch's reconcile.prom, never over it
SCONTROL = "/usr/bin/scontrol"
SANE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

EXIT_HEALTHY, EXIT_UNHEALTHY = 0, 1


# --- the run ---------------------------------------------------------------------------


@dataclass
class Settings:
    state_file: str
    node: str
    journal_path: str | None = None
    deadline: float = DEFAULT_DEADLINE
    apply: bool = False
    scontrol: str = SCONTROL
    log: IO[str] | None = None
    max_drained: MaxDrained | None = None  # the fleet guard; None: none
    textfile: str | None = None  # a directory for TEXTFILE_NAME


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
        if line["verdict"] != "skipped" and s.textfile:
            _write_metrics(s.textfile, line, out)
        words = [f"{k}={line[k]}" for k in ("verdict", "action") if k in line]
        if line.get("action") == "withheld":
            detail = f"{line['why']}; the drain would say: {line['reason']}"
        else:
            detail = line.get("reason") or line.get("why") or ""
        # Old spellings: in the one line slurmd logs (its only output), after the verdict.
        detail = "; ".join(filter(None, (detail, *line.get("warnings", ()))))
        said = escape_controls(f"node {s.node}: {' '.join(words)}{': ' + detail if detail else ''}")  # names, messages
        out.write(f"reconcile slurm-health: {said}\n")
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
        verdict, note, warnings = _run_check(s, mono0 + check_budget(s.deadline), journal)
        line.update(verdict="healthy" if verdict.healthy else "unhealthy", problems=list(verdict.problems))
        if note:
            line["note"] = note
        if warnings:
            line["warnings"] = list(warnings)
        if verdict.timed_out:
            line["verdict"] = "timeout"
        sink = SlurmNode(s.node, Scontrol(s.scontrol, mono0 + s.deadline), s.max_drained)
        try:
            sink.act(verdict)
        except SlurmError as exc:
            line.update(sink.fields)
            return finish(EXIT_UNHEALTHY, action="failed", why=str(exc),
                          **({"reason": verdict.reason} if verdict.reason else {}))
        return finish(EXIT_HEALTHY if verdict.healthy else EXIT_UNHEALTHY, **sink.fields)
    finally:
        guard.release()
        if line.get("verdict") == "timeout":
            _end_stuck_run(out)


def health_metrics(line: dict[str, Any]) -> str:
    """The metrics of one run (its journal line) for node_exporter's textfile collector. What the
    run did not learn is left out, never 0: the partitions only when the guard counted them,
    the withheld drain only when Slurm was told something (not when scontrol failed)."""
    from ..views.prometheus import Metrics

    node = {"node": line["node"]}
    m = Metrics()
    m.family("reconcile_slurm_health_drain_withheld", "gauge",
             "1 when the last slurm-health run would have drained the node but the fleet guard "
             "(--max-drained) withheld it: the node is unhealthy and still takes jobs.")
    if line.get("action") in ("none", "drain", "resume", "withheld"):
        m.add("reconcile_slurm_health_drain_withheld", line["action"] == "withheld", node)
    for name, key, help_text in (
            ("reconcile_slurm_health_partition_nodes", "nodes", "Nodes in the partition, as the fleet guard counted."),
            ("reconcile_slurm_health_partition_out_of_service_nodes", "out_of_service",
             "Other nodes of the partition drained, down, failing, not responding or rebooting."),
            ("reconcile_slurm_health_partition_drain_limit_nodes", "limit",
             "Out-of-service nodes of the partition at which the fleet guard withholds a drain.")):
        m.family(name, "gauge", help_text)
        for part in line.get("partitions", []):
            m.add(name, part[key], {**node, "partition": part["partition"]})
    m.family("reconcile_slurm_health_last_run_timestamp_seconds", "gauge",
             "When the last slurm-health run ended (Unix time).")
    m.add("reconcile_slurm_health_last_run_timestamp_seconds", round(time.time(), 3), node)
    return m.text()


def _write_metrics(directory: str, line: dict[str, Any], out: IO[str]) -> None:
    from .sinks.textfile import write_textfile

    try:
        write_textfile(directory, health_metrics(line), TEXTFILE_NAME)
    except OSError as exc:
        out.write(f"reconcile slurm-health: cannot write {directory}/{TEXTFILE_NAME}: {exc.strerror or exc}\n")


def _run_check(s: Settings, by: float, journal: Any) -> tuple[Verdict, str, tuple[str, ...]]:
    """The check in a worker thread, waited for until `by` (time.monotonic()); past it the verdict
    is "no verdict", which drains: a node whose health cannot be told must not take jobs."""
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["verdict"] = _check(s, journal)
        except BaseException as exc:  # reported as the verdict, never a traceback in slurmd's log
            result["verdict"] = (Verdict(False, reason_text(f"internal error: {type(exc).__name__}: {exc}"),
                                         ("internal error",)), "", ())

    worker = threading.Thread(target=work, name="slurm-health-check", daemon=True)
    worker.start()
    worker.join(max(0.0, by - time.monotonic()))
    if worker.is_alive():
        budget = check_budget(s.deadline)
        return Verdict(False, reason_text(f"health check did not finish within {budget:g}s"), timed_out=True), "", ()
    return result["verdict"]


def _check(s: Settings, journal: Any) -> tuple[Verdict, str, tuple[str, ...]]:
    """Diff (or apply, under the apply lock) through pipeline/runs.py; the finished run judged
    as the Slurm sink judges it, a note, and the state file's old-spelling warnings. A run that
    finds the lock held judges what is there instead."""
    from ..core.refusals import Refusal
    from ..pipeline import runs
    from ..pipeline.statefile import StateFileError, load

    command = "apply" if s.apply else "diff"
    try:
        state = load(s.state_file)
    except StateFileError as exc:
        refused = Refusal("state-file", exc.problems[0] if exc.problems else "invalid", problems=tuple(exc.problems))
        return judge(runs.finished(refused, command, s.state_file)), "", tuple(exc.warnings)
    note = ""
    if not s.apply:
        result = runs.diff(state)
    else:
        result = runs.apply(state, None, journal, 0.0)
        if isinstance(result, Refusal) and result.reason in ("lock-held", "journal"):
            # Someone is applying by hand or `reconcile watch` is: judge what is there, change nothing.
            note = f"not applied: {result.message}"
            result = runs.diff(state, command="apply")
    return judge(runs.finished(result, command, s.state_file)), note, tuple(state.warnings)


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
