"""Names and text from the host or from a remote report never reach a terminal with their control
characters: file names, systemctl's words, journal entries, the progress line, error lines and a
remote target's report, with ESC sequences (`ESC ] 0 ; pwned BEL` retitles the window, `ESC [ 2 J`
clears the screen), CR and backspace in them. What is printed is read as bytes: no raw control
character but the view's own colour codes when colour is on, and the escaped text readable.
Also here: a remote report this side cannot read is an error line for that target, and `--via`
quotes the appended words for every prefix that runs a remote shell (the far side's argv is
recorded by a stand-in `reconcile` behind a real sshd on 127.0.0.1)."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import cli_env, read_terminal, reconcile_argv, run_cli
from host_doubles import ScriptedHost
from reconcile_host.core.escape import escape_controls
from reconcile_host.core.host import CommandResult
from reconcile_host.doors.remote import Target, remote_shells, via_target
from reconcile_host.pipeline.journal import Journal
from ssh_support import sshd  # noqa: F401  (the fixture)

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\rX\x08"  # retitle, clear the screen, overwrite the line
SGR = re.compile("\x1b\\[[0-9;]*m")  # the views' own colour codes (views/text.py Style)
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def raw_controls(text: str, colour: bool = False) -> list[str]:
    """The control characters in printed text, but line ends (a pty writes CR LF) and, when colour
    is on, the views' own SGR sequences."""
    text = text.replace("\r\n", "\n")
    if colour:
        text = SGR.sub("", text)
    return RAW.findall(text)


def on_a_terminal(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run with stdout and stderr on one pseudo-terminal, as a person at a terminal would."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env, cwd=cwd,
                            close_fds=True)
    os.close(follower)
    out = read_terminal(leader)
    proc.wait(timeout=120)
    return proc.returncode, out.decode(errors="surrogateescape")


# --- the rule ----------------------------------------------------------------------------------

@pytest.mark.skipif(not shutil.which("systemd-escape"), reason="systemd-escape not installed")
def test_the_rule_is_systemds_for_every_c0_control_and_del():
    # systemd's cescape (src/basic/escape.c) writes a byte below 0x20 or 0x7f as \xHH; systemd-escape
    # shows it. NUL cannot be an argument; it is checked below.
    for code in [*range(1, 0x20), 0x7F]:
        char = chr(code)
        said = subprocess.run(["systemd-escape", "--", char], capture_output=True, text=True, check=True).stdout
        assert escape_controls(char) == said.rstrip("\n"), hex(code)
    assert escape_controls("\x00") == "\\x00"


def test_c1_bidi_and_undecodable_bytes_are_escaped_and_text_is_kept():
    for char in ["\x85", "\x9b", "\x9d", "\u202e", "\u2066", "\u200f", "\u2028"]:
        assert not raw_controls(escape_controls(f"a{char}b")), repr(char)
    # A path byte that was not UTF-8 (os.fsdecode's surrogate): its byte, as `ls -b` shows it.
    assert escape_controls(os.fsdecode(b"ck\x9bpt")) == "ck\\x9bpt"
    assert escape_controls("\ud800") == "\\ud800"  # a lone surrogate from a remote JSON: never an encode error
    # Printable text, other scripts and systemd's own escapes stay as they are.
    for text in ["vllm@gpu0.service", "dev-disk-by\\x2duuid-1.device", "модель 模型 😀", "a b"]:
        assert escape_controls(text) == text
    assert escape_controls("one\ntwo\tx", newlines=True) == "one\ntwo\\x09x"


# --- file names, in the text report, on a terminal and in a pipe -----------------------------------

def hostile_mount(tmp: Path, planned: bool) -> tuple[Path, Path]:
    """A mount point whose name carries the escapes; `planned`: the state gives source and fstype,
    so diff plans the mount, else it is blocked."""
    point = tmp / f"mp{HOSTILE}"
    point.mkdir()
    how = "    source: tmpfs\n    fstype: tmpfs\n" if planned else ""
    state = tmp / "s.yaml"
    state.write_text(f"version: 1\nmounts:\n  {json.dumps(str(point))}:\n    mounted: true\n{how}")
    return state, point


