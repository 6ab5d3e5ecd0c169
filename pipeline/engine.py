"""The pipeline: observe -> diff -> plan -> apply -> verify, in `needs` order.

The engine owns ordering, the apply passes, verification, the journal and the
status of each resource; reconcilers only answer for their own kind. Verification
is the reconciler's own observe + diff run again, so it can never disagree with
`diff`.
"""

from __future__ import annotations

import fnmatch
import os
import pickle  # here, not where it is used: the observer children forked from this process inherit it
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.contract import (
    Action,
    ActionResult,
    ApplyError,
    Context,
    Drift,
    ObserveError,
    Plan,
    Reconciler,
    Resource,
    Result,
    Status,
    to_plain,
    utc_iso,
)
from ..core.host import Host
from ..core.values import format_duration
from ..local.host import ForkedChild, LocalHost, collect_children, split_beats
from ..reconcilers import key_of, reconciler_for
from .report import ResourceReport, RunReport
from .statefile import LoadedState

# A resource is worked on in passes (plan, act, observe) until nothing is left to do,
# like a controller requeueing: some fixes only show their next step once the first is
# done (unmask, then disable). Bounded, and a pass after which the resource looks exactly
# as before stops the loop: no progress is not retried.
MAX_PASSES = 3
SETTLE_POLL = 0.25


class HostMismatch(Exception):
    """The state file is for another machine: `reason` is `host-mismatch` (the hostname glob)
    or `machine-mismatch` (the pinned /etc/machine-id)."""

    def __init__(self, message: str, reason: str = "host-mismatch"):
        super().__init__(message)
        self.reason = reason


def machine_of(host: Any) -> dict[str, Any]:
    machine = getattr(host, "machine", None)
    return machine() if callable(machine) else {"hostname": host.hostname(), "machine_id": None, "boot_id": None}


def check_machine(state: Any, machine: Mapping[str, Any], command: str) -> None:
    """Refuse a state file pinned (`host: {machine_id: ...}`) to another machine: a recreated VM
    or a reused address answers with another /etc/machine-id, and its drift would be planned
    against a machine the file was never written for."""
    want = getattr(state, "machine_id", None)
    if not want:
        return
    have = machine.get("machine_id")
    if have != want:
        seen = f"machine-id {have}" if have else "no readable /etc/machine-id"
        # Both ids first: Slurm's drain reason and a narrow terminal keep the start of the line.
        raise HostMismatch(f"{machine.get('hostname')!r} has {seen}, not {want} as {state.path} pins: "
                           f"refusing to {'plan' if command == 'diff' else 'apply'}", "machine-mismatch")


def host_matches(pattern: str | None, hostname: str) -> bool:
    if not pattern:
        return True
    short = hostname.split(".", 1)[0]
    return fnmatch.fnmatchcase(hostname, pattern) or fnmatch.fnmatchcase(short, pattern)


def judge(drift: Sequence[Drift], plan: Plan) -> Status:
    """A resource's status from its drift and the plan for it, the same for diff and apply."""
    if not drift:
        return Status.OK
    if plan.converging:
        return Status.CONVERGING
    if plan.blocked:
        return Status.BLOCKED
    return Status.DRIFT


def _plan_message(plan: Plan) -> str:
    out = ""
    for m in (plan.blocked, plan.converging, plan.message):
        if m:  # a part that starts on a line of its own needs no separator
            out = m if not out else out + ("" if m.startswith("\n") else "; ") + m
    return out


def observe_group(rec: Reconciler, host: Host, group: list[Resource]) -> dict[str, Any]:
    """One kind's observation by id; an ObserveError for what could not be observed."""
    try:
        found = rec.observe(host, group)
    except ObserveError as exc:
        found = {r.id: exc for r in group}
    except Exception as exc:  # a bug in a reconciler must not hide the other resources
        if os.environ.get("RECONCILE_DEBUG"):
            raise
        found = {r.id: ObserveError(f"internal error while observing: {type(exc).__name__}: {exc}")
                 for r in group}
    return {r.id: found.get(r.id, ObserveError("not observed")) for r in group}


