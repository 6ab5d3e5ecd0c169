"""The `pools` kind: Ceph pools observed from the hypervisor that holds the cluster's config and
keys (a Proxmox node), below the VMs whose disks they hold. What can still be written counting
the quota, the quota itself, thin provisioning, the fill rate from reconcile's own kept
observations, the cluster's ratios — and numbers that cannot be current (an OSD down, PGs not
active) are an error, never `ok` (docs/pools.md).

Observed in the forked observer child under `observe_timeout` (reads.py); apply only sets a
quota the pool is below (plan.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...core.contract import Action, Context, Drift, Metric, ObserveError, Plan, Reconciler, Resource
from . import plan as planning
from .spec import cluster_key, normalise, problems
from .verdicts import FREE_FIELDS, diff

if TYPE_CHECKING:
    from ...core.host import Host

MARGIN = 5.0  # beyond the observe_timeout: the child reports Ceph's own words before it is abandoned


class PoolsReconciler(Reconciler):
    key = "pools"
    kind = "pool"
    rank = 5  # the storage below everything else a host declares
    volatile_drift = FREE_FIELDS

    def observe_deadline(self, resources: Sequence[Resource]) -> float | None:
        by_cluster: dict[tuple, float] = {}
        for r in resources:
            k = cluster_key(r.spec["cluster"])
            by_cluster[k] = max(by_cluster.get(k, 0.0), float(r.spec["observe_timeout"]))
        return sum(by_cluster.values()) + MARGIN

    def resources(self, section: dict[str, Any]) -> list[Resource]:
        return [Resource(id=f"pool:{name}", kind=self.kind, name=name, spec=normalise(name, raw),
                         needs=tuple(raw.get("needs", ()))) for name, raw in section.items()]

    def problems(self, section: Any) -> list[tuple[tuple, str]]:
        return problems(section)

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        from .parsers import NoPool, NotCurrent, observed_from, pool_entry, provisioned_from_du
        from .reads import ClusterError, rbd_du, read_cluster
        from .records import days_to_full, keep

        groups: dict[tuple, list[Resource]] = {}
        for r in resources:
            groups.setdefault(cluster_key(r.spec["cluster"]), []).append(r)
        out: dict[str, Any] = {}
        for group in groups.values():
            cluster = group[0].spec["cluster"]
            timeout = max(float(r.spec["observe_timeout"]) for r in group)
            deadline = time.monotonic() + timeout
            try:
                answers = read_cluster(host, cluster, sorted({r.spec["pool"] for r in group}), timeout)
            except ClusterError as exc:
                for r in group:
                    out[r.id] = ObserveError(str(exc))
                continue
            for r in group:
                pool = r.spec["pool"]
                pgs = answers["pgs"][pool]
                try:
                    pool_entry(answers["osd_dump"], pool)  # an unknown pool is said so, before its PG error
                    if isinstance(pgs, ClusterError):
                        raise pgs
                    obs = observed_from(pool, answers["via"], {**answers, "pgs": pgs})  # NotCurrent before rbd du
                    if "max_overcommit" in r.spec:  # `rbd du` hangs with an OSD of the pool down: asked only now
                        du = rbd_du(host, cluster, pool, deadline - time.monotonic())
                        obs = observed_from(pool, answers["via"], {**answers, "pgs": pgs},
                                            provisioned=provisioned_from_du(du))
                except (NoPool, NotCurrent, ClusterError) as exc:
                    out[r.id] = ObserveError(str(exc))
                    continue
                rate, note = keep(obs.cluster, pool, time.time(), obs.stored)
                out[r.id] = dataclasses.replace(obs, fill_rate=None if rate is None else round(rate, 3),
                                                days_to_full=days_to_full(obs.free, rate), rate_note=note)
        return out

    def diff(self, resource: Resource, observed: Any) -> list[Drift]:
        return diff(resource.spec, observed)

    def plan(self, resource: Resource, observed: Any, drift: Sequence[Drift], ctx: Context) -> Plan:
        return planning.plan(resource, observed, drift)

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        return planning.apply(host, resource, action)

    def summary(self, resource: Resource, observed: Any) -> str:
        return planning.summary(observed)

    def metrics(self, resource: Mapping[str, Any], report: Mapping[str, Any]) -> list[Metric]:
        from .metrics import pool_metrics

        return pool_metrics(resource, report)
