"""Moving damaged samples aside so the job regenerates them: renamed into a quarantine
directory on the same filesystem, with a manifest; nothing is copied or deleted."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from ...pipeline.atomic import write_json
from ...pipeline.contract import ApplyError, Resource, utc_iso
from .integrity import CONTENT, DAMAGED, check_path
from .listing import QUARANTINE, compile_pattern


def inside(root: str, rel: str) -> str:
    norm = os.path.normpath(rel)
    if os.path.isabs(norm) or norm.startswith("..") or norm.split(os.sep)[0] == QUARANTINE:
        raise ApplyError(f"refusing to move {rel!r}: not a file inside {root}")
    return norm


def quarantine(resource: Resource, files: Iterable[dict[str, Any]]) -> str:
    """Move damaged files into <dir>/.reconcile-quarantine/<UTC time>/ (same file system, so a
    rename: nothing is copied or deleted) and write a manifest of what was moved and why.
    Each file is checked again first, reading all of it (the depth that can have found it
    damaged): one found whole now, gone, or unreadable is left where it is."""
    root = resource.spec["dir"]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    qdir = os.path.join(root, QUARANTINE, stamp)
    n = 1
    while os.path.exists(qdir):
        n += 1
        qdir = os.path.join(root, QUARANTINE, f"{stamp}-{n}")
    moved: list[dict[str, Any]] = []
    skipped: list[str] = []
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
            os.rename(src, dst)
            moved.append({"path": rel, "moved_to": os.path.join(QUARANTINE, os.path.basename(qdir), rel),
                          "reason": reason, "size": st.st_size, "mtime": st.st_mtime})
    finally:
        if moved:
            write_json(os.path.join(qdir, "manifest.json"), {
                "created": utc_iso(),
                "extraction": resource.name, "dir": root,
                "why": "damaged sample files moved aside so that the job regenerates them",
                "files": moved,
            })
    text = f"moved {len(moved)} file{'s' if len(moved) != 1 else ''} to {qdir}"
    if skipped:
        text += f"; {len(skipped)} no longer damaged or gone, left alone"
    return text
