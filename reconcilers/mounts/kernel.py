"""Which mount a path is on, as the kernel answers it: the mount id of an O_PATH descriptor of
the path, from the `mnt_id:` line of /proc/self/fdinfo (Linux 3.15). It is the first field of
/proc/self/mountinfo, and what statx(2) answers for STATX_MNT_ID (Linux 5.8; not the 64-bit
STATX_MNT_ID_UNIQUE, another id space).

Strings that look alike are not enough: after `mount --move` or move_mount(MOVE_MOUNT_BENEATH)
the last line for a mount point is not the visible one, and a mount whose parent directory was
mounted over is still listed, with its mount point, though nothing can reach it (findmnt -M and
mountpoint(1) say "mounted" there). Only the id of what the path reaches tells.

O_PATH rather than statx: it needs no C call from Python (os.statx exists only from 3.15), asks
the filesystem for no attributes (statx would, on a network filesystem, unless told not to), and
triggers no automount on the last component (an O_PATH open has no LOOKUP_OPEN intent:
fs/open.c build_open_flags, fs/namei.c follow_automount). Called in the probe child only: the
path walk can block on a hung filesystem.
"""

from __future__ import annotations

import os

PATH_MAX = 4096  # bytes, with the terminating NUL (include/uapi/linux/limits.h)


def mount_id(path: str) -> int:
    """The id of the mount `path` reaches (symlinks followed)."""
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as fh:
            for line in fh.read().split(b"\n"):
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    finally:
        os.close(fd)
    raise OSError(0, "the kernel gives no mnt_id in /proc/self/fdinfo (Linux 3.15 or later is needed)", path)
