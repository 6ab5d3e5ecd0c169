"""Prometheus: `--format prometheus` and `reconcile watch --textfile DIR` read by the real
readers (prometheus_client's text parser, `promtool check metrics`, Debian's
prometheus-node-exporter scraped on 127.0.0.1), and the alerting rules of
contrib/prometheus/ unit-tested with `promtool test rules`.

The expected values come from the authorities: GPU memory from the (fake) driver through the
real pynvml, sample counts from Python's zipfile over the files the test wrote, statuses from
the JSON report of the same state."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv, run_cli, wait_for
from extraction_support import age, write_sample
from gpu_support import FakeConfig, nvml_env, seed_gpus
from promtool_support import PROMTOOL, needs_promtool, promtool, rule_tests_with
from ssh_support import free_port

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "contrib" / "prometheus" / "reconcile.rules.yml"
RULES_TEST = ROOT / "contrib" / "prometheus" / "reconcile.rules.test.yml"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
MIB = 2**20

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client not installed (pip: the test extra)")
needs_node_exporter = pytest.mark.skipif(not os.access(NODE_EXPORTER, os.X_OK),
                                         reason="node_exporter not installed (Debian: prometheus-node-exporter)")


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition text, by (name, labels), through prometheus_client's parser."""
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def value(found: dict, name: str, **labels: str) -> float:
    want = {(k, v) for k, v in labels.items()}
    hits = [v for (n, ls), v in found.items() if n == name and want <= ls]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} series"
    return hits[0]


def driver_memory(lib: Path, config: Path) -> list[tuple[int, int]]:
    """(used, total) bytes per GPU as the driver says, through the real pynvml."""
    probe = ("import json, pynvml; pynvml.nvmlInit(); print(json.dumps([[m.used, m.total] for m in "
             "(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i), version=pynvml.nvmlMemory_v2) "
             "for i in range(pynvml.nvmlDeviceGetCount()))]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=30,
                         env={**os.environ, **nvml_env(lib, config)}).stdout
    return [tuple(x) for x in json.loads(out)]


def write_gpus(path: Path, unhealthy: int | None = None) -> Path:
    gpus = seed_gpus(2)
    gpus[0].used_mib = 1234
    if unhealthy is not None:
        gpus[unhealthy].ecc_volatile = 3
    FakeConfig(gpus=gpus).write(path, whole=True)
    return path


@pytest.fixture
def host(tmp_path, fake_lib):
    """A state with GPUs (GPU 1 unhealthy), a mount and an extraction with one cut-off file."""
    config = write_gpus(tmp_path / "gpus.conf", unhealthy=1)
    out = tmp_path / "samples"
    for i in range(6):
        write_sample(out, i)
    age(write_sample(out, 6, cut=100))  # cut off mid-write an hour ago: damaged, not being written
    write_sample(out, 7, cut=100)  # cut off just now: being written
    state = tmp_path / "state.yaml"
    state.write_text(f"version: 1\ngpus:\n  count: 2\n  healthy: true\nmounts:\n  /:\n    mounted: true\n"
                     f"extractions:\n  eagle3:\n    dir: {out}\n    pattern: 'rows_{{group}}/data_{{index}}.ckpt'\n"
                     f"    total: 10\n    verify: content\n")
    env = {**nvml_env(fake_lib, config), "RECONCILE_STATE_DIR": str(tmp_path / "rstate")}
    return state, config, out, env


