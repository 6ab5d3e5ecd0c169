"""The pools kind against a real Ceph (tests/ceph_support.py: one mon, one mgr, one memstore OSD,
cephx, loopback), through the real CLI, read with a read-only key both ways reconcile reads:
librados' binding (python3-rados, loaded by path from Debian's dist-packages) and the `ceph` CLI.

Every expected number comes from Ceph's own JSON at test time (`ceph df detail`, `osd dump`,
`osd pool get-quota`, `rbd du`), read with the admin key; each test has a pool of its own."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from ceph_support import Cluster, needs_ceph, session_cluster  # noqa: F401 - session_cluster: the `ceph_cluster` fixture
from cli_support import reconcile_json, run_cli

pytestmark = needs_ceph
CLIENTS = ["rados", "cli"]  # RECONCILE_CEPH_CLIENT: librados' binding, the `ceph` CLI
READ_PREFIXES = {"df", "osd dump", "osd df", "health", "pg ls-by-pool"}


def new_pool(c: Cluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    c.ceph("osd", "pool", "create", name, "8")
    c.ceph("osd", "pool", "application", "enable", name, "rbd")
    c.wait_clean()
    wait_for(f"`ceph df` lists {name}", lambda: df_objects(c, name) is not None)
    return name


def state(tmp: Path, c: Cluster, pool: str, body: str, *, reader: bool = True, conf: Path | None = None,
          keyring: Path | None = None) -> Path:
    who = "reconcile" if reader else "admin"
    keyring = keyring or (c.reader_keyring if reader else c.admin_keyring)
    path = tmp / f"{pool}.yaml"
    lines = "\n".join("    " + ln for ln in body.strip().splitlines())
    timeout = "" if "observe_timeout" in body else "    observe_timeout: 20s\n"
    path.write_text(f"version: 1\npools:\n  {pool}:\n    cluster: {{conf: {conf or c.conf}, id: {who}, "
                    f"keyring: {keyring}}}\n{timeout}{lines}\n")
    return path


def pool_df(c: Cluster, pool: str) -> dict:
    return next(p["stats"] for p in c.json("df", "detail")["pools"] if p["name"] == pool)


def df_objects(c: Cluster, pool: str) -> int | None:
    """The objects `ceph df` counts in POOL; None while it does not list the pool yet (the manager,
    which answers `ceph df`, learns of a new pool from the PG stats, a while after it is made)."""
    return next((p["stats"]["objects"] for p in c.json("df", "detail")["pools"] if p["name"] == pool), None)


def one(doc: dict) -> dict:
    assert doc is not None
    (res,) = doc["resources"]
    return res


def audit_lines(c: Cluster) -> list[str]:
    return c.audit_log.read_text(errors="replace").splitlines() if c.audit_log.exists() else []


def audit_since(c: Cluster, before: int) -> list[str]:
    """The audit log's lines after the first BEFORE, once it holds every command sent so far: the
    monitor writes its cluster log after a Paxos commit, a while after the command. A command of
    the admin's own, sent now, is written after them; its line is waited for."""
    marker = f"reconcile-test-{uuid.uuid4().hex}"
    c.ceph("log", marker)
    wait_for(f"the audit log's line for `ceph log {marker}`", lambda: any(marker in ln for ln in audit_lines(c)))
    return audit_lines(c)[before:]


def put(c: Cluster, pool: str, tmp: Path, count: int, size: int = 4 << 20, may_block: bool = False) -> int:
    """Write COUNT objects; with MAY_BLOCK, stop at the first write that blocks (a pool flagged full
    blocks its writers: what Ceph does) and go on. Then wait until `ceph df` counts every object
    `rados ls` lists. The pool's stored bytes, as `ceph df` then says."""
    blob = tmp / "blob"
    blob.write_bytes(os.urandom(size))
    for i in range(count):
        argv = ["rados", "-c", str(c.conf), "-n", "client.admin", "-k", str(c.admin_keyring), "-p", pool, "put",
                f"obj-{uuid.uuid4().hex[:8]}-{i}", str(blob)]
        try:
            subprocess.run(argv, check=True, capture_output=True, timeout=20 if may_block else 120)
        except subprocess.TimeoutExpired:
            if not may_block:
                raise
            break
    return settled(c, pool)


