"""State files: every malformed input gives exit 1, one `file:line:col: message` line per problem
and no traceback; sizes, durations and ordering are parsed as documented."""

from __future__ import annotations

import pytest
from cli_support import run_cli
from reconcile_host.core.values import is_unit_name, parse_duration, parse_size, parse_size_or_percent
from reconcile_host.pipeline.statefile import StateFileError, load

GOOD_UNIT = "version: 1\nunits:\n  a.service:\n    active: false\n"

# (name, file content, expected "line:col", a fragment the message must contain)
MALFORMED = [
    ("unknown-top-key", "version: 1\nunit:\n  a.service:\n    active: false\n",
     "2:1", "unknown key 'unit' (did you mean 'units'?)"),
    ("unknown-unit-field", "version: 1\nunits:\n  a.service:\n    activ: false\n",
     "4:5", "unknown key 'activ' (did you mean 'active'?)"),
    ("bool-as-string", "version: 1\nunits:\n  a.service:\n    active: yes\n",
     "4:13", 'expected boolean, got string "yes"'),
    ("enabled-enum", "version: 1\nunits:\n  a.service:\n    enabled: maybe\n",
     "4:14", 'expected one of true, false, "masked"; got "maybe"'),
    ("duplicate-unit", "version: 1\nunits:\n  a.service:\n    active: true\n  a.service:\n    active: false\n",
     "5:3", "duplicate key 'a.service' (first defined at line 3)"),
    ("duplicate-top", "version: 1\nversion: 1\n", "2:1", "duplicate key 'version'"),
    ("unknown-version", "version: 2\nunits: {}\n", "1:10", "unsupported state file version 2"),
    ("version-as-string", 'version: "1"\n', "1:10", 'unsupported state file version "1"'),
    ("missing-version", "units:\n  a.service:\n    active: true\n", "1:1", "missing required key 'version'"),
    ("unit-no-suffix", "version: 1\nunits:\n  vllm:\n    active: false\n", "3:3", "invalid systemd unit name 'vllm'"),
    ("unit-with-space", "version: 1\nunits:\n  my unit.service:\n    active: false\n",
     "3:3", "invalid systemd unit name 'my unit.service'"),
    ("unknown-need", "version: 1\nunits:\n  a.service:\n    active: true\n    needs: [unit:b.service]\n"
     "  c.service:\n    active: true\n", "5:13", "needs unknown resource 'unit:b.service'"),
    ("need-did-you-mean", "version: 1\nunits:\n  vllm.service:\n    active: false\n  x.service:\n"
     "    active: true\n    needs: [unit:vlm.service]\n", "7:13", "(did you mean 'unit:vllm.service'?)"),
    ("need-cycle", "version: 1\nunits:\n  a.service:\n    active: true\n    needs: [unit:b.service]\n"
     "  b.service:\n    active: true\n    needs: [unit:a.service]\n", "5:13", "needs form a cycle"),
    ("need-self", "version: 1\nunits:\n  a.service:\n    active: true\n    needs: [unit:a.service]\n",
     "5:13", "unit:a.service needs itself"),
    ("need-bad-form", "version: 1\nunits:\n  a.service:\n    active: true\n    needs: [disk:/data]\n",
     "5:13", "invalid need 'disk:/data'"),
    ("needs-not-list", "version: 1\nunits:\n  a.service:\n    active: true\n    needs: unit:b.service\n",
     "5:12", 'expected list, got string "unit:b.service"'),
    ("yaml-unclosed-flow", "version: 1\nunits:\n  a.service: {active: true\n", "4:1", "expected ',' or '}'"),
    ("yaml-bad-indent", "version: 1\nunits:\n  a.service:\n    active: true\n   enabled: false\n", "5:4",
     "expected <block end>, but found '<block mapping start>'"),
    ("yaml-tab", "version: 1\nunits:\n\ta.service:\n", "3:1", "found character '\\t' that cannot start any token"),
    ("top-level-list", "- version: 1\n", "1:1", "expected a mapping at the top level, got list"),
    ("empty-file", "", "1:1", "empty state file"),
    ("units-is-list", "version: 1\nunits:\n  - a.service\n", "3:3", 'units: expected mapping, got list'),
    ("unit-spec-scalar", "version: 1\nunits:\n  a.service: stopped\n", "3:14",
     'expected mapping, got string "stopped"'),
    ("host-not-string", "version: 1\nhost: 5\n", "2:7", "host: expected string or mapping, got integer 5"),
    ("unit-empty-spec", "version: 1\nunits:\n  a.service: {}\n", "3:14", "should be non-empty"),
]


