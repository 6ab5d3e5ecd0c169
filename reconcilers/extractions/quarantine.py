"""Moving damaged samples aside so the job regenerates them: renamed into a quarantine
directory on the same filesystem, with a manifest; nothing is copied or deleted.

Each move is recorded before it is made: one JSON line (the file's path, where it goes, why,
its size and mtime) appended to `moves.jsonl` in the quarantine directory and fsynced, as the
apply journal records an intent (pipeline/journal.py). `manifest.json` is written when the
moves are over. An apply killed in between leaves a directory with records and no manifest: the
next observation finds it (listing.py `unfinished_quarantines`) and the next apply finishes it (`finish`), writing the
manifest from the records and from what the filesystem shows was moved. A directory left by an
older reconcile with neither (moved files only) is accounted for from the files themselves.

The output directory is the job's user's: every step goes through held directory fds
(common/usertree.py, common/quarantine.py): the quarantine made with mkdirat and checked to be
reconcile's own, each sample opened with no link followed, each move a renameat between fds
taken before it, records and manifest 0600 under names made O_EXCL.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from ...common.filechecks.integrity import CONTENT, DAMAGED, check_path
from ...common.quarantine import QUARANTINE, makedirs_in, open_new
from ...common.usertree import Tree, UnsafeTree, rename_between
from ...core.contract import ApplyError, Resource, utc_iso
from .listing import MANIFEST, compile_pattern

RECORDS = "moves.jsonl"
WHY = "damaged sample files moved aside so that the job regenerates them"
# Test seam: "recorded:N" or "moved:N" and a FIFO path: the mover opens the FIFO (blocking until
# the test opens it too) once it has written its Nth record, or made its Nth move, so a test can
# kill -9 it at exactly that point (tests/test_extractions_quarantine.py).
PAUSE_AT, PAUSE_FIFO = "RECONCILE_TEST_QUARANTINE_PAUSE", "RECONCILE_TEST_QUARANTINE_FIFO"


def inside(root: str, rel: str) -> str:
    norm = os.path.normpath(rel)
    if os.path.isabs(norm) or norm.startswith("..") or norm.split(os.sep)[0] == QUARANTINE:
        raise ApplyError(f"refusing to move {rel!r}: not a file inside {root}")
    return norm


class MoveRecords:
    """`moves.jsonl`: one line per move, written and fsynced before the rename it records; made
    O_EXCL|O_NOFOLLOW (0600) in the quarantine folder held by fd."""

    def __init__(self, q: Tree):
        self.q = q
        self.path = os.path.join(q.path, RECORDS)
        self.fd: int | None = None

    def add(self, record: dict[str, Any]) -> None:
        if self.fd is None:
            self.fd = os.open(RECORDS, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | os.O_CLOEXEC, 0o600, dir_fd=self.q.fd)
            os.fsync(self.q.fd)  # the records file's own name survives a crash
        line = (json.dumps(record) + "\n").encode()
        if os.write(self.fd, line) != len(line):
            raise ApplyError(f"cannot record the move of {record['path']} in {self.path}: short write")
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _manifest(q: Tree, doc: dict[str, Any]) -> None:
    q.write_atomic(MANIFEST, json.dumps(doc, default=str).encode(), mode=0o600)


def _held(tree: Tree, rel: str) -> Tree:
    """REL's directory (\"\" for the tree itself), held by its own fd."""
    return tree.subdir(rel) if rel else Tree(os.dup(tree.fd), tree.path)


def _pause(point: str, n: int) -> None:
    if os.environ.get(PAUSE_AT) == f"{point}:{n}" and os.environ.get(PAUSE_FIFO):
        with open(os.environ[PAUSE_FIFO], "rb") as fifo:  # blocks until the test opens it for writing
            fifo.read()


