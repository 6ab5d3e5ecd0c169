"""Adding an output format is one module in views/ and one line of views.FORMATS (docs/design.md,
"Formats").

In a temporary copy of the package, the TAP format docs/design.md sketches (its module and its
line taken from the doc's own blocks) is added from exactly those two places; then the real CLI
of that copy runs `diff --format tap` through both doors (__main__'s plain reader without click,
and click), on a state file that does not validate, on a refused run, and on an inventory. The
output is read by Perl's TAP::Parser (the TAP harness `prove` runs on), and what it should say
comes from the same runs' `--format json` reports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from addition_support import copy_package, documented_sketch, env_for, insert_at

VIA_CLICK = "import sys; from reconcile_host.cli import main; sys.argv[0] = 'reconcile'; main()"
VIA_MAIN = "import sys; from reconcile_host.__main__ import main; sys.argv[0] = 'reconcile'; main()"

needs_perl = pytest.mark.skipif(subprocess.run(["perl", "-MTAP::Parser", "-e", "1"], capture_output=True).returncode,
                                reason="Perl's TAP::Parser not installed (Debian: perl)")


# The format's module and its FORMATS line, as docs/design.md ("Formats") shows them.
VIEW_MODULE, FORMATS_LINE = documented_sketch("def render_tap(", "FORMATS: dict[str, Format]", '"tap": Format(')


def copy_with_a_new_format(tmp: Path) -> Path:
    """The package copied to TMP/pkg/reconcile_host, plus the two places of a new format."""
    pkg = copy_package(tmp)
    (pkg / "views" / "tap.py").write_text(VIEW_MODULE)
    insert_at(pkg / "views" / "__init__.py", '    "prometheus": Format(', FORMATS_LINE)
    return pkg


def run(pkg: Path, tmp: Path, *args: str, door: str = VIA_MAIN) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "importtime", "-c", door, *args], capture_output=True, text=True,
                          env=env_for(pkg, tmp), timeout=180, cwd=tmp)


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]


def imported(proc: subprocess.CompletedProcess) -> set[str]:
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


PARSE = r"""
use TAP::Parser;
local $/; my $p = TAP::Parser->new({tap => scalar <STDIN>});
while (my $r = $p->next) {
    printf "%d\t%s\t%s\n", $r->number, ($r->is_ok ? "ok" : "not ok"), $r->description if $r->is_test;
}
printf "plan\t%s\nversion\t%s\n", $p->plan, $p->version;
print "error\t$_\n" for $p->parse_errors;
"""


def tap(text: str) -> tuple[list[tuple[bool, str]], str]:
    """TAP::Parser's reading of TEXT: each test's (ok, description), and the plan. Parse errors fail."""
    proc = subprocess.run(["perl", "-e", PARSE], input=text, capture_output=True, text=True, check=True, timeout=60)
    tests, plan, errors = [], "", []
    for line in proc.stdout.splitlines():
        first, _, rest = line.partition("\t")
        if first == "plan":
            plan = rest
        elif first == "error":
            errors.append(rest)
        elif first.isdigit():
            ok, _, description = rest.partition("\t")
            tests.append((int(first), ok == "ok", description))
    assert not errors, errors
    assert [n for n, *_ in tests] == list(range(1, len(tests) + 1))
    return [(ok, d.removeprefix("- ")) for _n, ok, d in tests], plan


@pytest.fixture(scope="module")
def pkg(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("format")
    pkg = copy_with_a_new_format(tmp)
    which = subprocess.run([sys.executable, "-c", "import reconcile_host; print(reconcile_host.__file__)"],
                           env=env_for(pkg, tmp), capture_output=True, text=True)
    assert which.stdout.strip() == str(pkg / "__init__.py"), "the copy, not the installed package, must run"
    return pkg


def drifting_state(tmp: Path) -> Path:
    (tmp / "not-mounted").mkdir(exist_ok=True)
    path = tmp / "s.yaml"
    path.write_text(f"version: 1\nmounts:\n  /:\n    mounted: true\n  {tmp / 'not-mounted'}:\n    mounted: true\n")
    return path


@needs_perl
def test_a_format_added_in_two_places_is_a_choice_of_both_doors(pkg, tmp_path):
    state = drifting_state(tmp_path)
    fast = run(pkg, tmp_path, "diff", str(state), "--format", "tap")
    slow = run(pkg, tmp_path, "diff", str(state), "--format", "tap", door=VIA_CLICK)
    assert "click" not in imported(fast), "the plain diff took click's path: its reader does not know the format"
    assert "click" in imported(slow)
    assert fast.returncode == slow.returncode == 2, fast.stderr
    assert fast.stdout == slow.stdout and stderr_lines(fast) == stderr_lines(slow) == []

    report = json.loads(run(pkg, tmp_path, "diff", str(state), "--format", "json").stdout)
    tests, plan = tap(fast.stdout)
    assert plan == f"1..{len(report['resources'])}"
    assert tests == [(r["status"] == "ok", f"{r['id']}: {r['status']}") for r in report["resources"]]
    assert [ok for ok, _ in tests] == [True, False]  # `/` is mounted; the empty directory is not

    helped = run(pkg, tmp_path, "diff", "--help", door=VIA_CLICK)
    assert re.search(r"--format \[[a-z|]*\btap\b", helped.stdout), helped.stdout


@needs_perl
def test_a_bad_state_file_is_one_line_and_a_tap_report(pkg, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmounts:\n  /:\n    mounted: maybe\n")
    seen = []
    for door in (VIA_MAIN, VIA_CLICK):
        proc = run(pkg, tmp_path, "diff", str(bad), "--format", "tap", door=door)
        assert proc.returncode == 1
        lines = stderr_lines(proc)
        assert len(lines) == 1 and re.match(rf"{re.escape(str(bad))}:\d+:\d+: ", lines[0]), proc.stderr
        assert "Traceback" not in proc.stderr
        tests, plan = tap(proc.stdout)
        assert (tests, plan) == ([(False, lines[0])], "1..1")
        seen.append((proc.stdout, lines))
    assert seen[0] == seen[1]
    validated = run(pkg, tmp_path, "validate", str(bad), door=VIA_CLICK)
    assert stderr_lines(validated) == seen[0][1]  # the same line `reconcile validate` prints


@needs_perl
def test_a_refused_run_is_a_tap_report_saying_why(pkg, tmp_path):
    mine = Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else ""
    other = "f" * 32 if mine != "f" * 32 else "0" * 32
    state = tmp_path / "s.yaml"
    state.write_text(f"version: 1\nhost: {{name: '*', machine_id: {other}}}\nmounts:\n  /:\n    mounted: true\n")
    proc = run(pkg, tmp_path, "diff", str(state), "--format", "tap")
    assert proc.returncode == 1
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("reconcile: error: "), proc.stderr
    refusal = json.loads(run(pkg, tmp_path, "diff", str(state), "--format", "json").stdout)
    assert refusal["error"]["reason"] == "machine-mismatch"
    tests, plan = tap(proc.stdout)
    assert (tests, plan) == ([(False, lines[0].removeprefix("reconcile: error: "))], "1..1")
    assert tests[0][1] == refusal["error"]["message"]


@needs_perl
def test_an_inventory_renders_in_the_new_format(pkg, tmp_path):
    home = tmp_path / "inventory"
    home.mkdir()
    (home / "ok.yaml").write_text("version: 1\nmounts:\n  /:\n    mounted: true\n")
    drifting_state(home).rename(home / "drift.yaml")
    remote = f"{sys.executable} -m reconcile_host"  # each host: the copy, behind the `env` command prefix
    inventory = home / "hosts.yaml"
    inventory.write_text(f"version: 1\ndefaults:\n  remote_command: {json.dumps(remote)}\nhosts:\n"
                         "  a:\n    via: env\n    state: ok.yaml\n  b:\n    via: env\n    state: drift.yaml\n")
    proc = run(pkg, tmp_path, "diff", "--inventory", str(inventory), "--format", "tap", door=VIA_CLICK)
    assert proc.returncode == 2, proc.stderr  # the worst host's
    doc = json.loads(run(pkg, tmp_path, "diff", "--inventory", str(inventory), "--format", "json",
                         door=VIA_CLICK).stdout)
    assert [h["status"] for h in doc["hosts"]] == ["ok", "drift"]
    tests, plan = tap(proc.stdout)
    assert plan == "1..2"
    assert tests == [(h["status"] == "ok", f"{h['host']}: {h['status']}") for h in doc["hosts"]]