def test_a_file_name_reaches_the_terminal_escaped(tmp_path):
    state, point = hostile_mount(tmp_path, planned=False)
    env = {**cli_env(tmp_path), "TERM": "xterm-256color"}
    code, out = on_a_terminal(reconcile_argv("diff", str(state)), env, tmp_path)
    assert code == 2, out
    assert "\x1b[" in out and not raw_controls(out, colour=True), out  # colour on, and only ours
    assert escape_controls(f"mount:{point}") in out
    code, out = on_a_terminal(reconcile_argv("diff", str(state)), {**env, "NO_COLOR": "1"}, tmp_path)
    assert code == 2 and not raw_controls(out), out
    assert escape_controls(f"mount:{point}") in out

    (tmp_path / "p").mkdir()
    planned, point = hostile_mount(tmp_path / "p", planned=True)
    proc = subprocess.run(reconcile_argv("diff", str(planned)), capture_output=True, env=env, cwd=tmp_path,
                          timeout=120)
    out = proc.stdout.decode()
    assert proc.returncode == 2 and not raw_controls(out) and not raw_controls(proc.stderr.decode()), out
    assert escape_controls(str(point)) in out and "→" in out  # the planned mount, named escaped

    # JSON stays exact: the name as the kernel has it.
    doc = json.loads(subprocess.run(reconcile_argv("diff", str(planned), "--format", "json"), capture_output=True,
                                    env=env, cwd=tmp_path, timeout=120).stdout)
    assert doc["resources"][0]["id"] == f"mount:{point}"


def test_error_lines_escape_the_names_they_carry(tmp_path):
    bad = tmp_path / f"bad{HOSTILE}.yaml"
    bad.write_text("version: 1\nmounts:\n  /:\n    mountd: true\n")
    for args in (("validate", str(bad)), ("diff", str(bad)), ("diff", str(tmp_path / f"missing{HOSTILE}.yaml")),
                 ("apply", str(bad), "--journal", str(tmp_path / "j.jsonl"))):
        proc = run_cli(tmp_path, *args)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr and not raw_controls(proc.stderr), proc.stderr
        assert escape_controls(HOSTILE) in proc.stderr and "Traceback" not in proc.stderr


def test_systemctls_words_in_a_report_are_escaped():
    """A unit's error carries what systemctl said (a test double says it here): rendered escaped."""
    from reconcile_host.pipeline import runs
    from reconcile_host.pipeline.report import to_json
    from reconcile_host.pipeline.statefile import load
    from reconcile_host.views.text import Style, render_text

    state = load("<test>", text="version: 1\nunits:\n  a.service:\n    active: true\n")
    said = "\x1b]0;pwned\x07\x1b[2J\x08"  # (a CR would end the line: the report keeps the last one)
    host = ScriptedHost(lambda argv: CommandResult(tuple(argv), 1, "", f"Failed: {said} no"))
    doc = to_json(runs.diff(state, host))
    assert said in doc["resources"][0]["message"]  # the report keeps the words exactly
    for colour in (True, False):
        out = io.StringIO()
        render_text(doc, out, style=Style(out, force=colour))
        assert not raw_controls(out.getvalue(), colour=colour), out.getvalue()
        assert escape_controls(said) in out.getvalue()


# --- reconcile log, the progress line ---------------------------------------------------------------

def test_the_journals_names_reach_the_terminal_escaped(tmp_path):
    journal = Journal.at(str(tmp_path / "journal.jsonl"))
    name = f"unit:x{HOSTILE}.service"
    common = {"run": f"r{HOSTILE}", "pid": 1, "resource": name, "action": "stop", "target": f"x{HOSTILE}"}
    for line in (
        {"time": "2026-12-01T09:00:00.000Z", "event": "intent", **common, "description": f"stop {HOSTILE}",
         "before": {"active": f"a{HOSTILE}"}},
        {"time": "2026-12-01T09:00:01.000Z", "event": "result", **common, "result": "failed",
         "message": f"systemctl said {HOSTILE}"},
        {"time": "2026-12-01T09:00:02.000Z", "event": "verified", **common, "after": {"active": f"b{HOSTILE}"}},
        {"time": "2026-12-01T09:01:00.000Z", "event": "watch-pass", "pass": 1, "pid": 2, "actions_done": 0,
         "actions_failed": 1, "resources": {name: "error"}},
        {"time": "2026-12-01T09:02:00.000Z", "event": "slurm-health", "node": f"n{HOSTILE}", "command": "diff",
         "verdict": "drain", "reason": f"r{HOSTILE}", "exit_code": 2},
        {"time": "2026-12-01T09:03:00.000Z", "event": "ack", "node": "n1", "by": f"b{HOSTILE}",
         "reason": f"r{HOSTILE}"},
    ):
        journal(line)
    env = {**cli_env(tmp_path), "TERM": "xterm-256color"}
    code, out = on_a_terminal(reconcile_argv("log", "--journal", str(journal.path), "-v"), env, tmp_path)
    assert code == 0, out
    assert "\x1b[" in out and not raw_controls(out, colour=True), out
    assert escape_controls(name) in out and escape_controls(f"systemctl said {HOSTILE}") in out
    piped = run_cli(tmp_path, "log", "--journal", str(journal.path), "-v")
    assert piped.returncode == 0 and not raw_controls(piped.stdout), piped.stdout
    # JSON stays exact.
    doc = json.loads(run_cli(tmp_path, "log", "--journal", str(journal.path), "--format", "json").stdout)
    assert doc["events"][0]["actions"][0]["resource"] == name


