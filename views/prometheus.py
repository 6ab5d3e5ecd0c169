"""The Prometheus view: a report as the text exposition format that node_exporter's textfile
collector reads (`--format prometheus`, `reconcile watch --textfile DIR`).

Names follow Prometheus' conventions (https://prometheus.io/docs/practices/naming/): the
`reconcile_` prefix, base units in the name (`_bytes`, `_seconds`, `_samples`), `_total` only on
counters, and one series per possible value of an enumeration (`status`, `health`) holding 1 for
the current one and 0 for the others, so a rule can say `== 1` and a vanished series is never
mistaken for a healthy one. What reconcile could not read is left out, never written as 0
(unknown is never ok); the resource's `status` says why.

Counters exist only where a process lives across runs: `reconcile watch` keeps them
(TextfileExporter); a one-off `diff`/`apply` reports the counts of its own run as gauges.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import IO, Any

from .. import FORMAT_VERSION, __version__
from ..pipeline.atomic import write_text
from ..pipeline.report import STATUSES

TEXTFILE_NAME = "reconcile.prom"
GPU_HEALTH = ("healthy", "unhealthy", "unknown")
ACTION_RESULTS = ("planned", "done", "failed", "skipped")


def escape_label(value: Any) -> str:
    """A label value as the exposition format wants it: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))  # shortest round-trip form; `inf`/`nan` never occur here


