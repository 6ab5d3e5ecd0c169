"""One run path (pipeline/runs.py, docs/design.md "The run path"): the apply lock is taken there
and nowhere else, and every door's refusal carries a reason from the one closed set
(core/refusals.py REASONS), which every format renders and the report schema enumerates.

The authorities: the code itself, read with `ast`; the lock a real flock (pipeline/journal.py),
whose acquisitions are watched at run time; the schema checked by jsonschema, the JUnit by
ElementTree, the metrics by prometheus_client's parser."""

from __future__ import annotations

import ast
import io
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from cli_support import run_cli
from test_refusals import OK_STATE, check_refusal, other_id

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())
# The lock's own module, and the one place that takes it.
LOCK_OWNERS = {Path("pipeline/journal.py"), Path("pipeline/runs.py")}


def package_modules() -> list[Path]:
    from test_layers import modules

    return [p.relative_to(ROOT) for p in modules().values()]


def apply_lock_uses(tree: ast.AST) -> list[str]:
    """Where code reaches the journal's apply lock: `x.lock()`, `x.lock_path`, or a `Lock(path)`
    on a path that is not named for a lock of its own (slurm-health's `slurm-health.lock`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "lock_path":
            found.append(f"line {node.lineno}: .lock_path")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "lock" and isinstance(func, ast.Attribute) and not node.args:
                found.append(f"line {node.lineno}: .lock()")
            elif name == "Lock" and node.args:  # threading.Lock() takes none
                named = [c.value for a in node.args for c in ast.walk(a)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if not any(n.endswith(".lock") and n != "lock" for n in named):
                    found.append(f"line {node.lineno}: Lock({ast.unparse(node.args[0])})")
    return found


def test_the_rule_sees_every_way_to_the_lock():
    # The guard of the check below: each way in is seen, a lock of its own name is not.
    seen = apply_lock_uses(ast.parse("journal.lock().acquire()\nLock(journal.lock_path)\n"
                                     "Lock(path)\nLock(d / 'lock')\nLock(d / 'slurm-health.lock')\n"
                                     "threading.Lock()\n"))
    assert sorted(s.split(": ", 1)[1] for s in seen) == sorted([".lock()", "Lock(journal.lock_path)", ".lock_path",
                                                               "Lock(path)", "Lock(d / 'lock')"])


def test_only_the_run_path_takes_the_apply_lock():
    modules = package_modules()
    assert Path("pipeline/runs.py") in modules and Path("cli.py") in modules
    wrong = {}
    for rel in modules:
        if rel in LOCK_OWNERS:
            continue
        uses = apply_lock_uses(ast.parse((ROOT / rel).read_text(), str(rel)))
        if uses:
            wrong[str(rel)] = uses
    assert not wrong, f"the apply lock is taken outside pipeline/runs.py: {wrong}"


# --- at run time: who takes the lock --------------------------------------------------------

@pytest.fixture
def lock_takers(monkeypatch, tmp_path):
    """Every acquisition of a pipeline.journal.Lock, as (the calling module, the lock file)."""
    from reconcile_host.pipeline import journal

    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    taken: list[tuple[str, str]] = []
    real = journal.Lock.acquire

    def acquire(self, *a, **kw):
        taken.append((sys._getframe(1).f_globals["__name__"], Path(self.path).name))
        return real(self, *a, **kw)

    monkeypatch.setattr(journal.Lock, "acquire", acquire)
    return taken


def ok_state(tmp_path: Path) -> Path:
    state = tmp_path / "s.yaml"
    state.write_text(OK_STATE)
    return state


def test_the_cli_apply_takes_the_lock_through_the_run_path(tmp_path, lock_takers):
    from reconcile_host import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["apply", str(ok_state(tmp_path)), "--journal", str(tmp_path / "journal.jsonl")])
    assert done.value.code == 0
    assert lock_takers == [("reconcile_host.pipeline.runs", "lock")]


def test_a_saved_plan_takes_the_lock_through_the_run_path(tmp_path, lock_takers):
    from reconcile_host.pipeline.plans import apply_saved_plan
    from reconcile_host.pipeline.report import RunReport

    plan = tmp_path / "plan.json"
    made = run_cli(tmp_path, "diff", str(ok_state(tmp_path)), "--out", str(plan))
    assert made.returncode == 0, made.stderr
    report = apply_saved_plan(str(plan), journal_path=str(tmp_path / "journal.jsonl"))
    assert isinstance(report, RunReport) and report.exit_code == 0
    assert lock_takers == [("reconcile_host.pipeline.runs", "lock")]


def test_a_watch_pass_takes_the_lock_through_the_run_path(tmp_path, lock_takers):
    from reconcile_host.pipeline.journal import Journal
    from reconcile_host.pipeline.watch import Watcher

    w = Watcher(str(ok_state(tmp_path)), 1.0, Journal(tmp_path / "journal.jsonl"), log=io.StringIO(), max_passes=1)
    assert w.run() == 0 and w.pass_outcome == "ok"
    assert lock_takers == [("reconcile_host.pipeline.runs", "lock")]


def test_slurm_health_applies_through_the_run_path(tmp_path, lock_takers):
    from reconcile_host.doors import slurm
    from reconcile_host.pipeline.journal import Journal

    journal = Journal.at(str(tmp_path / "journal.jsonl"))
    verdict, note, _ = slurm._check(slurm.Settings(str(ok_state(tmp_path)), "n1", str(journal.path), apply=True),
                                 journal)
    assert verdict.healthy and note == ""
    assert lock_takers == [("reconcile_host.pipeline.runs", "lock")]


# --- each caller's refusal and its reason ------------------------------------------------------

def plan_of(tmp_path: Path) -> tuple[Path, Path]:
    state, plan = ok_state(tmp_path), tmp_path / "plan.json"
    made = run_cli(tmp_path, "diff", str(state), "--out", str(plan))
    assert made.returncode == 0, made.stderr
    return state, plan


def test_a_saved_plan_whose_state_file_changed_is_stale(tmp_path):
    state, plan = plan_of(tmp_path)
    state.write_text(OK_STATE + "# edited\n")
    proc = run_cli(tmp_path, "apply", str(plan), "--journal", str(tmp_path / "j.jsonl"), "--format", "json")
    assert "changed since" in check_refusal(proc, "json", "plan-stale")


def test_an_edited_saved_plan_is_invalid(tmp_path):
    _state, plan = plan_of(tmp_path)
    doc = json.loads(plan.read_text())
    doc["fingerprints"] = {k: "0" * 64 for k in doc["fingerprints"]}
    plan.write_text(json.dumps(doc))
    proc = run_cli(tmp_path, "apply", str(plan), "--journal", str(tmp_path / "j.jsonl"), "--format", "json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["error"]["reason"] == "plan-invalid"
    assert proc.stderr.startswith(f"reconcile: error: refusing the saved plan {plan}: it does not match itself")


@pytest.mark.parametrize("fmt", ["json", "junit", "prometheus"])
def test_a_saved_plan_meeting_a_held_lock_says_lock_held(tmp_path, fmt):
    from reconcile_host.pipeline.journal import Journal

    _state, plan = plan_of(tmp_path)
    journal = tmp_path / "j" / "journal.jsonl"
    journal.parent.mkdir()
    with Journal.at(str(journal)).lock() as held:
        held.acquire()
        proc = run_cli(tmp_path, "apply", str(plan), "--journal", str(journal), "--format", fmt)
    assert "another reconcile apply holds" in check_refusal(proc, fmt, "lock-held")


def watch_once(tmp_path: Path, state: Path, journal=None, lock_file=None):
    """One pass of a real Watcher; returns it and the Finished its hook got."""
    from reconcile_host.pipeline.watch import Watcher

    got = []
    w = Watcher(str(state), 1.0, journal, lock_file, lock_wait=0, log=io.StringIO(), max_passes=1,
                on_pass=got.append)
    w.run()
    assert len(got) == 1
    return w, got[0]


def test_watch_refusals_carry_their_reasons(tmp_path, monkeypatch):
    from reconcile_host.pipeline.journal import Journal, Lock

    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    state = ok_state(tmp_path)
    with Lock(tmp_path / "lock") as held:
        held.acquire()
        w, run = watch_once(tmp_path, state, lock_file=tmp_path / "lock")
    assert (w.pass_outcome, run.refusal.reason, run.report) == ("skipped", "lock-held", None)
    assert run.doc["error"]["reason"] == "lock-held"

    (tmp_path / "afile").write_text("")  # the journal's directory is a regular file
    w, run = watch_once(tmp_path, state, journal=Journal(tmp_path / "afile" / "journal.jsonl"))
    assert (w.pass_outcome, run.refusal.reason) == ("failed", "journal")

    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(f"version: 1\nhost: {{machine_id: {other_id()}}}\n" + OK_STATE.split("\n", 1)[1])
    w, run = watch_once(tmp_path, pinned)
    assert (w.pass_outcome, run.refusal.reason) == ("failed", "machine-mismatch")
    assert run.doc["machine"]["hostname"]  # the machine that refused is named

    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmounts: [\n")
    w, run = watch_once(tmp_path, bad)
    assert (w.pass_outcome, run.refusal.reason) == ("failed", "state-file")
    assert run.doc["problems"][0]["file"] == str(bad)


def test_a_bug_in_a_watch_pass_is_an_internal_error_and_the_watch_goes_on(tmp_path, monkeypatch):
    from reconcile_host.pipeline import engine

    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RECONCILE_DEBUG", raising=False)

    def boom(self, *a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine.Engine, "apply", boom)
    w, run = watch_once(tmp_path, ok_state(tmp_path))
    assert (w.pass_outcome, run.refusal.reason, run.refusal.message) == ("failed", "internal-error",
                                                                         "RuntimeError: boom")
    assert "pass 1: failed: internal error: RuntimeError: boom" in w.out.getvalue()


def test_slurm_health_judges_a_bad_state_file_unhealthy(tmp_path, monkeypatch):
    from reconcile_host.doors import slurm
    from reconcile_host.pipeline.journal import Journal

    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmounts: [\n")
    journal = Journal.at(str(tmp_path / "journal.jsonl"))
    verdict, _, _ = slurm._check(slurm.Settings(str(bad), "n1", str(journal.path)), journal)
    assert not verdict.healthy and verdict.problems == ("state file",)
    assert verdict.reason.startswith(f"reconcile: state file: {bad}:")


def test_slurm_health_with_the_lock_held_judges_without_applying(tmp_path, monkeypatch):
    from reconcile_host.doors import slurm
    from reconcile_host.pipeline.journal import Journal

    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    journal = Journal.at(str(tmp_path / "journal.jsonl"))
    with journal.lock() as held:
        held.acquire()
        verdict, note, _ = slurm._check(slurm.Settings(str(ok_state(tmp_path)), "n1", str(journal.path), apply=True),
                                     journal)
    assert verdict.healthy and note.startswith("not applied: another reconcile apply holds")


# --- the closed set, in every format ------------------------------------------------------------

def test_the_schema_enumerates_the_closed_set():
    from reconcile_host.core.refusals import REASONS, Refusal

    assert SCHEMA["properties"]["error"]["properties"]["reason"]["enum"] == list(REASONS)
    with pytest.raises(ValueError):
        Refusal("plan", "a reason outside the set")


def test_the_docs_list_the_closed_set():
    from reconcile_host.core.refusals import REASONS

    lines = (ROOT / "docs" / "json-report.md").read_text().splitlines()
    table = lines[lines.index("| `error.reason` | when |") + 2:]
    listed = [line.split("`")[1] for line in table[:next(i for i, x in enumerate(table) if not x.startswith("|"))]]
    assert listed == list(REASONS)


@pytest.mark.parametrize("fmt", ["json", "junit", "prometheus"])
def test_every_reason_renders_in_every_format(fmt):
    from prometheus_client.parser import text_string_to_metric_families
    from reconcile_host.core.refusals import REASONS, Refusal
    from reconcile_host.pipeline.runs import finished
    from reconcile_host.views import render

    for reason in REASONS:
        problems = ("s.yaml:2:3: bad",) if reason == "state-file" else ()
        run = finished(Refusal(reason, f"why {reason}", problems=problems), "apply", "s.yaml")
        out = io.StringIO()
        render(dict(run.doc), fmt, out)
        if fmt == "json":
            doc = json.loads(out.getvalue())
            jsonschema.validate(doc, SCHEMA)
            assert doc["error"]["reason"] == reason and doc["exit_code"] == 1
        elif fmt == "junit":
            types = [e.get("type") for e in ET.fromstring(out.getvalue()).iter("error")]
            assert types == [reason]
        else:
            infos = [s.labels for fam in text_string_to_metric_families(out.getvalue()) for s in fam.samples
                     if s.name == "reconcile_error_info"]
            assert infos == [{"reason": reason}]


def test_below_the_command_line_nothing_imports_click():
    """click is the command line's (cli.py; commands.py prints through it when there is an error):
    the doors, the sinks and the run path print without it."""
    wrong = []
    for rel in package_modules():
        if rel.parts[0] in ("cli.py", "commands.py", "__main__.py"):
            continue
        for node in ast.walk(ast.parse((ROOT / rel).read_text(), str(rel))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "click" for n in names):
                wrong.append(f"{rel}:{node.lineno}")
    assert not wrong