@pytest.mark.parametrize("name,text,where,fragment", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_state_file_one_line_with_position(tmp_path, name, text, where, fragment):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    proc = run_cli(tmp_path, "validate", str(path))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines, "no error printed"
    first = lines[0]
    assert first.startswith(f"{path}:{where}: "), first
    assert fragment in first, first
    # every line is a file:line:col: message line
    for line in lines:
        assert line.startswith(f"{path}:"), line
        assert line.split(":", 3)[1].isdigit() and line.split(":", 3)[2].isdigit(), line


def test_several_problems_each_on_its_own_line_in_file_order(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("version: 1\nunits:\n  a.service:\n    activ: true\n  b:\n    enabled: sometimes\n")
    proc = run_cli(tmp_path, "validate", str(path))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert [line.split(":")[1:3] for line in lines] == [["4", "5"], ["5", "3"], ["6", "14"]]


def test_not_utf8_reports_position(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"version: 1\nhost: \xff\xfe\n")
    proc = run_cli(tmp_path, "validate", str(path))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"{path}:2:7: not UTF-8"), proc.stderr


def test_missing_file_is_one_line_error(tmp_path):
    proc = run_cli(tmp_path, "diff", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"{tmp_path / 'nope.yaml'}:1:1: no such file"


def test_validate_accepts_good_files_and_reports_each_bad_one(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(GOOD_UNIT)
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nunits:\n  a.service:\n    active: 1\n")
    assert run_cli(tmp_path, "validate", str(good)).returncode == 0
    proc = run_cli(tmp_path, "validate", str(good), str(bad))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"{bad}:4:13: ")


def test_shipped_states_are_valid(tmp_path):
    from pathlib import Path

    states = sorted((Path(__file__).resolve().parent.parent / "states").glob("*.yaml"))
    assert states, "no shipped state files"
    proc = run_cli(tmp_path, "validate", *map(str, states))
    assert proc.returncode == 0, proc.stderr
    assert "warning:" not in proc.stderr, "the shipped states use the current spellings"


def test_cache_serves_a_validated_file_and_notices_edits(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(GOOD_UNIT)
    env_cache = tmp_path / "cache"
    import os

    os.environ["RECONCILE_CACHE_DIR"] = str(env_cache)
    try:
        first = load(path)
        assert list((env_cache / "validated").iterdir()), "verdict not cached"
        again = load(path)
        assert again.doc == first.doc
        path.write_text(GOOD_UNIT.replace("active: false", "active: maybe"))
        with pytest.raises(StateFileError) as exc:
            load(path)
        assert ":4:13:" in exc.value.problems[0]
    finally:
        del os.environ["RECONCILE_CACHE_DIR"]


def test_default_order_units_first_and_needs_respected(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "s.yaml"
    path.write_text("version: 1\nunits:\n  z.service:\n    active: true\n    needs: [unit:y.service]\n"
                    "  x.service:\n    active: true\n  y.service:\n    active: true\n")
    order = [r.id for r in load(path).resources]
    assert order == ["unit:x.service", "unit:y.service", "unit:z.service"]


@pytest.mark.parametrize("text,value", [
    ("0MiB", 0), ("512MiB", 512 * 2**20), ("4TiB", 4 * 2**40), ("75.8GB", 75_800_000_000),
    ("1024", 1024), (2048, 2048), ("10 KB", 10_000), ("1kib", 1024),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MiB", "-1GB", "4TB!", "1.2.3GB", "12 parsecs", True, -5])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_parse_size_or_percent():
    assert parse_size_or_percent("15%") == ("percent", 15.0)
    assert parse_size_or_percent("4TiB") == ("bytes", 4 * 2**40)
    with pytest.raises(ValueError):
        parse_size_or_percent("150%")


@pytest.mark.parametrize("text,seconds", [
    ("10s", 10), ("500ms", 0.5), ("5m", 300), ("1h30m", 5400), ("2d", 172800), (30, 30), (1.5, 1.5),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "10x", "s", "1h 30m", "-5s", True])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("name,ok", [
    ("vllm-kimi-k25-int4.service", True), ("getty@tty1.service", True), ("foo.timer", True),
    ("data.mount", True), ("vllm", False), ("a b.service", False), ("x.servic", False), ("", False),
    ("a" * 250 + ".service", False), ("a@b@c.service", True), ("@a.service", False),
])
def test_unit_names(name, ok):
    assert is_unit_name(name) is ok


def test_shipped_bundled_schema_is_current():
    """schema/reconcile-state.schema.json (what editors point at) is exactly `reconcile schema`:
    the bundle with the old spellings marked deprecated."""
    import json
    from pathlib import Path

    from reconcile_host.pipeline.statefile import editor_schema

    shipped = Path(__file__).resolve().parent.parent / "schema" / "reconcile-state.schema.json"
    assert json.loads(shipped.read_text()) == editor_schema(), "regenerate: reconcile schema > " + str(shipped)
