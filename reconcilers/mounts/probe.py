"""The child that touches a possibly hung filesystem: it resolves the declared path, asks the
kernel which mount the path reaches, reads the mount table and fstab, resolves UUID=/LABEL=
sources, runs statvfs and the write probe. Runs in a forked child (Host.fork_call) and writes
JSON lines: {"step": WHAT} before each step that can block, then {"answer": {...}}; its parent
abandons it at a deadline and names the last step it began.

Which mount is at the path is the kernel's answer (kernel.mount_id), matched with the mountinfo
line of that id; mount ids are reused once a mount is gone, so the id is asked again after the
table is read and the pair is kept only when both agree. The path is resolved as mount(8)
resolves a mount point: realpath(3), so a declared symlink means the directory it points to;
with readlink alone (`resolve`), so that finding the mount asks the mounted filesystem nothing.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from typing import IO, Any

from . import kernel
from .sources import resolve_source
from .tables import by_id, find_fstab, mounts_at, parse_fstab, parse_mountinfo

PROBE_PREFIX = ".reconcile-probe."  # the write probe's file: this, then 24 random hex digits
PROBE_TRIES = 3  # random names tried before the probe gives up (each taken one: EEXIST)
ID_ATTEMPTS = 3  # the mount table changed between two mount-id answers: read it again


MAXSYMLINKS = 40  # the kernel's limit on symlinks followed in one lookup (ELOOP beyond)


def resolve(path: str) -> str:
    """realpath(3), strict, with readlink(2) alone on each component: no stat, so the
    filesystem mounted at the path, which may not answer, is asked nothing (the kernel walks to
    its root dentry without calling it; readlink of a directory fails EINVAL in the VFS).
    FileNotFoundError when a component is missing, OSError for ENOTDIR, ELOOP, EACCES, ..."""
    done, pending, followed = "/", [c for c in path.split("/") if c], 0
    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        if name == "..":
            done = os.path.dirname(done)
            continue
        candidate = os.path.join(done, name)
        try:
            target = os.readlink(candidate)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            done = candidate  # there, and not a symlink
            continue
        followed += 1
        if followed > MAXSYMLINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        pending[:0] = [c for c in target.split("/") if c]
        if target.startswith("/"):
            done = "/"
    return done


def canonical(path: str) -> str:
    """lib/canonicalize.c: realpath(3), or the path unchanged when realpath fails."""
    try:
        return resolve(path)
    except (OSError, ValueError):
        return path


def _step(out: IO[bytes], what: str) -> None:
    out.write(json.dumps({"step": what}).encode() + b"\n")


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _memory() -> tuple[int, int]:
    """(totalram pages, page size): MemTotal is totalram_pages in kB (fs/proc/meminfo.c)."""
    page = os.sysconf("SC_PAGE_SIZE")
    for line in _read("/proc/meminfo").split(b"\n"):
        if line.startswith(b"MemTotal:"):
            return int(line.split()[1]) * 1024 // page, page
    return 0, page


def locate(path: str, mountinfo: str) -> dict[str, Any]:
    """The declared path resolved, and what the kernel has there: the visible mount (or the
    mount the path merely lies on), and the other lines for that mount point."""
    try:
        resolved, exists = resolve(path), True
    except FileNotFoundError:  # the path, or what its symlink points to, is not there
        resolved, exists = path, False
    mounts: list = []
    mid = None
    for _ in range(ID_ATTEMPTS):
        before = kernel.mount_id(resolved) if exists else None
        mounts = parse_mountinfo(_read(mountinfo))
        mid = kernel.mount_id(resolved) if exists else None
        if before == mid and (mid is None or by_id(mounts, mid) is not None):
            break
    line = by_id(mounts, mid) if mid is not None else None
    visible = line if line is not None and line.mount_point == resolved else None
    hidden = [m for m in mounts_at(mounts, resolved) if m is not visible]
    return {"resolved": resolved, "exists": exists, "mount_id": mid, "visible": visible,
            "on": None if visible else line, "hidden": hidden, "mounts": mounts}


def probe_mount(req: dict[str, Any], out: IO[bytes]) -> None:
    """Everything about one declared mount that asks the filesystem; the answer goes to `out`."""
    path = req["path"]
    answer: dict[str, Any] = {}
    try:
        _step(out, f"resolving {path} (realpath, mount id)")
        where = locate(path, req.get("mountinfo", "/proc/self/mountinfo"))
    except (OSError, ValueError) as exc:  # ELOOP, ENAMETOOLONG, EACCES, a NUL byte
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        out.write(json.dumps({"answer": {"error": f"cannot resolve {path}: {why}"}}).encode() + b"\n")
        return
    visible = where["visible"]
    answer.update(resolved=where["resolved"], exists=where["exists"], mount_id=where["mount_id"],
                  mount=_plain(visible), on=_plain(where["on"]), hidden=[_plain(m) for m in where["hidden"]])

    fstab_path = req.get("fstab", "/etc/fstab")
    _step(out, f"reading {fstab_path}")
    bad: list[int] = []
    try:
        entries = parse_fstab(_read(fstab_path), bad)
    except FileNotFoundError:
        entries = []
    except OSError as exc:
        out.write(json.dumps({"answer": {"error": f"cannot read {fstab_path}: {exc.strerror}"}}).encode() + b"\n")
        return
    # Resolving every fstab target (the last rule of mount --target) touches other filesystems:
    # only when the path is not mounted, which is when the entry matters.
    entry = find_fstab(entries, path, where["resolved"], None if visible else canonical,
                       [m.mount_point for m in where["mounts"]])
    answer.update(fstab=_plain(entry), fstab_errors=bad)

    if req.get("source"):
        wanted = [req["source"], visible.source if visible else None, entry.source if entry else None]
        sources = []
        for src in dict.fromkeys(s for s in wanted if s):
            _step(out, f"resolving the source {src}")
            sources.append(resolve_source(src))
        answer["sources"] = sources

    if visible is not None and req.get("mounted", True):
        answer["ram_pages"], answer["page_size"] = _memory()
        target = where["resolved"]
        _step(out, f"statvfs on {path}")
        try:
            st = os.statvfs(target)
            answer["space"] = {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize,
                               "total_inodes": st.f_files, "free_inodes": st.f_favail}
        except OSError as exc:
            answer["error"] = f"statvfs {path}: {exc.strerror}"
        read_only = "ro" in visible.options or "ro" in visible.super_options
        if req.get("writable") and not read_only and "error" not in answer:
            _step(out, f"the write probe on {path}")
            answer.update(_write_probe(target, req.get("prefix", PROBE_PREFIX)))
    out.write(json.dumps({"answer": answer}).encode() + b"\n")


def _write_probe(directory: str, prefix: str) -> dict[str, Any]:
    """Create, write, fsync and remove a file in the mount's root. Its name is random, made
    O_CREAT|O_EXCL|O_NOFOLLOW relative to a descriptor of the root and removed by unlinkat on that
    same descriptor: a file, symlink or FIFO anyone has put there under any name can neither take
    the probe's place (turning the mount `blocked`) nor be written through, and no path is
    resolved twice."""
    name = prefix
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return {"writable": False, "write_error": f"{exc.strerror} ({directory})"}
    try:
        for _ in range(PROBE_TRIES):
            name = prefix + os.urandom(12).hex()
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dfd)
                break
            except FileExistsError:
                continue  # 96 random bits taken already: try another
        else:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))
        try:
            os.write(fd, b"reconcile write probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(name, dir_fd=dfd)
        return {"writable": True}
    except OSError as exc:
        return {"writable": False, "write_error": f"{exc.strerror} ({os.path.join(directory, name)})"}
    finally:
        os.close(dfd)


def _plain(obj: Any) -> Any:
    return dataclasses.asdict(obj) if obj is not None else None
