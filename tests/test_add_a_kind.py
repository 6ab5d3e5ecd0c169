"""Adding a resource kind touches three places and nothing else (docs/design.md, "Adding a kind"):
its module in reconcilers/, its schema fragment in schema/kinds/, one line of the registry.

In a temporary copy of the package, the `files` kind docs/design.md sketches (a file's mode; the
module and the registry line taken from the doc's own blocks) is added from exactly those three
places; then validate, diff, apply, a second apply, `needs` naming it, its `rank`,
and `reconcile schema` are run through the real CLI of that copy, and the file's mode is read
back from the filesystem."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from addition_support import copy_package, documented_sketch, env_for, insert_at

# The kind's module and its registry line, as docs/design.md ("Adding a kind") shows them.
KIND_MODULE, REGISTRY_LINE = documented_sketch("class FilesReconciler(Reconciler)", "KINDS: dict[str, Kind]",
                                               '"files": Kind(')

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


def copy_with_a_new_kind(tmp: Path) -> Path:
    """The package copied to TMP/pkg/reconcile_host, plus the three places of a new kind."""
    pkg = copy_package(tmp)
    (pkg / "reconcilers" / "files.py").write_text(KIND_MODULE)
    (pkg / "schema" / "kinds" / "files.schema.json").write_text(json.dumps(KIND_SCHEMA, indent=2))
    insert_at(pkg / "reconcilers" / "__init__.py", '    "extractions": Kind(', REGISTRY_LINE)
    return pkg


def run(pkg: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reconcile_host", *args], capture_output=True, text=True,
                          env=env_for(pkg, tmp), timeout=120, cwd=tmp)


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
    # `needs` orders the second after the first; the kind's rank (50) puts both after the mount (30).
    assert ids == ["mount:/proc", f"file:{first}", f"file:{second}"], ids
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
