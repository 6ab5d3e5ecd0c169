"""File checks through the user's tree held by fd (common/usertree.py), for the layouts added
beside the first six (diffusers, litgpt, fabric, orbax): nothing here opens a path string of
the user's tree. Imported only in the observer child."""

from __future__ import annotations

import os
import stat
import zipfile

from ...common.filechecks.integrity import CONTENT, STRUCTURE, check_path
from ...common.usertree import Tree, UnsafeTree


def check_file(tree: Tree, rel: str, depth: str) -> tuple[bool, str]:
    """layouts.file_check's verdict for the regular file REL of TREE: (whole, reason or what
    cannot be proven). Opened with no-follow from the directory's fd; a symbolic link, a FIFO or
    a device is unreadable, never opened."""
    parent, _, name = rel.rpartition("/")
    try:
        st = tree.lstat(rel)
    except FileNotFoundError:
        return False, "missing"
    except OSError as exc:
        return False, f"unreadable: {exc}"
    if not stat.S_ISREG(st.st_mode):
        return False, "unreadable: not a regular file (a symbolic link, a folder or a device)"
    try:
        sub = tree.subdir(parent) if parent else None
    except (OSError, UnsafeTree) as exc:
        return False, f"unreadable: {exc}"
    try:
        fd = sub.fd if sub else tree.fd
        v = check_path(name, depth, dir_fd=fd)
        if v.state == "gone":
            return False, "missing"
        if not v.whole and depth == CONTENT and "torch.load(weights_only=True)" in v.reason:
            # globals weights_only refuses (numpy in random states, Lightning's objects): its loader
            # allows them; the structure and every entry's CRC-32 are checked, the pickle not walked
            s = check_path(name, STRUCTURE, dir_fd=fd)
            if not s.whole:
                return False, s.reason or s.state
            return _testzip(tree, rel)
        if not v.whole:
            return False, v.reason or v.state
        if v.no_crc:
            return True, "written without CRCs: its bytes cannot be proven"
        return True, ""
    finally:
        if sub:
            sub.close()


def _testzip(tree: Tree, rel: str) -> tuple[bool, str]:
    try:
        fd = tree.open_regular(rel)
    except OSError as exc:
        return False, f"unreadable: {exc}"
    return zip_crcs(fd)


def zip_crcs(fd: int) -> tuple[bool, str]:
    """(whether every entry of the ZIP archive open at FD matches its CRC-32, why not); FD is
    closed. zipfile's testzip reads each entry whole against the CRC the archive keeps."""
    try:
        with os.fdopen(fd, "rb") as fh, zipfile.ZipFile(fh) as z:
            bad = z.testzip()
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        return False, f"{type(exc).__name__}: {exc}"[:200]
    if bad is not None:
        return False, f"entry {bad}: CRC-32 does not match (damaged)"
    return True, ""


def tree_mtime_size(tree: Tree, rel: str, limit: int = 100_000) -> tuple[float, int, int]:
    """(newest mtime, files, bytes) of everything below the folder REL (its own entry included),
    symbolic links not followed, at most LIMIT entries."""
    mtime = tree.lstat(rel).st_mtime
    files = size = 0
    todo = [rel]
    seen = 0
    while todo:
        d = todo.pop()
        for e in tree.entries(d):
            seen += 1
            if seen > limit:
                return mtime, files, size
            mtime = max(mtime, e.mtime_ns / 1e9)
            if e.kind == "dir":
                todo.append(f"{d}/{e.name}")
            else:
                files += 1
                size += e.size
    return mtime, files, size
