"""The extractions kind's own Prometheus metrics (Reconciler.metrics; views/prometheus.py writes
them), read from the report's JSON form of ExtractionObserved and its JobObserved: a report from
a remote host arrives as JSON. tests/test_kind_metrics.py holds every key read here to a field
of those dataclasses, so renaming a field cannot drop a metric unnoticed.

Names and labels as docs/prometheus.md lists them; contrib/prometheus/reconcile.rules.yml joins
on them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.contract import Metric, Sample


def extraction_metrics(resource: Mapping[str, Any], report: Mapping[str, Any]) -> list[Metric]:
    observed = resource["observed"]
    ident = {"id": resource["id"]}
    present = bool(observed.get("exists", True))  # no directory yet: no progress to tell, not zeros

    def one(value: Any) -> tuple[Sample, ...]:
        return (Sample(value, ident),) if present else ()

    job = observed.get("job")
    running: tuple[Sample, ...] = ()
    if present and isinstance(job, Mapping) and job.get("how") != "none":  # no `job` declared: none to run
        running = (Sample(bool(job.get("running")), ident),)
    return [
        Metric("reconcile_extraction_done_samples", "Samples with a file not found damaged.",
               one(observed.get("done"))),
        Metric("reconcile_extraction_expected_samples", "Samples the extraction writes in all (its total).",
               one(observed.get("total"))),
        Metric("reconcile_extraction_missing_samples", "Samples without a usable file (allow_missing excluded).",
               one(observed.get("missing"))),
        Metric("reconcile_extraction_damaged_files", "Files found damaged by the last run.",
               one(len(observed.get("damaged") or ()))),
        Metric("reconcile_extraction_writing_files", "Incomplete files the running job is still writing.",
               one(observed.get("writing"))),
        Metric("reconcile_extraction_rate_samples_per_second", "Write rate from recent files' modification times.",
               one(observed.get("rate"))),
        Metric("reconcile_extraction_eta_seconds", "Time left to min_done at the current rate.",
               one(observed.get("eta_s"))),
        Metric("reconcile_extraction_newest_file_timestamp_seconds", "Modification time of the newest sample file "
                                                                     "(Unix time).", one(observed.get("newest"))),
        Metric("reconcile_extraction_job_running", "1 when the extraction's job runs.", running),
    ]