def test_metrics_of_a_real_run_carry_its_values(tmp_path, fake_lib, host):
    state, config, out, env = host
    before = time.time()
    proc = run_cli(tmp_path, "diff", str(state), "--format", "prometheus", **env)
    after = time.time()
    assert proc.returncode == 2, proc.stderr  # drift: GPU 1 blocked, a damaged file
    found = samples(proc.stdout)
    doc = json.loads(run_cli(tmp_path, "diff", str(state), "--format", "json", **env).stdout)

    assert value(found, "reconcile_up") == 1
    for res in doc["resources"]:
        for status in ("ok", "drift", "converging", "blocked", "error"):
            assert value(found, "reconcile_resource_status", id=res["id"], kind=res["kind"], status=status) == \
                (1 if res["status"] == status else 0), (res["id"], status)
        assert value(found, "reconcile_resource_drift_fields", id=res["id"]) == len(res["drift"])
    for status, n in doc["summary"].items():
        if not status.startswith("actions_"):
            assert value(found, "reconcile_resources", status=status) == n
    assert value(found, "reconcile_last_run_actions", result="planned") == doc["summary"]["actions_planned"]
    assert value(found, "reconcile_last_run_exit_code") == proc.returncode

    # GPUs: memory as the driver reports it; health as reconcile judged it.
    for index, (used, total) in enumerate(driver_memory(fake_lib, config)):
        assert value(found, "reconcile_gpu_memory_used_bytes", gpu=str(index)) == used
        assert value(found, "reconcile_gpu_memory_total_bytes", gpu=str(index)) == total
    assert value(found, "reconcile_gpu_memory_used_bytes", gpu="0") == 1234 * MIB
    assert value(found, "reconcile_gpu_health", gpu="1", health="unhealthy") == 1
    assert value(found, "reconcile_gpu_health", gpu="1", health="healthy") == 0
    assert value(found, "reconcile_gpu_health", gpu="0", health="healthy") == 1
    assert value(found, "reconcile_gpus_visible") == 2

    # The extraction: done = the files Python's zipfile reads whole.
    whole = 0
    for path in out.rglob("data_*.ckpt"):
        try:
            with zipfile.ZipFile(path) as z:
                whole += z.testzip() is None
        except zipfile.BadZipFile:
            pass
    ext = {"id": "extraction:eagle3"}
    assert value(found, "reconcile_extraction_done_samples", **ext) == whole == 6
    assert value(found, "reconcile_extraction_expected_samples", **ext) == 10
    assert value(found, "reconcile_extraction_missing_samples", **ext) == 10 - whole
    assert value(found, "reconcile_extraction_damaged_files", **ext) == 1
    assert value(found, "reconcile_extraction_writing_files", **ext) == 1
    newest = max(p.stat().st_mtime for p in out.rglob("data_*.ckpt"))
    assert value(found, "reconcile_extraction_newest_file_timestamp_seconds", **ext) == pytest.approx(newest)
    # No job declared: whether one runs is unknown, so not written (never a 0).
    assert not [k for k in found if k[0] == "reconcile_extraction_job_running"]

    ended = value(found, "reconcile_last_run_timestamp_seconds")
    assert before <= ended - value(found, "reconcile_last_run_duration_seconds") and ended <= after


@needs_promtool
def test_promtool_accepts_the_metrics_of_a_real_run(tmp_path, host):
    state, _, _, env = host
    text = run_cli(tmp_path, "diff", str(state), "--format", "prometheus", **env).stdout
    lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    # rc 0 and no lint remark (naming: units, _total only on counters, HELP on every family).
    assert lint.returncode == 0 and lint.stdout == "" and lint.stderr == "", lint.stdout + lint.stderr


def test_bad_state_with_prometheus_format_is_one_line(tmp_path):
    state = tmp_path / "bad.yaml"
    state.write_text("version: 1\nmounts:\n  /:\n    mountd: true\n")
    proc = run_cli(tmp_path, "diff", str(state), "--format", "prometheus")
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"{state}:4:5: ") and len(proc.stderr.splitlines()) == 1
    # A scraper gets a textfile that says the run could not happen, never an empty or healthy one.
    got = samples(proc.stdout)
    assert got[("reconcile_up", frozenset())] == 0
    assert not [name for name, _ in got if name.startswith(("reconcile_resource", "reconcile_last_run"))]


def test_inventory_refuses_prometheus_before_touching_a_host(tmp_path):
    proc = run_cli(tmp_path, "diff", "--inventory", str(tmp_path / "hosts.yaml"), "--format", "prometheus")
    assert proc.returncode == 1
    assert proc.stderr.startswith("reconcile: error: --format prometheus is per host"), proc.stderr


# --- watch --textfile ------------------------------------------------------------------