def test_the_progress_line_draws_only_its_own_controls():
    from reconcile_host.views.progress import ProgressLine

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream, now = Tty(), [0.0]
    line = ProgressLine(stream, clock=lambda: now[0], after=0.0)
    for t in (0.0, 1.0, 2.0):
        now[0] = t
        line(f"checking {HOSTILE}.pt", t * 10, 100, "samples")
    line(None, None, None, "")
    drawn = stream.getvalue()
    assert escape_controls(HOSTILE) in drawn
    # Its own: CR to the line's start and EL (ESC [ K) to clear the rest of it; nothing else.
    assert not raw_controls(drawn.replace("\r\x1b[K", "").replace("\x1b[K", "").replace("\r", "\n")), drawn


# --- a remote report ----------------------------------------------------------------------------------

def fake_target(tmp: Path, report: dict, stderr: str = "", code: int | None = None) -> str:
    """A stand-in for the far side's reconcile: reads the state from stdin, prints `report`."""
    doc = tmp / "report.json"
    doc.write_text(json.dumps(report))
    script = tmp / "fake-reconcile"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdin.read()\n"
                      f"sys.stdout.write(open({str(doc)!r}).read())\nsys.stderr.write({stderr!r})\n"
                      f"sys.exit({report.get('exit_code', 1) if code is None else code})\n")
    script.chmod(0o755)
    return str(script)


def real_report(tmp: Path) -> tuple[Path, dict]:
    """This reconcile's own JSON report of a blocked mount: the shape a target sends."""
    state, _point = hostile_mount(tmp, planned=False)
    proc = run_cli(tmp, "diff", str(state), "--format", "json")
    return state, json.loads(proc.stdout)


def test_a_remote_reports_names_are_escaped_and_an_unknown_status_is_an_error_line(tmp_path):
    state, doc = real_report(tmp_path)
    doc["host"] = f"far{HOSTILE}"
    doc["notes"] = [f"note {HOSTILE}"]
    doc["resources"][0]["message"] = f"line one {HOSTILE}\nline two {HOSTILE}"
    script = fake_target(tmp_path, doc)
    env = {**cli_env(tmp_path), "TERM": "xterm-256color"}
    code, out = on_a_terminal(reconcile_argv("diff", str(state), "--via", "env", "--remote-command", script),
                              env, tmp_path)
    assert code == 2, out
    assert not raw_controls(out, colour=True) and escape_controls(f"far{HOSTILE}") in out, out

    # A status this side does not know: one line for the target, exit 1, no crash.
    doc["resources"][0]["status"] = f"pwned{HOSTILE}"
    script = fake_target(tmp_path, doc)
    for fmt in ("text", "json"):
        proc = run_cli(tmp_path, "diff", str(state), "--via", "env", "--remote-command", script, "--format", fmt)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.startswith("reconcile: error: env: its report does not follow the report format")
        assert "resources[0].status" in proc.stderr and "internal error" not in proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and not raw_controls(proc.stderr), proc.stderr
    assert json.loads(proc.stdout)["error"]["reason"] == "remote-error"

    # Its stderr, passed through when it refuses, is escaped too.
    script = fake_target(tmp_path, {}, stderr=f"reconcile: error: lock held by {HOSTILE}\n", code=1)
    (tmp_path / "report.json").write_text("")
    proc = run_cli(tmp_path, "diff", str(state), "--via", "env", "--remote-command", script)
    assert proc.returncode == 1 and escape_controls(HOSTILE) in proc.stderr and not raw_controls(proc.stderr)


