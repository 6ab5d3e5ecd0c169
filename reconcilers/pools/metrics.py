"""The pools kind's own Prometheus metrics (Reconciler.metrics; views/prometheus.py writes them),
read from the report's JSON form of PoolObserved (tests/test_kind_metrics.py holds every key
read here to a field of it). Unknown is never 0: a value the observation does not have (no
quota, no rate yet, not filling) writes no sample. contrib/prometheus/reconcile-ceph.rules.yml
alerts on them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.contract import Metric, Sample


def pool_metrics(resource: Mapping[str, Any], report: Mapping[str, Any]) -> list[Metric]:
    o = resource["observed"]
    ident = {"id": resource["id"], "pool": o["pool"], "cluster": o["cluster"]}

    def one(value: Any) -> tuple[Sample, ...]:
        return (Sample(value, ident),) if value is not None else ()

    return [
        Metric("reconcile_pool_stored_bytes", "Bytes the pool's clients stored (ceph df detail: stored).",
               one(o["stored"])),
        Metric("reconcile_pool_free_bytes", "What can still be written: min(max_avail, quota - stored).",
               one(o["free"])),
        Metric("reconcile_pool_max_avail_bytes", "Ceph's max_avail for the pool (the quota not counted).",
               one(o["max_avail"])),
        Metric("reconcile_pool_quota_bytes", "The pool's quota (quota_max_bytes); no sample without one.",
               one(o["quota_bytes"])),
        Metric("reconcile_pool_quota_room_bytes", "Quota - stored (negative: overshot); no sample without a quota.",
               one(o["quota_room"])),
        Metric("reconcile_pool_overcommit_ratio", "Provisioned RBD image sizes / (stored + free).",
               one(o["overcommit"])),
        Metric("reconcile_pool_fill_rate_bytes_per_second", "Fill rate over reconcile's kept observations (2d).",
               one(o["fill_rate"])),
        Metric("reconcile_pool_days_to_full", "Days until free is written at the fill rate; no sample when the "
                                              "rate is unknown or the pool is not filling.", one(o["days_to_full"])),
        Metric("reconcile_pool_full_flag", "1 when the pool carries a full or full_quota flag.",
               (Sample(any(f in ("full", "full_quota") for f in o["flags"]), ident),)),
    ]
