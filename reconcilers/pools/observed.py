"""What one observation of a Ceph pool holds: plain frozen data, pickled back from the observer
child and written to the report as JSON (the kind's metrics read that JSON: tests/test_kind_metrics.py
holds each key they read to a field here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ratios:
    """The cluster's fullness ratios (`ceph osd dump`: nearfull_ratio, backfillfull_ratio,
    full_ratio). Ceph keeps them as 32-bit floats (0.95 reads back 0.949999988): rounded to 4
    places, which is finer than any ratio a person sets."""

    nearfull: float
    backfillfull: float
    full: float


@dataclass(frozen=True)
class PoolObserved:
    pool: str
    cluster: str  # the fsid (`ceph osd dump`)
    via: str  # "python3-rados" or "ceph CLI": how it was read
    epoch: int  # the OSD map's epoch the numbers are from
    stored: int  # bytes the pool's clients wrote (`ceph df detail`: stored)
    max_avail: int  # what Ceph says can still be written (ignores the quota)
    quota_bytes: int | None  # the pool's quota (`quota_max_bytes`); None: none set (Ceph's 0)
    free: int  # what can still be written: min(max_avail, quota - stored)
    quota_room: int | None  # quota - stored (negative: overshot); None without a quota
    flags: tuple[str, ...]  # the pool's flags that say it is filling: full, full_quota, nearfull, backfillfull
    health: tuple[str, ...]  # "CODE: message" of the health checks about fullness (OSD_FULL, POOL_FULL, ...)
    other_health: tuple[str, ...]  # every other health check, quoted, not judged
    ratios: Ratios
    fullest_osd: str | None  # "osd.3" (`ceph osd df`: the highest utilization)
    fullest_osd_percent: float | None
    osds: tuple[int, ...]  # the OSDs holding the pool's PGs (up and acting)
    pgs: int
    provisioned: int | None  # Σ RBD image sizes (`rbd du`); None: not read (no max_overcommit)
    overcommit: float | None  # provisioned / (stored + free)
    fill_rate: float | None  # bytes per second over the kept observations; None: unknown
    days_to_full: float | None  # free / fill_rate in days; None: unknown or not filling
    rate_note: str  # why the rate is unknown, or over what span it was measured