class Metrics:
    """Families in the order they were first declared, each with its samples."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[tuple[dict[str, Any], float | int | bool]]]] = {}

    def family(self, name: str, kind: str, help_text: str) -> None:
        self._families.setdefault(name, (kind, help_text, []))

    def add(self, name: str, value: float | int | bool | None, labels: Mapping[str, Any] | None = None) -> None:
        if value is None:  # unknown: no sample rather than a zero
            return
        self._families[name][2].append((dict(labels or {}), value))

    def text(self) -> str:
        lines: list[str] = []
        for name, (kind, help_text, samples) in self._families.items():
            if not samples:
                continue
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                body = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
                lines.append(f"{name}{{{body}}} {_number(value)}" if body else f"{name} {_number(value)}")
        return "\n".join(lines) + "\n"


def report_metrics(doc: Mapping[str, Any] | None, m: Metrics | None = None, up: bool = True) -> Metrics:
    """The metrics of one report (its JSON form, pipeline/report.py); `doc` None: no report, only
    `reconcile_up` and the build info."""
    m = m or Metrics()
    m.family("reconcile_up", "gauge", "1 when the last run produced a report; 0 when it could not run at all "
                                      "(state file unreadable or invalid, lock error, wrong host).")
    m.add("reconcile_up", 1 if up and doc is not None else 0)
    m.family("reconcile_build_info", "gauge", "reconcile's version and its report format version.")
    m.add("reconcile_build_info", 1, {"version": __version__, "format_version": FORMAT_VERSION})
    if doc is None:
        return m
    started, duration = float(doc.get("started") or 0.0), float(doc.get("duration_s") or 0.0)
    m.family("reconcile_last_run_timestamp_seconds", "gauge", "When the last run that produced a report ended "
                                                              "(Unix time).")
    m.add("reconcile_last_run_timestamp_seconds", round(started + duration, 3))
    m.family("reconcile_last_run_duration_seconds", "gauge", "How long the last run took.")
    m.add("reconcile_last_run_duration_seconds", duration)
    m.family("reconcile_last_run_exit_code", "gauge", "The last run's exit code: 0 converged, 2 drift remains, "
                                                      "1 error.")
    m.add("reconcile_last_run_exit_code", int(doc.get("exit_code", 1)))
    m.family("reconcile_last_run_info", "gauge", "The last run's command and state file.")
    m.add("reconcile_last_run_info", 1, {"command": doc.get("command", ""), "state_file": doc.get("state_file", ""),
                                         "dry_run": "true" if doc.get("dry_run") else "false"})

    resources = doc.get("resources", [])
    m.family("reconcile_resource_status", "gauge", "1 for the resource's status in the last run, 0 for the "
                                                   "other statuses.")
    m.family("reconcile_resource_drift_fields", "gauge", "How many of the resource's fields differ from the "
                                                         "state file.")
    for res in resources:
        ident = {"id": res["id"], "kind": res["kind"]}
        for status in STATUSES:
            m.add("reconcile_resource_status", int(res["status"] == status), {**ident, "status": status})
        m.add("reconcile_resource_drift_fields", len(res.get("drift", [])), ident)
    summary = doc.get("summary", {})
    m.family("reconcile_resources", "gauge", "Resources of the last run by status.")
    for status in STATUSES:
        m.add("reconcile_resources", int(summary.get(status, 0)), {"status": status})
    m.family("reconcile_last_run_actions", "gauge", "The last run's actions by result (planned: diff and "
                                                    "dry runs).")
    for result in ACTION_RESULTS:
        m.add("reconcile_last_run_actions",
              sum(1 for res in resources for a in res.get("actions", []) if a.get("result") == result),
              {"result": result})
    for res in resources:
        observed = res.get("observed")
        if not isinstance(observed, Mapping):
            continue
        if res["kind"] == "gpus":
            _gpu_metrics(m, res["id"], observed)
        elif res["kind"] == "extraction":
            _extraction_metrics(m, res["id"], observed)
    return m


def _gpu_metrics(m: Metrics, rid: str, observed: Mapping[str, Any]) -> None:
    gpus = observed.get("gpus") or []
    m.family("reconcile_gpus_visible", "gauge", "GPUs the driver shows.")
    m.add("reconcile_gpus_visible", len(gpus), {"id": rid})
    m.family("reconcile_gpu_health", "gauge", "1 for the GPU's memory health (DCGM's memory watch: ECC, "
                                              "retired pages, row remapping), 0 for the others.")
    m.family("reconcile_gpu_memory_used_bytes", "gauge", "GPU memory in use.")
    m.family("reconcile_gpu_memory_total_bytes", "gauge", "GPU memory in all.")
    m.family("reconcile_gpu_temperature_celsius", "gauge", "GPU temperature.")
    m.family("reconcile_gpu_power_watts", "gauge", "GPU power draw.")
    for g in gpus:
        labels = {"gpu": g.get("index"), "uuid": g.get("uuid", ""), "bus_id": g.get("bus_id", "")}
        health = g.get("health", "unknown")
        for value in GPU_HEALTH:
            m.add("reconcile_gpu_health", int(health == value), {**labels, "health": value})
        m.add("reconcile_gpu_memory_used_bytes", g.get("memory_used"), labels)
        m.add("reconcile_gpu_memory_total_bytes", g.get("memory_total"), labels)
        m.add("reconcile_gpu_temperature_celsius", g.get("temperature_c"), labels)
        m.add("reconcile_gpu_power_watts", g.get("power_w"), labels)


def _extraction_metrics(m: Metrics, rid: str, observed: Mapping[str, Any]) -> None:
    ident = {"id": rid}
    m.family("reconcile_extraction_done_samples", "gauge", "Samples with a file not found damaged.")
    m.family("reconcile_extraction_expected_samples", "gauge", "Samples the extraction writes in all (its total).")
    m.family("reconcile_extraction_missing_samples", "gauge", "Samples without a usable file (allow_missing "
                                                              "excluded).")
    m.family("reconcile_extraction_damaged_files", "gauge", "Files found damaged by the last run.")
    m.family("reconcile_extraction_writing_files", "gauge", "Incomplete files the running job is still writing.")
    m.family("reconcile_extraction_rate_samples_per_second", "gauge", "Write rate from recent files' "
                                                                      "modification times.")
    m.family("reconcile_extraction_eta_seconds", "gauge", "Time left to min_done at the current rate.")
    m.family("reconcile_extraction_newest_file_timestamp_seconds", "gauge", "Modification time of the newest "
                                                                            "sample file (Unix time).")
    m.family("reconcile_extraction_job_running", "gauge", "1 when the extraction's job runs.")
    if not observed.get("exists", True):
        return
    m.add("reconcile_extraction_done_samples", observed.get("done"), ident)
    m.add("reconcile_extraction_expected_samples", observed.get("total"), ident)
    m.add("reconcile_extraction_missing_samples", observed.get("missing"), ident)
    m.add("reconcile_extraction_damaged_files", len(observed.get("damaged") or ()), ident)
    m.add("reconcile_extraction_writing_files", observed.get("writing"), ident)
    m.add("reconcile_extraction_rate_samples_per_second", observed.get("rate"), ident)
    m.add("reconcile_extraction_eta_seconds", observed.get("eta_s"), ident)
    m.add("reconcile_extraction_newest_file_timestamp_seconds", observed.get("newest"), ident)
    job = observed.get("job")
    if isinstance(job, Mapping) and job.get("how") != "none":
        m.add("reconcile_extraction_job_running", bool(job.get("running")), ident)


def render_prometheus(doc: Mapping[str, Any], out: IO[str]) -> None:
    # An error report (the state file could not be read: `problems`, no resources) is a run that
    # could not happen: reconcile_up 0 and the build info, not a report of nothing that looks healthy.
    out.write(report_metrics(None if doc.get("problems") else doc).text())


def write_textfile(directory: str | os.PathLike, text: str, name: str = TEXTFILE_NAME) -> str:
    """Write DIR/NAME whole: a temporary file beside it (a dot name without `.prom`, which the
    collector ignores), then rename(2), so a scrape never reads half a file."""
    path = os.path.join(os.fspath(directory), name)
    write_text(path, text)
    return path


class TextfileExporter:
    """`reconcile watch --textfile DIR`: after each pass, DIR/reconcile.prom holds the last
    report's metrics and the counters of this watch process."""

    def __init__(self, directory: str | os.PathLike, interval: float, clock=time.time):
        self.directory = os.fspath(directory)
        self.interval = interval
        self.clock = clock
        self.passes: dict[str, int] = {"ok": 0, "failed": 0, "skipped": 0}
        self.actions = {"done": 0, "failed": 0}
        self.last_doc: Mapping[str, Any] | None = None
        self.path = os.path.join(self.directory, TEXTFILE_NAME)

    def __call__(self, doc: Mapping[str, Any] | None, outcome: str) -> str:
        """One pass: its report's JSON form (None when the pass produced none) and its outcome
        (`ok`, `failed`, `skipped`)."""
        self.passes[outcome] = self.passes.get(outcome, 0) + 1
        if doc is not None:
            self.last_doc = doc
            for res in doc.get("resources", []):
                for a in res.get("actions", []):
                    if a.get("result") in self.actions:
                        self.actions[a["result"]] += 1
        # A pass without a report (bad state file, lock error) keeps the previous report's
        # metrics, whose timestamp then ages: "not run for 2 intervals" fires if it lasts.
        up = doc is not None or outcome == "skipped"
        m = report_metrics(self.last_doc, up=up and self.last_doc is not None)
        m.family("reconcile_watch_interval_seconds", "gauge", "reconcile watch's interval between passes.")
        m.add("reconcile_watch_interval_seconds", self.interval)
        m.family("reconcile_watch_passes_total", "counter", "Passes of this reconcile watch process by outcome.")
        for outcome_name, n in self.passes.items():
            m.add("reconcile_watch_passes_total", n, {"outcome": outcome_name})
        m.family("reconcile_watch_actions_total", "counter", "Actions this reconcile watch process carried out, "
                                                             "by result.")
        for result, n in self.actions.items():
            m.add("reconcile_watch_actions_total", n, {"result": result})
        m.family("reconcile_watch_last_pass_timestamp_seconds", "gauge", "When the last pass ended, whatever its "
                                                                         "outcome (Unix time).")
        m.add("reconcile_watch_last_pass_timestamp_seconds", round(self.clock(), 3))
        return write_textfile(self.directory, m.text())

