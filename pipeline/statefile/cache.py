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


def read(digest: str) -> dict | None:
    """The document validated under this digest, or None: an entry that does not parse, was
    written for another digest or is not a state document is as good as none (and is rewritten)."""
    try:
        with open(os.path.join(cache_dir(), "validated", f"{digest}.json"), encoding="utf-8") as fh:
            entry = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != digest:
        return None
    doc = entry.get("doc")
    return doc if isinstance(doc, dict) and isinstance(doc.get("version"), int) else None


def write(digest: str, doc: dict) -> None:
    # Best effort: a read-only cache only costs speed.
    from ...core.atomic import write_json

    try:
        write_json(os.path.join(cache_dir(), "validated", f"{digest}.json"), {"key": digest, "doc": doc})
    except OSError:
        pass
