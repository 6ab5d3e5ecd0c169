"""The pools kind's reading of Ceph's JSON, its verdicts and its plan, on answers captured from a
real Ceph 16.2.15 (tests/data/pools/README.md says how). The expected numbers are read from the
same captured JSON by the test, never typed in; the state-file checks run through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import run_cli
from reconcile_host.core.contract import Resource
from reconcile_host.reconcilers.pools import records
from reconcile_host.reconcilers.pools.parsers import NoPool, NotCurrent, observed_from, provisioned_from_du
from reconcile_host.reconcilers.pools.plan import plan
from reconcile_host.reconcilers.pools.spec import normalise
from reconcile_host.reconcilers.pools.verdicts import diff

DATA = Path(__file__).resolve().parent / "data" / "pools"


def answers(case: str) -> dict:
    got = {name: json.loads((DATA / case / f"{name}.json").read_text())
           for name in ("df", "osd_dump", "osd_df", "health", "pgs")}
    return got


def df_stats(a: dict, pool: str) -> dict:
    return next(p["stats"] for p in a["df"]["pools"] if p["name"] == pool)


def resource(**fields) -> Resource:
    return Resource(id="pool:vm", kind="pool", name="vm", spec=normalise("vm", fields))


def test_healthy_pool_read_as_ceph_wrote_it():
    a = answers("healthy")
    o = observed_from("vm", "python3-rados", a)
    stats = df_stats(a, "vm")
    assert (o.stored, o.max_avail, o.free) == (stats["stored"], stats["max_avail"], stats["max_avail"])
    assert o.quota_bytes is None and stats["quota_bytes"] == 0
    assert o.cluster == a["osd_dump"]["fsid"] and o.epoch == a["osd_dump"]["epoch"]
    assert o.ratios.full == round(a["osd_dump"]["full_ratio"], 4)
    assert o.pgs == len(a["pgs"]["pg_stats"]) and o.osds == (0,)
    assert o.flags == () and o.health == ()
    assert set(a["health"]["checks"]) == {line.split(":")[0] for line in o.other_health}
    top = max(a["osd_df"]["nodes"], key=lambda n: n["utilization"])
    assert o.fullest_osd == top["name"]
    assert diff(resource(healthy=True, min_free=stats["max_avail"]).spec, o) == []


def test_over_quota_free_counts_the_quota_not_max_avail():
    a = answers("over_quota")
    o = observed_from("vm", "ceph CLI", a)
    stats = df_stats(a, "vm")
    pool = next(p for p in a["osd_dump"]["pools"] if p["pool_name"] == "vm")
    assert o.quota_bytes == pool["quota_max_bytes"] == stats["quota_bytes"]
    assert o.quota_room == stats["quota_bytes"] - stats["stored"] < 0
    assert o.free == 0 < o.max_avail == stats["max_avail"]
    assert set(o.flags) == {"full", "full_quota"} & set(pool["flags_names"].split(","))
    assert [line.split(":")[0] for line in o.health] == ["POOL_FULL"]
    r = resource(healthy=True, min_free="1MiB", quota={"max_bytes": stats["quota_bytes"], "min_free": "1MiB"})
    drift = diff(r.spec, o)
    assert [d.field for d in drift] == ["healthy", "min_free", "quota.min_free"]
    p = plan(r, o, drift)
    assert p.actions == () and "rbd du -p vm" in p.blocked


def test_a_quota_is_set_only_when_the_pool_is_below_it():
    a = answers("over_quota")
    o = observed_from("vm", "ceph CLI", a)
    above = o.stored + 1
    r = resource(quota={"max_bytes": above})
    p = plan(r, o, diff(r.spec, o))
    assert [(x.action, dict(x.params)) for x in p.actions] == [("set-quota", {"pool": "vm", "max_bytes": above})]
    r = resource(quota={"max_bytes": o.stored})
    p = plan(r, o, diff(r.spec, o))
    assert p.actions == () and "block every writer" in p.blocked


def test_an_osd_down_is_not_current():
    a = answers("osd_down")
    down = [o["osd"] for o in a["osd_dump"]["osds"] if not o["up"]]
    assert down
    with pytest.raises(NotCurrent, match=f"osd.{down[0]} of pool vm is down"):
        observed_from("vm", "python3-rados", a)
    # Without the OSD map's word, the stale PGs alone say so.
    alive = {**a, "osd_dump": {**a["osd_dump"], "osds": [{**o, "up": 1} for o in a["osd_dump"]["osds"]]}}
    states = {pg["state"] for pg in a["pgs"]["pg_stats"]}
    with pytest.raises(NotCurrent, match=next(iter(states)).replace("+", r"\+")):
        observed_from("vm", "python3-rados", alive)


def test_an_unknown_pool_names_the_clusters_pools():
    a = answers("healthy")
    with pytest.raises(NoPool) as exc:
        observed_from("ghost", "python3-rados", a)
    assert all(p["pool_name"] in str(exc.value) for p in a["osd_dump"]["pools"])


def test_ratios_report_the_exact_commands():
    a = answers("healthy")
    o = observed_from("vm", "python3-rados", a)
    want = {"nearfull": round(o.ratios.nearfull - 0.05, 2), "backfillfull": o.ratios.backfillfull,
            "full": o.ratios.full}
    r = resource(ratios=want)
    p = plan(r, o, diff(r.spec, o))
    assert p.actions == () and f"`ceph osd set-nearfull-ratio {want['nearfull']:g}`" in p.blocked
    assert "set-full-ratio" not in p.blocked  # only what differs


def test_overcommit_from_rbd_du():
    a = answers("healthy")
    du = {"images": [{"name": "a", "provisioned_size": 3 << 30, "used_size": 0},
                     {"name": "a", "snapshot": "s1", "provisioned_size": 3 << 30, "used_size": 0}],
          "total_provisioned_size": 3 << 30, "total_used_size": 0}
    provisioned = provisioned_from_du(du)
    assert provisioned == du["total_provisioned_size"]  # rbd's own total counts the image once
    o = observed_from("vm", "python3-rados", a, provisioned=provisioned)
    assert o.overcommit == round(provisioned / (o.stored + o.free), 4)


def test_rate_unknown_until_two_observations_ten_minutes_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(tmp_path))
    r, note = records.keep("fsid", "vm", 1000.0, 100)
    assert r is None and note.startswith("unknown")
    r, note = records.keep("fsid", "vm", 1000.0 + records.RATE_MIN_SPAN - 1, 200)
    assert r is None and "10m" in note
    r, note = records.keep("fsid", "vm", 1000.0 + records.RATE_MIN_SPAN, 300)
    assert r is not None and r > 0
    # Older than the window: dropped from the record.
    r, note = records.keep("fsid", "vm", 1000.0 + records.RATE_WINDOW + 1, 300)
    kept = records.load(records.record_path("fsid", "vm"))
    assert min(t for t, _ in kept) > 1000.0


STATE = """\
version: 1
pools:
  vm:
    quota: {max_bytes: 1.3MiB, min_free: 500GiB}
    max_overcommit: 0
    ratios: {nearfull: 0.85, backfillfull: 0.80, full: 0.98}
  other:
    ratios: {nearfull: 0.5}
  third:
    cluster: {conf: /etc/ceph/other.conf}
    ratios: {nearfull: 1.5}
    quota: {max_bytes: 1MiB, min_free: 1MiB}