def settled(c: Cluster, pool: str) -> int:
    listed = len(c.tool("rados", "-p", pool, "ls").stdout.split())
    wait_for("`ceph df` counts what `rados ls` lists", lambda: df_objects(c, pool) == listed)
    return pool_df(c, pool)["stored"]


def wait_for(what, check, deadline: float = 120.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"not within {deadline}s: {what}")


@pytest.mark.parametrize("client", CLIENTS)
def test_observes_what_ceph_says_and_writes_nothing(tmp_path, ceph_cluster, client):
    c = ceph_cluster
    pool = new_pool(c, "obs")
    put(c, pool, tmp_path, 2)
    before_dump = c.json("osd", "dump")
    before_df = pool_df(c, pool)
    audit_before = len(audit_lines(c))
    path = state(tmp_path, c, pool, "healthy: true\nmin_free: 1MiB")
    run = reconcile_json(tmp_path, "diff", str(path), RECONCILE_CEPH_CLIENT=client)
    after_df = pool_df(c, pool)
    res = one(run.doc)
    assert run.code == 0 and res["status"] == "ok", (run, res)
    o = res["observed"]
    assert o["via"] == ("python3-rados" if client == "rados" else "ceph CLI")
    assert o["stored"] == before_df["stored"] == after_df["stored"]
    assert min(before_df["max_avail"], after_df["max_avail"]) <= o["max_avail"] <= max(before_df["max_avail"],
                                                                                        after_df["max_avail"])
    assert o["quota_bytes"] is None and before_df["quota_bytes"] == 0  # Ceph's 0: no quota
    assert o["free"] == o["max_avail"]
    assert o["cluster"] == before_dump["fsid"] and o["epoch"] == before_dump["epoch"]
    r = before_dump
    assert (o["ratios"]["nearfull"], o["ratios"]["full"]) == (round(r["nearfull_ratio"], 4), round(r["full_ratio"], 4))
    # The first observation: no rate yet, and the report says so.
    assert o["fill_rate"] is None and o["rate_note"].startswith("unknown")
    # Wrote nothing: the OSD map's epoch is where it was, and the mon's audit log holds only reads
    # by client.reconcile since.
    assert c.json("osd", "dump")["epoch"] == before_dump["epoch"]
    mine = [ln for ln in audit_since(c, audit_before) if "entity='client.reconcile'" in ln]
    assert mine, "the audit log shows no command of client.reconcile"
    for ln in mine:
        cmd = json.loads(ln[ln.index("cmd=") + 4:ln.rindex("]") + 1])[0]
        assert cmd["prefix"] in READ_PREFIXES, ln