def test_an_inventory_host_with_an_unreadable_report_is_that_hosts_error(tmp_path):
    state, doc = real_report(tmp_path)
    good = tmp_path / "good"
    good.mkdir()
    good_script = fake_target(good, doc)
    doc["resources"][0]["actions"] = [{"action": "mount", "target": "x", "result": f"gone{HOSTILE}"}]
    bad_script = fake_target(tmp_path, doc)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("version: 1\nhosts:\n" + "".join(
        f"  {n}:\n    via: env\n    remote_command: {s}\n    state: {state.name}\n"
        for n, s in (("good", good_script), ("bad", bad_script))))
    proc = run_cli(tmp_path, "diff", "--inventory", str(inventory))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stdout + proc.stderr
    assert not raw_controls(proc.stdout) and not raw_controls(proc.stderr)
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("good", "bad")}
    assert rows["good"][1] == "drift" and rows["bad"][1] == "error", proc.stdout
    assert "its report does not follow the report format" in proc.stdout
    entries = {h["host"]: h for h in json.loads(
        run_cli(tmp_path, "diff", "--inventory", str(inventory), "--format", "json").stdout)["hosts"]}
    assert entries["good"]["status"] == "drift" and entries["bad"]["status"] == "error"
    assert "actions[0].result" in entries["bad"]["error"]


# --- --via: which prefixes run a remote shell ----------------------------------------------------------

PREFIXES = {  # prefix -> remote shells its appended words pass through
    "ssh root@pve pct exec 129 --": 1,
    "/usr/bin/ssh -o ConnectTimeout=10 root@pve": 1,
    "timeout 30 ssh root@pve": 1,
    "sshpass -p x ssh root@pve": 1,
    "autossh -M 0 root@pve": 1,
    "ssh jump ssh inner": 2,
    "pct exec 129 --": 0,
    "nsenter -t 4242 -m -p -u": 0,
    "docker exec -i ctr": 0,
    "kubectl exec -i pod --": 0,
}
WORDS = ["diff", "--state-label", "it's a host; $(touch /tmp/pwned) `id` \"x\"", "-"]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_words_survive_every_shell_the_prefix_passes_them_through(prefix):
    target = via_target(prefix, remote_command="reconcile")
    assert remote_shells(target.prefix) == target.shells == PREFIXES[prefix]
    argv = target.argv(WORDS)
    assert argv[:len(target.prefix)] == list(target.prefix)
    rest = argv[len(target.prefix):]
    for _ in range(target.shells):  # each remote shell: the words joined by spaces, parsed again
        rest = shlex.split(" ".join(rest))
    assert rest == ["reconcile", *WORDS]


def stand_ins(tmp: Path) -> Path:
    """`sshpass` and `autossh` as they behave for this purpose (neither is installed by .ci/run):
    sshpass drops `-p PASSWORD` and runs the rest; autossh drops `-M PORT` and runs ssh with the
    rest. Both hand their words on unchanged, as the real ones do."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "sshpass").write_text('#!/bin/sh\n[ "$1" = -p ] && shift 2\nexec "$@"\n')
    (bin_dir / "autossh").write_text('#!/bin/sh\n[ "$1" = -M ] && shift 2\nexec ssh "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


@pytest.mark.system
def test_via_prefixes_that_run_ssh_hand_the_far_side_its_words_exactly(sshd, tmp_path):  # noqa: F811
    record = tmp_path / "argv.json"
    far = tmp_path / "far-reconcile"
    far.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
                   "sys.exit(3)\n")
    far.chmod(0o755)
    opts = " ".join(f"-o {shlex.quote(o)}" for o in sshd.client_options)
    ssh = f"ssh {opts} -o BatchMode=yes -p {sshd.port} root@127.0.0.1"
    env_path = f"{stand_ins(tmp_path)}:{os.environ['PATH']}"
    state = tmp_path / "it's a host; $(id) `id` \"x\".yaml"
    state.write_text("version: 1\n")
    for prefix in (ssh, f"timeout 60 {ssh}", f"sshpass -p x {ssh}", f"autossh -M 0 {ssh[4:]}", f"{ssh} {ssh}"):
        record.unlink(missing_ok=True)
        proc = run_cli(tmp_path, "diff", str(state), "--via", prefix, "--remote-command", str(far), timeout=120,
                       PATH=env_path)
        assert proc.returncode == 1, prefix
        assert json.loads(record.read_text()) == ["diff", "--format", "json", "--state-label", str(state), "-"], \
            (prefix, proc.stderr)


def test_a_host_target_quotes_once():
    assert Target("x", ("ssh", "h"), shells=1).argv(["a b"]) == ["ssh", "h", "reconcile 'a b'"]
