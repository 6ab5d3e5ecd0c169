"""What the add-a-thing tests share (test_add_a_kind, test_add_a_format, test_add_a_sink): the
documented sketch and its registration line, taken from docs/design.md (the tests run the sketch
the docs show, not a copy of it); the package copied to a temporary directory with them added;
the environment a reconcile of that copy runs in."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"


def documented_sketch(module_marker: str, table_marker: str, line_start: str) -> tuple[str, str]:
    """The python block of docs/design.md holding MODULE_MARKER, and the line starting with
    LINE_START of the block holding TABLE_MARKER (indented as a table entry)."""
    from docs_support import blocks

    python = [b for b in blocks(DESIGN) if b.lang == "python"]
    module = next(b for b in python if module_marker in b.text)
    table = next(b for b in python if table_marker in b.text)
    line = next(line for line in table.lines if line.strip().startswith(line_start))
    return module.text, "    " + line.strip() + "\n"


def copy_package(tmp: Path) -> Path:
    """The package copied to TMP/pkg/reconcile_host (its code only)."""
    pkg = tmp / "pkg" / "reconcile_host"
    shutil.copytree(ROOT, pkg, ignore=shutil.ignore_patterns(".git", ".venv*", "tests", "bench", "docs", "build",
                                                             "__pycache__", "*.egg-info", ".*cache"))
    return pkg


def insert_at(path: Path, anchor: str, text: str, after: bool = False) -> None:
    """TEXT before (or after) ANCHOR, which the file holds exactly once."""
    body = path.read_text()
    assert body.count(anchor) == 1, (path, anchor)
    path.write_text(body.replace(anchor, anchor + text if after else text + anchor))


def env_for(pkg: Path, tmp: Path) -> dict[str, str]:
    """The copy first on the path; its cache and state in TMP."""
    return {**os.environ, "PYTHONPATH": str(pkg.parent), "RECONCILE_CACHE_DIR": str(tmp / "cache"),
            "RECONCILE_STATE_DIR": str(tmp / "state")}
