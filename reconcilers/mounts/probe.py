"""The child that touches a possibly hung filesystem: statvfs, the write probe, resolving
UUID=/LABEL= sources. Runs in a forked child (Host.fork_call); writes "statvfs done" and then
one JSON object, and its parent abandons it at a deadline."""

from __future__ import annotations

import json
import os
import stat
from typing import IO, Any

PROBE_PREFIX = ".reconcile-probe."  # name of the temporary file the write probe creates and removes
# udev's links for the source forms mount(8) accepts besides device paths.
TAG_DIRS = {"UUID": "by-uuid", "LABEL": "by-label", "PARTUUID": "by-partuuid", "PARTLABEL": "by-partlabel"}


def _resolve_source(src: str) -> dict[str, Any]:
    path = src
    tag, sep, value = src.partition("=")
    if sep and tag in TAG_DIRS:
        # udev escapes these in link names (libblkid's blkid_encode_string)
        value = value.replace("\\", "\\x5c").replace("/", "\\x2f").replace(" ", "\\x20")
        path = f"/dev/disk/{TAG_DIRS[tag]}/{value}"
    if not path.startswith("/dev/"):
        return {"given": src, "path": src, "devno": None, "note": ""}
    if not os.path.exists(path):
        return {"given": src, "path": None, "devno": None, "note": f"{path} does not exist"}
    real = os.path.realpath(path)
    st = os.stat(real)
    devno = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" if stat.S_ISBLK(st.st_mode) else None
    return {"given": src, "path": real, "devno": devno, "note": ""}


def probe_mount(req: dict[str, Any], out: IO[bytes]) -> None:
    """statvfs, the write probe and source resolution for one mount; the answer goes to `out`."""
    answer: dict[str, Any] = {"sources": [_resolve_source(s) for s in req["resolve"]]}
    path = req["path"]
    if req["stat"]:
        try:
            st = os.statvfs(path)
            answer["space"] = {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize,
                               "total_inodes": st.f_files, "free_inodes": st.f_favail}
        except OSError as exc:
            answer["error"] = f"statvfs {path}: {exc.strerror}"
    if req["probe"] and "error" not in answer:
        out.write(b"statvfs done\n")  # lets the parent tell which step hung
        name = os.path.join(path, req["prefix"] + str(os.getpid()))
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"reconcile write probe\n")
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(name)
            answer["writable"] = True
        except OSError as exc:
            answer["writable"] = False
            answer["write_error"] = f"{exc.strerror} ({name})"
    out.write(json.dumps(answer).encode() + b"\n")