def test_quota_set_only_below_what_is_stored_and_its_overshoot(tmp_path, ceph_cluster):
    c = ceph_cluster
    pool = new_pool(c, "quota")
    stored = put(c, pool, tmp_path, 3)
    want = stored + (16 << 20)  # room for four more 4 MiB objects
    path = state(tmp_path, c, pool, f"quota: {{max_bytes: {want}}}", reader=False)
    journal = tmp_path / "journal.jsonl"
    run = reconcile_json(tmp_path, "apply", str(path), "--journal", str(journal))
    assert run.code == 0, run
    assert c.json("osd", "pool", "get-quota", pool)["quota_max_bytes"] == want
    logged = json.loads(run_cli(tmp_path, "log", "--journal", str(journal), "--resource", f"pool:{pool}",
                                "--format", "json").stdout)
    (event,) = logged["events"]
    assert [(a["action"], a["outcome"]) for a in event["actions"]] == [("set-quota", "done")]
    assert {"resource": f"pool:{pool}", "before": {"quota_bytes": None}, "after": {"quota_bytes": want}} in \
        [{**o, "before": {k: v for k, v in o["before"].items() if k == "quota_bytes"},
          "after": {k: v for k, v in o["after"].items() if k == "quota_bytes"}} for o in event["observed"]]

    # A quota at or below what the pool stores would block every writer now: blocked, not set.
    low = stored // 2
    path = state(tmp_path, c, pool, f"quota: {{max_bytes: {low}}}", reader=False)
    run = reconcile_json(tmp_path, "apply", str(path), "--journal", str(journal))
    res = one(run.doc)
    assert res["status"] == "blocked" and "block every writer" in res["message"], res
    assert c.json("osd", "pool", "get-quota", pool)["quota_max_bytes"] == want

    # Past the quota: in-flight writes overshoot it, the mon flags the pool full_quota, `ceph df`'s
    # max_avail still counts the cluster's space; reconcile's free counts the quota.
    put(c, pool, tmp_path, 6, may_block=True)
    wait_for("the pool is flagged full_quota", lambda: "full_quota" in next(
        p for p in c.json("osd", "dump")["pools"] if p["pool_name"] == pool)["flags_names"])
    settled(c, pool)
    path = state(tmp_path, c, pool, f"healthy: true\nmin_free: 1MiB\nquota: {{max_bytes: {want}, min_free: 1MiB}}")
    run = reconcile_json(tmp_path, "diff", str(path))
    df = pool_df(c, pool)
    res = one(run.doc)
    o = res["observed"]
    assert o["stored"] == df["stored"] and o["quota_bytes"] == df["quota_bytes"] == want
    assert o["quota_room"] == want - df["stored"] < 0 and o["free"] == 0 < df["max_avail"]
    health = c.json("health", "detail")["checks"]
    assert "full_quota" in o["flags"] and "POOL_FULL" in health
    drift = {d["field"]: d for d in res["drift"]}
    assert set(drift) == {"healthy", "min_free", "quota.min_free"}, drift
    assert "full_quota" in drift["healthy"]["have"] and health["POOL_FULL"]["summary"]["message"] in \
        drift["healthy"]["have"]
    assert res["status"] == "blocked" and run.code == 2


def test_thin_provisioning_from_rbd_du(tmp_path, ceph_cluster):
    c = ceph_cluster
    pool = new_pool(c, "thin")
    total = c.json("df")["stats"]["total_bytes"]
    c.tool("rbd", "create", "--size", f"{2 * total >> 20}M", f"{pool}/disk-0")
    path = state(tmp_path, c, pool, "max_overcommit: 1.5")
    run = reconcile_json(tmp_path, "diff", str(path))
    res = one(run.doc)
    du = json.loads(c.tool("rbd", "du", "-p", pool, "--format", "json").stdout)
    provisioned = sum(i["provisioned_size"] for i in du["images"])
    o = res["observed"]
    df = pool_df(c, pool)
    assert o["provisioned"] == provisioned and o["stored"] == df["stored"]
    assert o["overcommit"] == round(provisioned / (o["stored"] + o["free"]), 4) > 1.5
    assert [d["field"] for d in res["drift"]] == ["max_overcommit"] and res["status"] == "blocked"


def test_days_to_full_from_kept_observations(tmp_path, ceph_cluster):
    c = ceph_cluster
    pool = new_pool(c, "rate")
    path = state(tmp_path, c, pool, "min_days_to_full: 5d")
    first = reconcile_json(tmp_path, "diff", str(path))
    res = one(first.doc)
    assert res["status"] == "converging" and res["drift"][0]["field"] == "min_days_to_full", res
    assert "unknown" in res["drift"][0]["have"]
    # The kept record: two observations 10 minutes apart are needed. One from 30 minutes ago is
    # put into the record reconcile wrote, holding less than now (as if the pool had grown since).
    stored = put(c, pool, tmp_path, 4)
    (record,) = (tmp_path / "state" / "pools").iterdir()
    rec = json.loads(record.read_text())
    t0, s0 = rec["kept"][0]
    rec["kept"].insert(0, [t0 - 1800, 0])
    record.write_text(json.dumps(rec))
    second = reconcile_json(tmp_path, "diff", str(path))
    o = one(second.doc)["observed"]
    kept = json.loads(record.read_text())["kept"]
    assert [s for _, s in kept] == [0, s0, stored] and o["stored"] == stored
    slope = statistics.linear_regression([t for t, _ in kept], [s for _, s in kept]).slope
    assert o["fill_rate"] == pytest.approx(slope, rel=1e-6)
    assert o["days_to_full"] == pytest.approx(o["free"] / slope / 86400, abs=1e-4)  # kept to 4 places
    fields = [d["field"] for d in one(second.doc)["drift"]]
    assert ("min_days_to_full" in fields) == (o["days_to_full"] < 5)


