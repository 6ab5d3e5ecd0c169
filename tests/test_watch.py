"""`reconcile watch`: the loop as a unit, its backoff, its signals, and contrib/reconcile-watch.service
run as a real service of the namespaced systemd."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from cli_support import cli_env, reconcile_argv
from gitops_support import REPO, cli, is_active, service, wait_for  # noqa: F401  (cli: fixture)
from reconcile_host.pipeline.journal import Journal, Lock
from reconcile_host.pipeline.watch import Watcher, backoff

# --- the loop, without a host ---------------------------------------------------------------


def test_backoff_doubles_and_is_capped_at_ten_minutes():
    assert [backoff(60, k) for k in range(7)] == [60, 120, 240, 480, 600, 600, 600]
    assert [backoff(1, k) for k in (0, 1, 2, 3, 9, 10, 20)] == [1, 2, 4, 8, 512, 600, 600]
    assert backoff(3600, 3) == 3600  # never shorter than the interval itself


def test_bad_state_file_backs_off_is_not_applied_and_good_one_resets(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    state = tmp_path / "state.yaml"
    state.write_text("version: 1\nunits:\n  vllm.service:\n    activ: false\n")
    waits = []

    def wait(delay):
        waits.append(delay)
        if len(waits) == 3:  # a fix is pushed
            state.write_text("version: 1\n")

    log = io.StringIO()
    w = Watcher(str(state), 1.0, Journal(tmp_path / "journal.jsonl"), tmp_path / "lock", log=log, max_passes=5,
                wait=wait)
    assert w.run() == 0
    assert waits == [2, 4, 8, 1]
    text = log.getvalue()
    assert text.count("state file does not validate, not applying it") == 3
    assert f"{state}:4:5: units.\"vllm.service\": unknown key 'activ'" in text
    assert "changed, reloaded" not in text and f"state file {state} loaded" in text
    assert not (tmp_path / "journal.jsonl").exists()  # nothing changed, nothing journaled


def test_pass_skipped_while_another_apply_holds_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    state = tmp_path / "state.yaml"
    state.write_text("version: 1\n")
    log = io.StringIO()
    with Lock(tmp_path / "lock") as held:
        held.acquire()
        w = Watcher(str(state), 5.0, None, tmp_path / "lock", lock_wait=0, log=log, max_passes=1)
        w.run()
    assert "pass 1: skipped: another reconcile apply holds" in log.getvalue()
    assert w.failures == 0


def test_sigterm_between_passes_exits_zero_at_once(tmp_path):
    state = tmp_path / "state.yaml"
    state.write_text("version: 1\n")
    proc = subprocess.Popen(reconcile_argv("watch", str(state), "--interval", "1h", "--journal",
                                           str(tmp_path / "journal.jsonl")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env(tmp_path))
    try:
        lines = []
        for line in proc.stdout:  # the loop logs each step as it happens (flushed)
            lines.append(line)
            if line.startswith("pass 1:"):
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines) + rest
    assert "stopped cleanly after 1 pass (SIGTERM received)" in rest


def test_old_spellings_are_said_once_at_start_not_every_pass(tmp_path):
    data = tmp_path / "hs"
    data.mkdir()
    state = tmp_path / "state.yaml"
    state.write_text(f"version: 1\nextractions:\n  hs:\n    dir: {data}\n    total: 10\n    verify: all\n")
    said = [line for line in subprocess.run(reconcile_argv("validate", str(state)), capture_output=True, text=True,
                                            env=cli_env(tmp_path), timeout=60).stderr.splitlines()
            if ": warning: " in line]
    assert said and said[0].startswith(f"{state}:6:13: warning: extractions.hs.verify: 'all'"), said
    proc = subprocess.Popen(reconcile_argv("watch", str(state), "--interval", "1s", "-v", "--journal",
                                           str(tmp_path / "journal.jsonl")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env(tmp_path))
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(("pass 3:", "pass 4:")):
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = lines + rest.splitlines()
    assert proc.returncode == 0, "\n".join(out)
    assert [line for line in out if ": warning: " in line] == said, "\n".join(out)
    loaded = next(i for i, line in enumerate(out) if line.startswith(f"state file {state} loaded"))
    assert out[loaded + 1] == said[0]  # at start, with the loading


# --- as a service of a real systemd -----------------------------------------------------------

WATCH = "t-reconcile-watch.service"


def reconcile_bin_dir() -> str:
    """Where the install this test runs from put the `reconcile` command (a venv's bin, ~/.local/bin, ...)."""
    beside = Path(sys.executable).parent / "reconcile"
    found = str(beside) if beside.exists() else shutil.which("reconcile")
    assert found, "the reconcile command is not installed"
    return os.path.dirname(found)


def watch_unit(tmp, state, journal, log) -> str:
    """contrib/reconcile-watch.service as shipped, its command found on the PATH the unit's comments
    say to set for an install outside the usual places, pointed at the test's files."""
    text = (REPO / "contrib" / "reconcile-watch.service").read_text()
    text, n = re.subn(r"^(ExecStart=/usr/bin/env reconcile watch) --interval 60s$",
                      rf"\1 {state} --interval 1s --journal {journal}", text, flags=re.M)
    assert n == 1
    text, n = re.subn(r"^Environment=PATH=", f"Environment=PATH={reconcile_bin_dir()}:", text, flags=re.M)
    assert n == 1
    text = re.sub(r"^WorkingDirectory=.*$", f"WorkingDirectory={tmp}", text, flags=re.M)
    # The namespace shares the host's /var: no StateDirectory= for the test.
    text = re.sub(r"^StateDirectory=.*$\n", "", text, flags=re.M)
    return text.replace("\n[Service]\n", f"\n[Service]\nEnvironment=RECONCILE_CACHE_DIR={tmp}/cache\n"
                        f"Environment=RECONCILE_STATE_DIR={tmp}/state\n"  # the kinds' records: not /var/lib
                        f"StandardOutput=append:{log}\nStandardError=append:{log}\n"
                        # systemd tells ExecStopPost= how the main process ended.
                        "ExecStopPost=/bin/sh -c 'echo $SERVICE_RESULT $EXIT_CODE $EXIT_STATUS"
                        f" > {tmp}/exit-status'\n", 1)


def test_watch_service_repairs_drift_reloads_state_and_stops_cleanly(nsystemd, cli):  # noqa: F811
    nsystemd.write_unit("t-victim.service", service("victim"))
    nsystemd.write_unit("t-second.service", service("second"))
    state = cli.state("version: 1\nunits:\n  t-victim.service:\n    active: false\n")
    log = cli.tmp / "watch.log"
    nsystemd.write_unit(WATCH, watch_unit(cli.tmp, state, cli.journal, log))
    assert nsystemd.show(WATCH, "KillMode") == "mixed"
    nsystemd.systemctl("start", WATCH, check=True)
    wait_for(lambda: log.exists() and "pass 1:" in log.read_text(), what="the first pass")

    # Break a resource: the next pass repairs it.
    nsystemd.systemctl("start", "t-victim.service", check=True)
    wait_for(lambda: is_active(nsystemd, "t-victim.service") == "inactive", what="t-victim stopped by watch")
    entries = wait_for(lambda: [e for e in cli.journal_lines() if e.get("event") == "watch-pass"],
                       what="a watch-pass journal line")
    actions = [e for e in cli.journal_lines() if e.get("event") == "result"]
    assert [(e["resource"], e["action"], e["result"]) for e in actions] == [
        ("unit:t-victim.service", "stop", "done")]
    [passed] = entries
    assert passed["resources"] == {"unit:t-victim.service": "ok"} and passed["actions_done"] == 1
    assert passed["state_file"] == str(state) and not passed["interrupted"]

    # A new state file (a `git pull`): reloaded, and acted on.
    state.write_text("version: 1\nunits:\n  t-victim.service:\n    active: false\n"
                     "  t-second.service:\n    active: true\n")
    wait_for(lambda: is_active(nsystemd, "t-second.service") == "active", what="t-second started by watch")
    assert re.search(rf"state file {re.escape(str(state))} changed, reloaded", log.read_text())

    # systemctl stop: SIGTERM, a clean exit 0, not a kill and not a failure.
    nsystemd.systemctl("stop", WATCH, check=True)
    assert nsystemd.show(WATCH, "ActiveState") == "inactive"  # not "failed"
    # systemd's own account of how the main process ended (it unloads the stopped unit, so
    # `systemctl show` cannot tell any more): exited with 0, not killed by the signal.
    assert (cli.tmp / "exit-status").read_text().split() == ["success", "exited", "0"]
    assert re.search(r"stopped cleanly after \d+ passes \(SIGTERM received\)\n\Z", log.read_text())
    assert len([e for e in cli.journal_lines() if e.get("event") == "watch-pass"]) == 2
    assert not os.path.exists(cli.journal.parent / "lock") or not (cli.journal.parent / "lock").read_text()
