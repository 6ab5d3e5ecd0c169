"""Progress on a terminal: the first integrity check, apply waiting for a resource to
settle, a long command. On stderr only, only when it is a terminal, only with --format text;
erased before the report. The CLI runs on a real pseudo-terminal here; the line appears after
$RECONCILE_PROGRESS_AFTER seconds (0 in these tests: the work is controlled, not the clock)."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest
from extraction_support import env_for, state_yaml, write_samples
from reconcile_host.local.host import LocalHost
from reconcile_host.views import progress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_the_line_waits_then_shows_count_rate_and_eta_then_goes():
    out, clock = io.StringIO(), Clock()
    line = progress.ProgressLine(out, clock=clock)
    line("extraction x: checking", 0, 1000, "samples")
    clock.t += 0.2
    line("extraction x: checking", 100, 1000, "samples")
    assert out.getvalue() == ""  # quick work never flashes a line
    clock.t += 0.8  # 1 s after it started, 500 done: 500/s, 1 s left
    line("extraction x: checking", 500, 1000, "samples")
    assert out.getvalue() == "\rextraction x: checking: 500/1,000 samples (50%), 500/s, ETA 1s\x1b[K"
    clock.t += 0.01
    line("extraction x: checking", 510, 1000, "samples")  # within REDRAW of the last: not drawn
    assert out.getvalue().count("\r") == 1
    line("extraction x: checking", None, None, "")
    assert out.getvalue().endswith("\r\x1b[K")
    line(None, None, None, "")  # nothing shown: nothing to erase
    assert out.getvalue().count("\r") == 2


def test_a_wait_in_seconds():
    assert progress.render("gpus: waiting for it to settle (memory)", 12.4, 30, "s", 12, 0) == \
        "gpus: waiting for it to settle (memory): 12s of 30s"
    assert progress.render("x", 3725, None, "s", 1, 0) == "x: 1h02m"


def test_shown_only_on_a_terminal_with_text():
    master, slave = pty.openpty()
    try:
        with open(slave, "w", closefd=False) as tty, open(os.devnull, "w") as null:
            assert isinstance(progress.attach(LocalHost(), "text", tty).on_progress, progress.ProgressLine)
            for fmt in ("json", "junit", "prometheus"):
                assert progress.attach(LocalHost(), fmt, tty).on_progress is None
            assert progress.attach(LocalHost(), "text", null).on_progress is None  # not a terminal
    finally:
        os.close(master)
        os.close(slave)


def test_a_long_command_is_shown_while_it_runs():
    said = []
    host = LocalHost()
    host.on_progress = lambda *record: said.append(record)
    assert host.run(["sleep", "1.2"], timeout=30).ok  # at least 1.2 s: longer than the 0.5 s step
    waits = [r for r in said if r[1] is not None]
    assert waits and all(r[0] == "waiting for `sleep 1.2`" and r[2] == 30 and r[3] == "s" for r in waits)
    assert said[-1] == ("waiting for `sleep 1.2`", None, None, "")  # and it is over
    said.clear()
    assert host.run(["true"]).ok and said == []  # a quick one says nothing


def test_apply_waiting_for_a_resource_to_settle(monkeypatch):
    """The engine's wait for drift that clears by itself (GPU memory after a stop) is progress."""
    import test_engine as te
    from reconcile_host.core.contract import Drift

    class Settling(te.ToyReconciler):
        volatile_drift = ("level",)

        def diff(self, resource, observed):
            if resource.name == "mem":  # its drift clears on the third look
                te.WORLD["looks"] = te.WORLD.get("looks", 0) + 1
                return [] if te.WORLD["looks"] >= 3 else [Drift("level", 0, 1)]
            return super().diff(resource, observed)

    monkeypatch.setitem(te.KINDS, "toys", te.Kind("toy", "test_progress:Settling"))
    globals()["Settling"] = Settling
    te.WORLD.clear()
    from dataclasses import replace

    from reconcile_host.pipeline.engine import Engine

    first = te.toy("a", want=1)
    mem = replace(te.toy("mem", want=0, needs=["toy:a"]), settle=30.0)
    host = te.Host()
    said = []
    host.on_progress = lambda *record: said.append(record)
    monkeypatch.setattr("reconcile_host.pipeline.engine.SETTLE_POLL", 0.01)
    report = Engine(te.state(first, mem), host).apply()
    assert te.statuses(report)["toy:mem"] == "ok"
    waits = [r for r in said if r[0] and r[1] is not None]
    assert waits and waits[0][0] == "toy:mem: waiting for it to settle (level)" and waits[0][2:] == (30.0, "s")
    assert ("toy:mem: waiting for it to settle (level)", None, None, "") in said
    assert said[-1] == (None, None, None, "")  # the run is over: the line goes before the report


def _run_on_pty(argv, env, stdout_pipe=False, timeout=120):
    """Run argv with stderr (and stdout unless stdout_pipe) on a pseudo-terminal: (rc, what the
    terminal showed, stdout when piped)."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 160 columns
    proc = subprocess.Popen(argv, stdin=slave, stdout=subprocess.PIPE if stdout_pipe else slave, stderr=slave,
                            env=env, close_fds=True)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last holder of the terminal closed it
                break
            if not data:
                break
            seen += data
        elif proc.poll() is not None:
            break
    out = proc.stdout.read() if stdout_pipe else b""
    proc.wait(timeout=10)
    os.close(master)
    return proc.returncode, seen.decode(errors="replace"), out.decode()


@pytest.fixture()
def extraction(tmp_path):
    write_samples(tmp_path / "hs", range(40))
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(tmp_path / "hs"), "total": 50})
    env = {**env_for(tmp_path), "RECONCILE_PROGRESS_AFTER": "0", "TERM": "xterm"}
    return state, env


def test_diff_on_a_terminal_shows_the_first_check_then_erases_it(extraction):
    state, env = extraction
    rc, screen, _ = _run_on_pty([sys.executable, "-m", "reconcile_host", "diff", str(state)], env)
    assert rc == 2, screen
    assert "extraction eagle3: checking: " in screen and "/40 samples" in screen  # the first check's count
    shown = screen.index("extraction eagle3: checking")
    erased = screen.index("\r\x1b[K", shown + 1)
    report = screen.index("extraction:eagle3")
    assert shown < erased < report  # erased before the report starts
    assert "checking" not in screen[report:]


def test_never_in_json_nor_without_a_terminal(extraction, tmp_path):
    state, env = extraction
    rc, screen, out = _run_on_pty([sys.executable, "-m", "reconcile_host", "diff", str(state), "--format", "json"],
                                  env, stdout_pipe=True)
    assert rc == 2 and "checking" not in screen and "\x1b[K" not in screen
    assert json.loads(out)["resources"][0]["observed"]["done"] == 40
    (tmp_path / "state").rename(tmp_path / "state-was")  # a first check again
    proc = subprocess.run([sys.executable, "-m", "reconcile_host", "diff", str(state)], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 2 and "checking" not in proc.stderr and "\x1b" not in proc.stderr + proc.stdout