def test_watch_textfile_counts_passes_and_says_when_it_could_not_run(tmp_path, monkeypatch):
    """The Watcher with the textfile sink the CLI hands it, three passes: ok, bad state file, ok."""
    from reconcile_host.doors.sinks.textfile import Textfile
    from reconcile_host.pipeline.watch import Watcher

    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    state = tmp_path / "state.yaml"
    good = "version: 1\nmounts:\n  /:\n    mounted: true\n"
    state.write_text(good)
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    seen: list[dict] = []

    def between(_delay: float) -> None:
        seen.append(samples((textdir / "reconcile.prom").read_text()))
        state.write_text("version: 1\nmounts: [\n" if len(seen) == 1 else good)

    watcher = Watcher(str(state), 30.0, None, None, log=io.StringIO(), max_passes=3, wait=between,
                      on_pass=Textfile(textdir, 30.0, watch=True).take)
    assert watcher.run() == 0
    seen.append(samples((textdir / "reconcile.prom").read_text()))
    first, failed, last = seen
    assert value(first, "reconcile_up") == 1 and value(failed, "reconcile_up") == 0 and value(last, "reconcile_up") == 1
    assert value(failed, "reconcile_watch_passes_total", outcome="failed") == 1
    assert value(last, "reconcile_watch_passes_total", outcome="ok") == 2
    assert value(last, "reconcile_watch_interval_seconds") == 30
    # The failed pass produced no report: the last report's time stays, and ages.
    assert value(failed, "reconcile_last_run_timestamp_seconds") == value(first, "reconcile_last_run_timestamp_seconds")
    assert value(last, "reconcile_last_run_timestamp_seconds") > value(first, "reconcile_last_run_timestamp_seconds")
    assert [p.name for p in textdir.iterdir()] == ["reconcile.prom"]  # no temporary file left


def test_textfile_is_replaced_whole_never_rewritten_in_place(tmp_path):
    from reconcile_host.doors.sinks.textfile import write_textfile

    path = Path(write_textfile(tmp_path, "a 1\n"))
    with open(path) as reader:  # a scrape in progress
        write_textfile(tmp_path, "b 2\n")
        assert reader.read() == "a 1\n"  # its file was replaced by rename(2), not truncated
    assert path.read_text() == "b 2\n"


def test_watch_textfile_needs_an_existing_directory(tmp_path):
    proc = run_cli(tmp_path, "watch", str(tmp_path / "s.yaml"), "--textfile", str(tmp_path / "nope"))
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith(f"reconcile: error: --textfile {tmp_path / 'nope'}: no such directory")


# --- a real node_exporter scrapes it --------------------------------------------------------

def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


@needs_node_exporter
def test_node_exporter_serves_what_watch_writes(tmp_path, fake_lib):
    config = write_gpus(tmp_path / "gpus.conf")
    state = tmp_path / "state.yaml"
    state.write_text("version: 1\ngpus:\n  count: 2\n  healthy: true\n")
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    port = free_port()
    exporter = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
                                 "--collector.disable-defaults", "--collector.textfile",
                                 f"--collector.textfile.directory={textdir}"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "node_exporter.log", "wb"))  # noqa: SIM115
    watch = subprocess.Popen(reconcile_argv("watch", str(state), "--interval", "1s", "--textfile", str(textdir),
                                            "--journal", str(tmp_path / "journal.jsonl")),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=cli_env(tmp_path, **nvml_env(fake_lib, config)))
    try:
        def connectable() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                assert exporter.poll() is None, (tmp_path / "node_exporter.log").read_text()
                return False
        wait_for(connectable, timeout=20, what="node_exporter to listen")

        def scraped(health: str, gpu: str) -> dict | None:
            found = samples(scrape(port))
            hits = [v for (n, ls), v in found.items() if n == "reconcile_gpu_health"
                    and ("gpu", gpu) in ls and ("health", health) in ls]
            return found if hits == [1.0] else None

        found = wait_for(lambda: scraped("healthy", "1"), timeout=60, what="watch's metrics in a scrape")
        assert value(found, "node_textfile_scrape_error") == 0
        assert value(found, "node_textfile_mtime_seconds", file=str(textdir / "reconcile.prom")) > 0
        assert value(found, "reconcile_up") == 1
        assert value(found, "reconcile_resource_status", id="gpus", status="ok") == 1
        (used0, _), _ = driver_memory(fake_lib, config)
        assert value(found, "reconcile_gpu_memory_used_bytes", gpu="0") == used0

        # The GPU goes bad: the next passes say so through the same scrape.
        write_gpus(config, unhealthy=1)
        found = wait_for(lambda: scraped("unhealthy", "1"), timeout=60, what="the unhealthy GPU in a scrape")
        assert value(found, "reconcile_resource_status", id="gpus", status="blocked") == 1
    finally:
        watch.send_signal(signal.SIGTERM)
        try:
            log, _ = watch.communicate(timeout=60)
        finally:
            if watch.poll() is None:
                watch.kill()
        exporter.terminate()
        exporter.wait(timeout=10)
    assert watch.returncode == 0, log
    assert "stopped cleanly" in log


