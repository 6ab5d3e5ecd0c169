"""The alerting rules (contrib/prometheus/reconcile.rules.yml) against what reconcile really
writes: each broken host alerts, naming what is broken, and a healthy host fires nothing.

`promtool test rules` is fed series taken at test time from real runs (tests/prom_scenes.py):
a cron `diff --textfile` with a GPU gone bad (blocked), a cron run and a watch whose state file
does not validate, a watch whose actions fail at every pass (with its real back-off), a watch
that stops (stuck), a host whose metrics disappear, and a healthy watch. The expected alerts'
labels are read from the same series (the resource's id, the refusal's reason).

The rules are used as shipped, with their annotations left out (their text is the static unit
test's business, contrib/prometheus/reconcile.rules.test.yml): expressions and `for:` as they are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import run_cli
from gpu_support import FakeConfig, nvml_env, seed_gpus
from prom_scenes import Scene, parse, promtool_file, watch_runs

pytest.importorskip("prometheus_client.parser", reason="prometheus_client not installed (pip: the test extra)")
ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "contrib" / "prometheus" / "reconcile.rules.yml"
PROMTOOL = "/usr/bin/promtool"
pytestmark = pytest.mark.skipif(not os.access(PROMTOOL, os.X_OK), reason="promtool not installed (Debian: prometheus)")

STEPS = 50  # minutes of model time


def load_rules() -> dict:
    from ruamel.yaml import YAML

    return json.loads(json.dumps(YAML(typ="safe").load(RULES.read_text())))


ALERTS = [rule["alert"] for group in load_rules()["groups"] for rule in group["rules"] if "alert" in rule]
SEVERITY = {rule["alert"]: rule["labels"]["severity"] for group in load_rules()["groups"]
            for rule in group["rules"] if "alert" in rule}


def rules_without_annotations(tmp: Path) -> Path:
    doc = load_rules()
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    out = tmp / "rules.yml"
    out.write_text(json.dumps(doc, indent=1))  # JSON is YAML: promtool reads it as it is
    return out


def one(samples, name: str, **match: str) -> dict[str, str]:
    """The labels of the one sample called `name` whose labels include `match` and whose value is 1
    (or more), as reconcile wrote it."""
    hits = [labels for n, labels, v in samples if n == name and v >= 1 and match.items() <= labels.items()]
    assert len(hits) == 1, (name, match, hits)
    return hits[0]


def expect(alert: str, instance: str, **labels: str) -> dict:
    return {"exp_labels": {"severity": SEVERITY[alert], "instance": instance, "job": "node", **labels}}


def cron_runs(text: str, every: int = 60, until: int = STEPS * 60) -> list[tuple[float, str]]:
    """The same run repeated by cron every minute (its timestamps move with it)."""
    return [(float(t), text) for t in range(0, until + 1, every)]


@pytest.fixture
def scenes(tmp_path, fake_lib, monkeypatch):
    """The hosts, each from real runs; returns (scenes, expected firing alerts per eval time)."""
    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(tmp_path / "rstate"))
    textdir = tmp_path / "cron"
    textdir.mkdir()
    found: dict[str, list] = {}

    # blocked: a GPU with uncorrected ECC errors, audited by cron (`diff --textfile --interval`).
    gpus = seed_gpus(2)
    gpus[1].ecc_volatile = 3
    config = FakeConfig(gpus=gpus).write(tmp_path / "gpus.conf")
    gstate = tmp_path / "gpus.yaml"
    gstate.write_text("version: 1\ngpus:\n  count: 2\n  healthy: true\n")
    proc = run_cli(tmp_path, "diff", str(gstate), "--textfile", str(textdir), "--interval", "1m",
                   **nvml_env(fake_lib, config))
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(run_cli(tmp_path, "diff", str(gstate), "--format", "json", **nvml_env(fake_lib, config)).stdout)
    assert [r["status"] for r in doc["resources"]] == ["blocked"]  # the JSON report says so too
    blocked = (textdir / "reconcile.prom").read_text()
    found["blocked"] = parse(blocked)
    found["nvml"] = nvml_env(fake_lib, config)

    # invalid state file, cron: the run exits 1 and still publishes why.
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmounts:\n  /:\n    mountd: true\n")
    proc = run_cli(tmp_path, "diff", str(bad), "--textfile", str(textdir), "--interval", "1m")
    assert proc.returncode == 1 and proc.stderr.startswith(f"{bad}:4:5: "), proc.stderr
    invalid_cron = (textdir / "reconcile.prom").read_text()
    found["invalid-cron"] = parse(invalid_cron)

    # invalid state file from the watch's first pass (a bad push, then a reboot): no report ever.
    invalid_watch = watch_runs(bad, 8, 60.0)
    found["invalid-watch"] = parse(invalid_watch[-1][1])

    # actions failing at every pass: an extraction whose resume cannot start (its cwd is missing).
    out = tmp_path / "samples"
    out.mkdir()
    fstate = tmp_path / "failing.yaml"
    fstate.write_text(f"version: 1\nextractions:\n  eagle3:\n    dir: {out}\n"
                      "    pattern: 'rows_{group}/data_{index}.ckpt'\n"
                      f"    total: 10\n    job:\n      command: [\"true\"]\n      cwd: {tmp_path / 'gone'}\n")
    failing = watch_runs(fstate, 8, 60.0)
    assert failing[-1][0] > STEPS * 60  # the real back-off spread 8 passes over the whole timeline
    found["failing"] = parse(failing[-1][1])

    # healthy: a watch on `/` mounted, every minute; stuck: the same watch, stopped after 3 passes.
    good = tmp_path / "good.yaml"
    good.write_text("version: 1\nmounts:\n  /:\n    mounted: true\n")
    healthy = watch_runs(good, 3, 60.0)
    assert [t for t, _ in healthy] == [0.0, 60.0, 120.0]
    found["healthy"] = parse(healthy[-1][1])
    healthy_text = healthy[-1][1]

    hosts = [
        Scene("blocked:9100", cron_runs(blocked)),
        Scene("invalid-cron:9100", cron_runs(invalid_cron)),
        Scene("invalid-watch:9100", invalid_watch),
        Scene("failing:9100", failing),
        # The healthy watch keeps passing every minute: its real file, rewritten each minute.
        Scene("healthy:9100", [(float(t), healthy_text) for t in range(0, STEPS * 60 + 1, 60)]),
        Scene("stuck:9100", healthy),  # passes at 0, 1, 2 minutes, then never again
        Scene("gone:9100", [(float(t), healthy_text) for t in range(0, 601, 60)], gone_at=660.0),
    ]
    return hosts, found


def firing_at(found: dict, minute: int) -> dict[str, list[dict]]:
    """What must be firing at `minute`, by alert: the rules' meaning, with the labels reconcile wrote."""
    want: dict[str, list[dict]] = {a: [] for a in ALERTS}
    gpu_bad = one(found["blocked"], "reconcile_gpu_health", health="unhealthy")
    want["ReconcileGpuUnhealthy"].append(expect("ReconcileGpuUnhealthy", "blocked:9100", **gpu_bad))
    if minute >= 10:
        res = one(found["blocked"], "reconcile_resource_status", status="blocked")
        want["ReconcileResourceBlocked"].append(expect("ReconcileResourceBlocked", "blocked:9100", **res))
    if minute >= 5:
        for host in ("invalid-cron", "invalid-watch"):
            reason = one(found[host], "reconcile_error_info")
            assert reason == {"reason": "state-file"}
            want["ReconcileCannotRun"].append(expect("ReconcileCannotRun", f"{host}:9100", **reason))
    if minute >= 15:
        res = one(found["failing"], "reconcile_resource_actions_failed")
        want["ReconcileActionsFailing"].append(expect("ReconcileActionsFailing", "failing:9100", **res))
    if minute >= 7:  # its extraction makes no progress either: from the second sample, held 5 minutes
        want["ReconcileExtractionStalled"].append(expect("ReconcileExtractionStalled", "failing:9100",
                                                         id=one(found["failing"], "reconcile_resource_status",
                                                                status="drift")["id"]))
    if minute >= 30:
        res = one(found["failing"], "reconcile_resource_status", status="drift")
        want["ReconcileDriftPersists"].append(expect("ReconcileDriftPersists", "failing:9100", **res))
    # stuck: last pass at 2m, due at 3m; overdue by more than 5 minutes from 8m, held 5 minutes.
    if minute >= 14:
        want["ReconcileNotRunning"].append(expect("ReconcileNotRunning", "stuck:9100"))
    # its file: last written at 2m; older than 2 intervals + 15 minutes from 19m, held 5 minutes.
    if minute >= 25:
        want["ReconcileTextfileStale"].append(
            expect("ReconcileTextfileStale", "stuck:9100", file="/var/lib/prometheus/node-exporter/reconcile.prom"))
    # gone at 11m: the last sample is seen for 5 more minutes, then gone, held 5 minutes.
    if minute >= 22:
        want["ReconcileMetricsGone"].append(expect("ReconcileMetricsGone", "gone:9100"))
    return want