def observe_to_pipe(rec: Reconciler, host: Host, group: list[Resource], out: Any) -> None:
    """In a forked child: observe one kind and write the pickled result."""
    host.heartbeat_to = out  # this child's copy of the host: its heartbeats go to the parent
    try:
        payload = pickle.dumps(("observed", observe_group(rec, host, group)))
    except BaseException:  # a bug let through by RECONCILE_DEBUG, or an observation pickle refuses
        import traceback

        payload = pickle.dumps(("bug", traceback.format_exc()))
    out.write(payload)


def start_observer(rec: Reconciler, host: Host, group: Sequence[Resource]) -> tuple[ForkedChild, float] | None:
    """Fork the child that observes `group`, with its deadline, when the kind observes in one
    (`observe_deadline`); None when it observes in this process. OSError when the fork fails."""
    seconds = rec.observe_deadline(group) if group else None
    if seconds is None:
        return None
    return host.fork_call(observe_to_pipe, rec, host, list(group)), time.monotonic() + seconds


class Prefetch:
    """Observation started while the state file is still being built (`statefile.load(on_kind=)`).

    A kind observed in a child (`observe_deadline`) is forked as soon as its resources exist, so
    its slow part (pynvml's import in the GPU child, about 50 ms) runs on another CPU while the
    other kinds are imported and built; Engine.observe takes the child over. For read-only
    commands only (diff, apply --dry-run): apply observes after taking its lock."""

    def __init__(self, host: Host | None = None):
        self.host = host or LocalHost()
        self._started: dict[frozenset[str], tuple[ForkedChild, float]] = {}

    def __call__(self, rec: Reconciler, resources: Sequence[Resource]) -> None:
        try:
            started = start_observer(rec, self.host, resources)
        except OSError:
            return  # Engine.observe tries again and reports what goes wrong
        if started is not None:
            self._started[frozenset(r.id for r in resources)] = started

    def take(self, group: Sequence[Resource]) -> tuple[ForkedChild, float] | None:
        """The child observing exactly these resources, once."""
        return self._started.pop(frozenset(r.id for r in group), None)


