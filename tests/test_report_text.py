"""The text report: plan-style lines, colour only on a terminal, never with a non-empty NO_COLOR
or on TERM=dumb."""

from __future__ import annotations

import os
import pty
import subprocess

from cli_support import cli_env, read_terminal, reconcile_argv


def drifting_state(tmp):
    # A mount point that nothing is mounted on and that no fstab names: drift on any machine.
    point = tmp / "not-mounted"
    point.mkdir()
    path = tmp / "s.yaml"
    path.write_text(f"version: 1\nmounts:\n  {point}:\n    mounted: true\n")
    return path, point


def run_on_tty(argv, env):
    """Run with stdout on a pseudo-terminal, as a person at a terminal would."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdout=follower, stderr=subprocess.PIPE, env=env, close_fds=True)
    os.close(follower)
    out = read_terminal(leader)
    proc.wait(timeout=30)
    return proc.returncode, out.decode()


def test_colour_on_a_terminal_only(tmp_path):
    state, point = drifting_state(tmp_path)
    env = cli_env(tmp_path)
    code, out = run_on_tty(reconcile_argv("diff", str(state)), env)
    assert code == 2
    assert "\033[" in out and f"mount:{point}" in out

    code, out = run_on_tty(reconcile_argv("diff", str(state)), {**env, "NO_COLOR": "1"})
    assert code == 2 and "\033[" not in out and f"mount:{point}" in out

    piped = subprocess.run(reconcile_argv("diff", str(state)), capture_output=True, text=True, env=env)
    assert piped.returncode == 2 and "\033[" not in piped.stdout


def test_colour_follows_no_color_and_term_dumb(tmp_path):
    # no-color.org: NO_COLOR disables colour "when present and not an empty string"; clig.dev:
    # no colour on TERM=dumb. Each case on a real terminal, where colour is otherwise on.
    state, point = drifting_state(tmp_path)
    env = {**cli_env(tmp_path), "TERM": "xterm"}
    cases = {"NO_COLOR empty": ({"NO_COLOR": ""}, True), "NO_COLOR=0": ({"NO_COLOR": "0"}, False),
             "NO_COLOR=1": ({"NO_COLOR": "1"}, False), "TERM=dumb": ({"TERM": "dumb"}, False),
             "TERM=xterm": ({}, True)}
    for case, (extra, coloured) in cases.items():
        code, out = run_on_tty(reconcile_argv("diff", str(state)), {**env, **extra})
        assert code == 2 and ("\033[" in out) is coloured and f"mount:{point}" in out, (case, out)


def test_plan_style_lines(tmp_path):
    state, point = drifting_state(tmp_path)
    proc = subprocess.run(reconcile_argv("diff", str(state)), capture_output=True, text=True, env=cli_env(tmp_path))
    lines = proc.stdout.splitlines()
    assert lines[0] == f"reconcile diff: {state} on {os.uname().nodename}"
    assert any(line.startswith(f"  ! mount:{point}") or line.startswith(f"  ~ mount:{point}") for line in lines)
    assert any("mounted:" in line and "false -> true" in line for line in lines), proc.stdout
    assert lines[-1] == "No actions planned. 1 blocked."


def test_whole_report_reaches_a_file_and_exit_code_kept(tmp_path):
    """diff leaves without the interpreter's teardown (cli.exit_now): a report far larger than
    one stdio buffer, written to a regular file (block-buffered), must still arrive whole, and
    the exit code must survive."""
    lines = ["version: 1", "mounts:"]
    for i in range(120):
        point = tmp_path / f"not-mounted-{i:03d}"
        point.mkdir()
        lines += [f"  {point}:", "    mounted: true"]
    state = tmp_path / "s.yaml"
    state.write_text("\n".join(lines) + "\n")
    out = tmp_path / "report.json"
    with open(out, "w") as fh:
        proc = subprocess.run(reconcile_argv("diff", str(state), "--format", "json"), stdout=fh,
                              stderr=subprocess.PIPE, text=True, env=cli_env(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert out.stat().st_size > 4 * 8192
    import json

    report = json.loads(out.read_text())
    assert len(report["resources"]) == 120
    assert all(r["drift"] == [{"field": "mounted", "want": True, "have": False}] for r in report["resources"])
