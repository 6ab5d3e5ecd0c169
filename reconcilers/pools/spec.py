"""A declared pool, normalised (sizes in bytes, durations in seconds), and what the schema cannot
check in the `pools:` section: each reported as FILE:LINE:COL by the state-file loader."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...core.values import _SIZE, _SIZE_UNITS, dotted, never_answers, parse_duration, parse_size, parse_size_or_percent

DEFAULT_CONF = "/etc/ceph/ceph.conf"
DEFAULT_ID = "reconcile"
DEFAULT_OBSERVE_TIMEOUT = 15.0
RATIO_NAMES = ("nearfull", "backfillfull", "full")
# The OSD's own last stop (src/common/options/global.yaml.in osd_failsafe_full_ratio, 0.97): at or
# above it a full ratio never stops writes before the OSD refuses every one.
FAILSAFE_FULL = 0.97


def cluster_of(raw: Mapping[str, Any]) -> dict[str, Any]:
    c = raw.get("cluster") or {}
    return {"conf": c.get("conf") or DEFAULT_CONF, "id": c.get("id") or DEFAULT_ID, "keyring": c.get("keyring")}


def cluster_key(cluster: Mapping[str, Any]) -> tuple[str, str, str]:
    return (cluster["conf"], cluster["id"], cluster.get("keyring") or "")


def normalise(name: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"pool": raw.get("pool") or name, "cluster": cluster_of(raw),
                            "observe_timeout": parse_duration(raw.get("observe_timeout", DEFAULT_OBSERVE_TIMEOUT))}
    if "healthy" in raw:
        spec["healthy"] = bool(raw["healthy"])
    if raw.get("min_free") is not None:
        spec["min_free"] = parse_size_or_percent(raw["min_free"])
    quota = raw.get("quota")
    if isinstance(quota, Mapping):
        spec["quota"] = {k: parse_size(quota[k]) for k in ("max_bytes", "min_free") if quota.get(k) is not None}
    if raw.get("max_overcommit") is not None:
        spec["max_overcommit"] = float(raw["max_overcommit"])
    if raw.get("min_days_to_full") is not None:
        spec["min_days_to_full"] = parse_duration(raw["min_days_to_full"]) / 86400.0
    ratios = raw.get("ratios")
    if isinstance(ratios, Mapping):
        spec["ratios"] = {k: float(ratios[k]) for k in RATIO_NAMES if ratios.get(k) is not None}
    return spec


def _whole_bytes(value: Any) -> bool:
    """Whether a size names a whole number of bytes: `1.5GiB` does, `1.3MiB` (1,363,148.8) does not."""
    if isinstance(value, int):
        return True
    m = re.match(_SIZE, str(value), re.IGNORECASE)
    if not m:
        return True  # the schema says what is wrong with it
    from fractions import Fraction

    return (Fraction(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").upper()]).denominator == 1


def _ratio_problems(name: str, ratios: Any) -> list[tuple[tuple, str]]:
    out: list[tuple[tuple, str]] = []
    if not isinstance(ratios, Mapping):
        return out
    got = {k: ratios[k] for k in RATIO_NAMES if isinstance(ratios.get(k), (int, float))
           and not isinstance(ratios.get(k), bool)}
    for k, v in got.items():
        if not 0 <= v <= 1:
            out.append(((name, "ratios", k), f"{dotted((name, 'ratios', k))}: {v} is not a ratio: Ceph's ratios "
                                              "are between 0 and 1 (0.85 is 85% full)"))
    if out:
        return out
    order = [k for k in RATIO_NAMES if k in got]
    for lower, upper in zip(order, order[1:], strict=False):
        if not got[lower] < got[upper]:
            out.append(((name, "ratios", upper), f"{dotted((name, 'ratios', upper))}: {got[upper]} is not above "
                                                  f"{lower} {got[lower]}: Ceph wants nearfull < backfillfull < full "
                                                  "(else OSD_OUT_OF_ORDER_FULL)"))
    if "full" in got and got["full"] >= FAILSAFE_FULL:
        out.append(((name, "ratios", "full"), f"{dotted((name, 'ratios', 'full'))}: {got['full']} is at or above "
                                               f"osd_failsafe_full_ratio ({FAILSAFE_FULL}): the OSDs would refuse "
                                               "every write before the cluster ever says full"))
    return out


def problems(section: Mapping[str, Any]) -> list[tuple[tuple, str]]:
    out = never_answers((((name,), spec) for name, spec in section.items()), "observe_timeout")
    first_ratios: dict[str, tuple[str, dict]] = {}
    for name, raw in section.items():
        if not isinstance(raw, Mapping):
            continue
        out += _ratio_problems(name, raw.get("ratios"))
        quota = raw.get("quota")
        if isinstance(quota, Mapping):
            for k in ("max_bytes", "min_free"):
                if quota.get(k) is not None and not _whole_bytes(quota[k]):
                    out.append(((name, "quota", k), f"{dotted((name, 'quota', k))}: {quota[k]} is not a whole "
                                                    "number of bytes; reconcile sends Ceph bytes (it reads `10G` "
                                                    "as GiB): give bytes or a size that comes out whole"))
            try:
                top, room = parse_size(quota.get("max_bytes")), parse_size(quota.get("min_free"))
            except (ValueError, TypeError):
                top = room = None
            if top is not None and room is not None and room >= top:
                out.append(((name, "quota", "min_free"), f"{dotted((name, 'quota', 'min_free'))}: {quota['min_free']} "
                                                         f"is not below quota.max_bytes {quota['max_bytes']}: the "
                                                         "room under the quota could never be that large"))
        over = raw.get("max_overcommit")
        if isinstance(over, (int, float)) and not isinstance(over, bool) and over <= 0:
            out.append(((name, "max_overcommit"), f"{dotted((name, 'max_overcommit'))}: {over} allows no image at "
                                                  "all; give a positive factor (1.0: no thin provisioning)"))
        ratios = raw.get("ratios")
        if isinstance(ratios, Mapping) and ratios:
            conf = (raw.get("cluster") or {}).get("conf") or DEFAULT_CONF
            mine = {k: ratios.get(k) for k in RATIO_NAMES}
            if conf in first_ratios and first_ratios[conf][1] != mine:
                other = first_ratios[conf][0]
                out.append(((name, "ratios"), f"{dotted((name, 'ratios'))}: differ from pool {other}'s of the same "
                                              f"cluster ({conf}): the ratios are the cluster's, one set for all "
                                              "its pools"))
            first_ratios.setdefault(conf, (name, mine))
    return sorted(out)
