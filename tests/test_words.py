"""The repository speaks to its readers: comments, docs and tests say why in their own words or
cite the upstream source (a file and function, an upstream project's issue as `owner/repo#N`);
never the number of an entry in this project's own tracker, which a reader of the repository does
not have. The CHANGELOG keeps its history as it was written."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The word "issue" (or "issues") followed by a number: an entry of our own tracker. An upstream
# issue is cited as owner/repo#N or by its URL (…/issues/N), which this does not match.
INTERNAL = re.compile(r"\b[Ii]ssues? \d+|\bseed-recovery\b|\bthe seed's\b")
SKIP = {"CHANGELOG.md"}


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    paths = []
    for name in out.decode().split("\0"):
        if not name or name in SKIP or name.startswith("tests/data/") and name.endswith((".json", ".txt", ".log")):
            continue
        p = ROOT / name
        if p.is_file() and not p.is_symlink() and p.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".c", ".sh", ""}:
            paths.append(p)
    return paths


def test_no_internal_tracker_numbers_outside_the_changelog() -> None:
    found = []
    for p in tracked_text_files():
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = INTERNAL.search(line)
            if m and p.name != "test_words.py":
                found.append(f"{p.relative_to(ROOT)}:{n}: {m.group(0)!r}: {line.strip()[:100]}")
    assert not found, "words that point to no document a reader has:\n" + "\n".join(found)
