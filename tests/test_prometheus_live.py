"""The alerting rules in a real Prometheus (Debian's prometheus) scraping real node_exporters
(prometheus-node-exporter, textfile collector) fed by real `reconcile watch` processes, all on
127.0.0.1, free ports, temporary directories.

Four hosts, each its own node_exporter: a watch on a GPU gone bad (blocked), a watch on a state
file that does not validate, a watch that is stopped (SIGSTOP: a stuck process), a healthy
watch. Each broken one must fire its alert, read from Prometheus' API; the healthy one must
have no alert, firing or pending, over several rule evaluations after its metrics arrived.

The test controls the work, not the clock: one-second intervals, and the shipped rules with
their durations shortened (every `for:`, the not-running margin's 5-minute floor, the stale
file's 15 minutes, the range windows); their expressions are otherwise as shipped, and each
shortened constant must be found in the shipped file, so a changed rule cannot slip by."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv, wait_for
from gpu_support import FakeConfig, nvml_env, seed_gpus
from ssh_support import free_port

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "contrib" / "prometheus" / "reconcile.rules.yml"
PROMETHEUS = "/usr/bin/prometheus"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
pytestmark = pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(NODE_EXPORTER, os.X_OK)),
                                reason="prometheus / prometheus-node-exporter not installed (Debian packages)")

SHORTER = [  # (pattern in the shipped rules, replacement): durations only
    (r"for: \d+m", "for: 2s"),
    # Margins well above a loaded CI machine's pass time plus scrape and evaluation lag (1 s
    # each), so the healthy watch cannot be late by accident; the stuck one is late for good.
    (r"clamp_min\(reconcile_run_interval_seconds, 300\)", "clamp_min(reconcile_run_interval_seconds, 10)"),
    (r"2 \* reconcile_run_interval_seconds \+ 900", "2 * reconcile_run_interval_seconds + 20"),
    (r"\[1h\]", "[2m]"),
    (r"\[30m\]", "[30s]"),
]


def short_rules(tmp: Path) -> Path:
    text = RULES.read_text()
    for pattern, repl in SHORTER:
        text, n = re.subn(pattern, repl, text)
        assert n, f"{pattern} not in {RULES}: update the test with the rule"
    out = tmp / "rules.yml"
    out.write_text(text)
    return out


def api(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        doc = json.loads(resp.read())
    assert doc["status"] == "success", doc
    return doc["data"]


class Daemons:
    """Processes this test started; stopped (and reaped) whatever happens."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], **kw) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **kw)
        log.close()
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a stopped watch must see its SIGTERM
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def daemons(tmp_path):
    d = Daemons(tmp_path)
    yield d
    d.stop()


def test_broken_hosts_fire_and_the_healthy_one_never(tmp_path, fake_lib, daemons):
    gpus = seed_gpus(2)
    gpus[1].ecc_volatile = 3  # uncorrected ECC errors: GPU 1 unhealthy, the gpus resource blocked
    config = FakeConfig(gpus=gpus).write(tmp_path / "gpus.conf")
    states = {
        "blocked": "version: 1\ngpus:\n  count: 2\n  healthy: true\n",
        "invalid": "version: 1\nmounts:\n  /:\n    mountd: true\n",
        "stuck": "version: 1\nmounts:\n  /:\n    mounted: true\n",
        "healthy": "version: 1\nmounts:\n  /:\n    mounted: true\n",
    }
    targets: dict[str, str] = {}
    watches: dict[str, subprocess.Popen] = {}
    for name, text in states.items():
        home = tmp_path / name
        (home / "textfile").mkdir(parents=True)
        (home / "state.yaml").write_text(text)
        port = free_port()
        daemons.start(f"node_exporter-{name}", [
            NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
            "--collector.textfile", f"--collector.textfile.directory={home / 'textfile'}"])
        targets[f"127.0.0.1:{port}"] = name
        watches[name] = daemons.start(f"watch-{name}", reconcile_argv(
            "watch", str(home / "state.yaml"), "--interval", "1s", "--textfile", str(home / "textfile"),
            "--journal", str(home / "journal.jsonl")), env=cli_env(home, **nvml_env(fake_lib, config)))
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(short_rules(tmp_path))],
        "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": sorted(targets)}]}],
    }))
    prometheus = daemons.start("prometheus", [
        PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prom_port}"])

    def log_of(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]

    def query(expr: str) -> list[dict]:
        assert prometheus.poll() is None, log_of("prometheus")
        try:
            return api(prom_port, "/api/v1/query?query=" + urllib.request.quote(expr))["result"]
        except OSError:
            return []

    # Every host's metrics are in Prometheus (the first passes are done and scraped).
    wait_for(lambda: len(query("reconcile_up")) == 4 or None, timeout=90, what="reconcile_up from all four hosts")
    # The stuck watch: stopped between two passes, as a hung process would be. Its file stays.
    watches["stuck"].send_signal(signal.SIGSTOP)
    healthy_since = time.time()

    def alerts() -> list[dict]:
        try:
            return api(prom_port, "/api/v1/alerts")["alerts"]
        except OSError:
            return []

    want = {("blocked", "ReconcileResourceBlocked"), ("blocked", "ReconcileGpuUnhealthy"),
            ("invalid", "ReconcileCannotRun"), ("stuck", "ReconcileNotRunning")}

    def firing() -> set[tuple[str, str]] | None:
        got = {(targets.get(a["labels"].get("instance", ""), "?"), a["labels"]["alertname"])
               for a in alerts() if a["state"] == "firing"}
        return got if want <= got else None

    try:
        got = wait_for(firing, timeout=120, what=f"alerts {sorted(want)} firing")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; alerts: {alerts()}; prometheus: {log_of('prometheus')}") from None
    by = {(targets.get(a["labels"].get("instance", ""), "?"), a["labels"]["alertname"]): a["labels"]
          for a in alerts() if a["state"] == "firing"}
    assert by[("blocked", "ReconcileResourceBlocked")]["id"] == "gpus"
    assert by[("blocked", "ReconcileGpuUnhealthy")]["gpu"] == "1"
    assert by[("invalid", "ReconcileCannotRun")]["reason"] == "state-file"

    # The healthy host: nothing firing or pending, over at least five more rule evaluations.
    seen: set[str] = set()

    def evaluations() -> int:
        groups = api(prom_port, "/api/v1/rules")["groups"]
        seen.update(g["lastEvaluation"] for g in groups if g["name"] == "reconcile")
        return len(seen)

    wait_for(lambda: evaluations() >= 6 or None, timeout=60, what="six more rule evaluations")
    healthy = [a for a in alerts() if targets.get(a["labels"].get("instance", "")) == "healthy"]
    assert healthy == [], healthy
    # ... and not in the past either: Prometheus' own ALERTS series since the metrics arrived.
    instance = next(i for i, n in targets.items() if n == "healthy")
    window = max(1, int(time.time() - healthy_since) + 5)
    past = query(f'count_over_time(ALERTS{{instance="{instance}"}}[{window}s])')
    assert past == [], past
    assert got >= want
    assert watches["healthy"].poll() is None, log_of("watch-healthy")
