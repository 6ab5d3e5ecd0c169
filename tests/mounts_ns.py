"""Helpers for scenario scripts that run INSIDE a private mount namespace (see
mounts_support.run_scenario): they make mounts, run reconcile, and ask the kernel what is there,
by means that are not reconcile's own: the mount id of a path from statx(STATX_MNT_ID), the
mount table from findmnt (-J, surrogateescape), mount(8) itself.

A scenario records what it saw with `fact(name, value)`; the test reads $T/facts.json after the
namespace is gone and asserts there.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cli_support import reconcile_json

T = os.environ["T"]
TB = os.fsencode(T)
FACTS: dict[str, Any] = {}


def fact(name: str, value: Any) -> Any:
    FACTS[name] = value
    with open(os.path.join(T, "facts.json"), "w") as fh:
        json.dump(FACTS, fh, ensure_ascii=True)
    return value


def sh(*argv: str | bytes, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([os.fsencode(a) if isinstance(a, str) else a for a in argv], capture_output=True,
                       env=env, stdin=subprocess.DEVNULL)
    if check and r.returncode:
        raise RuntimeError(f"{argv!r}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
    return r


def path(*parts: str | bytes) -> str:
    """$T/PART... as str (surrogateescape)."""
    return os.fsdecode(os.path.join(TB, *(os.fsencode(p) for p in parts)))


def mkdir(p: str) -> str:
    os.makedirs(os.fsencode(p), exist_ok=True)
    return p


def tmpfs(target: str, source: str | bytes = "scratch", options: str | None = None) -> None:
    sh("mount", "-t", "tmpfs", *(["-o", options] if options else []), source, target)


class _Statx(ctypes.Structure):  # struct statx, include/uapi/linux/stat.h: stx_mnt_id at 0x90
    _fields_ = [("stx_mask", ctypes.c_uint32), ("_head", ctypes.c_uint8 * 0x8C), ("stx_mnt_id", ctypes.c_uint64),
                ("_tail", ctypes.c_uint64 * 13)]


def mnt_id(p: str) -> int:
    """The kernel's mount id for what `p` reaches, from statx(STATX_MNT_ID) (not the fdinfo of
    an O_PATH descriptor, which is what reconcile reads)."""
    assert ctypes.sizeof(_Statx) == 256 and _Statx.stx_mnt_id.offset == 0x90
    libc = ctypes.CDLL(None, use_errno=True)
    buf = _Statx()
    if libc.statx(-100, os.fsencode(p), 0x800, 0x1000, ctypes.byref(buf)) != 0:  # AT_NO_AUTOMOUNT, STATX_MNT_ID
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), p)
    assert buf.stx_mask & 0x1000, "this kernel's statx gives no mount id (Linux 5.8 or later)"
    return int(buf.stx_mnt_id)


COLUMNS = "ID,PARENT,TARGET,SOURCE,FSTYPE,FSROOT,VFS-OPTIONS,FS-OPTIONS"


def table() -> list[dict]:
    """The kernel's table as findmnt reads it."""
    out = sh("findmnt", "-J", "--list", "-o", COLUMNS, env={**os.environ, "LC_ALL": "C"}).stdout
    return json.loads(out.decode("utf-8", "surrogateescape"))["filesystems"]


def line(mount_id: int) -> dict:
    return next(e for e in table() if e["id"] == mount_id)


def mounts_at(p: str) -> list[dict]:
    """Every mount the kernel lists with `p` as its mount point."""
    return [e for e in table() if e["target"] == p]


def state(mounts: dict[str, dict], name: str = "state.yaml") -> str:
    """A state file; keys written as explicit, escaped YAML keys (any length, any character)."""
    lines = ["version: 1", "mounts:"]
    for key, spec in mounts.items():
        lines += [f"  ? {json.dumps(key)}", f"  : {json.dumps(spec)}"]
    p = os.path.join(T, name)
    Path(p).write_text("\n".join(lines) + "\n")
    return p


def reconcile(command: str, state_file: str, *args: str) -> tuple[int, dict[str, dict], str]:
    """`reconcile COMMAND STATE --format json` (cli_support.reconcile_json, its files in $T, from
    this directory): exit code, resources by id, stderr."""
    code, doc, stderr = reconcile_json(Path(T), command, state_file, *args, cwd=os.getcwd())
    if doc is None:
        raise RuntimeError(f"reconcile {command}: exit {code}, no report: {stderr!r}")
    return code, {res["id"]: res for res in doc["resources"]}, stderr


def apply_twice(state_file: str, name: str) -> None:
    """apply, then apply again: both reports go into the facts."""
    rc1, first, err1 = reconcile("apply", state_file)
    rc2, second, err2 = reconcile("apply", state_file)
    fact(f"{name}.first", {"rc": rc1, "resources": first, "stderr": err1})
    fact(f"{name}.second", {"rc": rc2, "resources": second, "stderr": err2})


# --- move_mount(MOVE_MOUNT_BENEATH): util-linux 2.38 has no mount --beneath ---------------------

SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # the generic syscall table (x86_64, arm64, ...)
OPEN_TREE_CLONE, MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_BENEATH = 1, 0x4, 0x200  # linux/mount.h (6.5)


def mount_beneath(source_dir: str, target: str) -> int:
    """Clone the mount at source_dir and put it beneath the top mount at target; 0, or errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(SYS_OPEN_TREE, -100, ctypes.c_char_p(os.fsencode(source_dir)),
                      OPEN_TREE_CLONE | os.O_CLOEXEC)
    if fd < 0:
        return ctypes.get_errno()
    try:
        rc = libc.syscall(SYS_MOVE_MOUNT, ctypes.c_int(fd), ctypes.c_char_p(b""), -100,
                          ctypes.c_char_p(os.fsencode(target)), MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_BENEATH)
        return ctypes.get_errno() if rc else 0
    finally:
        os.close(fd)


_NESTED = """
import json, os, sys
sys.path.insert(0, os.environ["PYTHONPATH"])
from mounts_ns import line, mnt_id, sh
at, argv = sys.argv[1], sys.argv[2:]
r = sh(*argv, check=False)
out = {"rc": r.returncode, "stderr": r.stderr.decode(errors="replace")}
if r.returncode == 0:
    out["line"] = line(mnt_id(at))
print(json.dumps(out, ensure_ascii=True))
"""


def mount8(at: str, *argv: str) -> dict:
    """What mount(8) does with ARGV, run in a nested private namespace (so nothing stays
    mounted here): its exit code and stderr, and the kernel's line for what `at` then reaches."""
    r = sh("unshare", "--mount", "--propagation", "private", sys.executable, "-c", _NESTED, at, "mount", *argv)
    return json.loads(r.stdout)
