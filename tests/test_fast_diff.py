"""`reconcile diff` without click (commands.py, read by __main__.py): the plain forms are read as
click reads them, and both doors print, exit and fail alike. Also what a warm `diff` imports."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys

import pytest
from cli_support import cli_env
from reconcile_host import commands
from reconcile_host.cli import diff as click_diff

# The words a `diff` command line is made of here: the plain forms' and their near misses.
WORDS = ["s.yaml", "t.yaml", "-", "", "--format", "json", "text", "junit", "prometheus", "xml", "JSON",
         "--format=json", "--format=", "--format=text", "-v", "--verbose", "-vv", "--verbose=1", "--", "--out",
         "p.json", "-h", "--help", "--host", "ssh://h", "--inventory", "--state-label", "--form", "-x"]
# The forms the fast path must take (the benchmark's and the docs').
PLAIN = [[], ["s.yaml"], ["s.yaml", "--format", "json"], ["--format", "json", "s.yaml"], ["s.yaml", "-v"],
         ["--format=junit", "-v", "s.yaml"], ["--verbose", "--format", "prometheus"], ["-v"],
         ["--format", "json", "--state-label", "s.yaml", "-"]]  # what a remote diff runs on each target
DEFAULTS = {"host": None, "via": None, "remote_command": None, "ssh_options": (), "connect_timeout": None,
            "remote_timeout": None, "inventory": None, "limit": None, "parallel": 10, "report_dir": None,
            "state_label": None, "out_path": None}


def click_params(args: list[str]) -> dict:
    ctx = click_diff.make_context("diff", list(args))
    return dict(ctx.params)


def command_lines():
    for n in range(4):
        yield from itertools.product(WORDS, repeat=n)
    yield from PLAIN


def test_the_reader_takes_only_what_click_reads_the_same():
    taken = 0
    for words in command_lines():
        plain = commands.read_plain_diff(list(words), {})
        if plain is None:
            continue
        taken += 1
        params = click_params(list(words))  # click accepts it (no UsageError) ...
        # ... and gives the command the same arguments, every other option at its default.
        assert {k: params[k] for k in ("file", "fmt", "verbose", "state_label")} == \
            {k: plain[k] for k in ("file", "fmt", "verbose", "state_label")}, words
        assert {k: params[k] for k in DEFAULTS if k != "state_label"} == \
            {k: v for k, v in DEFAULTS.items() if k != "state_label"}, words
        assert plain["out_path"] is None
    assert taken > 100
    for words in PLAIN:
        assert commands.read_plain_diff(words, {}) is not None, words


@pytest.mark.parametrize("words", [["--state-label", "-v", "-"], ["--", "s.yaml"], ["s.yaml", "--out", "p.json"],
                                   ["--help"],
                                   ["s.yaml", "t.yaml"], ["--format", "xml", "s.yaml"], ["-v", "-v"],
                                   ["--host", "ssh://h", "s.yaml"], ["s.yaml", "--format"]])
def test_everything_else_goes_to_click(words):
    assert commands.read_plain_diff(words, {}) is None


def test_shell_completion_goes_to_click():
    assert commands.read_plain_diff(["s.yaml"], {commands.COMPLETE_VAR: "bash_complete"}) is None


# --- both doors alike, as a subprocess ------------------------------------------------------------

VIA_CLICK = "import sys; from reconcile_host.cli import main; sys.argv[0] = 'reconcile'; main()"
VIA_MAIN = "import sys; from reconcile_host.__main__ import main; sys.argv[0] = 'reconcile'; main()"


def run(tmp, code: str, *args: str, prelude: str = "", **kw):
    return subprocess.run([sys.executable, "-c", prelude + code, *args], capture_output=True, text=True,
                          cwd=kw.pop("cwd", tmp), env=cli_env(tmp, **kw.pop("env", {})), timeout=120, **kw)


def imported(stderr: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def drifting_state(tmp, mounts: int = 1):
    lines = ["version: 1", "mounts:"]
    for i in range(mounts):
        point = tmp / f"not-mounted-{i:03d}"
        point.mkdir()
        lines += [f"  {point}:", "    mounted: true"]
    path = tmp / "s.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def plain_report(stdout: str) -> dict:
    doc = json.loads(stdout)
    doc.pop("started")
    doc.pop("duration_s")
    return doc


def test_a_warm_diff_imports_neither_click_nor_the_parsers(tmp_path):
    state = drifting_state(tmp_path)
    argv = [sys.executable, "-X", "importtime", "-m", "reconcile_host", "diff", str(state)]
    cold = subprocess.run(argv, capture_output=True, text=True, env=cli_env(tmp_path), timeout=120)
    warm = subprocess.run(argv, capture_output=True, text=True, env=cli_env(tmp_path), timeout=120)
    assert cold.returncode == warm.returncode == 2, warm.stderr
    assert "reconcile_host.pipeline.statefile.positions" in imported(cold.stderr)  # the first run parses
    heavy = {"click", "reconcile_host.cli", "ruamel.yaml", "jsonschema", "deepdiff", "psutil", "pynvml",
             "reconcile_host.pipeline.statefile.positions", "reconcile_host.common.filechecks.integrity"}
    assert not heavy & imported(warm.stderr)
    assert "reconcile_host.commands" in imported(warm.stderr)


def test_every_dataclass_a_warm_diff_builds_has_its_own_docstring(tmp_path):
    """dataclass() gives a class without one a docstring made with inspect.signature: about 0.4 ms
    a class, at every start-up."""
    state = drifting_state(tmp_path)
    code = ("import dataclasses, sys; from reconcile_host.__main__ import main\n"
            "import reconcile_host.commands as c\n"
            "def leave(code):\n"
            "    for m in list(sys.modules.values()):\n"
            "        if getattr(m, '__name__', '').startswith('reconcile_host'):\n"
            "            for v in vars(m).values():\n"
            "                if dataclasses.is_dataclass(v) and isinstance(v, type) and v.__module__ == m.__name__:\n"
            "                    print(v.__module__ + '.' + v.__qualname__,\n"
            "                          not (v.__doc__ or '').startswith(v.__name__ + '('))\n"
            "    sys.stdout.flush(); c.os._exit(code)\n"
            "c.exit_now = leave\n"
            "sys.argv[0] = 'reconcile'; main()\n")
    run(tmp_path, VIA_MAIN, "diff", str(state))  # fills the validation cache
    proc = subprocess.run([sys.executable, "-c", code, "diff", str(state)], capture_output=True, text=True,
                          env=cli_env(tmp_path), timeout=120)
    rows = [line.rsplit(" ", 1) for line in proc.stdout.splitlines() if line.startswith("reconcile_host.")]
    assert len(rows) > 15, proc.stdout + proc.stderr
    assert [name for name, ok in rows if ok != "True"] == []


@pytest.mark.parametrize("extra", [[], ["--format", "json"], ["-v"], ["--format=junit"]])
def test_both_doors_print_and_exit_alike(tmp_path, extra):
    state = drifting_state(tmp_path)
    fast = subprocess.run([sys.executable, "-X", "importtime", "-c", VIA_MAIN, "diff", str(state), *extra],
                          capture_output=True, text=True, env=cli_env(tmp_path), timeout=120)
    slow = run(tmp_path, VIA_CLICK, "diff", str(state), *extra)
    assert "click" not in imported(fast.stderr)
    assert fast.returncode == slow.returncode == 2
    if "json" in extra:
        assert plain_report(fast.stdout) == plain_report(slow.stdout)
    elif any("junit" in e for e in extra):
        def timeless(xml: str) -> str:
            return re.sub(r' (time|timestamp)="[^"]*"', "", xml)

        assert "<testcase" in fast.stdout and timeless(fast.stdout) == timeless(slow.stdout)
    else:
        assert fast.stdout == slow.stdout
    assert [line for line in fast.stderr.splitlines() if not line.startswith("import time:")] == \
        slow.stderr.splitlines()


@pytest.mark.parametrize("bad", [False, True])
def test_both_doors_read_a_state_from_stdin_alike(tmp_path, bad):
    """What a remote diff runs on each target (`--state-label NAME -`, the state on stdin): the
    report, and a bad state's error pointing into NAME, are the same through either door."""
    state = drifting_state(tmp_path)
    text = state.read_text() + ("  x:\n    mounted: maybe\n" if bad else "")
    args = ["diff", "--format", "json", "--state-label", "states/h1.yaml", "-"]
    fast = subprocess.run([sys.executable, "-X", "importtime", "-c", VIA_MAIN, *args], input=text,
                          capture_output=True, text=True, cwd=tmp_path, env=cli_env(tmp_path), timeout=120)
    slow = run(tmp_path, VIA_CLICK, *args, input=text)
    assert bad or "click" not in imported(fast.stderr)  # (an error is printed through click.echo)
    assert "reconcile_host.cli" not in imported(fast.stderr)
    assert fast.returncode == slow.returncode == (1 if bad else 2), slow.stderr
    assert plain_report(fast.stdout) == plain_report(slow.stdout)
    assert [line for line in fast.stderr.splitlines() if not line.startswith("import time:")] == \
        slow.stderr.splitlines()
    if bad:
        assert slow.stderr.startswith("states/h1.yaml:"), slow.stderr


