"""`reconcile watch`: keep a host converged, level-triggered.

Each pass does what `reconcile apply` does (observe everything, act, verify by observing
again) under the apply lock, through the one run path (runs.py, which takes the lock),
whatever did or did not happen since the last pass: no event is needed to notice drift, and a
missed event cannot leave drift behind.

- The state file is read each pass and reloaded when its bytes change (a `git pull`
  deployment). A state file that does not validate is not applied, not even its last good
  version: reverting the host to a state the repository no longer holds would be worse.
- After a failed pass (a resource that cannot be observed, an action that failed, a bad
  state file) the next one waits interval * 2^n, capped at 10 minutes; one good pass resets it.
- SIGTERM or SIGINT ends the loop after the current step: the resource being worked on is
  finished and verified, the lock released, and the process exits 0. systemd must send the
  signal to this process only (KillMode=mixed): the systemctl it may be running must finish.
- One journal line ({"event": "watch-pass", ...}) per pass that changed something, after the
  engine's line per action; one log line (stdout, i.e. the systemd journal) per pass whose
  outcome differs from the previous one, every pass with --verbose.
- After each pass that ran to its end, `on_pass(run)` gets it as a runs.Finished: its report's
  JSON form, or the refusal that stopped it (as its error report), its outcome (`ok`, `failed`
  or `skipped`) and the wait before the next pass. The CLI hands in the sinks asked for
  (doors/sinks/, e.g. the textfile of `--textfile DIR`); what a sink cannot do is logged.
"""

from __future__ import annotations

import hashlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..core.contract import utc_iso
from ..core.escape import escape_controls
from ..core.refusals import Refusal

if TYPE_CHECKING:
    from .runs import Finished

MAX_BACKOFF = 600.0


class _StopRequested(Exception):
    pass


class _PassFailed(Exception):
    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.problems = problems or (message,)


def backoff(interval: float, failures: int, cap: float = MAX_BACKOFF) -> float:
    """The wait before the next pass after `failures` failed passes in a row."""
    if failures <= 0:
        return interval
    return max(interval, min(interval * 2.0 ** failures, cap))