"""


def test_bad_input_is_one_line_each_with_its_position(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(STATE)
    proc = run_cli(tmp_path, "validate", str(path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"{path}:4:24: pools.vm.quota.max_bytes: 1.3MiB is not a whole number of bytes; reconcile sends Ceph bytes "
        "(it reads `10G` as GiB): give bytes or a size that comes out whole",
        f"{path}:4:42: pools.vm.quota.min_free: 500GiB is not below quota.max_bytes 1.3MiB: the room under the "
        "quota could never be that large",
        f"{path}:5:21: pools.vm.max_overcommit: 0 allows no image at all; give a positive factor (1.0: no thin "
        "provisioning)",
        f"{path}:6:44: pools.vm.ratios.backfillfull: 0.8 is not above nearfull 0.85: Ceph wants nearfull < "
        "backfillfull < full (else OSD_OUT_OF_ORDER_FULL)",
        f"{path}:6:56: pools.vm.ratios.full: 0.98 is at or above osd_failsafe_full_ratio (0.97): the OSDs would "
        "refuse every write before the cluster ever says full",
        f"{path}:8:13: pools.other.ratios: differ from pool vm's of the same cluster (/etc/ceph/ceph.conf): the "
        "ratios are the cluster's, one set for all its pools",
        f"{path}:11:24: pools.third.ratios.nearfull: 1.5 is not a ratio: Ceph's ratios are between 0 and 1 (0.85 "
        "is 85% full)",
        f"{path}:12:40: pools.third.quota.min_free: 1MiB is not below quota.max_bytes 1MiB: the room under the "
        "quota could never be that large",
    ], lines
    ok = tmp_path / "ok.yaml"
    ok.write_text("version: 1\npools:\n  vm:\n    quota: {max_bytes: 1.5GiB, min_free: 1GiB}\n    max_overcommit: 1.5\n"
                  "    ratios: {nearfull: 0.85, backfillfull: 0.9, full: 0.95}\n    min_days_to_full: 5d\n")
    assert run_cli(tmp_path, "validate", str(ok)).returncode == 0
