"""The validation cache: a state file that validated once is remembered by the hash of its bytes
and of the schema, so `diff` on an unchanged file imports neither ruamel.yaml nor jsonschema.
A cache is a hint, never an authority: an entry that cannot be read is as good as none."""

from __future__ import annotations

import json
import os


def cache_dir() -> str:
    explicit = os.environ.get("RECONCILE_CACHE_DIR")
    if explicit:
        return explicit
    if os.geteuid() == 0:
        return "/var/cache/reconcile"
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                        "reconcile")


def read(digest: str) -> tuple[dict, list[tuple[int, int, str]]] | None:
    """The document validated under this digest and the warnings its validation found (line,
    column, message: old spellings, which a cached file must still say), or None: an entry that
    does not parse, was written for another digest, is not a state document or has no list of
    warnings (written by an older reconcile) is as good as none (and is rewritten)."""
    try:
        with open(os.path.join(cache_dir(), "validated", f"{digest}.json"), encoding="utf-8") as fh:
            entry = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != digest:
        return None
    doc, warnings = entry.get("doc"), entry.get("warnings")
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), int) or not isinstance(warnings, list):
        return None
    if not all(isinstance(w, list) and len(w) == 3 and type(w[0]) is int and type(w[1]) is int
               and isinstance(w[2], str) for w in warnings):
        return None
    return doc, [(w[0], w[1], w[2]) for w in warnings]


def write(digest: str, doc: dict, warnings: list[tuple[int, int, str]]) -> None:
    # Best effort: a read-only cache only costs speed.
    from ...core.atomic import write_json

    try:
        write_json(os.path.join(cache_dir(), "validated", f"{digest}.json"),
                   {"key": digest, "doc": doc, "warnings": [list(w) for w in warnings]})
    except OSError:
        pass
