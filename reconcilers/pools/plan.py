"""What reconcile does about a pool's drift: only what cannot hurt at once.

It sets a pool's quota (`ceph osd pool set-quota POOL max_bytes N`, in bytes) when the pool
stores less than it: a quota at or below `stored` marks the pool full_quota at the mon's next
check and every writer of it (a VM's disk) blocks (src/mon/OSDMonitor.cc check_pool_quota ->
FLAG_FULL_QUOTA). Everything else — the ratios, freeing space, deleting images — is reported
with the exact command, never done."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...core.contract import Action, ApplyError, Drift, Plan, Resource, run_action
from ...core.values import format_bytes
from .observed import PoolObserved
from .verdicts import days_words, free_words

if TYPE_CHECKING:
    from ...core.host import Host

APPLY_TIMEOUT = 60.0


def ceph_argv(cluster: Mapping[str, Any], *args: str) -> list[str]:
    argv = ["ceph", "-c", cluster["conf"], "--id", cluster["id"], "--connect-timeout", "30"]
    if cluster.get("keyring"):
        argv += ["--keyring", cluster["keyring"]]
    return [*argv, *args]


def _cmd(*words: str) -> str:
    return "`ceph " + " ".join(shlex.quote(w) for w in words) + "`"


def _freeing(pool: str) -> str:
    return (f"see what holds it (`rbd du -p {pool}`, `rbd trash ls -p {pool}`) and free it, or add OSDs; "
            f"at the full ratio `rbd rm` fails (the trash move needs space): raise the full ratio for the "
            f"cleanup ({_cmd('osd', 'set-full-ratio', 'RATIO')}) or `rados -p {pool} rm --force-full OBJECT`")


def plan(resource: Resource, o: PoolObserved, drift: Sequence[Drift]) -> Plan:
    spec, pool = resource.spec, o.pool
    message = summary(o)
    if not drift:
        return Plan(message=message)
    actions: list[Action] = []
    blocked: list[str] = []
    converging = None
    for d in drift:
        if d.field == "quota.max_bytes":
            want = int(d.want)
            if o.stored < want:
                actions.append(Action("set-quota", f"pool {pool}",
                                      f"ceph osd pool set-quota {pool} max_bytes {want} ({format_bytes(want)}; "
                                      f"was {'none' if o.quota_bytes is None else format_bytes(o.quota_bytes)}, "
                                      f"stored {format_bytes(o.stored)})",
                                      params={"pool": pool, "max_bytes": want}))
            else:
                blocked.append(f"quota.max_bytes {want} ({format_bytes(want)}) is at or below what pool {pool} "
                               f"stores ({o.stored}, {format_bytes(o.stored)}): set now, it would block every "
                               f"writer of the pool at once; not set. Free space first, or declare a larger quota "
                               f"({_cmd('osd', 'pool', 'set-quota', pool, 'max_bytes', str(want))} does it by hand)")
        elif d.field == "healthy":
            blocked.append(f"pool {pool} is filling: {d.have}; {_freeing(pool)}")
        elif d.field == "min_free":
            blocked.append(f"pool {pool}: {free_words(o)}, below min_free {d.want[2:]}; {_freeing(pool)}")
        elif d.field == "quota.min_free":
            quota = (spec.get("quota") or {}).get("max_bytes") or o.quota_bytes
            by_hand = _cmd("osd", "pool", "set-quota", pool, "max_bytes", str(quota or "BYTES"))
            blocked.append(f"pool {pool}: {d.have}, below quota.min_free {d.want[2:]}: free space, or raise the quota "
                           f"in the state file (reconcile sets it; {by_hand} is the command)")
        elif d.field == "max_overcommit":
            blocked.append(f"pool {pool}: RBD images provisioned {d.have}, above max_overcommit {d.want[2:]}: "
                           f"should the images fill, the pool fills; `rbd du -p {pool}` lists them (images are "
                           "never deleted by reconcile)")
        elif d.field == "min_days_to_full":
            if o.fill_rate is None:
                converging = f"the fill rate is not known yet: {o.rate_note}"
            else:
                blocked.append(f"pool {pool} fills in {days_words(o)}, sooner than min_days_to_full "
                               f"{d.want[2:]}; {_freeing(pool)}")
        elif d.field == "ratios":
            cmds = ", ".join(_cmd("osd", f"set-{k}-ratio", f"{v:g}")
                             for k, v in spec["ratios"].items() if abs(getattr(o.ratios, k) - v) > 5e-5)
            blocked.append(f"the cluster's ratios are {d.have}, not {d.want}: reconcile never sets them "
                           f"(they stop every pool's writers); by hand: {cmds}")
    return Plan(actions=tuple(actions), blocked="; ".join(blocked) or None,
                converging=converging if not blocked and not actions else None, message=message)


def apply(host: Host, resource: Resource, action: Action) -> str:
    if action.action != "set-quota":
        raise ApplyError(f"unknown action {action.action}")
    pool, want = action.params["pool"], int(action.params["max_bytes"])
    argv = ceph_argv(resource.spec["cluster"], "osd", "pool", "set-quota", pool, "max_bytes", str(want))
    return run_action(host, argv, timeout=APPLY_TIMEOUT)


def summary(o: PoolObserved) -> str:
    quota = "no quota" if o.quota_bytes is None else f"quota {format_bytes(o.quota_bytes)}"
    parts = [f"{format_bytes(o.stored)} stored, {free_words(o)}, {quota}"]
    if o.overcommit is not None:
        parts.append(f"overcommit {o.overcommit:.2f}")
    parts.append(f"days to full: {days_words(o)}")
    if o.fullest_osd:
        parts.append(f"fullest OSD {o.fullest_osd} {o.fullest_osd_percent}%")
    parts.append(f"ratios {o.ratios.nearfull:g}/{o.ratios.backfillfull:g}/{o.ratios.full:g}, "
                 f"epoch {o.epoch}, via {o.via}")
    return "; ".join(parts)