class Engine:
    def __init__(self, state: LoadedState, host: Host | None = None,
                 journal: Callable[[dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.time, prefetch: Prefetch | None = None,
                 history_path: str | os.PathLike | None = None):
        self.state = state
        self.host = host or LocalHost()
        self.prefetch = prefetch
        self.journal = journal
        self.clock = clock
        self._reconcilers: dict[str, Reconciler] = {}
        # The journal the kinds read their history from (GPU recovery caps): the one written, else
        # HISTORY_PATH, else the default journal (diff reads what apply wrote).
        self.history_path = getattr(journal, "path", None) or history_path
        self.ctx = Context(resources=state.by_id, history=self._history)
        self.run_id = os.urandom(6).hex()  # ties a run's journal lines together
        self.journal_error = ""
        self.machine: dict[str, Any] | None = None  # machine_of(host), read when a run starts
        self.ending = ""  # an `ends_run` action was carried out (a reboot requested): why nothing more is done

    def reconciler(self, resource: Resource) -> Reconciler:
        key = key_of(resource.kind)
        if key is None:
            raise KeyError(f"no kind {resource.kind!r} in the registry (reconcilers/__init__.py)")
        if key not in self._reconcilers:
            self._reconcilers[key] = reconciler_for(key)
            self._reconcilers[key].context = self.ctx
        return self._reconcilers[key]

    # --- observe ---------------------------------------------------------------------

    def observe(self, resources: Sequence[Resource]) -> dict[str, Any]:
        """Observed state (or an ObserveError) by id, one batched call per kind.

        Kinds are observed at the same time: kinds with an `observe_deadline` each in a forked
        child (abandoned and reported when late; it also runs on another CPU), the others in
        threads, since most of their time goes to waiting (systemctl, a probe child). Children,
        and kinds that fork (`forks_to_observe`), go first, before any thread exists: forking
        a threaded process can leave the child stuck on a lock another thread held."""
        by_kind: dict[str, list[Resource]] = {}
        for r in resources:
            by_kind.setdefault(r.kind, []).append(r)
        found: dict[str, Any] = {}
        children: dict[str, tuple[ForkedChild, float]] = {}
        in_process: list[list[Resource]] = []
        for group in by_kind.values():
            started = self.prefetch.take(group) if self.prefetch else None
            try:
                started = started or start_observer(self.reconciler(group[0]), self.host, group)
            except OSError as exc:
                found.update({r.id: ObserveError(f"cannot start a child to observe {r.kind}: {exc.strerror}")
                              for r in group})
                continue
            if started is None:
                in_process.append(group)
            else:
                children[group[0].kind] = started
        forking = [g for g in in_process if self.reconciler(g[0]).forks_to_observe]
        threaded = [g for g in in_process if not self.reconciler(g[0]).forks_to_observe]
        for group in forking:
            found.update(self._observe_kind(group))
        if threaded:
            found.update(self._observe_threaded(threaded))
        if children:
            found.update(self._collect(by_kind, children))
        return {r.id: found[r.id] for r in resources}

    def _observe_threaded(self, groups: list[list[Resource]]) -> dict[str, Any]:
        """One thread per kind but the first, which this thread observes itself."""
        import threading

        results: list[dict[str, Any] | BaseException] = [{} for _ in groups]

        def work(i: int) -> None:
            try:
                results[i] = self._observe_kind(groups[i])
            except BaseException as exc:  # only with RECONCILE_DEBUG: raised again below
                results[i] = exc

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(1, len(groups))]
        for t in threads:
            t.start()
        work(0)
        for t in threads:
            t.join()
        found: dict[str, Any] = {}
        for result in results:
            if isinstance(result, BaseException):
                raise result
            found.update(result)
        return found

    def _collect(self, by_kind: Mapping[str, list[Resource]],
                 children: Mapping[str, tuple[ForkedChild, float]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        seconds = {kind: self.reconciler(by_kind[kind][0]).observe_deadline(by_kind[kind]) or 0.0
                   for kind in children}
        idle = {kind: seconds[kind] for kind in children if self.reconciler(by_kind[kind][0]).observe_idle}
        collected = collect_children(children, idle, self._progress_sink())
        for kind, (said, finished) in collected.items():
            group, child = by_kind[kind], children[kind][0]
            if not finished:
                within = f"{'made no progress for' if kind in idle else 'did not finish within'} " \
                         f"{format_duration(seconds[kind])}"
                found.update({r.id: ObserveError(
                    f"observing {r.kind} {within}: the host does not answer (a wedged driver or a hung "
                    f"filesystem?); observer pid {child.pid} abandoned") for r in group})
                continue
            try:
                tag, value = pickle.loads(split_beats(said)[1])
            except Exception:
                tag, value = "died", f"the observer exited {child.returncode} without an answer"
            if tag == "observed":
                found.update(value)
                continue
            if tag == "bug" and os.environ.get("RECONCILE_DEBUG"):
                raise RuntimeError(f"observing {kind} failed in its child:\n{value}")
            reason = value.strip().splitlines()[-1] if tag == "bug" else value
            found.update({r.id: ObserveError(f"internal error while observing: {reason}") for r in group})
        return found

    def _progress_sink(self) -> Callable[[str | None, float | None, float | None, str], None] | None:
        """Where progress goes: the host's progress line, when the command line shows one."""
        return getattr(self.host, "on_progress", None)

    def _progress(self, what: str | None, done: float | None = None, total: float | None = None,
                  unit: str = "") -> None:
        """Progress of a long wait (done None: it is over; what None: everything is)."""
        sink = self._progress_sink()
        if sink is not None:
            sink(what, done, total, unit)

    def _observe_kind(self, group: list[Resource]) -> dict[str, Any]:
        return observe_group(self.reconciler(group[0]), self.host, group)

    def _assess(self, r: Resource, obs: Any) -> tuple[list[Drift], Plan]:
        rec = self.reconciler(r)
        drift = rec.diff(r, obs)
        return drift, rec.plan(r, obs, drift, self.ctx)

    def _report(self, r: Resource, obs: Any, actions: Sequence[ActionResult] = (),
                extra: str = "", status: Status | None = None) -> ResourceReport:
        if isinstance(obs, ObserveError):
            return ResourceReport(r, Status.ERROR, actions=tuple(actions),
                                  message="; ".join(m for m in (str(obs), extra) if m))
        drift, plan = self._assess(r, obs)
        planned = tuple(ActionResult(a, Result.PLANNED) for a in plan.actions) if not actions else ()
        return ResourceReport(
            r, status or judge(drift, plan), tuple(drift), tuple(actions) or planned,
            "; ".join(m for m in (extra, _plan_message(plan)) if m), obs,
            self.reconciler(r).summary(r, obs), plan.caveats,
        )

    # --- diff ------------------------------------------------------------------------

    def diff(self, command: str = "diff") -> RunReport:
        started = self.clock()
        self.machine = machine_of(self.host)
        check_machine(self.state, self.machine, "diff")
        observed = self.observe(self.state.resources)
        reports = []
        for r in self.state.resources:
            try:
                reports.append(self._report(r, observed[r.id]))
            except Exception as exc:
                if os.environ.get("RECONCILE_DEBUG"):
                    raise
                reports.append(ResourceReport(r, Status.ERROR, message=f"internal error: {exc!r}"))
        self._progress(None)  # the report comes next: no progress line left under it
        return self._run_report(command, reports, started, dry_run=command != "diff")

    def _run_report(self, command: str, reports: list[ResourceReport], started: float,
                    dry_run: bool = False) -> RunReport:
        hostname = self.host.hostname()
        matches = host_matches(self.state.host, hostname)
        notes = () if matches else (f"this host is {hostname!r}, the state file is for {self.state.host!r}",)
        return RunReport(command, self.state.path, hostname, tuple(reports), self.state.host, matches,
                         dry_run, started, self.clock(), notes, self.machine or machine_of(self.host))

    # --- apply -----------------------------------------------------------------------

    def apply(self, on_result: Callable[[ResourceReport], None] | None = None,
              only: Mapping[str, Collection[tuple[str, str]]] | None = None) -> RunReport:
        """Act on every resource. `only` (resource id -> allowed (action, target) pairs), when given,
        limits what is carried out, e.g. to a saved plan: other planned actions are reported as skipped."""
        started = self.clock()
        hostname = self.host.hostname()
        if not host_matches(self.state.host, hostname):
            raise HostMismatch(f"this host is {hostname!r}, but {self.state.path} is for "
                               f"{self.state.host!r}: refusing to apply")
        self.machine = machine_of(self.host)
        check_machine(self.state, self.machine, "apply")
        observed = self.observe(self.state.resources)  # all at once, before anything is changed
        host_changed = False
        final: dict[str, ResourceReport] = {}

        for r in self.state.resources:
            if self.ending:
                final[r.id] = ResourceReport(r, Status.CONVERGING, message=f"not observed or acted on: {self.ending}")
                if on_result:
                    on_result(final[r.id])
                continue
            try:
                if host_changed:
                    # Something acted since this was observed (a unit stop frees GPUs): look again,
                    # giving the host the resource's settle time to catch up with that change.
                    observed[r.id] = self._verify(r)
                report, changed = self._apply_one(r, observed[r.id], final, only)
            except Exception as exc:
                if os.environ.get("RECONCILE_DEBUG"):
                    raise
                report, changed = ResourceReport(r, Status.ERROR, message=f"internal error: {exc!r}"), False
            host_changed = host_changed or changed
            final[r.id] = report
            if on_result:
                on_result(report)
        self._progress(None)
        return self._run_report("apply", [final[r.id] for r in self.state.resources], started)

    def _apply_one(self, r: Resource, obs: Any, final: dict[str, ResourceReport],
                   only: Mapping[str, Collection[tuple[str, str]]] | None = None) -> tuple[ResourceReport, bool]:
        if isinstance(obs, ObserveError):
            return self._report(r, obs), False
        unmet = [n for n in r.needs if n in final and final[n].status is not Status.OK]
        if unmet:
            drift, plan = self._assess(r, obs)
            if not drift:
                return self._report(r, obs), False
            skipped = tuple(ActionResult(a, Result.SKIPPED) for a in plan.actions)
            why = ", ".join(f"{n} is {final[n].status.value}" for n in unmet)
            return ResourceReport(r, Status.BLOCKED, tuple(drift), skipped,
                                  f"not acted on: needs not ok ({why})", obs,
                                  self.reconciler(r).summary(r, obs), plan.caveats), False

        rec = self.reconciler(r)
        results: list[ActionResult] = []
        failure = ""
        allowed = None if only is None else set(only.get(r.id, ()))
        not_allowed: dict[tuple[str, str], Action] = {}
        once_done: set[tuple[str, str]] = set()  # `once` actions carried out: never again in this apply
        for _ in range(MAX_PASSES):
            drift, plan = self._assess(r, obs)
            actions = plan.actions
            if allowed is not None:
                not_allowed.update({(a.action, a.target): a for a in actions if (a.action, a.target) not in allowed})
                actions = tuple(a for a in actions if (a.action, a.target) in allowed)
            # A later pass planning a `once` action again (a job started in the first pass exited at
            # once, and the observation changed in other ways) does not repeat it: the report says
            # what came of the first, and the next apply decides again.
            actions = tuple(a for a in actions if (a.action, a.target) not in once_done)
            if not actions:
                break
            before = to_plain(obs)
            pass_results = []
            for action in actions:
                # The journal is the recovery timeline: each action's intent is on disk before it
                # starts and its result when it ends, so after a kill -9 the journal says what may
                # have been done. An intent that cannot be written refuses the action.
                t0 = self.clock()
                refused_by = self.journal_error or self._write(self._line("intent", r, action, t0, before=before))
                if refused_by:
                    pass_results.append(ActionResult(action, Result.FAILED, f"not carried out: {refused_by}",
                                                     t0, self.clock()))
                    failure = f"{action.action} {action.target} not carried out: {refused_by}"
                    break
                stop = False
                try:
                    msg = rec.apply(self.host, r, action)
                    done = ActionResult(action, Result.DONE, msg or "", t0, self.clock())
                except (ApplyError, PermissionError, OSError) as exc:
                    done = ActionResult(action, Result.FAILED, str(exc), t0, self.clock())
                    failure = "; ".join(m for m in (failure, f"{action.action} {action.target} failed: {exc}") if m)
                    # One GPU's setting failed: the other GPUs' actions still run.
                    stop = not getattr(exc, "independent", False)
                lost = self._write(self._line("result", r, action, done.finished, started=t0,
                                              result=done.result.value, message=done.message))
                if lost:  # carried out, but not recorded: said loudly, and nothing more is done
                    done = replace(done, message="; ".join(m for m in (done.message, f"result not journaled: {lost}")
                                                           if m))
                    failure = failure or f"{action.action} {action.target} was carried out but {lost}"
                    stop = True
                pass_results.append(done)
                if action.once:
                    once_done.add((action.action, action.target))
                if action.ends_run and done.result is Result.DONE:
                    self.ending = f"{action.description or action.action} was requested ({done.message})"
                    stop = True
                if stop:
                    break
            if self.ending:  # the host is going down: nothing more is observed or done
                results.extend(pass_results)
                results.extend(ActionResult(a, Result.SKIPPED) for a in actions
                               if id(a) not in {id(p.action) for p in pass_results})
                return ResourceReport(r, Status.CONVERGING, tuple(drift), tuple(results), self.ending, obs,
                                      rec.summary(r, obs), plan.caveats), True
            obs = self._verify(r)
            after = None if isinstance(obs, ObserveError) else to_plain(obs)
            if pass_results and not self.journal_error:
                self._write({"event": "verified", "time": utc_iso(self.clock(), millis=True), "run": self.run_id,
                             "resource": r.id, "after": after})
            results.extend(pass_results)
            # Actions the failed one would have been followed by are reported as skipped.
            if failure:
                done = {id(p.action) for p in pass_results}
                results.extend(ActionResult(a, Result.SKIPPED) for a in actions if id(a) not in done)
                break
            if isinstance(obs, ObserveError) or after == before:
                break  # unobservable now, or the pass changed nothing: another would not either

        refused = ""
        if not_allowed:
            results.extend(ActionResult(a, Result.SKIPPED, "not in the saved plan") for a in not_allowed.values())
            refused = f"{len(not_allowed)} planned action(s) not carried out: not in the saved plan"
        changed = any(a.result is Result.DONE for a in results)
        if not results:
            return self._report(r, obs), False
        report = self._report(r, obs, results, extra="; ".join(m for m in (failure, refused) if m))
        if self.journal_error and failure:
            report = replace(report, status=Status.ERROR)
        elif report.status is Status.OK and failure:
            report = replace(report, status=Status.DRIFT)
        elif report.status is Status.DRIFT and (changed or failure):
            report = replace(report, message="; ".join(
                m for m in ("not verified: drift remains after acting", report.message) if m))
        return report, changed

    def _verify(self, r: Resource) -> Any:
        """Observe again; poll up to the resource's settle time for drift that may still clear."""
        deadline = time.monotonic() + r.settle
        waiting = None
        while True:
            obs = self.observe([r])[r.id]
            if isinstance(obs, ObserveError):
                if waiting:
                    self._progress(waiting)
                return obs
            drift, _ = self._assess(r, obs)
            # Drift that waiting cannot clear (a broken GPU next to freed ones) ends the wait at once.
            if not drift or not self.reconciler(r).settles(drift) or time.monotonic() >= deadline:
                if waiting:
                    self._progress(waiting)
                return obs
            # apply waiting for GPU memory to be freed after a stop: on the progress line
            waiting = f"{r.id}: waiting for it to settle ({', '.join(d.field for d in drift)})"
            self._progress(waiting, r.settle - (deadline - time.monotonic()), r.settle, "s")
            time.sleep(min(SETTLE_POLL, max(0.0, deadline - time.monotonic())))

    def _history(self, since: float) -> list[dict[str, Any]]:
        """The journal's entries since SINCE (epoch seconds), newest first: what the kinds may know of
        what earlier runs did (Context.history)."""
        if isinstance(self.journal, ActionLog):
            return [e for e in reversed(self.journal.entries) if (_when(e) or 0.0) >= since]
        from pathlib import Path

        from ..core.paths import default_journal_path
        from .journal_read import read_newest_first

        path = Path(self.history_path or default_journal_path())
        return [e for e in read_newest_first(path, since) if (_when(e) or since) >= since]

    def _line(self, event: str, r: Resource, action: Action, when: float, **extra: Any) -> dict[str, Any]:
        boot = (self.machine or {}).get("boot_id")
        if boot:  # which boot it was done in: a reboot's intent and what came of it are in two boots
            extra = {"boot": boot, **extra}
        return {"event": event, "time": utc_iso(when, millis=True), "run": self.run_id, "pid": os.getpid(),
                "resource": r.id, "action": action.action, "target": action.target,
                "description": action.description, **{k: (utc_iso(v, millis=True) if k == "started" else v)
                                                       for k, v in extra.items()}}

    def _write(self, entry: dict[str, Any]) -> str:
        """Append one journal line (the journal fsyncs it); the reason when it cannot be written,
        which from then on refuses every further action of this run: nothing done without a record."""
        if not self.journal or self.journal_error:
            return self.journal_error
        try:
            self.journal(entry)
        except OSError as exc:
            self.journal_error = f"the journal cannot be written ({exc.strerror or exc})"
        return self.journal_error


def _when(entry: Mapping[str, Any]) -> float | None:
    from .journal_read import parse_time

    return parse_time(entry.get("time"))


@dataclass
class ActionLog:
    """Collects journal entries in memory (tests, saved plans)."""

    entries: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)


__all__ = ["Engine", "RunReport", "ResourceReport", "HostMismatch", "judge", "host_matches", "Action"]
