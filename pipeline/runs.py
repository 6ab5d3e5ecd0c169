"""The run steps, written once: take the apply lock, build the engine, diff or apply, and turn
what refuses a run into a `Refusal` (core/refusals.py) with a reason from the closed set.

Every door calls these two functions: `reconcile diff` and `apply` (commands.py, cli.py), a
saved plan (plans.py), each pass of `reconcile watch` (watch.py) and `reconcile slurm-health`
(doors/slurm.py). None of them takes the apply lock itself (tests/test_runs.py reads the code
for it): the lock is taken here, for the whole of an apply, so no two applies act at once and
an apply never acts on what it observed before another one changed the host.

What a run ends with goes to its consumers (doors/sinks/) as a `Finished`: the report's JSON
form, or the refusal's error report, which every format renders.

Only the standard library and core/ are imported at the top: `reconcile diff` starts here
(tests/test_fast_diff.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.refusals import Refusal

if TYPE_CHECKING:
    from pathlib import Path  # annotations only: pathlib (urllib.parse, ipaddress) is ~3 ms of a start-up

    from ..core.host import Host
    from .engine import Prefetch
    from .report import ResourceReport, RunReport
    from .statefile import LoadedState


def diff(state: LoadedState, host: Host | None = None, *, command: str = "diff",
         prefetch: Prefetch | None = None, history_path: str | Path | None = None) -> RunReport | Refusal:
    """Observe and plan; change nothing, take no lock. `command` "apply": a dry run's report.
    `history_path`: the journal the plan's recovery caps are counted from (the default one's
    otherwise), as an apply with that journal would count them."""
    from .engine import Engine, HostMismatch

    engine = Engine(state, host, prefetch=prefetch, history_path=history_path)
    try:
        return engine.diff(command=command)
    except HostMismatch as exc:  # the state file pins another machine-id
        return Refusal(exc.reason, str(exc), engine.machine)


def apply(state: LoadedState, host: Host | None, journal: Callable[[dict[str, Any]], None] | None,
          lock_wait: float = 0.0, *, only: Mapping[str, Collection[tuple[str, str]]] | None = None,
          before: Callable[[RunReport], Refusal | None] | None = None,
          on_result: Callable[[ResourceReport], None] | None = None,
          lock_file: Path | None = None) -> RunReport | Refusal:
    """Act until the host matches the state, under the apply lock (the journal's, beside it, or
    `lock_file`; none when there is neither: a test's journal-less engine), waiting `lock_wait`
    seconds for another apply to finish.

    `only`: the (action, target) pairs allowed per resource id (a saved plan's). `before`: looks
    at the host as observed under the lock, before anything is done, and may refuse the run (a
    saved plan that no longer holds). `on_result`: each resource's report as it is done (the
    watch stops there on SIGTERM)."""
    from .engine import Engine, HostMismatch, machine_of
    from .journal import Lock, LockError, LockHeld

    path = lock_file or getattr(journal, "lock_path", None)
    lock = Lock(path) if path else None
    if lock is not None:
        try:
            lock.acquire(timeout=lock_wait)
        except LockError as exc:
            # Held by another apply, or the journal's directory cannot be used (unreadable, missing).
            return Refusal("lock-held" if isinstance(exc, LockHeld) else "journal", str(exc),
                           machine_of(host) if host is not None else None)
    try:
        engine = Engine(state, host, journal=journal)
        try:
            if before is not None:
                # Observed under the lock: no other apply can change the host between this look and acting.
                refused = before(engine.diff(command="apply"))
                if refused is not None:
                    return refused
            report = engine.apply(on_result=on_result, only=only)
            _complete_reboots(journal, engine, report)
            return report
        except HostMismatch as exc:  # another hostname (the `host:` glob) or machine-id
            return Refusal(exc.reason, str(exc), engine.machine or machine_of(engine.host))
    finally:
        if lock is not None:
            lock.release()


def _complete_reboots(journal: Any, engine: Any, report: RunReport) -> None:
    """The first apply of a boot completes the journal's record of a reboot reconcile requested in
    the boot before (pipeline/recoveries.py), under the same lock."""
    if getattr(journal, "path", None) is None:
        return  # a journal-less engine (tests) or an in-memory log: there is no record to complete
    from .recoveries import complete_reboots

    try:
        complete_reboots(journal, engine.machine or {}, report)
    except OSError as exc:
        import sys

        print(f"reconcile: warning: the reboot's completion cannot be journaled: {exc}", file=sys.stderr)


@dataclass(frozen=True)
class Finished:
    """A finished run as its consumers (doors/sinks/) get it: the document every format renders
    (the report's JSON form, or the refusal's error report) and, when it was refused, the
    Refusal. A pass of `reconcile watch` also says its outcome (ok, failed, skipped) and how long
    until the next pass."""

    command: str
    doc: Mapping[str, Any]
    refusal: Refusal | None = None
    outcome: str = ""
    next_in: float | None = None

    @property
    def report(self) -> Mapping[str, Any] | None:
        """The report's JSON form; None for a refusal."""
        return None if self.refusal is not None else self.doc


def finished(result: RunReport | Refusal | Mapping[str, Any], command: str, state_file: str,
             dry_run: bool = False, **extra: Any) -> Finished:
    """What a run ended with (a RunReport, its JSON form, or a Refusal) as a Finished."""
    from .report import refusal_doc, to_json

    if isinstance(result, Refusal):
        return Finished(command, refusal_doc(result, command, state_file, dry_run=dry_run), result, **extra)
    return Finished(command, result if isinstance(result, Mapping) else to_json(result), **extra)
