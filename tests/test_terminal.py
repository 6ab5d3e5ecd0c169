"""The terminal lane: the text views as a person reads them, on a real pseudo-terminal.

Each command runs with its stdout and stderr on one pty (the standard library's `pty.openpty`)
whose window size is set with TIOCSWINSZ (tty_ioctl(4)), as a terminal emulator sets it, in the
four settings a person has: colour on (`TERM=xterm-256color`), `NO_COLOR=1`, `TERM=dumb`, and a
narrow window (40 columns, colour on). The states need no root: mount points in the test's
temporary directory (one reconcile could mount: a planned action; one it cannot: blocked), a
state that cannot be observed (an error), a journal written in the temporary directory, and a
remote report (a stand-in target behind `--via`) whose actions were done, failed and skipped.
What is asserted is what a person reads: the exit code, no traceback and no "internal error",
escape sequences only where colour is on, the resource and the verdict on the screen.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv, run_cli
from reconcile_host.pipeline.journal import Journal

SETTINGS = {  # name -> (environment, columns, colour expected)
    "colour": ({"TERM": "xterm-256color"}, 80, True),
    "no-color": ({"TERM": "xterm-256color", "NO_COLOR": "1"}, 80, False),
    "dumb": ({"TERM": "dumb"}, 80, False),
    "narrow": ({"TERM": "xterm-256color"}, 40, True),
}
ESC = "\x1b"
SGR = re.compile("\x1b\\[[0-9;]*m")  # the views' colours (views/text.py Style)
BAD = ("Traceback", "internal error", "RECONCILE_DEBUG")
# The window's size comes from the pty (TIOCSWINSZ); COLUMNS/LINES in the environment (a test
# runner's, pytest-xdist's workers') would override it (Python's shutil.get_terminal_size reads them first).
SIZE_VARS = ("COLUMNS", "LINES")


class Screen:
    """A command on a pty of COLUMNS x 24: its exit code and what it wrote (CR LF as LF)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, columns: int = 80):
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, cwd=cwd,
                                     close_fds=True, start_new_session=True)
        os.close(follower)
        self.leader, self.chunks = leader, []

    def read_until(self, pattern: str, deadline: float = 120.0) -> bool:
        """Read until PATTERN is on the screen (True) or the command ends (False)."""
        end = time.monotonic() + deadline
        while pattern not in self.text:
            ready, _, _ = select.select([self.leader], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise AssertionError(f"{pattern!r} not shown within {deadline}s: {self.text!r}")
            try:
                data = os.read(self.leader, 65536)
            except OSError:  # EIO: the command closed the terminal
                return False
            if not data:
                return False
            self.chunks.append(data)
        return True

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        while self.read_until("\0never\0", deadline=timeout):
            pass
        os.close(self.leader)
        return self.proc.wait(timeout=timeout), self.text

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace").replace("\r\n", "\n")


def on_a_terminal(args: list[str], tmp: Path, setting: str, **env: str) -> tuple[int, str]:
    extra, columns, _ = SETTINGS[setting]
    full = cli_env(tmp, **extra, **env)
    if "NO_COLOR" not in extra:
        full.pop("NO_COLOR", None)
    # The progress line (views/progress.py) is left out of these screens: it appears only after
    # half a second, a matter of how loaded the machine is; tests/test_progress.py tries it.
    full["RECONCILE_PROGRESS_AFTER"] = "3600"
    for name in SIZE_VARS:
        full.pop(name, None)
    return Screen(reconcile_argv(*args), full, tmp, columns).finish()


def read_as_a_person(out: str, setting: str, coloured: bool = True) -> None:
    """No traceback, no internal error; colours where the setting has them (`coloured`: this
    screen has something to colour), no escape sequence at all where it has none."""
    for word in BAD:
        assert word not in out, out
    colour = SETTINGS[setting][2]
    assert (ESC in out) == (colour and coloured), f"{setting}: {out!r}"
    if colour:  # only colours (SGR), nothing that moves the cursor or retitles the window
        assert not SGR.sub("", out).count(ESC), out


def plain(out: str) -> str:
    """What a person reads: the text without its colours."""
    return SGR.sub("", out)


def states(tmp: Path) -> dict[str, Path]:
    """State files that need no root to observe: drift with a planned action, blocked, error, ok."""
    mountable, blocked = tmp / "mountable", tmp / "blocked"
    mountable.mkdir()
    blocked.mkdir()
    made = {
        "planned": f"version: 1\nmounts:\n  {mountable}:\n    mounted: true\n    source: tmpfs\n    fstype: tmpfs\n",
        "blocked": f"version: 1\nmounts:\n  {blocked}:\n    mounted: true\n",
        # Its run directory is a file: the checkpoints kind cannot observe it (docs/checkpoints.md).
        "error": f"version: 1\ncheckpoints:\n  run:\n    dir: {tmp / 'a-file'}\n",
        "ok": "version: 1\nmounts:\n  /:\n    mounted: true\n",
    }
    (tmp / "a-file").write_text("not a directory\n")
    out = {}
    for name, text in made.items():
        out[name] = tmp / f"{name}.yaml"
        out[name].write_text(text)
    both = tmp / "mixed.yaml"
    both.write_text(made["planned"] + made["blocked"].removeprefix("version: 1\nmounts:\n")
                    + made["error"].removeprefix("version: 1\n"))
    out["mixed"] = both
    return out


@pytest.mark.parametrize("setting", SETTINGS)
def test_diff_with_a_planned_action_on_a_colour_terminal(tmp_path, setting):
    """The first `diff` a person runs after a crash: drift with an action planned. On a colour
    terminal this printed the drift, then `internal error: KeyError: ''` (the planned action's
    colour looked up by an empty name)."""
    s = states(tmp_path)
    code, out = on_a_terminal(["diff", str(s["planned"])], tmp_path, setting)
    read_as_a_person(out, setting)
    assert code == 2, out
    out = plain(out)
    assert f"mount:{tmp_path / 'mountable'}" in out and "Plan: 1 action to take." in out
    assert f"→ mount -t tmpfs tmpfs {tmp_path / 'mountable'}" in out


@pytest.mark.parametrize("setting", SETTINGS)
def test_diff_and_a_dry_run_of_planned_blocked_and_error_resources(tmp_path, setting):
    s = states(tmp_path)
    for args in (["diff", str(s["mixed"])], ["apply", "--dry-run", str(s["mixed"])], ["diff", "-v", str(s["ok"])]):
        code, out = on_a_terminal(args, tmp_path, setting)
        read_as_a_person(out, setting)
        out = plain(out)
        if "ok.yaml" in args[-1]:
            assert code == 0 and "No drift: the host matches the state file." in out, out
            continue
        assert code == 1, out  # an error resource makes the run an error
        for mark, what in (("→", "mount"), ("!", "blocked"), ("✗", "error")):
            assert mark in out and what in out, (mark, out)
        assert "Error: 1 resource could not be observed." in out


def remote_apply_report(tmp: Path, s: dict[str, Path]) -> str:
    """A stand-in target for `apply --via`: it answers the handshake as the real reconcile does and
    the apply with this reconcile's own report of the mixed state, its actions done, failed and
    skipped (the results a real apply reports)."""
    doc = json.loads(run_cli(tmp, "diff", str(s["mixed"]), "--format", "json").stdout)
    doc["command"] = "apply"
    action = doc["resources"][0]["actions"][0]
    doc["resources"][0]["actions"] = [{**action, "result": "done"},
                                      {**action, "target": "again", "result": "failed", "message": "mount: busy"},
                                      {**action, "target": "third", "result": "skipped", "message": "after a failure"}]
    doc["summary"].update(actions_planned=0, actions_done=1, actions_failed=1)
    (tmp / "apply.json").write_text(json.dumps(doc))
    script = tmp / "target-reconcile"
    script.write_text(f"#!{sys.executable}\nimport os, sys\n"
                      "if sys.argv[1:] == ['version', '--json']:\n"
                      f"    os.execv({sys.executable!r}, [{sys.executable!r}, '-m', 'reconcile_host', *sys.argv[1:]])\n"
                      f"sys.stdin.read()\nsys.stdout.write(open({str(tmp / 'apply.json')!r}).read())\nsys.exit(1)\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("setting", SETTINGS)
def test_apply_with_done_failed_and_skipped_actions(tmp_path, setting):
    s = states(tmp_path)
    target = remote_apply_report(tmp_path, s)
    code, out = on_a_terminal(["apply", str(s["mixed"]), "--via", "env", "--remote-command", target],
                              tmp_path, setting)
    read_as_a_person(out, setting)
    assert code == 1, out
    out = plain(out)
    assert "(failed: mount: busy)" in out and "(skipped: after a failure)" in out
    assert "Applied 1 action, 1 failed." in out


def journal_of(tmp: Path) -> Path:
    journal = Journal.at(str(tmp / "journal.jsonl"))
    base = {"run": "r1", "pid": 1, "resource": "unit:a.service", "target": "a.service"}
    for line in (
        {"time": "2026-12-01T09:00:00.000Z", "event": "intent", **base, "action": "stop",
         "description": "stop a.service", "before": {"active": "active"}},
        {"time": "2026-12-01T09:00:01.000Z", "event": "result", **base, "action": "stop", "result": "done"},
        {"time": "2026-12-01T09:00:01.000Z", "event": "intent", **base, "action": "disable",
         "description": "disable a.service"},
        {"time": "2026-12-01T09:00:02.000Z", "event": "result", **base, "action": "disable", "result": "failed",
         "message": "Access denied"},
        {"time": "2026-12-01T09:00:02.000Z", "event": "intent", **base, "action": "mask",
         "description": "mask a.service"},  # no result: the run was killed
        {"time": "2026-12-01T09:00:03.000Z", "event": "verified", **base, "after": {"active": "inactive"}},
        {"time": "2026-12-01T09:01:00.000Z", "event": "watch-pass", "pass": 1, "pid": 2, "actions_done": 0,
         "actions_failed": 1, "resources": {"unit:a.service": "drift"}},
    ):
        journal(line)
    return journal.path


@pytest.mark.parametrize("setting", SETTINGS)
def test_log(tmp_path, setting):
    journal = journal_of(tmp_path)
    code, out = on_a_terminal(["log", "--journal", str(journal), "-v"], tmp_path, setting)
    read_as_a_person(out, setting)
    assert code == 0, out
    out = plain(out)
    assert "1 done, 1 failed, 1 unknown" in out and "may or may not have happened" in out
    assert "watch pass 1" in out
    code, out = on_a_terminal(["log", "--journal", str(tmp_path / "none.jsonl")], tmp_path, setting)
    read_as_a_person(out, setting, coloured=False)  # a warning and one plain line
    assert code == 0 and "No journal entries in this window." in out


@pytest.mark.parametrize("setting", SETTINGS)
def test_watch_first_pass_then_stopped(tmp_path, setting):
    """`watch` on a state it cannot act on (blocked): the first pass on the screen, then SIGTERM
    (as systemd stops it): exit 0, said so."""
    s = states(tmp_path)
    extra, columns, _ = SETTINGS[setting]
    env = {**cli_env(tmp_path, **extra), "RECONCILE_PROGRESS_AFTER": "3600"}
    if "NO_COLOR" not in extra:
        env.pop("NO_COLOR", None)
    for name in SIZE_VARS:
        env.pop(name, None)
    screen = Screen(reconcile_argv("watch", str(s["blocked"]), "--interval", "1h", "--journal",
                                   str(tmp_path / "journal.jsonl")), env, tmp_path, columns)
    try:
        assert screen.read_until("pass 1"), screen.text
        screen.read_until("\n", deadline=30)
        screen.proc.send_signal(signal.SIGTERM)
        code, out = screen.finish()
    finally:
        if screen.proc.poll() is None:
            screen.proc.kill()
    for word in BAD:
        assert word not in out, out
    assert ESC not in out, out  # watch's lines are a log (systemd's journal): never coloured
    assert code == 0 and "stopped cleanly" in out, out


@pytest.mark.parametrize("setting", SETTINGS)
def test_errors_are_one_line(tmp_path, setting):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmounts:\n  /:\n    mountd: true\n")
    for args, first in ((["diff", str(bad)], f"{bad}:4:5: "), (["validate", str(bad)], f"{bad}:4:5: "),
                        (["diff", str(tmp_path / "missing.yaml")], f"{tmp_path / 'missing.yaml'}:1:1: "),
                        (["diff", "--format", "xml"], "reconcile: error: "),
                        (["apply", str(bad), "--lock-timeout", "soon"], "reconcile: error: --lock-timeout")):
        code, out = on_a_terminal(args, tmp_path, setting)
        for word in BAD:
            assert word not in out, out
        assert code == 1, out
        assert out.startswith(first), (args, out)
        assert ESC not in out  # error lines carry no colour


@pytest.mark.parametrize("setting", SETTINGS)
def test_help_fits_the_window(tmp_path, setting):
    columns = SETTINGS[setting][1]
    for args in (["--help"], ["diff", "--help"], ["log", "--help"]):
        code, out = on_a_terminal(args, tmp_path, setting)
        for word in BAD:
            assert word not in out, out
        assert code == 0 and "Usage: reconcile" in out, out
        assert ESC not in out
        # click wraps help to the terminal's width less 2, never under 50 columns (click 8
        # formatting.py HelpFormatter.__init__: max(min(columns, max_width) - 2, 50)).
        assert max(len(line) for line in out.splitlines()) <= max(columns - 2, 50), out
