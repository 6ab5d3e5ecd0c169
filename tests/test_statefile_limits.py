"""What a state file, an inventory or a saved plan may be, and states that
can never hold.

- Only a regular file is read. A FIFO with no writer would block open(2) for good; a device may
  never end. Each is refused at 1:1 before it is opened, through every command and output
  format, and the kernel (os.stat) says what the file is.
- U+0085 (NEL) is refused with the other C1 control characters, where it stands.
- What the schema allows but can never hold (min_done above total, a template declared active,
  a zero probe or observe timeout) is refused by `validate` (so the pre-commit hook catches it),
  at the offending value; a template declared with any other state (which diff could never
  observe: tests/test_units_trust.py asks systemd) at its name.
- An inventory's messages call it an inventory.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import xml.etree.ElementTree as ET

import pytest
from cli_support import cli_env, reconcile_argv, run_cli

HANG = 20  # a refusal is immediate; a command that blocks on open(2) would run into this


def _fifo(tmp_path, name: str):
    path = tmp_path / name
    os.mkfifo(path)
    assert stat.S_ISFIFO(os.stat(path).st_mode)  # the kernel's word on what it is
    return path


def _one_line(proc, path, what: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{path}:1:1: is {what}, not a regular file"), lines[0]


@pytest.mark.parametrize("command", [("validate",), ("diff",), ("apply", "--dry-run"), ("apply",), ("plan",)])
def test_a_fifo_state_file_is_refused_not_waited_on(tmp_path, command):
    if command == ("plan",):
        command = ("diff", "--out", str(tmp_path / "plan.json"))
    fifo = _fifo(tmp_path, "state.yaml")
    proc = run_cli(tmp_path, *command, str(fifo), timeout=HANG)
    _one_line(proc, fifo, "a FIFO (named pipe)")
    assert "give `-` and send it on standard input" in proc.stderr


@pytest.mark.parametrize("fmt", ["json", "junit"])
def test_a_fifo_state_file_gets_an_error_report_in_machine_formats(tmp_path, fmt):
    fifo = _fifo(tmp_path, "state.yaml")
    proc = run_cli(tmp_path, "diff", str(fifo), "--format", fmt, timeout=HANG)
    _one_line(proc, fifo, "a FIFO (named pipe)")
    if fmt == "json":
        [problem] = json.loads(proc.stdout)["problems"]
        assert (problem["line"], problem["column"]) == (1, 1) and "FIFO" in problem["message"]
    else:
        root = ET.fromstring(proc.stdout)
        assert "FIFO" in ET.tostring(root, encoding="unicode")


def test_a_character_device_is_refused_before_it_is_read(tmp_path):
    assert stat.S_ISCHR(os.stat("/dev/zero").st_mode)
    proc = run_cli(tmp_path, "validate", "/dev/zero", timeout=HANG)
    _one_line(proc, "/dev/zero", "a character device")


def test_a_pipe_through_stdin_still_works(tmp_path):
    proc = subprocess.run(reconcile_argv("validate", "-"), input="version: 1\n", capture_output=True, text=True,
                          timeout=HANG, env=cli_env(tmp_path))
    assert proc.returncode == 0, proc.stderr


def test_a_fifo_inventory_and_a_fifo_saved_plan_are_refused(tmp_path):
    state = tmp_path / "s.yaml"
    state.write_text("version: 1\n")
    inv = _fifo(tmp_path, "hosts.yaml")
    proc = run_cli(tmp_path, "diff", "--inventory", str(inv), timeout=HANG)
    _one_line(proc, inv, "a FIFO (named pipe)")
    assert "an inventory is read only from a regular file" in proc.stderr
    plan = _fifo(tmp_path, "plan.json")
    proc = run_cli(tmp_path, "apply", str(plan), timeout=HANG)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "FIFO" in proc.stderr, proc.stderr


def test_an_inventory_tag_is_refused_as_an_inventory(tmp_path):
    state = tmp_path / "s.yaml"
    state.write_text("version: 1\n")
    inv = tmp_path / "hosts.yaml"
    inv.write_text("version: 1\nhosts:\n  a: !!str {ssh: a}\n")
    proc = run_cli(tmp_path, "diff", "--inventory", str(inv), timeout=HANG)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"{inv}:3:6: tag '!!str' is not allowed in an inventory"), proc.stderr
    assert "state file" not in proc.stderr


C1 = [chr(c) for c in range(0x80, 0xA0)]


@pytest.mark.parametrize("char", C1, ids=[f"U+{ord(c):04X}" for c in C1])
def test_every_c1_control_character_is_refused_where_it_stands(tmp_path, char):
    text = f"version: 1\nhost: ab{char}c\n"
    path = tmp_path / "s.yaml"
    path.write_text(text)
    proc = run_cli(tmp_path, "validate", str(path))
    # where it stands: line 2, the character after "host: ab" (8 characters: column 9)
    assert (proc.returncode, proc.stderr) == (
        1, f"{path}:2:9: control character U+{ord(char):04X} is not allowed in a state file "
           "(write it as an escape such as \\x00 in a double-quoted string)\n")


@pytest.mark.parametrize("code", [0x2028, 0x2029])
@pytest.mark.parametrize("after", ["c", "\n"], ids=["inside", "before-a-newline"])
def test_line_and_paragraph_separators_are_refused_where_they_stand(tmp_path, code, after):
    # libyaml (YAML 1.1) counts them as line breaks, ruamel's own parser (YAML 1.2) does not: the
    # positions of everything after one would depend on which parser is installed.
    path = tmp_path / "s.yaml"
    path.write_text(f"version: 1\nhost: ab{chr(code)}{after}\n")
    proc = run_cli(tmp_path, "validate", str(path))
    assert (proc.returncode, proc.stderr) == (
        1, f"{path}:2:9: line separator U+{code:04X} is not allowed in a state file: YAML parsers and editors "
           f"disagree on where the next line starts (write it as an escape, \\u{code:04x}, in a double-quoted "
           "string)\n")
    escaped = tmp_path / "e.yaml"
    escaped.write_text(f'version: 1\nhost: "ab\\u{code:04x}c"\n')
    assert run_cli(tmp_path, "validate", str(escaped)).returncode == 0


def test_nel_written_as_an_escape_is_accepted(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text('version: 1\nhost: "ab\\x85c"\n')
    proc = run_cli(tmp_path, "validate", str(path))
    assert proc.returncode == 0, proc.stderr


IMPOSSIBLE = [
    ("min-done-over-total", "extractions:\n  x:\n    dir: /srv/x\n    total: 10\n    min_done: 11\n",
     (6, 15), "extractions.x.min_done: 11 can never be done: there are only 10 samples"),
    ("probe-timeout-0s", "mounts:\n  /data:\n    probe_timeout: 0s\n", (4, 20),
     'mounts."/data".probe_timeout: 0s leaves no time to answer'),
    ("probe-timeout-0", "mounts:\n  /data:\n    probe_timeout: 0\n", (4, 20),
     'mounts."/data".probe_timeout: 0 leaves no time to answer'),
    ("extraction-observe-timeout-0ms", "extractions:\n  x:\n    dir: /srv/x\n    total: 1\n    observe_timeout: 0ms\n",
     (6, 22), "extractions.x.observe_timeout: 0ms leaves no time"),
    ("template-enabled", "units:\n  t@.service:\n    enabled: false\n", (3, 3),
     'units."t@.service": a template has no state of its own to check'),
    ("gpus-observe-timeout-0s", "gpus:\n  observe_timeout: 0s\n", (3, 20), "gpus.observe_timeout: 0s leaves no time"),
]


@pytest.mark.parametrize("name,body,where,message", IMPOSSIBLE, ids=[i[0] for i in IMPOSSIBLE])
def test_a_state_that_can_never_hold_does_not_validate(tmp_path, name, body, where, message):
    path = tmp_path / f"{name}.yaml"
    path.write_text("version: 1\n" + body)
    proc = run_cli(tmp_path, "validate", str(path))
    assert proc.returncode == 1, proc.stdout
    [line] = proc.stderr.splitlines()
    m = re.fullmatch(re.escape(str(path)) + r":(\d+):(\d+): (.*)", line)
    assert m and (int(m.group(1)), int(m.group(2))) == where and m.group(3).startswith(message), line


def test_what_can_hold_next_to_it_still_validates(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("version: 1\nextractions:\n  x:\n    dir: /srv/x\n    total: 10\n    min_done: 10\n"
                    "mounts:\n  /data:\n    probe_timeout: 1ms\n"
                    "units:\n  t@a.service:\n    active: true\n  t@b.service:\n    enabled: masked\n")
    proc = run_cli(tmp_path, "validate", str(path))
    assert proc.returncode == 0, proc.stderr