def test_ratios_are_reported_with_their_commands_never_set(tmp_path, ceph_cluster):
    c = ceph_cluster
    pool = new_pool(c, "ratios")
    put(c, pool, tmp_path, 2)
    dump = c.json("osd", "dump")
    utilization = max(n["utilization"] for n in c.json("osd", "df")["nodes"]) / 100
    low = round(utilization / 2, 4)
    c.ceph("osd", "set-nearfull-ratio", str(low))
    try:
        wait_for("OSD_NEARFULL", lambda: "OSD_NEARFULL" in c.json("health", "detail")["checks"])
        declared = {k: round(dump[f"{k}_ratio"], 4) for k in ("nearfull", "backfillfull", "full")}
        body = "healthy: true\nratios: {" + ", ".join(f"{k}: {v}" for k, v in declared.items()) + "}"
        path = state(tmp_path, c, pool, body, reader=False)
        run = reconcile_json(tmp_path, "apply", str(path), "--journal", str(tmp_path / "journal.jsonl"))
        res = one(run.doc)
        drift = {d["field"]: d for d in res["drift"]}
        assert set(drift) == {"healthy", "ratios"} and "OSD_NEARFULL" in drift["healthy"]["have"]
        assert f"`ceph osd set-nearfull-ratio {declared['nearfull']:g}`" in res["message"]
        assert round(c.json("osd", "dump")["nearfull_ratio"], 4) == low  # reported, never set
    finally:
        c.ceph("osd", "set-nearfull-ratio", str(dump["nearfull_ratio"]))


@pytest.mark.parametrize("client", CLIENTS)
def test_unreachable_refused_unknown_are_errors_in_cephs_words(tmp_path, ceph_cluster, client):
    c = ceph_cluster
    pool = new_pool(c, "err")
    wrong = tmp_path / "wrong-port.conf"
    text = c.conf.read_text()
    wrong.write_text(text.replace(f"127.0.0.1:{c.port}", "127.0.0.1:1"))
    path = state(tmp_path, c, pool, "observe_timeout: 3s", conf=wrong)
    started = time.monotonic()
    res = one(reconcile_json(tmp_path, "diff", str(path), RECONCILE_CEPH_CLIENT=client).doc)
    assert res["status"] == "error" and time.monotonic() - started < 60, res
    assert "timed out" in res["message"] or "did not answer" in res["message"] or "cannot reach" in res["message"], res

    bad = tmp_path / "bad.keyring"
    key = subprocess.run(["ceph-authtool", "--gen-print-key"], capture_output=True, text=True, check=True).stdout
    bad.write_text(f"[client.reconcile]\n\tkey = {key.strip()}\n")
    path = state(tmp_path, c, pool, "healthy: true", keyring=bad)
    res = one(reconcile_json(tmp_path, "diff", str(path), RECONCILE_CEPH_CLIENT=client).doc)
    assert res["status"] == "error" and "refused client.reconcile" in res["message"], res

    path = state(tmp_path, c, "ghost", "healthy: true")
    res = one(reconcile_json(tmp_path, "diff", str(path), RECONCILE_CEPH_CLIENT=client).doc)
    assert res["status"] == "error" and "no pool named 'ghost'" in res["message"] and pool in res["message"], res


