"""The validation cache: a state file that validated once is remembered by the hash of its bytes
and of the schema, so `diff` on an unchanged file imports neither ruamel.yaml nor jsonschema.
A cache is a hint, never an authority: an entry that cannot be read is as good as none.

A cached document is acted on as if it had been validated, so only reconcile's own user may have
written it: the cache folder and its `validated/` folder must be real directories (no link)
owned by that user and writable by no one else, and an entry a regular file owned by that user,
opened with no link followed and read bounded; anything else is ignored (and nothing is written
into a folder another user could change). A folder such as /tmp/rc, which any user can make
first, is therefore never used."""

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


ENTRY_LIMIT = 64 << 20  # a state document of 50,000 resources is ~10 MiB


def _ours(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _trusted_dirs() -> bool:
    """The cache folder and validated/ are real directories only reconcile's user can change."""
    import stat

    base = cache_dir()
    for path in (base, os.path.join(base, "validated")):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # made by write() with mode 0700
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or not _ours(st):
            return False
    return True


def read(digest: str) -> tuple[dict, list[tuple[int, int, str]]] | None:
    """The document validated under this digest and the warnings its validation found (line,
    column, message: old spellings, which a cached file must still say), or None: an entry that
    does not parse, was written for another digest, is not a state document or has no list of
    warnings (written by an older reconcile) is as good as none (and is rewritten)."""
    import stat

    if not _trusted_dirs():
        return None
    try:
        fd = os.open(os.path.join(cache_dir(), "validated", f"{digest}.json"),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _ours(st) or st.st_size > ENTRY_LIMIT:
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            entry = json.loads(fh.read(ENTRY_LIMIT + 1))
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
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

    if not _trusted_dirs():
        return
    try:
        write_json(os.path.join(cache_dir(), "validated", f"{digest}.json"),
                   {"key": digest, "doc": doc, "warnings": [list(w) for w in warnings]})
    except OSError:
        pass
