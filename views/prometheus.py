"""The Prometheus view: a report as the text exposition format that node_exporter's textfile
collector reads (`--format prometheus`, `reconcile watch --textfile DIR`).

Names follow Prometheus' conventions (https://prometheus.io/docs/practices/naming/): the
`reconcile_` prefix, base units in the name (`_bytes`, `_seconds`, `_samples`), `_total` only on
counters, and one series per possible value of an enumeration (`status`, `health`) holding 1 for
the current one and 0 for the others, so a rule can say `== 1` and a vanished series is never
mistaken for a healthy one. What reconcile could not read is left out, never written as 0
(unknown is never ok); the resource's `status` says why.

The metrics every report has are written here; each kind adds its own from its observed state
(Reconciler.metrics: reconcilers/<kind>/metrics.py), so this view names no kind.

Counters exist only where a process lives across runs: `reconcile watch` keeps them (the
textfile sink, doors/sinks/textfile.py, which writes these metrics to DIR/reconcile.prom); a
one-off `diff`/`apply` reports the counts of its own run as gauges.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import IO, Any

from .. import FORMAT_VERSION, __version__
from ..pipeline.report import STATUSES

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


def report_metrics(doc: Mapping[str, Any] | None, m: Metrics | None = None, up: bool = True,
                   attempt: Mapping[str, Any] | None = None) -> Metrics:
    """The metrics of one report (its JSON form, pipeline/report.py); `doc` None: no report, only
    `reconcile_up` and the build info. `attempt`: the last attempt's own document when it produced
    no report (an error report: bad state file, lock held, another machine), whose reason is
    written as reconcile_error_info so an alert can say why (docs/prometheus.md)."""
    m = m or Metrics()
    m.family("reconcile_up", "gauge", "1 when the last run produced a report; 0 when it could not run at all "
                                      "(state file unreadable or invalid, lock error, wrong host).")
    m.add("reconcile_up", 1 if up and doc is not None and attempt is None else 0)
    m.family("reconcile_build_info", "gauge", "reconcile's version and its report format version.")
    m.add("reconcile_build_info", 1, {"version": __version__, "format_version": FORMAT_VERSION})
    m.family("reconcile_error_info", "gauge", "1 with the reason the last attempt produced no report "
                                              "(state-file, lock-held, host-mismatch, machine-mismatch, ...).")
    m.family("reconcile_state_file_valid", "gauge", "1 when the state file validated at the last attempt, 0 "
                                                    "when it did not.")
    m.family("reconcile_last_attempt_timestamp_seconds", "gauge", "When the last attempt ended, whether or not "
                                                                  "it produced a report (Unix time).")
    last = attempt or doc
    if attempt is not None:
        reason = (attempt.get("error") or {}).get("reason") or ("state-file" if attempt.get("problems") else "error")
        m.add("reconcile_error_info", 1, {"reason": reason})
    if last is not None:
        m.add("reconcile_state_file_valid", int(not last.get("problems")))
        m.add("reconcile_last_attempt_timestamp_seconds",
              round(float(last.get("started") or 0.0) + float(last.get("duration_s") or 0.0), 3))
        _machine_metrics(m, last.get("machine") or (doc or {}).get("machine"))
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
    m.family("reconcile_resource_actions_failed", "gauge", "The resource's actions that failed in the last run.")
    for res in resources:
        ident = {"id": res["id"], "kind": res["kind"]}
        for status in STATUSES:
            m.add("reconcile_resource_status", int(res["status"] == status), {**ident, "status": status})
        m.add("reconcile_resource_drift_fields", len(res.get("drift", [])), ident)
        m.add("reconcile_resource_actions_failed",
              sum(1 for a in res.get("actions", []) if a.get("result") == "failed"), ident)
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
    _kind_metrics(m, doc)
    return m


def _machine_metrics(m: Metrics, machine: Mapping[str, Any] | None) -> None:
    """Which machine wrote the file (hostname, /etc/machine-id, boot id, and the SSH host key a
    remote run connected to): an info series, joined on `instance` by the operator's queries."""
    if not isinstance(machine, Mapping):
        return
    m.family("reconcile_machine_info", "gauge", "The machine the last run observed: hostname, machine-id, "
                                                "boot id (1).")
    keys = ("hostname", "machine_id", "boot_id") + (("ssh_host_key",) if machine.get("ssh_host_key") else ())
    m.add("reconcile_machine_info", 1, {k: machine.get(k) or "" for k in keys})


def _kind_metrics(m: Metrics, doc: Mapping[str, Any]) -> None:
    """Each kind's own metrics (Reconciler.metrics: the kind reads its own observed JSON), for
    the resources that were observed. A kind this reconcile does not know (a report from a newer
    one on a remote host) has none here."""
    from ..reconcilers import key_of, reconciler_for

    reconcilers: dict[str, Any] = {}
    for res in doc.get("resources", []):
        if not isinstance(res.get("observed"), Mapping):
            continue
        key = key_of(res["kind"])
        if key is None:
            continue
        if key not in reconcilers:
            reconcilers[key] = reconciler_for(key)
        for metric in reconcilers[key].metrics(res, doc):
            m.family(metric.name, metric.type, metric.help)
            for sample in metric.samples:
                m.add(metric.name, sample.value, sample.labels)


def is_error_report(doc: Mapping[str, Any]) -> bool:
    return bool(doc.get("problems") or doc.get("error"))


def run_metrics(doc: Mapping[str, Any], interval: float | None = None) -> Metrics:
    """One `diff`/`apply` run's metrics (stdout, or `--textfile DIR` for cron). An error report
    (bad state file, lock held, another machine) is a run that could not happen: reconcile_up 0
    and its reason, not a report of nothing that looks healthy. `interval`: how often cron runs it
    (`--interval`), for the not-running and staleness alerts."""
    error = is_error_report(doc)
    m = report_metrics(None if error else doc, attempt=doc if error else None)
    if interval:
        schedule_metrics(m, interval, time.time() + interval)
    return m


def schedule_metrics(m: Metrics, interval: float, next_run: float) -> None:
    m.family("reconcile_run_interval_seconds", "gauge", "How often reconcile runs here (watch --interval, or "
                                                        "the cron interval given with --interval).")
    m.add("reconcile_run_interval_seconds", interval)
    m.family("reconcile_next_run_timestamp_seconds", "gauge", "When the next run is due, after any back-off "
                                                              "(Unix time).")
    m.add("reconcile_next_run_timestamp_seconds", round(next_run, 3))


def render_prometheus(doc: Mapping[str, Any], out: IO[str], verbose: bool = False) -> None:
    out.write(run_metrics(doc).text())
