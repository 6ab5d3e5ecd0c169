"""The Prometheus textfile: DIR/reconcile.prom, written whole after every run, for
node_exporter's textfile collector (docs/prometheus.md).

`reconcile diff|apply --textfile DIR --interval D` (cron) writes the run's metrics whatever
its outcome, a refusal included (reconcile_up 0 and why). `reconcile watch --textfile DIR`
writes after each pass the last report's metrics and the counters of the watch process: a pass
that produced no report keeps the previous report's metrics, whose timestamp then ages, and
says why it could not run (reconcile_up 0, reconcile_error_info{reason}), on which
ReconcileCannotRun fires. The metrics themselves are views/prometheus.py's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import SinkError, SinkOption

if TYPE_CHECKING:
    from ...pipeline.runs import Finished

TEXTFILE_NAME = "reconcile.prom"


def write_textfile(directory: str | os.PathLike, text: str, name: str = TEXTFILE_NAME) -> str:
    """Write DIR/NAME whole: a temporary file beside it (a dot name without `.prom`, which the
    collector ignores), then rename(2), so a scrape never reads half a file."""
    from ...core.atomic import write_text

    path = os.path.join(os.fspath(directory), name)
    write_text(path, text, mode=0o644)  # node_exporter reads it as its own user
    return path


class Textfile:
    """DIR/reconcile.prom after each run (`interval`: how often runs come, for the not-running
    and staleness alerts); `watch`: a long-lived `reconcile watch`, whose counters it keeps."""

    OPTIONS = (
        SinkOption("--textfile", "DIR", "Also write DIR/reconcile.prom (atomically, whatever the outcome) for "
                                        "node_exporter's textfile collector; needs --interval.", directory=True),
        SinkOption("--interval", "DURATION", "With --textfile: how often this command runs (cron), for the "
                                             "not-running alert."),
        SinkOption("--textfile", "DIR", "After each pass write DIR/reconcile.prom (atomically) for node_exporter's "
                                        "textfile collector.", commands=("watch",), directory=True),
    )

    def __init__(self, directory: str | os.PathLike, interval: float, watch: bool = False,
                 clock: Callable[[], float] = time.time):
        self.directory = os.fspath(directory)
        self.interval = interval
        self.watch = watch
        self.clock = clock
        self.path = os.path.join(self.directory, TEXTFILE_NAME)
        self.passes: dict[str, int] = {"ok": 0, "failed": 0, "skipped": 0}
        self.actions = {"done": 0, "failed": 0}
        self.last_doc: Mapping[str, Any] | None = None

    @classmethod
    def from_options(cls, command: str, values: Mapping[str, Any], interval: float | None = None,
                     **_context: Any) -> Textfile | None:
        """`--textfile DIR` (and, but for the watch, whose own interval it takes, `--interval D`)."""
        directory, every = values.get("--textfile"), values.get("--interval")
        if command != "watch":
            if every and not directory:
                raise SinkError("--interval needs --textfile DIR")
            if not directory:
                return None
            if not every:
                raise SinkError("--textfile needs --interval (how often cron runs this; "
                                "the not-running alert needs it)")
            from ...core.values import parse_duration

            try:
                interval = parse_duration(every)
            except ValueError:
                raise SinkError(f"--interval: invalid duration {every!r} (use e.g. 30s, 5m)") from None
            if interval <= 0:
                raise SinkError("--interval must be more than 0s")
        if not directory:
            return None
        if not os.path.isdir(directory):
            raise SinkError(f"--textfile {directory}: no such directory "
                            "(node_exporter's --collector.textfile.directory)")
        return cls(directory, float(interval or 0.0), watch=command == "watch")

    def take(self, run: Finished) -> None:
        try:
            write_textfile(self.directory, self.pass_metrics(run) if self.watch else self.run_metrics(run))
        except OSError as exc:
            raise SinkError(f"--textfile {self.directory}: cannot write {TEXTFILE_NAME}: "
                            f"{exc.strerror or exc}") from None

    def run_metrics(self, run: Finished) -> str:
        from ...views.prometheus import run_metrics

        return run_metrics(run.doc, self.interval).text()

    def pass_metrics(self, run: Finished) -> str:
        """One pass of the watch: the last report's metrics, and the watch's own counters."""
        from ...views.prometheus import report_metrics, schedule_metrics

        doc = run.report
        self.passes[run.outcome] = self.passes.get(run.outcome, 0) + 1
        if doc is not None:
            self.last_doc = doc
            for res in doc.get("resources", []):
                for a in res.get("actions", []):
                    if a.get("result") in self.actions:
                        self.actions[a["result"]] += 1
        # A skipped pass (another apply held the lock) is not a failure: the last report stands.
        up = (doc is not None or run.outcome == "skipped") and self.last_doc is not None
        m = report_metrics(self.last_doc, up=up, attempt=None if up else run.doc)
        now = self.clock()
        schedule_metrics(m, self.interval, now + (self.interval if run.next_in is None else run.next_in))
        m.family("reconcile_watch_interval_seconds", "gauge", "reconcile watch's interval between passes.")
        m.add("reconcile_watch_interval_seconds", self.interval)
        m.family("reconcile_watch_passes_total", "counter", "Passes of this reconcile watch process by outcome.")
        for outcome, n in self.passes.items():
            m.add("reconcile_watch_passes_total", n, {"outcome": outcome})
        m.family("reconcile_watch_actions_total", "counter", "Actions this reconcile watch process carried out, "
                                                             "by result.")
        for result, n in self.actions.items():
            m.add("reconcile_watch_actions_total", n, {"result": result})
        m.family("reconcile_watch_last_pass_timestamp_seconds", "gauge", "When the last pass ended, whatever its "
                                                                         "outcome (Unix time).")
        m.add("reconcile_watch_last_pass_timestamp_seconds", round(now, 3))
        return m.text()