class Watcher:
    def __init__(self, state_path: str, interval: float, journal: Callable[[dict[str, Any]], None] | None,
                 lock_file: Path | None = None, lock_wait: float = 30.0, verbose: bool = False,
                 log: IO[str] | None = None, max_backoff: float = MAX_BACKOFF, max_passes: int | None = None,
                 wait: Callable[[float], None] | None = None,
                 on_pass: Callable[[Finished], Any] | None = None):
        """`journal`: where the engine's lines go (a Journal: its apply lock is taken for each
        pass); `lock_file`: another apply lock (tests), none when there is neither."""
        self.state_path = state_path
        self.interval = interval
        self.journal = journal
        self.lock_file = lock_file
        self.lock_wait = lock_wait
        self.verbose = verbose
        self.out = log or sys.stdout
        self.max_backoff = max_backoff
        self.max_passes = max_passes
        self._wait_fn = wait
        self.on_pass = on_pass
        self.pass_report: Any = None
        self.pass_outcome = "failed"
        self.pass_error: tuple[Refusal, float] | None = None  # (refusal, started) of a pass without a report
        self.passes = 0
        self.failures = 0
        self.delays: list[float] = []
        self.stop_signal: str | None = None
        self._state = None
        self._state_sha: str | None = None
        self._last_outcome: Any = None
        self._wake: tuple[int, int] | None = None

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> int:
        restore = self._install_signals()
        self.log(f"watching {self.state_path} every {self.interval:g}s (pid {os.getpid()})")
        try:
            while not self.stop_signal:
                delay = self.one_pass()
                self._after_pass(delay)
                if self.stop_signal or (self.max_passes is not None and self.passes >= self.max_passes):
                    break
                self.delays.append(delay)
                self._wait(delay)
        finally:
            restore()
        why = f"{self.stop_signal} received" if self.stop_signal else "done"
        self.log(f"stopped cleanly after {self.passes} pass{'es' if self.passes != 1 else ''} ({why})")
        return 0

    def one_pass(self) -> float:
        """One observe-apply-verify pass; returns how long to wait before the next."""
        from ..core.contract import Result, Status
        from . import runs

        self.passes += 1
        self.pass_report, self.pass_outcome, self.pass_error = None, "failed", None
        started = time.time()
        try:
            state = self._current_state()
        except _PassFailed as exc:
            self.pass_error = (Refusal("state-file", str(exc), problems=exc.problems), started)
            return self._failed(str(exc))
        done: list[Any] = []

        def after_resource(report: Any) -> None:
            done.append(report)
            if self.stop_signal:
                raise _StopRequested

        try:
            report = runs.apply(state, None, self.journal, self.lock_wait, on_result=after_resource,
                                lock_file=self.lock_file)
        except _StopRequested:
            self.pass_outcome = "interrupted"
            self._record(done, started, interrupted=True)
            self.log(f"pass {self.passes}: {self.stop_signal} received: stopped after "
                     f"{len(done)} of {len(state.resources)} resources")
            return 0.0
        except Exception as exc:
            if os.environ.get("RECONCILE_DEBUG"):
                raise
            report = Refusal("internal-error", f"{type(exc).__name__}: {exc}")
        if isinstance(report, Refusal):
            self.pass_error = (report, started)
            if report.reason == "lock-held":
                # Someone is applying by hand: not a failure, the next pass looks again.
                self.log(f"pass {self.passes}: skipped: {report.message}")
                self.pass_outcome = "skipped"
                return self.interval
            internal = "internal error: " if report.reason == "internal-error" else ""
            return self._failed(internal + report.message)

        self.pass_report = report
        self._record(report.resources, started)
        failed = sum(1 for r in report.resources for a in r.actions if a.result is Result.FAILED)
        errors = report.count(Status.ERROR)
        counts = {s.value: report.count(s) for s in Status if report.count(s)}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items()) or "no resources"
        if errors or failed:
            why = [f"{r.resource.id}: {r.message.splitlines()[0] if r.message else r.status.value}"
                   for r in report.resources if r.status is Status.ERROR or
                   any(a.result is Result.FAILED for a in r.actions)]
            return self._failed(f"{report.actions_done} action(s) done, {failed} failed; {summary}; "
                                + "; ".join(why))
        self.failures = 0
        self.pass_outcome = "ok"
        outcome = (tuple(sorted(counts.items())), report.actions_done > 0)
        if self.verbose or report.actions_done or outcome != self._last_outcome:
            self.log(f"pass {self.passes}: {report.actions_done} action(s) done; {summary}")
        self._last_outcome = outcome
        return self.interval

    # --- helpers ---------------------------------------------------------------------

    def _after_pass(self, delay: float | None = None) -> None:
        if self.on_pass is None or self.pass_outcome == "interrupted":
            return
        from .runs import finished

        if self.pass_report is not None:
            run = finished(self.pass_report, "apply", self.state_path, outcome=self.pass_outcome, next_in=delay)
        elif self.pass_error is not None:
            # No report: the refusal, as `diff --format json` would print it, so the metrics say why.
            refusal, started = self.pass_error
            run = finished(refusal, "apply", self.state_path, outcome=self.pass_outcome, next_in=delay)
            run.doc["started"] = started  # type: ignore[index]  (a fresh dict: the pass's start)
        else:
            return
        try:
            self.on_pass(run)
        except Exception as exc:  # e.g. the textfile directory is gone: say so, keep converging
            if os.environ.get("RECONCILE_DEBUG"):
                raise
            self.log(f"pass {self.passes}: {exc}")

    def _failed(self, message: str) -> float:
        self.failures += 1
        delay = backoff(self.interval, self.failures, self.max_backoff)
        self._last_outcome = None
        self.log(f"pass {self.passes}: failed: {message}; next pass in {delay:g}s")
        return delay

    def _record(self, resources: Any, started: float, interrupted: bool = False) -> None:
        """The journal line of a pass that changed something (the engine wrote one per action)."""
        from ..core.contract import Result

        changed = [r for r in resources if any(a.result in (Result.DONE, Result.FAILED) for a in r.actions)]
        if not changed:
            return
        for r in changed:
            for a in r.actions:
                if a.result in (Result.DONE, Result.FAILED):
                    self.log(f"  {r.resource.id}: {a.action.action} {a.action.target}: {a.result.value}"
                             + (f" ({a.message})" if a.result is Result.FAILED and a.message else ""))
        if not self.journal:
            return
        self.journal({
            "time": utc_iso(millis=True),
            "event": "watch-pass",
            "pass": self.passes,
            "pid": os.getpid(),
            "state_file": self.state_path,
            "state_sha256": self._state_sha,
            "resources": {r.resource.id: r.status.value for r in changed},
            "actions_done": sum(1 for r in changed for a in r.actions if a.result is Result.DONE),
            "actions_failed": sum(1 for r in changed for a in r.actions if a.result is Result.FAILED),
            "interrupted": interrupted,
            "duration_s": round(time.time() - started, 3),
        })

    def _current_state(self) -> Any:
        from .statefile import StateFileError, load

        try:
            raw = Path(self.state_path).read_bytes()
        except OSError as exc:
            raise _PassFailed(f"{self.state_path}: cannot read: {exc.strerror}; not applying") from None
        sha = hashlib.sha256(raw).hexdigest()
        if sha == self._state_sha and self._state is not None:
            return self._state
        try:
            try:
                # The bytes just hashed, not a second read that could see a newer version.
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = None  # let load() say where, as `reconcile validate` does
            state = load(self.state_path, text=text)
        except StateFileError as exc:
            raise _PassFailed("state file does not validate, not applying it: " + "; ".join(exc.problems),
                              tuple(exc.problems)) from None
        verb = "loaded" if self._state_sha is None else "changed, reloaded"
        self._state, self._state_sha = state, sha
        self.log(f"state file {self.state_path} {verb} (sha256 {sha[:12]}, {len(state.resources)} resources)")
        for warning in state.warnings:  # old spellings: once per version of the file, not every pass
            self.log(warning)
        return state

    def log(self, line: str) -> None:
        # Unit names, messages and state file paths in it: escaped for a terminal (and one journal
        # record per line under systemd), core/escape.py.
        self.out.write(escape_controls(line) + "\n")
        self.out.flush()  # a service's stdout is a pipe or file: unflushed lines arrive late or never

    # --- signals and waiting -----------------------------------------------------------

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._wake = (r, w)
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def handler(signum: int, _frame: Any) -> None:
            # Only a flag: the loop stops at its next step. A second signal ends at once.
            self.stop_signal = signal.Signals(signum).name
            signal.signal(signum, signal.SIG_DFL)

        for sig in previous:
            signal.signal(sig, handler)
        # The C-level handler writes to this pipe, which wakes a select() sleeping between passes.
        old_fd = signal.set_wakeup_fd(w)

        def restore() -> None:
            signal.set_wakeup_fd(old_fd)
            for sig, h in previous.items():
                signal.signal(sig, h)
            os.close(r)
            os.close(w)
            self._wake = None

        return restore

    def _wait(self, delay: float) -> None:
        if self._wait_fn is not None:
            self._wait_fn(delay)
            return
        deadline = time.monotonic() + delay
        while not self.stop_signal:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._wake is None:
                time.sleep(min(left, 0.5))
                continue
            ready, _, _ = select.select([self._wake[0]], [], [], left)
            if ready:
                try:
                    os.read(self._wake[0], 512)
                except BlockingIOError:
                    pass
