"""Ceph's JSON answers, read into a PoolObserved: pure functions, tested on answers captured from
a real Ceph 16.2.15 (tests/data/pools/).

The answers (the same JSON from `Rados.mon_command` and from `ceph ... -f json`):
- `df detail`: pools[].stats.stored / max_avail / quota_bytes (src/mon/PGMap.cc dump_pool_stats_full);
- `osd dump`: epoch, fsid, the three ratios, pools[] (pool_name, flags_names, quota_max_bytes),
  osds[] (up, in) (src/osd/OSDMap.cc OSDMap::dump);
- `osd df`: nodes[] (name, utilization) (src/mgr/... OSDUtilizationDumper);
- `health detail`: checks{CODE: {summary.message, detail[].message}} (src/mon/health_check.h);
- `pg ls-by-pool`: pg_stats[] (state, up, acting) (src/mon/PGMap.cc dump_pg_stats).

`ceph df` repeats the last numbers it had when the OSDs that hold a pool are down (exit 0): a
pool whose PGs are stale or not active, or whose OSDs are down, raises NotCurrent — its numbers
are not an observation."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from .observed import PoolObserved, Ratios

# The pool flags that say it is filling (src/osd/osd_types.h pg_pool_t FLAG_FULL, FLAG_FULL_QUOTA,
# FLAG_NEARFULL, FLAG_BACKFILLFULL; `flags_names` in `osd dump`).
FILL_FLAGS = ("full", "full_quota", "backfillfull", "nearfull")
# The health checks about fullness (src/mon/OSDMonitor.cc, src/mon/PGMap.cc get_health_checks).
FILL_CHECKS = frozenset({"OSD_FULL", "OSD_BACKFILLFULL", "OSD_NEARFULL", "OSD_FAILSAFE_FULL", "OSD_OUT_OF_ORDER_FULL",
                         "POOL_FULL", "POOL_BACKFILLFULL", "POOL_NEARFULL", "POOL_NEAR_FULL"})


# An erasure-coded PG's hole in its up/acting set (src/crush/crush.h CRUSH_ITEM_NONE): no OSD.
CRUSH_ITEM_NONE = 0x7FFFFFFF


class NotCurrent(Exception):
    """The pool's numbers cannot be current (an OSD of it down, PGs not active)."""


class NoPool(Exception):
    """The cluster has no pool of that name."""


def ratios(osd_dump: Mapping[str, Any]) -> Ratios:
    return Ratios(nearfull=round(float(osd_dump["nearfull_ratio"]), 4),
                  backfillfull=round(float(osd_dump["backfillfull_ratio"]), 4),
                  full=round(float(osd_dump["full_ratio"]), 4))


def pool_entry(osd_dump: Mapping[str, Any], pool: str) -> Mapping[str, Any]:
    for p in osd_dump.get("pools", ()):
        if p.get("pool_name") == pool:
            return p
    names = ", ".join(sorted(str(p.get("pool_name")) for p in osd_dump.get("pools", ()))) or "none"
    raise NoPool(f"no pool named {pool!r} in cluster {osd_dump.get('fsid', '?')} (its pools: {names})")