# --- the alerting rules ---------------------------------------------------------------------

@needs_promtool
def test_rules_are_valid_and_their_unit_tests_pass():
    check = promtool("check", "rules", str(RULES), timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 11 rules found" in check.stdout
    test = promtool("test", "rules", str(RULES_TEST))
    assert test.returncode == 0, test.stdout + test.stderr


MUTATIONS = [  # each breaks one alert; the unit tests must notice
    ("ReconcileResourceBlocked", 'expr: reconcile_resource_status{status="blocked"} == 1\n        for: 10m',
     'expr: reconcile_resource_status{status="blocked"} == 1\n        for: 2m'),
    ("ReconcileResourceUnobservable", '{status="error"} == 1', '{status="error"} == 0'),
    ("ReconcileGpuUnhealthy", 'health="unhealthy"} == 1', 'health="unknown"} == 1'),
    ("ReconcileExtractionStalled", "[30m]", "[10m]"),
    ("ReconcileNotRunning", "clamp_min(reconcile_run_interval_seconds, 300)",
     "clamp_min(reconcile_run_interval_seconds, 900)"),
    ("ReconcileDriftPersists", '{status="drift"} == 1\n        for: 30m', '{status="drift"} == 1\n        for: 20m'),
    ("ReconcileActionsFailing", "reconcile_resource_actions_failed > 0", "reconcile_resource_actions_failed > 1"),
    ("ReconcileCannotRun", "or on (instance, job)", "and on (instance, job)"),
    ("ReconcileTextfileStale", "2 * reconcile_run_interval_seconds + 900", "2 * reconcile_run_interval_seconds + 1800"),
    ("ReconcileMetricsGone", "last_over_time(reconcile_up[1h]) unless reconcile_up",
     "last_over_time(reconcile_up[1h]) and reconcile_up"),
    ("ReconcileMetricsAbsent", "absent(reconcile_up)\n        for: 15m", "absent(reconcile_up)\n        for: 45m"),
]


@needs_promtool
@pytest.mark.parametrize("alert, old, new", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_the_rule_tests_catch_a_broken_rule(tmp_path, alert, old, new):
    test = rule_tests_with(RULES, RULES_TEST, old, new, tmp_path)
    assert test.returncode == 1, test.stdout + test.stderr
    assert alert in test.stdout + test.stderr


def test_rules_use_only_series_reconcile_writes(tmp_path, host):
    """Every metric the rules and their tests name is written by a real run, with those labels:
    a renamed metric cannot leave the alerts silently watching nothing."""
    state, _, _, env = host
    written = samples(run_cli(tmp_path, "diff", str(state), "--format", "prometheus", **env).stdout)
    from reconcile_host.core.refusals import Refusal
    from reconcile_host.doors.sinks.textfile import Textfile
    from reconcile_host.pipeline.runs import finished

    textdir = tmp_path / "t"
    textdir.mkdir()
    Textfile(textdir, 60.0, watch=True).take(finished(Refusal("journal", "x"), "apply", "s.yaml", outcome="failed"))
    written.update(samples((textdir / "reconcile.prom").read_text()))
    labels_of: dict[str, set[str]] = {}
    for name, ls in written:
        labels_of.setdefault(name, set()).update(k for k, _ in ls)
    used = set(re.findall(r"\breconcile_[a-z_]+", RULES.read_text()))
    assert used and used <= set(labels_of), used - set(labels_of)
    for series in re.findall(r"series: '(reconcile_[a-z_]+)\{([^}]*)\}'", RULES_TEST.read_text()):
        name, body = series
        keys = {kv.split("=")[0] for kv in body.split(",")} - {"instance", "job"}  # added by the scrape
        assert name in labels_of, name
        assert keys == labels_of[name], (name, keys, labels_of[name])
