"""What differs between a declared pool and the observed one (the kind's `diff`).

Free space counts the quota: what a client can still write is min(max_avail, quota - stored).
`ceph df`'s MAX AVAIL ignores the quota (src/mon/PGMap.cc dump_object_stat_sum), and so does
Proxmox's `pvesm status`, whose free is `max_avail` (pve-storage PVE/Storage/RBDPlugin.pm)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ...core.contract import Drift
from ...core.values import format_bytes
from .observed import PoolObserved, Ratios

FREE_FIELDS = ("min_free", "quota.min_free", "min_days_to_full", "max_overcommit")  # move by themselves


def want_free(rule: tuple[str, float], o: PoolObserved) -> int:
    """min_free in bytes: a size, or a percentage of what the pool can hold (stored + free)."""
    kind, value = rule
    return math.ceil((o.stored + o.free) * value / 100) if kind == "percent" else int(value)


def free_words(o: PoolObserved) -> str:
    if o.quota_room is None:
        return f"{format_bytes(o.free)} free (max_avail; no quota)"
    return (f"{format_bytes(o.free)} free (min of max_avail {format_bytes(o.max_avail)} and the quota's room "
            f"{format_bytes(o.quota_room)})")


def ratios_words(r: Mapping[str, float] | Ratios) -> str:
    get = r.get if isinstance(r, Mapping) else lambda k: getattr(r, k)
    return ", ".join(f"{k} {get(k):g}" for k in ("nearfull", "backfillfull", "full") if get(k) is not None)


def days_words(o: PoolObserved) -> str:
    if o.fill_rate is None:
        return o.rate_note
    per_day = format_bytes(o.fill_rate * 86400)
    if o.days_to_full is None:
        return f"not filling ({per_day}/day, {o.rate_note})"
    return f"{o.days_to_full:.2f}d at {per_day}/day ({o.rate_note})"


def diff(spec: Mapping[str, Any], o: PoolObserved) -> list[Drift]:
    drift = []
    if spec.get("healthy") and (o.flags or o.health):
        drift.append(Drift("healthy", True, "; ".join([*(f"pool flag {f}" for f in o.flags), *o.health])))
    if "min_free" in spec:
        want = want_free(spec["min_free"], o)
        if o.free < want:
            kind, value = spec["min_free"]
            shown = f"{value:g}% ({format_bytes(want)})" if kind == "percent" else format_bytes(want)
            drift.append(Drift("min_free", f"≥ {shown}", free_words(o)))
    quota = spec.get("quota") or {}
    if "max_bytes" in quota and o.quota_bytes != quota["max_bytes"]:
        drift.append(Drift("quota.max_bytes", quota["max_bytes"], o.quota_bytes))
    if "min_free" in quota:
        room = o.quota_room
        if room is None or room < quota["min_free"]:
            have = ("no quota set" if room is None else f"{format_bytes(room)} under the quota "
                    f"({format_bytes(o.stored)} stored of {format_bytes(o.quota_bytes or 0)})")
            drift.append(Drift("quota.min_free", f"≥ {format_bytes(quota['min_free'])}", have))
    if "max_overcommit" in spec and (o.overcommit is None or o.overcommit > spec["max_overcommit"]):
        have = ("unknown (the pool holds nothing and has no room)" if o.overcommit is None else
                f"{o.overcommit:.2f} ({format_bytes(o.provisioned or 0)} provisioned in RBD images on "
                f"{format_bytes(o.stored + o.free)})")
        drift.append(Drift("max_overcommit", f"≤ {spec['max_overcommit']:g}", have))
    if "min_days_to_full" in spec:
        want = spec["min_days_to_full"]
        if o.fill_rate is None or (o.days_to_full is not None and o.days_to_full < want):
            drift.append(Drift("min_days_to_full", f"≥ {want:g}d", days_words(o)))
    if "ratios" in spec:
        have = {k: getattr(o.ratios, k) for k in spec["ratios"]}
        if any(abs(have[k] - v) > 5e-5 for k, v in spec["ratios"].items()):
            drift.append(Drift("ratios", ratios_words(spec["ratios"]), ratios_words(o.ratios)))
    return drift
