"""Who holds the GPUs, read from /proc: processes with a /dev/nvidia* file open, and the systemd
unit each belongs to (its cgroup)."""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from typing import Any

# Processes that hold /dev/nvidia* by design (monitoring, persistence): never holders, when they
# are the installed programs (trusted_exe), never by the name a process shows.
EXCLUDED_NAMES = frozenset({"nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nvidia-smi"})


def excluded(info: dict[str, Any]) -> bool:
    """The NVIDIA daemons and tools that hold every GPU's device file without being its user: by
    the file the process runs (trusted_exe), never by /proc/PID/comm or argv[0], which any process
    sets to what it likes (prctl PR_SET_NAME, `exec -a`, a copy of a binary under that name)."""
    return bool(info.get("path")) and os.path.basename(info["path"]) in EXCLUDED_NAMES


def trusted_exe(pid: int) -> str:
    """The path of the program PID runs (/proc/PID/exe, as its own root sees it) when root owns the
    file and every directory above it and no one else can write any of them (a sticky directory
    such as /tmp excepted: no one else can rename root's entry in it), as OpenSSH's StrictModes and
    systemd's chase(CHASE_SAFE) judge a path; "" otherwise. Only root could have put the program
    there, under that name: a name any user can choose proves nothing. The path must still name
    the very file running (same device and inode), so an upgraded or deleted binary, or a path in
    another mount namespace that differs from ours, is not trusted."""
    root = f"/proc/{pid}/root"  # the process's own root: a container's files are judged in its image
    try:
        path = os.readlink(f"/proc/{pid}/exe")
        running = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return ""
    if not path.startswith("/") or path.endswith(" (deleted)"):
        return ""
    try:
        named = os.lstat(root + path)
        if (not stat.S_ISREG(named.st_mode) or (named.st_dev, named.st_ino) != (running.st_dev, running.st_ino)
                or named.st_uid != 0 or named.st_mode & 0o022):
            return ""
        d = os.path.dirname(path)
        while True:
            st = os.lstat(root + d if d != "/" else root + "/")
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
                return ""
            if d == "/":
                return path
            d = os.path.dirname(d)
    except OSError:
        return ""
# Test/diagnostic knobs: where the GPU device files are, and a kernel log to read instead of dmesg.
DEV_GLOB_ENV = "RECONCILE_NVIDIA_DEV_GLOB"
DEFAULT_DEV_GLOB = "/dev/nvidia*"
DEV_GPU_RE = re.compile(r"nvidia(\d+)$")
# Where the driver describes each GPU (Device Minor, Bus Location): /proc/driver/nvidia/gpus/<bus>/information.
PROC_GPUS_ENV = "RECONCILE_NVIDIA_PROC_DIR"
DEFAULT_PROC_GPUS = "/proc/driver/nvidia/gpus"


def gpu_minors(directory: str) -> dict[str, int]:
    """PCI address (`0000:3b:00`) -> the driver's Device Minor, the N of /dev/nvidiaN, read from
    <directory>/<bus>/information (`Device Minor:    0`, `Bus Location:    0000:3b:00.0`). It is
    not the nvidia-smi index: on real 8-GPU hosts minor 3 is index 0 (tests/data/gpus/real/)."""
    from .xid import pci_key

    out: dict[str, int] = {}
    try:
        entries = os.listdir(directory)
    except OSError:
        return out
    for entry in entries:
        text = _read(os.path.join(directory, entry, "information"))
        if text is None:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        try:
            minor = int(fields["Device Minor"])
        except (KeyError, ValueError):
            continue
        out[pci_key(fields.get("Bus Location") or entry)] = minor
    return out


def unit_of_cgroup(text: str) -> str | None:
    """The system service of a /proc/PID/cgroup text, or None (scopes, user managers, no unit)."""
    path = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "name=systemd":
            path = parts[2]
            break
        if parts[0] == "0" and parts[1] == "":
            path = parts[2]  # unified hierarchy; a v1 name=systemd line wins if present
    if not path:
        return None
    for comp in path.split("/"):
        if comp.endswith(".service"):
            # user@UID.service is a user's whole session manager: never "the holder's unit".
            return None if comp.startswith("user@") else comp
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def proc_info(pid: int) -> dict[str, Any] | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None  # a zombie holds nothing any more
        starttime = int(fields[19])
    except (IndexError, ValueError):
        return None
    comm = (_read(f"/proc/{pid}/comm") or "").strip()
    argv0 = (_read(f"/proc/{pid}/cmdline") or "").split("\0", 1)[0]
    return {"name": comm, "exe": os.path.basename(argv0), "starttime": starttime, "path": trusted_exe(pid),
            "unit": unit_of_cgroup(_read(f"/proc/{pid}/cgroup") or "")}


def scan_device_holders(pattern: str) -> dict[int, tuple[str, ...]]:
    """PID -> the device files matching PATTERN it has open, from /proc/PID/fd links (what fuser does;
    psutil's open_files() leaves device nodes out)."""
    found: dict[int, tuple[str, ...]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        files = set()
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if fnmatch.fnmatchcase(target, pattern):
                files.add(target)
        if files:
            found[int(entry)] = tuple(sorted(files))
    return found
