"""reconcile's own kept observations of a pool, for its fill rate: one small JSON file per
cluster and pool under reconcile's state directory (`pools/FSID.POOL.json`), written whole
(core/atomic.py). Only reconcile's own time and the pool's `stored` are kept, over RATE_WINDOW:
ceph-mixin's CephPoolGrowthWarning (monitoring/ceph-mixin, `predict_linear` over 2 days) takes
the same window, from Prometheus; this kind needs no Prometheus to give the same answer.

The rate is the least-squares slope of `stored` over the kept observations (what
predict_linear computes), known once two of them are at least RATE_MIN_SPAN apart; before
that it is unknown, and said so — never "fine"."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ...core import paths
from ...core.atomic import write_json
from ...core.values import format_duration

RECORD_FORMAT = 1
RATE_WINDOW = 2 * 86400.0
RATE_MIN_SPAN = 600.0
MAX_KEPT = 4096  # an observation a minute for 2 days is 2,880
MAX_RECORD_BYTES = 1 << 20


def record_path(fsid: str, pool: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{fsid}.{pool}")
    return os.path.join(paths.state_dir(), "pools", f"{safe}.json")


def load(path: str) -> list[tuple[float, int]]:
    """The kept (time, stored) pairs; none when the record is absent or unreadable (the rate is
    then unknown until the span is kept again: slower, never wrong)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_RECORD_BYTES + 1)
    except OSError:
        return []
    if len(data) > MAX_RECORD_BYTES:
        return []
    try:
        rec = json.loads(data)
    except ValueError:
        return []
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        return []
    out = []
    for item in rec.get("kept") or ():
        if (isinstance(item, list) and len(item) == 2 and all(isinstance(v, (int, float)) for v in item)
                and not any(isinstance(v, bool) for v in item)):
            out.append((float(item[0]), int(item[1])))
    return out


def slope(kept: list[tuple[float, int]]) -> float:
    """Least squares: bytes per second."""
    n = len(kept)
    mt = sum(t for t, _ in kept) / n
    ms = sum(s for _, s in kept) / n
    den = sum((t - mt) ** 2 for t, _ in kept)
    return sum((t - mt) * (s - ms) for t, s in kept) / den if den else 0.0


def rate(kept: list[tuple[float, int]], now: float) -> tuple[float | None, str]:
    """(bytes per second or None, what the rate rests on)."""
    inside = [(t, s) for t, s in kept if now - RATE_WINDOW <= t <= now]
    if not inside:
        return None, "unknown: no kept observation yet (the rate needs two at least 10m apart)"
    span = max(t for t, _ in inside) - min(t for t, _ in inside)
    if span < RATE_MIN_SPAN:
        return None, (f"unknown: {len(inside)} kept observation(s) over {format_duration(span)}; the rate needs two "
                      f"at least {format_duration(RATE_MIN_SPAN)} apart")
    return slope(inside), f"over {len(inside)} observations in {format_duration(span)}"


def keep(fsid: str, pool: str, now: float, stored: int) -> tuple[float | None, str]:
    """Add this observation to the pool's record and return the rate over the window."""
    path = record_path(fsid, pool)
    kept = [(t, s) for t, s in load(path) if now - RATE_WINDOW <= t < now]
    kept.append((now, stored))
    kept = kept[-MAX_KEPT:]
    note_extra = ""
    try:
        write_json(path, {"format": RECORD_FORMAT, "cluster": fsid, "pool": pool,
                          "kept": [[round(t, 3), s] for t, s in kept]})
    except OSError as exc:
        note_extra = f" (the record {path} could not be written: {exc.strerror})"
    r, note = rate(kept, now)
    return r, note + note_extra


def days_to_full(free: int, bytes_per_second: float | None) -> float | None:
    """Days until `free` is written at the rate; None when unknown or not filling."""
    if bytes_per_second is None or bytes_per_second <= 0:
        return None
    return round(free / bytes_per_second / 86400.0, 4)


def history(path: str) -> list[dict[str, Any]]:
    return [{"time": t, "stored": s} for t, s in load(path)]