# Eval times away from each alert's boundary by a minute or more (the boundaries are the static
# unit test's: contrib/prometheus/reconcile.rules.test.yml and its mutations in test_prometheus.py).
EVAL_MINUTES = [1, 3, 12, 17, 24, 27, 33, 48]


def test_every_broken_host_alerts_and_the_healthy_one_never(tmp_path, scenes):
    hosts, found = scenes
    checks = []
    for minute in EVAL_MINUTES:
        for alert, exp in firing_at(found, minute).items():
            checks.append({"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": exp})
    doc = promtool_file(rules_without_annotations(tmp_path), hosts, STEPS, checks)
    (tmp_path / "alerts.test.yml").write_text(json.dumps(doc, indent=1))
    proc = subprocess.run([PROMTOOL, "test", "rules", "alerts.test.yml"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    # Every alert of the rules file was expected to fire somewhere, except the fleet-wide absent().
    fired = {c["alertname"] for c in checks if c["exp_alerts"]}
    assert set(ALERTS) - fired == {"ReconcileMetricsAbsent", "ReconcileResourceUnobservable"}


def test_no_metrics_anywhere_fires_absent(tmp_path, scenes):
    """The only host's metrics go away: ReconcileMetricsGone names it, and 15 minutes after its
    series end absent(reconcile_up) fires for the whole fleet."""
    hosts, found = scenes
    gone = [h for h in hosts if h.instance == "gone:9100"]
    checks = [
        {"eval_time": "20m", "alertname": "ReconcileMetricsAbsent", "exp_alerts": []},
        {"eval_time": "33m", "alertname": "ReconcileMetricsAbsent", "exp_alerts": [{"exp_labels": {
            "severity": SEVERITY["ReconcileMetricsAbsent"]}}]},
        {"eval_time": "33m", "alertname": "ReconcileMetricsGone",
         "exp_alerts": [expect("ReconcileMetricsGone", "gone:9100")]},
        {"eval_time": "5m", "alertname": "ReconcileMetricsGone", "exp_alerts": []},
    ]
    doc = promtool_file(rules_without_annotations(tmp_path), gone, STEPS, checks)
    (tmp_path / "absent.test.yml").write_text(json.dumps(doc, indent=1))
    proc = subprocess.run([PROMTOOL, "test", "rules", "absent.test.yml"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_gpu_series_join_dcgm_exporters_labels(scenes):
    """dcgm-exporter labels its series gpu, UUID, pci_bus_id, device, modelName, Hostname: each GPU
    series of reconcile carries the join keys (UUID, pci_bus_id) as dcgm spells them, with the
    values the driver gave (the fake NVML through pynvml), and reconcile_gpu_info the rest."""
    _, found = scenes
    health = [labels for n, labels, _ in found["blocked"] if n == "reconcile_gpu_health"]
    assert health and all(labels["UUID"] == labels["uuid"] and labels["pci_bus_id"] == labels["bus_id"]
                          for labels in health)
    info = [labels for n, labels, _ in found["blocked"] if n == "reconcile_gpu_info"]
    # What the driver says, through the real pynvml (the fake libnvidia-ml.so.1 behind it).
    probe = ("import json, pynvml; pynvml.nvmlInit(); hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in "
             "range(pynvml.nvmlDeviceGetCount())]; print(json.dumps([[str(i), pynvml.nvmlDeviceGetUUID(h), "
             "pynvml.nvmlDeviceGetPciInfo(h).busId.decode() if isinstance(pynvml.nvmlDeviceGetPciInfo(h).busId, bytes) "
             "else pynvml.nvmlDeviceGetPciInfo(h).busId, pynvml.nvmlDeviceGetName(h)] for i, h in enumerate(hs)]))")
    driver = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                       timeout=30, env={**os.environ, **found["nvml"]}).stdout)
    assert sorted([i["gpu"], i["UUID"], i["pci_bus_id"], i["model_name"]] for i in info) == sorted(driver)
    assert {k for i in info for k in i} == {"gpu", "UUID", "pci_bus_id", "device", "model_name", "Hostname"}


def test_the_cron_recipe_publishes_every_outcome_atomically(tmp_path):
    """docs/prometheus.md's cron line, `diff --textfile DIR --interval 15m`: a drifted run (exit 2)
    and a state file that does not validate (exit 1) are both published, each replacing the file
    whole (a reader holding the old one reads it whole), and nothing else is left in DIR."""
    textdir = tmp_path / "node-exporter"
    textdir.mkdir()
    out = tmp_path / "samples"
    out.mkdir()
    state = tmp_path / "s.yaml"
    state.write_text(f"version: 1\nextractions:\n  eagle3:\n    dir: {out}\n"
                     "    pattern: 'rows_{group}/data_{index}.ckpt'\n    total: 10\n")
    proc = run_cli(tmp_path, "diff", str(state), "--format", "json", "--textfile", str(textdir), "--interval", "15m")
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stdout)
    first = parse((textdir / "reconcile.prom").read_text())
    status = {labels["status"]: v for n, labels, v in first if n == "reconcile_resource_status"}
    said = doc["resources"][0]["status"]  # what the same run's JSON report says
    assert said != "ok" and status[said] == 1 and sum(status.values()) == 1
    assert ("reconcile_run_interval_seconds", {}, 900.0) in first
    with open(textdir / "reconcile.prom") as reader:
        state.write_text("version: 1\nextractions: [\n")
        proc = run_cli(tmp_path, "diff", str(state), "--textfile", str(textdir), "--interval", "15m")
        assert proc.returncode == 1
        assert parse(reader.read()) == first  # the old file, whole: replaced by rename(2)
    now = parse((textdir / "reconcile.prom").read_text())
    assert ("reconcile_up", {}, 0.0) in now and ("reconcile_state_file_valid", {}, 0.0) in now
    assert ("reconcile_error_info", {"reason": "state-file"}, 1.0) in now
    assert [p.name for p in textdir.iterdir()] == ["reconcile.prom"]
    proc = run_cli(tmp_path, "diff", str(state), "--textfile", str(textdir))
    assert proc.returncode == 1 and "--textfile needs --interval" in proc.stderr
