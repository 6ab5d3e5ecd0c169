"""Adding a resource kind touches three places and nothing else (docs/design.md, "Adding a kind"):
its module in reconcilers/, its schema fragment in schema/kinds/, one line of the registry.

In a temporary copy of the package, a small `files` kind (a file's mode) is added from exactly
those three places; then validate, diff, apply, a second apply, `needs` naming it, its `rank`,
and `reconcile schema` are run through the real CLI of that copy, and the file's mode is read
back from the filesystem."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

KIND_MODULE = '''\
"""files: a file's permission bits."""

from __future__ import annotations

import os

from ..pipeline.contract import Action, Drift, ObserveError, Plan, Reconciler, Resource


class FilesReconciler(Reconciler):
    key, kind, rank = "files", "file", 5  # before every other kind when `needs` is silent

    def resources(self, section):
        return [Resource(id=f"file:{path}", kind=self.kind, name=path, spec={"mode": spec["mode"]},
                         needs=tuple(spec.get("needs", ()))) for path, spec in section.items()]

    def observe(self, host, resources):
        out = {}
        for r in resources:
            try:
                out[r.id] = format(os.stat(r.name).st_mode & 0o7777, "o")
            except OSError as exc:
                out[r.id] = ObserveError(f"cannot stat {r.name}: {exc.strerror}")
        return out

    def diff(self, resource, observed):
        want = resource.spec["mode"]
        return [] if observed == want else [Drift("mode", want, observed)]

    def plan(self, resource, observed, drift, ctx):
        if not drift:
            return Plan()
        mode = resource.spec["mode"]
        return Plan(actions=(Action("chmod", resource.name, f"chmod {mode} {resource.name}", {"mode": mode}),))

    def apply(self, host, resource, action):
        os.chmod(action.target, int(action.params["mode"], 8))
        return f"mode {action.params['mode']}"
'''

KIND_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "files",
    "type": "object",
    "propertyNames": {"pattern": "^/"},
    "additionalProperties": {
        "type": "object",
        "additionalProperties": False,
        "required": ["mode"],
        "properties": {
            "mode": {"type": "string", "pattern": "^[0-7]{3,4}$"},
            "needs": {"$ref": "#/$defs/needs"},
        },
    },
}

REGISTRY_LINE = '    "files": Kind("file", ".files:FilesReconciler", name_word="PATH"),\n'


def copy_with_a_new_kind(tmp: Path) -> Path:
    """The package copied to TMP/pkg/reconcile_host, plus the three places of a new kind."""
    pkg = tmp / "pkg" / "reconcile_host"
    shutil.copytree(ROOT, pkg, ignore=shutil.ignore_patterns(".git", ".venv", "tests", "bench", "docs", "build",
                                                             "__pycache__", "*.egg-info", ".*cache"))
    (pkg / "reconcilers" / "files.py").write_text(KIND_MODULE)
    (pkg / "schema" / "kinds" / "files.schema.json").write_text(json.dumps(KIND_SCHEMA, indent=2))
    registry = pkg / "reconcilers" / "__init__.py"
    text = registry.read_text()
    anchor = '    "extractions": Kind('
    assert text.count(anchor) == 1
    registry.write_text(text.replace(anchor, REGISTRY_LINE + anchor))
    return pkg


def run(pkg: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pkg.parent), "RECONCILE_CACHE_DIR": str(tmp / "cache"),
           "RECONCILE_STATE_DIR": str(tmp / "state")}
    return subprocess.run([sys.executable, "-m", "reconcile_host", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp)


def test_a_kind_added_in_three_places_works_end_to_end(tmp_path):
    pkg = copy_with_a_new_kind(tmp_path)
    which = subprocess.run([sys.executable, "-c", "import reconcile_host; print(reconcile_host.__file__)"],
                           env={**os.environ, "PYTHONPATH": str(pkg.parent)}, capture_output=True, text=True)
    assert which.stdout.strip() == str(pkg / "__init__.py"), "the copy, not the installed package, must run"

    first, second = tmp_path / "first.conf", tmp_path / "second.conf"
    for f in (first, second):
        f.write_text("x\n")
        f.chmod(0o644)
    state = tmp_path / "files.yaml"
    state.write_text(f"""\
version: 1
mounts:
  /proc:
    fstype: proc
files:
  {second}:
    mode: "600"
    needs: [file:{first}]
  {first}:
    mode: "640"
""")
    journal = str(tmp_path / "journal.jsonl")

    validated = run(pkg, tmp_path, "validate", str(state))
    assert validated.returncode == 0, validated.stderr

    diff = run(pkg, tmp_path, "diff", str(state), "--format", "json")
    assert diff.returncode == 2, diff.stderr
    report = json.loads(diff.stdout)
    ids = [r["id"] for r in report["resources"]]
    # `needs` orders the second after the first; the kind's rank (5) puts both before the mount (30).
    assert ids == [f"file:{first}", f"file:{second}", "mount:/proc"], ids
    by_id = {r["id"]: r for r in report["resources"]}
    assert by_id[f"file:{second}"]["drift"] == [{"field": "mode", "want": "600", "have": "644"}]
    assert by_id[f"file:{second}"]["needs"] == [f"file:{first}"]

    applied = run(pkg, tmp_path, "apply", str(state), "--journal", journal, "--format", "json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert stat.S_IMODE(first.stat().st_mode) == 0o640 and stat.S_IMODE(second.stat().st_mode) == 0o600
    assert json.loads(applied.stdout)["summary"]["actions_done"] == 2

    again = run(pkg, tmp_path, "apply", str(state), "--journal", journal)
    assert again.returncode == 0 and "No changes: nothing to do." in again.stdout, again.stdout + again.stderr
    assert run(pkg, tmp_path, "diff", str(state)).returncode == 0

    # `needs` naming a resource of the new kind that is not declared: an error with its position.
    state.write_text(state.read_text().replace(f"needs: [file:{first}]", "needs: [file:/nowhere]"))
    bad = run(pkg, tmp_path, "validate", str(state))
    assert bad.returncode == 1
    assert f"{state}:8:13: file:{second} needs unknown resource 'file:/nowhere'" in bad.stderr, bad.stderr

    schema = json.loads(run(pkg, tmp_path, "schema").stdout)
    assert schema["properties"]["files"] == {"$ref": "#/$defs/files"}
    assert "file:PATH" in schema["$defs"]["needs"]["items"]["errorMessage"]
