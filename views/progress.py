"""The progress line: long work shown on a terminal while it runs, on stderr only.

What reports progress (Host.progress and the engine): the first integrity check of an
extraction (samples checked of the total, the rate, the time left), the files it then reads
whole, `apply` waiting for a resource to settle (GPU memory freed after a stop), and any command
that runs longer than half a second (a `systemctl stop` waiting for its unit). One line, redrawn
at most 10 times a second and only after the work has gone on for half a second (quick work
never flashes a line), erased when the work is over and before the report is printed.

Shown only with `--format text` and when stderr is a terminal (not TERM=dumb, which cannot
redraw a line; NO_COLOR does not hide it, the line has no colour): never in
JSON, JUnit or Prometheus output, never in a pipe, a log or a CI run. Written here rather than
taken from tqdm or rich: one line fed by several kinds of work (counts with a total, waits in
seconds, from this process and from observer children), cleared before the report; that is
these sixty lines, and no package to install or import.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

from ..core.escape import escape_controls

SHOW_AFTER = 0.5  # seconds a piece of work runs before its line appears
REDRAW = 0.1  # seconds between redraws at most


def attach(host: Any, fmt: str, stream: IO[str] | None = None) -> Any:
    """Give `host` a progress line on `stream` (stderr) when one should be shown; returns host."""
    stream = stream or sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if fmt == "text" and tty and os.environ.get("TERM") != "dumb":
        # Test seam: $RECONCILE_PROGRESS_AFTER, the seconds before a line appears (tests: 0).
        try:
            after = float(os.environ.get("RECONCILE_PROGRESS_AFTER", SHOW_AFTER))
        except ValueError:
            after = SHOW_AFTER
        host.on_progress = ProgressLine(stream, after=after)
    return host


class ProgressLine:
    def __init__(self, stream: IO[str], clock=time.monotonic, after: float = SHOW_AFTER):
        import threading  # here: only a terminal that shows the line pays for the import

        self.stream, self.clock, self.after = stream, clock, after
        self._lock = threading.Lock()  # kinds observed in threads may run long commands at once
        self._what: str | None = None
        self._first: tuple[float, float] = (0.0, 0.0)  # when this work was first seen, and its count then
        self._drawn = False
        self._last_draw = 0.0

    def __call__(self, what: str | None, done: float | None, total: float | None, unit: str) -> None:
        with self._lock:
            now = self.clock()
            if done is None:  # `what` is over (None: everything)
                if what is None or what == self._what:
                    self._erase()
                    self._what = None
                return
            if what != self._what:
                self._what, self._first = what, (now, done)
            since, first_done = self._first
            if now - since < self.after or (self._drawn and now - self._last_draw < REDRAW):
                return
            self._last_draw = now
            self._write("\r" + self._fit(render(what, done, total, unit, now - since, done - first_done)) + "\x1b[K")
            self._drawn = True

    def _erase(self) -> None:
        if self._drawn:
            self._write("\r\x1b[K")
            self._drawn = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def _fit(self, text: str) -> str:
        try:
            width = os.get_terminal_size(self.stream.fileno()).columns or 80  # 0: a terminal without a size
        except (OSError, ValueError, AttributeError):
            width = 80
        return text if len(text) < width else text[:max(1, width - 2)] + "…"


def render(what: str, done: float, total: float | None, unit: str, elapsed: float, gained: float) -> str:
    """One line: `what: 41,000/100,000 samples (41%), 8,200/s, ETA 7s`, or for a wait in
    seconds `what: 12s of 90s`. `what` names files and units: escaped (core/escape.py), so a name
    cannot move the cursor or overwrite the line it is drawn on."""
    what = escape_controls(what)
    if unit == "s":
        return f"{what}: {_duration(done)}" + (f" of {_duration(total)}" if total else "")
    text = f"{what}: {done:,.0f}" + (f"/{total:,.0f}" if total else "") + (f" {unit}" if unit else "")
    if total:
        text += f" ({100 * done / total:.0f}%)"
    rate = gained / elapsed if elapsed > 0 else 0.0
    if rate > 0:
        text += f", {rate:,.0f}/s"
        if total and total > done:
            text += f", ETA {_duration((total - done) / rate)}"
    return text


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m"