@pytest.mark.parametrize("client", CLIENTS)
def test_an_osd_down_makes_the_numbers_an_error_not_old_news(tmp_path, ceph_cluster, client):
    c = ceph_cluster
    pool = new_pool(c, "stale")
    path = state(tmp_path, c, pool, "healthy: true\nmax_overcommit: 2")
    c.stop_osd()
    try:
        assert c.ceph("df", "-f", "json").returncode == 0  # Ceph answers, with the last numbers it had
        started = time.monotonic()
        run = reconcile_json(tmp_path, "diff", str(path), RECONCILE_CEPH_CLIENT=client)
        res = one(run.doc)
        assert res["status"] == "error" and "osd.0 of pool" in res["message"] and "down" in res["message"], res
        assert time.monotonic() - started < 60  # `rbd du` (which hangs) was not asked
    finally:
        c.start_osd()
        c.wait_clean()


def test_metrics_of_a_real_run_and_the_alert_they_fire(tmp_path, ceph_cluster):
    """The kind's metrics read only fields of what it observed (tests/test_kind_metrics.py's check),
    carry the observed values, and fed to promtool fire ReconcilePoolNearlyFull for the pool that is
    nearly full counting its quota, not for the one with room."""
    from prom_scenes import Scene, parse, promtool_file
    from promtool_support import needs_promtool, promtool
    from ruamel.yaml import YAML
    from test_kind_metrics import check_metrics_reads

    c = ceph_cluster
    tight, roomy = new_pool(c, "tight"), new_pool(c, "roomy")
    stored = put(c, tight, tmp_path, 4)
    c.ceph("osd", "pool", "set-quota", tight, "max_bytes", str(stored + (256 << 10)))
    path = tmp_path / "two.yaml"
    cluster = f"{{conf: {c.conf}, id: reconcile, keyring: {c.reader_keyring}}}"
    path.write_text(f"version: 1\npools:\n  {tight}:\n    cluster: {cluster}\n    healthy: true\n"
                    f"  {roomy}:\n    cluster: {cluster}\n    healthy: true\n")
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    doc = reconcile_json(tmp_path, "diff", str(path), "--textfile", str(textfile), "--interval", "15m").doc
    check_metrics_reads(doc, "pools")
    text = (textfile / "reconcile.prom").read_text()  # the same run's report: free space moves between runs
    samples = parse(text)
    for res in doc["resources"]:
        o = res["observed"]
        got = {n: v for n, labels, v in samples if labels.get("id") == res["id"] and n.startswith("reconcile_pool_")}
        assert got["reconcile_pool_stored_bytes"] == pool_df(c, o["pool"])["stored"] == o["stored"]
        assert got["reconcile_pool_free_bytes"] == o["free"]
        assert ("reconcile_pool_quota_room_bytes" in got) == (o["quota_bytes"] is not None)
        assert "reconcile_pool_days_to_full" not in got  # the first observation: unknown, not 0
    if needs_promtool.args[0]:
        pytest.skip(needs_promtool.kwargs["reason"])
    rules = YAML(typ="safe").load((Path(__file__).resolve().parent.parent / "contrib" / "prometheus" /
                                   "reconcile-ceph.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(json.dumps(rules))
    labels = next(lb for n, lb, _ in samples if n == "reconcile_pool_free_bytes" and lb["pool"] == tight)
    want = {"severity": "critical", "instance": "pve1:9100", "job": "node", **labels}
    checks = [{"eval_time": "6m", "alertname": "ReconcilePoolNearlyFull", "exp_alerts": [{"exp_labels": want}]},
              {"eval_time": "6m", "alertname": "ReconcilePoolFillsSoon", "exp_alerts": []}]
    test = promtool_file(tmp_path / "rules.yml", [Scene("pve1:9100").run(0, text)], 10, checks)
    (tmp_path / "test.yml").write_text(json.dumps(test))
    ran = promtool("test", "rules", str(tmp_path / "test.yml"), cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
