"""Moving damaged samples aside so the job regenerates them: renamed into a quarantine
directory on the same filesystem, with a manifest; nothing is copied or deleted.

Each move is recorded before it is made: one JSON line (the file's path, where it goes, why,
its size and mtime) appended to `moves.jsonl` in the quarantine directory and fsynced, as the
apply journal records an intent (pipeline/journal.py). `manifest.json` is written when the
moves are over. An apply killed in between leaves a directory with records and no manifest: the
next observation finds it (listing.py `unfinished_quarantines`) and the next apply finishes it (`finish`), writing the
manifest from the records and from what the filesystem shows was moved. A directory left by an
older reconcile with neither (moved files only) is accounted for from the files themselves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from ...common.filechecks.integrity import CONTENT, DAMAGED, check_path
from ...common.quarantine import QUARANTINE, new_quarantine_dir
from ...core.atomic import fsync_dir, write_json
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
    """`moves.jsonl`: one line per move, written and fsynced before the rename it records."""

    def __init__(self, qdir: str):
        self.path = os.path.join(qdir, RECORDS)
        self.fd: int | None = None

    def add(self, record: dict[str, Any]) -> None:
        if self.fd is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fsync_dir(os.path.dirname(self.path))  # the records file's own name survives a crash
            fsync_dir(os.path.dirname(os.path.dirname(self.path)))
        line = (json.dumps(record) + "\n").encode()
        if os.write(self.fd, line) != len(line):
            raise ApplyError(f"cannot record the move of {record['path']} in {self.path}: short write")
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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
    qdir = new_quarantine_dir(root, QUARANTINE)
    moved: list[dict[str, Any]] = []
    skipped: list[str] = []
    records = MoveRecords(qdir)
    rx = compile_pattern(resource.spec["pattern"])
    try:
        for f in files:
            rel = inside(root, f["path"])
            parts = rel.split(os.sep)
            if len(parts) != len(rx) or not all(r.fullmatch(p) for r, p in zip(rx, parts, strict=True)):
                raise ApplyError(f"refusing to move {rel!r}: it does not match the pattern")
            src = os.path.join(root, rel)
            v = check_path(src, CONTENT)
            if v.state != DAMAGED or v.st is None:
                skipped.append(rel)
                continue
            reason, st = v.reason, v.st
            dst = os.path.join(qdir, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.lexists(dst):
                raise ApplyError(f"{dst} exists already")
            record = {"path": rel, "moved_to": os.path.join(QUARANTINE, os.path.basename(qdir), rel),
                      "reason": reason, "size": st.st_size, "mtime": st.st_mtime}
            records.add(record)
            _pause("recorded", len(moved) + 1)
            os.rename(src, dst)
            moved.append(record)
            _pause("moved", len(moved))
    finally:
        records.close()
        if moved:
            write_json(os.path.join(qdir, MANIFEST), {
                "created": utc_iso(), "extraction": resource.name, "dir": root, "why": WHY, "files": moved,
            })
    text = f"moved {len(moved)} file{'s' if len(moved) != 1 else ''} to {qdir}"
    if skipped:
        text += f"; {len(skipped)} no longer damaged or gone, left alone"
    return text


def _read_records(path: str) -> list[dict[str, Any]]:
    """The complete records; a torn last line (the kill came while it was written: its rename
    never happened) is left out."""
    try:
        with open(path, "rb") as fh:
            lines = fh.read().split(b"\n")
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


def finish(resource: Resource, name: str) -> str:
    """Write the manifest of an interrupted quarantine directory. A recorded file is moved if it
    is in the quarantine directory (a rename is all or nothing); one recorded but still in place,
    or gone, was not moved and is listed as such. Files there without a record (moved by a
    reconcile that kept no records) are listed from their own stat (a rename keeps the mtime),
    with the reason they are damaged now, marked `recorded: false`."""
    root = resource.spec["dir"]
    qdir = os.path.join(root, QUARANTINE, name)
    if os.sep in name or name in ("", ".", "..") or not os.path.isdir(qdir):
        raise ApplyError(f"no quarantine directory {qdir}")
    moved: list[dict[str, Any]] = []
    not_moved: list[dict[str, Any]] = []
    known: set[str] = set()
    for rec in _read_records(os.path.join(qdir, RECORDS)):
        rel = inside(root, rec["path"])
        known.add(rel)
        (moved if os.path.lexists(os.path.join(qdir, rel)) else not_moved).append(rec)
    for dirpath, dirnames, filenames in os.walk(qdir):
        dirnames.sort()
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, qdir)
            if rel in known or rel in (RECORDS, MANIFEST) or (fn.startswith(".") and fn.endswith(".tmp")):
                continue
            st = os.lstat(full)
            v = check_path(full, CONTENT)
            moved.append({"path": rel, "moved_to": os.path.join(QUARANTINE, name, rel),
                          "reason": v.reason or f"unknown (no record; {v.state} now)",
                          "size": st.st_size, "mtime": st.st_mtime, "recorded": False})
    write_json(os.path.join(qdir, MANIFEST), {
        "created": utc_iso(), "extraction": resource.name, "dir": root, "why": WHY,
        "interrupted": "the apply that moved these files was stopped before it wrote this manifest; "
                       "written by a later apply from the move records and the files",
        "files": moved, "not_moved": not_moved,
    })
    unrecorded = sum(1 for m in moved if m.get("recorded") is False)
    text = f"finished {qdir}: {len(moved)} file{'s' if len(moved) != 1 else ''} moved"
    if not_moved:
        text += f", {len(not_moved)} recorded but not moved (left in place)"
    if unrecorded:
        text += f", {unrecorded} without a record (listed from the files)"
    return text
