"""Each class of hostile input, as a user meets it: through the CLI, one line per
problem at the position of the offending node, exit 1, never a traceback. (The fuzzer,
tests/test_fuzz_statefile.py, covers the classes at random; these are their named cases.)"""

from __future__ import annotations

import io
import json
import os
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from cli_support import run_cli
from reconcile_host.pipeline.statefile import StateFileError, load
from reconcile_host.pipeline.statefile.positions import LIMITS

REPO = Path(__file__).resolve().parent.parent
UNIT = "version: 1\nunits:\n  a.service:\n    active: false\n"

BILLION_LAUGHS = "version: 1\n" + "\n".join(
    [f"a0: &a0 [{', '.join(['lol'] * 9)}]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]) + "\n"

# (name, content, "line:col" of the first problem, a fragment of its message)
REFUSED = [
    ("tag-omap", "version: 1\nunits: !!omap [a.service: {active: false}]\n", "2:8", "tag '!!omap' is not allowed"),
    ("tag-python", "version: 1\nhost: !!python/object/apply:os.system [ls]\n", "2:7", "tag '!!python/object/apply"),
    ("tag-set", "version: 1\nunits:\n  a.service:\n    active: !!set {a}\n", "4:13", "tag '!!set'"),
    ("tag-unknown", "version: 1\nunits:\n  a.service:\n    active: !bool false\n", "4:13", "tag '!bool'"),
    ("billion-laughs", BILLION_LAUGHS, "7:", "too many nodes"),
    ("alias-recursive", "version: 1\nx: &a [1, *a]\n", "2:11", "recursive alias"),
    ("alias-unknown", "version: 1\nunits:\n  a.service: *nope\n", "3:14", "names no anchor"),
    ("too-many-collection-aliases", "version: 1\nd: &d {active: false}\nunits:\n" + "".join(
        f"  u{i}.service: *d\n" for i in range(51)), "54:16", "too many aliases to collections"),
    ("nested-1000", "version: 1\nunits: " + "[" * 1000 + "]" * 1000 + "\n", "2:", "nested too deep"),
    ("multi-document", UNIT + "---\nversion: 1\n", "5:1", "a second YAML document"),
    ("yaml-1.1", "%YAML 1.1\n---\n" + UNIT, "", "read as YAML 1.2"),
    ("colliding-keys", "version: 1\nunits:\n  1: {}\n  '1': {}\n", "4:3", "duplicate key '1'"),
    ("key-true", "version: 1\ntrue: 1\n", "2:1", "key true is not a string"),
    ("key-list", "version: 1\n? [a, b]\n: 1\n", "2:3", "a mapping key must be a string"),
    ("merge-not-mapping", "version: 1\nunits:\n  a.service:\n    <<: [1]\n", "4:10", "a merge key '<<' takes"),
    ("int-5000-digits", "version: 1\ngpus:\n  count: " + "9" * 5000 + "\n", "3:10", "has more than 19 digits"),
    ("int-out-of-range", "version: 1\ngpus:\n  count: 9223372036854775808\n", "3:10", "out of range"),
    ("float-overflow", "version: 1\ngpus:\n  settle: 1e999\n", "3:11", "is too large"),
    ("inf", "version: 1\ngpus:\n  settle: .inf\n", "3:11", "infinity or not-a-number"),
    ("nan", "version: 1\ngpus:\n  settle: .nan\n", "3:11", "infinity or not-a-number"),
    ("negative-duration", "version: 1\ngpus:\n  settle: -1\n", "3:11", "invalid duration -1"),
    ("duration-overflow", "version: 1\ngpus:\n  settle: '" + "9" * 400 + "s'\n", "3:11", "invalid duration"),
    ("size-overflow", "version: 1\ngpus:\n  max_memory_used: " + "9" * 400 + "GiB\n", "3:20", "invalid size"),
    ("negative-size", "version: 1\ngpus:\n  max_memory_used: -5\n", "3:20", "invalid size -5"),
    ("float-for-integer", "version: 1\ngpus:\n  count: 8.0\n", "3:10", "expected integer, got number 8.0"),
    ("percent-over-100", "version: 1\nmounts:\n  /data:\n    min_free: 101%\n", "4:15", "invalid size '101%'"),
    ("inode-percent-over-100", "version: 1\nmounts:\n  /data:\n    min_free_inodes: 150%\n", "4:22",
     "percentage from 0% to 100%"),
    ("unit-newline", 'version: 1\nunits:\n  "a\\nb.service":\n    active: false\n', "3:3", "invalid systemd unit name"),
    ("unit-trailing-newline", 'version: 1\nunits:\n  "a.service\\n":\n    active: false\n', "3:3",
     "invalid systemd unit name 'a.service\\n'"),
    ("unit-slash", "version: 1\nunits:\n  a/b.service:\n    active: false\n", "3:3", "invalid systemd unit name"),
    ("nul-byte", "version: 1\nunits:\n  a.service:\n    active: fa\x00lse\n", "4:15", "control character U+0000"),
    ("escape-byte", "version: 1\nhost: \x1b[31mred\n", "2:7", "control character U+001B"),
    ("long-key", "version: 1\nunits:\n  " + "k" * 2000 + ".service:\n    active: false\n", "3:", ""),
]


@pytest.mark.parametrize("name,text,where,fragment", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_with_one_line_at_its_position(tmp_path, name, text, where, fragment):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    t0 = time.monotonic()
    proc = run_cli(tmp_path, "validate", str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    for line in lines:
        assert re.fullmatch(re.escape(str(path)) + r":\d+:\d+: \S.*", line), line
    assert lines[0].startswith(f"{path}:{where}"), lines[0]
    assert fragment in lines[0], lines[0]
    assert time.monotonic() - t0 < 50  # not a hang (the fuzzer bounds every input; this is a backstop)


def test_the_issues_341_byte_billion_laughs_is_refused_before_it_is_built():
    assert len(BILLION_LAUGHS) < 500  # 9 levels of 9: 387 million nodes once expanded
    with pytest.raises(StateFileError) as exc:
        load("bomb.yaml", text=BILLION_LAUGHS, use_cache=False)
    [problem] = exc.value.problems
    assert problem.startswith("bomb.yaml:7:") and f"more than {LIMITS.max_nodes}" in problem


ACCEPTED = [
    ("merge-key", "version: 1\nunits:\n  a.service: &d\n    active: false\n    enabled: false\n"
     "  b.service:\n    <<: *d\n    enabled: true\n",
     {"a.service": {"active": False, "enabled": False}, "b.service": {"enabled": True, "active": False}}),
    ("merge-list", "version: 1\nunits:\n  a.service: &a {active: false}\n  c.service: &c {enabled: true}\n"
     "  b.service: {<<: [*a, *c]}\n",
     {"a.service": {"active": False}, "c.service": {"enabled": True}, "b.service": {"active": False, "enabled": True}}),
    ("anchored-scalar", "version: 1\nunits:\n  a.service:\n    active: &x false\n  b.service:\n    active: *x\n",
     {"a.service": {"active": False}, "b.service": {"active": False}}),
    ("bom", "\ufeff" + UNIT, {"a.service": {"active": False}}),
    ("tab-separator", "version: 1\nunits:\n  a.service:\n    active:\tfalse\n", {"a.service": {"active": False}}),
    ("megabyte-comment", "version: 1\n# " + "x" * 2**20 + "\n" + UNIT.split("\n", 1)[1],
     {"a.service": {"active": False}}),
]


@pytest.mark.parametrize("name,text,units", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_accepted(tmp_path, name, text, units):
    state = load(f"{name}.yaml", text=text.encode(), use_cache=False)
    assert state.doc["units"] == units
    assert type(state.doc["units"]["a.service"]["active"]) is bool


def test_a_merged_key_problem_points_into_the_anchored_mapping(tmp_path):
    text = "version: 1\nunits:\n  a.service: &d\n    activ: false\n  b.service:\n    <<: *d\n"
    with pytest.raises(StateFileError) as exc:
        load("m.yaml", text=text, use_cache=False)
    assert exc.value.problems == [
        "m.yaml:4:5: units.\"a.service\": unknown key 'activ' (did you mean 'active'?)",
        "m.yaml:4:5: units.\"b.service\": unknown key 'activ' (did you mean 'active'?)"]


def test_invalid_utf8_and_dev_zero_and_a_directory(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"version: 1\nhost: caf\xe9\n")
    proc = run_cli(tmp_path, "validate", str(bad))
    assert (proc.returncode, proc.stderr) == (1, f"{bad}:2:10: not UTF-8 text (byte 0xe9)\n")
    proc = run_cli(tmp_path, "validate", "/dev/zero")  # never read: only regular files are
    assert (proc.returncode, proc.stderr.split(", not")[0]) == (1, "/dev/zero:1:1: is a character device")
    proc = run_cli(tmp_path, "validate", str(tmp_path))
    assert (proc.returncode, proc.stderr) == (1, f"{tmp_path}:1:1: is a directory, not a state file\n")
    big = tmp_path / "big.yaml"
    big.write_text(UNIT + "# " + "x" * 100 + "\n" + ("#" * 99 + "\n") * (LIMITS.max_bytes // 100))
    proc = run_cli(tmp_path, "validate", str(big))
    assert proc.returncode == 1 and ": file too large: more than 4194304 bytes" in proc.stderr, proc.stderr
    line, col = map(int, proc.stderr.split(":")[1:3])
    assert (line, col) > (6, 0)  # where the limit is crossed, not 1:1


def test_stdin_is_bounded_too(tmp_path):
    import subprocess

    from cli_support import cli_env, reconcile_argv

    with open("/dev/zero", "rb") as zero:
        proc = subprocess.run(reconcile_argv("diff", "-"), stdin=zero, capture_output=True, text=True,
                              env=cli_env(tmp_path), timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith("<stdin>:1:") and "file too large" in proc.stderr


def test_a_corrupted_cache_entry_is_ignored_and_rewritten(tmp_path):
    state = tmp_path / "s.yaml"
    state.write_text("version: 1\nmounts:\n  /proc:\n    fstype: proc\n")
    assert run_cli(tmp_path, "validate", str(state)).returncode == 0
    [entry] = (tmp_path / "cache" / "validated").iterdir()
    for garbage in ("{not json", '{"key": "other", "doc": {"version": 1}}',
                    json.dumps({"key": entry.stem, "doc": {"version": 1, "mounts": 5}}), "[]", ""):
        entry.write_text(garbage)
        proc = run_cli(tmp_path, "diff", str(state), "--format", "json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["resources"][0]["id"] == "mount:/proc"
        assert json.loads(entry.read_text())["doc"]["mounts"] == {"/proc": {"fstype": "proc"}}  # rewritten


# --- the CLI's own contract -------------------------------------------------------------------

@pytest.mark.parametrize("args", [["diff", "--format", "yaml", "x.yaml"], ["diff", "--no-such-option"],
                                  ["validate"], ["apply", "--lock-timeout"], ["no-such-command"],
                                  ["watch", "--interval"]])
def test_usage_mistakes_exit_1_with_one_line(tmp_path, args):
    proc = run_cli(tmp_path, *args)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("reconcile: error: ") and "--help" in proc.stderr


def test_help_and_version_exit_0(tmp_path):
    assert run_cli(tmp_path, "--version").returncode == 0
    assert run_cli(tmp_path, "diff", "--help").returncode == 0


REPORT_SCHEMA = json.loads((REPO / "schema" / "report.schema.json").read_text())


@pytest.mark.parametrize("command", [["diff"], ["apply"], ["apply", "--dry-run"]])
def test_json_and_junit_consumers_get_an_error_report(tmp_path, command):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nunits:\n  a.service:\n    activ: false\n  b:\n    active: 1\n")
    extra = ["--journal", str(tmp_path / "j.jsonl")] if command == ["apply"] else []
    proc = run_cli(tmp_path, *command, str(bad), "--format", "json", *extra)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    jsonschema.Draft202012Validator(REPORT_SCHEMA).validate(doc)
    assert doc["exit_code"] == 1 and doc["resources"] == [] and doc["command"] == command[0]
    assert [p["text"] for p in doc["problems"]] == proc.stderr.splitlines()
    assert [(p["line"], p["column"]) for p in doc["problems"]] == [(4, 5), (5, 3), (6, 13)]
    proc = run_cli(tmp_path, *command, str(bad), "--format", "junit", *extra)
    assert proc.returncode == 1
    suite = ET.fromstring(proc.stdout).find("testsuite")
    assert suite.get("errors") == "1" and suite.get("tests") == "1"
    error = suite.find("testcase/error")
    assert error.get("type") == "state-file" and error.text.splitlines() == proc.stderr.splitlines()


def test_an_escaping_exception_is_one_line_and_exit_1(monkeypatch, capsys):
    from reconcile_host import cli
    from reconcile_host.pipeline import statefile

    def boom(*_a, **_k):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(statefile, "load", boom)
    monkeypatch.delenv("RECONCILE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["validate", "x.yaml"])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err == ("reconcile: internal error: RuntimeError: boom second line "
                   "(set RECONCILE_DEBUG=1 for the traceback)\n")
    monkeypatch.setenv("RECONCILE_DEBUG", "1")
    with pytest.raises(RuntimeError):
        cli.main(["validate", "x.yaml"])


def test_watch_survives_a_state_file_it_cannot_read(tmp_path):
    from reconcile_host.pipeline.watch import Watcher

    state = tmp_path / "s.yaml"
    state.write_text(BILLION_LAUGHS)
    log = io.StringIO()
    w = Watcher(str(state), 1.0, None, tmp_path / "lock", log=log, max_passes=2, wait=lambda _s: None)
    assert w.run() == 0
    assert log.getvalue().count("failed: state file does not validate") == 2, log.getvalue()
    assert os.path.exists(state)