def health_lines(health: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """("CODE: message; detail", ...) of the fullness checks, and of the others."""
    fill, other = [], []
    for code, check in sorted((health.get("checks") or {}).items()):
        summary = (check.get("summary") or {}).get("message", "")
        details = [d.get("message", "") for d in check.get("detail") or () if d.get("message")]
        line = f"{code}: {summary}" + (f" ({'; '.join(details[:3])}{'; ...' if len(details) > 3 else ''})"
                                       if details else "")
        (fill if code in FILL_CHECKS else other).append(line)
    return tuple(fill), tuple(other)


def fullest_osd(osd_df: Mapping[str, Any]) -> tuple[str | None, float | None]:
    nodes = [n for n in osd_df.get("nodes") or () if n.get("type") == "osd"]
    if not nodes:
        return None, None
    top = max(nodes, key=lambda n: float(n.get("utilization", 0.0)))
    return str(top.get("name")), round(float(top.get("utilization", 0.0)), 2)


def pool_pgs(pgs: Mapping[str, Any] | list, pool: str, osd_dump: Mapping[str, Any]) -> tuple[tuple[int, ...], int]:
    """The OSDs holding the pool's PGs and the PG count; NotCurrent when a PG is stale or not active,
    or one of those OSDs is down."""
    stats = pgs.get("pg_stats", []) if isinstance(pgs, Mapping) else pgs  # Ceph < 15 answers a bare list
    osds = sorted({o for pg in stats for o in (*pg.get("up", ()), *pg.get("acting", ()))
                   if 0 <= o != CRUSH_ITEM_NONE})
    down = [o["osd"] for o in osd_dump.get("osds", ()) if o.get("osd") in osds and not o.get("up")]
    if down:
        names = ", ".join(f"osd.{o}" for o in down)
        raise NotCurrent(f"{names} of pool {pool} {'is' if len(down) == 1 else 'are'} down (osd dump epoch "
                         f"{osd_dump.get('epoch')}): `ceph df` repeats the last numbers it had, so they cannot "
                         "be current")
    bad = Counter(pg.get("state", "?") for pg in stats
                  if "active" not in pg.get("state", "").split("+") or "stale" in pg.get("state", "").split("+"))
    if bad:
        states = ", ".join(f"{n} {s}" for s, n in sorted(bad.items()))
        raise NotCurrent(f"{sum(bad.values())} of {len(stats)} PGs of pool {pool} are not active and current "
                         f"({states}): its numbers cannot be current")
    if not stats:
        raise NotCurrent(f"pool {pool} has no PGs yet (`pg ls-by-pool` lists none)")
    return tuple(osds), len(stats)


def observed_from(pool: str, via: str, answers: Mapping[str, Any], provisioned: int | None = None) -> PoolObserved:
    """A PoolObserved from the answers of one cluster (`df`, `osd_dump`, `osd_df`, `health`) and the
    pool's `pgs`; NoPool or NotCurrent when they say so. The rate fields are filled in later."""
    df, dump = answers["df"], answers["osd_dump"]
    entry = pool_entry(dump, pool)
    osds, npgs = pool_pgs(answers["pgs"], pool, dump)
    stats = next((p["stats"] for p in df.get("pools", ()) if p.get("name") == pool), None)
    if stats is None:
        raise NotCurrent(f"`ceph df` has no numbers for pool {pool} yet (the mgr has not reported it)")
    stored, max_avail = int(stats["stored"]), int(stats["max_avail"])
    quota = int(entry.get("quota_max_bytes") or 0) or None
    room = None if quota is None else quota - stored
    free = max(0, max_avail if room is None else min(max_avail, room))
    flags = tuple(f for f in str(entry.get("flags_names", "")).split(",") if f in FILL_FLAGS)
    fill, other = health_lines(answers["health"])
    osd_name, osd_pct = fullest_osd(answers["osd_df"])
    over = None
    if provisioned is not None:
        over = round(provisioned / (stored + free), 4) if stored + free > 0 else None
    return PoolObserved(
        pool=pool, cluster=str(dump.get("fsid", "")), via=via, epoch=int(dump.get("epoch", 0)),
        stored=stored, max_avail=max_avail, quota_bytes=quota, free=free, quota_room=room, flags=flags,
        health=fill, other_health=other, ratios=ratios(dump), fullest_osd=osd_name, fullest_osd_percent=osd_pct,
        osds=osds, pgs=npgs, provisioned=provisioned, overcommit=over, fill_rate=None, days_to_full=None,
        rate_note="")


def provisioned_from_du(du: Mapping[str, Any]) -> int:
    """Σ provisioned_size of the images (`rbd du --format json`: images[], src/tools/rbd/action/DiskUsage.cc);
    a snapshot's entry (it has `snapshot`) is not an image of its own."""
    return sum(int(i.get("provisioned_size", 0)) for i in du.get("images") or () if "snapshot" not in i)