def quarantine(resource: Resource, files: Iterable[dict[str, Any]]) -> str:
    """Move damaged files into <dir>/.reconcile-quarantine/<UTC time>/ (same file system, so a
    rename: nothing is copied or deleted), each recorded before it moves, then write a manifest
    of what was moved and why. Each file is checked again first, reading all of it (the depth
    that can have found it damaged): one found whole now, gone, or unreadable is left where it is."""
    root = resource.spec["dir"]
    moved: list[dict[str, Any]] = []
    skipped: list[str] = []
    rx = compile_pattern(resource.spec["pattern"])
    q: Tree | None = None
    records: MoveRecords | None = None
    try:
        with Tree.open(root) as tree:
            try:
                for f in files:
                    rel = inside(root, f["path"])
                    parts = rel.split(os.sep)
                    if len(parts) != len(rx) or not all(r.fullmatch(p) for r, p in zip(rx, parts, strict=True)):
                        raise ApplyError(f"refusing to move {rel!r}: it does not match the pattern")
                    parent, base = os.path.dirname(rel), os.path.basename(rel)
                    with _held(tree, parent) as src:
                        v = check_path(base, CONTENT, dir_fd=src.fd)  # no link followed (O_NOFOLLOW)
                        if v.state != DAMAGED or v.st is None:
                            skipped.append(rel)
                            continue
                        reason, st = v.reason, v.st
                        if q is None:
                            q = open_new(tree)
                            records = MoveRecords(q)
                        with makedirs_in(q, parent) as dst:
                            record = {"path": rel, "moved_to": os.path.join(QUARANTINE, os.path.basename(q.path), rel),
                                      "reason": reason, "size": st.st_size, "mtime": st.st_mtime}
                            assert records is not None
                            records.add(record)
                            _pause("recorded", len(moved) + 1)
                            rename_between(src, base, dst, base)  # RENAME_NOREPLACE: never over a file there
                    moved.append(record)
                    _pause("moved", len(moved))
            finally:
                if records is not None:
                    records.close()
                if moved and q is not None:
                    _manifest(q, {"created": utc_iso(), "extraction": resource.name, "dir": root, "why": WHY,
                                  "files": moved})
    except UnsafeTree as exc:
        raise ApplyError(str(exc)) from None
    finally:
        if q is not None:
            q.close()
    text = f"moved {len(moved)} file{'s' if len(moved) != 1 else ''} to {q.path if q else '(nothing)'}"
    if skipped:
        text += f"; {len(skipped)} no longer damaged or gone, left alone"
    return text


RECORDS_LIMIT = 256 << 20  # one line a moved file: millions of moves


def _read_records(q: Tree) -> list[dict[str, Any]]:
    """The complete records; a torn last line (the kill came while it was written: its rename
    never happened) is left out."""
    try:
        lines = q.read_bounded(RECORDS, RECORDS_LIMIT).split(b"\n")
    except FileNotFoundError:
        return []
    out = []
    for raw in lines:
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("path"), str):
            out.append(rec)
    return out


def _walk(q: Tree, rel: str = "") -> Iterable[tuple[str, Any]]:
    """Every regular file under a held quarantine folder (sorted; links and special files skipped)."""
    with _held(q, rel) as d:
        for e in d.entries():
            sub = f"{rel}/{e.name}" if rel else e.name
            if e.kind == "dir":
                yield from _walk(q, sub)
            elif e.kind == "file":
                yield sub, e


def finish(resource: Resource, name: str) -> str:
    """Write the manifest of an interrupted quarantine directory. A recorded file is moved if it
    is in the quarantine directory (a rename is all or nothing); one recorded but still in place,
    or gone, was not moved and is listed as such. Files there without a record (moved by a
    reconcile that kept no records) are listed from their own stat (a rename keeps the mtime),
    with the reason they are damaged now, marked `recorded: false`."""
    root = resource.spec["dir"]
    qdir = os.path.join(root, QUARANTINE, name)
    if os.sep in name or name in ("", ".", ".."):
        raise ApplyError(f"no quarantine directory {qdir}")
    try:
        with Tree.open(root) as tree:
            try:
                q = open_new(tree, name=name, create=False)
            except FileNotFoundError:
                raise ApplyError(f"no quarantine directory {qdir}") from None
            with q:
                text = _finish(resource, root, name, q)
    except UnsafeTree as exc:
        raise ApplyError(str(exc)) from None
    return text


def _finish(resource: Resource, root: str, name: str, q: Tree) -> str:
    moved: list[dict[str, Any]] = []
    not_moved: list[dict[str, Any]] = []
    known: set[str] = set()
    for rec in _read_records(q):
        rel = inside(root, rec["path"])
        known.add(rel)
        try:
            q.lstat(rel)
            moved.append(rec)
        except (FileNotFoundError, NotADirectoryError, UnsafeTree):
            not_moved.append(rec)
    for rel, e in _walk(q):
        fn = os.path.basename(rel)
        if rel in known or rel in (RECORDS, MANIFEST) or (fn.startswith(".") and fn.endswith(".tmp")):
            continue
        with _held(q, os.path.dirname(rel)) as d:
            v = check_path(fn, CONTENT, dir_fd=d.fd)
        moved.append({"path": rel, "moved_to": os.path.join(QUARANTINE, name, rel),
                      "reason": v.reason or f"unknown (no record; {v.state} now)",
                      "size": e.size, "mtime": e.mtime, "recorded": False})
    _manifest(q, {
        "created": utc_iso(), "extraction": resource.name, "dir": root, "why": WHY,
        "interrupted": "the apply that moved these files was stopped before it wrote this manifest; "
                       "written by a later apply from the move records and the files",
        "files": moved, "not_moved": not_moved,
    })
    unrecorded = sum(1 for m in moved if m.get("recorded") is False)
    text = f"finished {q.path}: {len(moved)} file{'s' if len(moved) != 1 else ''} moved"
    if not_moved:
        text += f", {len(not_moved)} recorded but not moved (left in place)"
    if unrecorded:
        text += f", {unrecorded} without a record (listed from the files)"
    return text
