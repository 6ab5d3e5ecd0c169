"""A resume command that exits at once: one apply starts it once, and says how it ended.

The command is real (a Python script that counts its runs in a file, prints a line and exits 3),
started by reconcile through its reaper (local/host.py); the expected exit status and log line
are what the same command gives when the test runs it itself. Whether the job has ended before
reconcile looks again is made certain by controlling the work, never by a sleep: in the engine
test, the host's spawn returns only once the job has ended (its reaper wrote how).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_support import reconcile_json, wait_for
from extraction_support import resource, state_yaml
from reconcile_host.local.host import LocalHost
from reconcile_host.pipeline.engine import Engine
from reconcile_host.pipeline.journal import Journal
from reconcile_host.pipeline.statefile import load

JOB = """import pathlib, sys
p = pathlib.Path(sys.argv[1])
p.write_text(str(int(p.read_text()) + 1 if p.exists() else 1))
print("cannot open dataset /nonexistent: no such file", file=sys.stderr, flush=True)
sys.exit(3)
"""


def _job(tmp: Path) -> tuple[list[str], Path, int, str]:
    """The resume argv and its counter file, and what the command gives when run by the test."""
    script = tmp / "job.py"
    script.write_text(JOB)
    counter = tmp / "runs"
    probe = subprocess.run([sys.executable, str(script), str(tmp / "probe-runs")], capture_output=True, text=True,
                           timeout=60)
    return [sys.executable, str(script), str(counter)], counter, probe.returncode, probe.stderr.strip()


def _starts(journal: Path) -> list[tuple[str, str]]:
    return [(e["event"], e.get("result", "")) for e in map(json.loads, journal.read_text().splitlines())
            if e.get("action") == "start"]


class EndedFirst(LocalHost):
    """The real host, whose detached start returns once the job has ended (its reaper wrote how):
    so the engine's next look finds it gone, as after a job that exits at once on a busy host."""

    def spawn_detached(self, argv, log_path, cwd=None, status_path=None):
        pid = super().spawn_detached(argv, log_path, cwd, status_path)
        assert status_path is not None
        wait_for(lambda: Path(status_path).exists(), 60, "the job to end")
        return pid


def test_a_job_that_exits_at_once_is_started_once_and_its_end_reported(tmp_path, monkeypatch):
    argv, counter, want_rc, want_line = _job(tmp_path)
    assert want_rc != 0 and want_line
    out = tmp_path / "hs"
    out.mkdir()
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": 4, "job": {"command": argv}})
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    journal = tmp_path / "journal.jsonl"
    report = Engine(load(state, use_cache=False), EndedFirst(), journal=Journal(journal)).apply()
    (r,) = report.resources
    # One start, though the pass after it found the job not running and planned a start again.
    assert _starts(journal) == [("intent", ""), ("result", "done")]
    assert counter.read_text() == "1"
    assert [(a.action.action, a.result.value) for a in r.actions] == [("start", "done")]
    assert r.status.value == "drift" and report.exit_code == 2
    assert f"exited with status {want_rc}" in r.message and want_line in r.message, r.message
    assert r.observed.job.exit_status == want_rc


def test_cli_apply_starts_once_diff_says_how_it_ended_next_apply_starts_again(tmp_path):
    argv, counter, want_rc, want_line = _job(tmp_path)
    out = tmp_path / "hs"
    out.mkdir()
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": 4, "job": {"command": argv}})
    journal = tmp_path / "journal.jsonl"
    status = tmp_path / "state" / "extractions" / "eagle3.exit.json"
    rc, rep, err = reconcile_json(tmp_path, "apply", str(state))
    r = resource(rep)
    assert [(a["action"], a["result"]) for a in r["actions"]] == [("start", "done")], (rep, err)
    # However fast the job ended (seen running at the verification, or already gone): one start.
    assert r["status"] in ("converging", "drift")
    if r["status"] == "drift":
        assert f"exited with status {want_rc}" in r["message"]
    wait_for(status.exists, 60, "the job to end")
    assert counter.read_text() == "1" and _starts(journal) == [("intent", ""), ("result", "done")]
    pid = json.loads((tmp_path / "state" / "extractions" / "eagle3.pid").read_text())["pid"]
    assert json.loads(status.read_text()) == {"pid": pid, "returncode": want_rc}

    rc, rep, _ = reconcile_json(tmp_path, "diff", str(state))
    r = resource(rep)
    assert rc == 2 and r["observed"]["job"]["exit_status"] == want_rc
    assert want_line in r["observed"]["job"]["log_tail"] and f"exited with status {want_rc}" in r["message"]

    # Once per apply, not once for ever: the next apply starts it again (and once).
    rc, rep, _ = reconcile_json(tmp_path, "apply", str(state))
    assert [a["action"] for a in resource(rep)["actions"]] == ["start"]
    wait_for(lambda: counter.read_text() == "2" and status.exists(), 60, "the second job to end")
    assert _starts(journal) == [("intent", ""), ("result", "done")] * 2