@pytest.mark.parametrize("case", ["missing", "bad yaml", "bad yaml json", "no file"])
def test_both_doors_fail_alike(tmp_path, case):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nunits:\n  a.service:\n    active: maybe\n")
    args = {"missing": ["diff", str(tmp_path / "nope.yaml")], "bad yaml": ["diff", str(bad)],
            "bad yaml json": ["diff", "--format", "json", str(bad)], "no file": ["diff"]}[case]
    cwd = tmp_path / "empty"
    cwd.mkdir()
    fast = run(tmp_path, VIA_MAIN, *args, cwd=cwd)
    slow = run(tmp_path, VIA_CLICK, *args, cwd=cwd)
    assert fast.returncode == slow.returncode == 1
    assert fast.stderr == slow.stderr and fast.stderr.strip(), fast.stderr
    if case == "bad yaml json":
        assert plain_report(fast.stdout) == plain_report(slow.stdout)
    else:
        assert fast.stdout == slow.stdout == ""


@pytest.mark.parametrize("raised", ["RuntimeError('boom\\nline two')", "KeyboardInterrupt()",
                                    "OSError(5, 'Input/output error')"])
def test_what_escapes_the_command_is_handled_alike(tmp_path, raised):
    state = drifting_state(tmp_path)
    prelude = (f"from reconcile_host.pipeline import engine\n"
               f"def boom(self, *a, **k):\n    raise {raised}\n"
               f"engine.Engine.diff = boom\n")
    fast = run(tmp_path, VIA_MAIN, "diff", str(state), prelude=prelude)
    slow = run(tmp_path, VIA_CLICK, "diff", str(state), prelude=prelude)
    assert fast.returncode == slow.returncode == 1
    assert fast.stderr == slow.stderr, (fast.stderr, slow.stderr)
    assert "internal error" in fast.stderr or "interrupted" in fast.stderr
    debug = run(tmp_path, VIA_MAIN, "diff", str(state), prelude=prelude, env={"RECONCILE_DEBUG": "1"})
    if "KeyboardInterrupt" not in raised:
        assert "Traceback" in debug.stderr and debug.returncode == 1


@pytest.mark.parametrize("mounts,unbuffered,code", [(1, False, 2), (150, False, 1), (1, True, 1)])
def test_a_reader_that_goes_away_is_handled_alike(tmp_path, mounts, unbuffered, code):
    """`reconcile diff | head -1` where head has already gone: a report larger than the output
    buffer (or any report with PYTHONUNBUFFERED) meets the closed pipe while it is written: exit 1,
    quietly, as click's main has it; a small buffered one only when flushed at exit, which keeps
    the report's exit code."""
    state = drifting_state(tmp_path, mounts)
    env = cli_env(tmp_path)
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    seen = []
    for door in (VIA_MAIN, VIA_CLICK):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before anything is written
        try:
            proc = subprocess.run([sys.executable, "-c", door, "diff", "--format", "json", str(state)],
                                  stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
        finally:
            os.close(write_end)
        seen.append((proc.returncode, proc.stderr))
    assert seen[0] == seen[1] == (code, "")
