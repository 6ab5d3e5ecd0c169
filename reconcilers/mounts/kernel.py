"""Which mount a path is on, as the kernel answers it: the mount id of statx(2)
(STATX_MNT_ID, Linux 5.8), else the `mnt_id:` line of /proc/self/fdinfo for an O_PATH
descriptor (Linux 3.15). The id is the first field of /proc/self/mountinfo.

Strings that look alike are not enough: after `mount --move` or move_mount(MOVE_MOUNT_BENEATH)
the last line for a mount point is not the visible one, and a mount whose parent directory was
mounted over is still listed, with its mount point, though nothing can reach it (findmnt -M and
mountpoint(1) say "mounted" there). Only the id of what the path reaches tells.

Called in the probe child only: both calls touch the filesystem and can block on a hung one.
"""

from __future__ import annotations

import ctypes
import os

STATX_MNT_ID = 0x1000  # include/uapi/linux/stat.h; not STATX_MNT_ID_UNIQUE (0x4000), another id space
AT_FDCWD = -100
AT_NO_AUTOMOUNT = 0x800  # do not trigger an automount on the last component (statx would)
AT_STATX_DONT_SYNC = 0x4000  # do not ask a network filesystem to refresh attributes
PATH_MAX = 4096  # bytes, with the terminating NUL (include/uapi/linux/limits.h)


class _Timestamp(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("_reserved", ctypes.c_int32)]


class Statx(ctypes.Structure):
    """struct statx (include/uapi/linux/stat.h): 256 bytes, stx_mnt_id at offset 0x90."""

    _fields_ = [("stx_mask", ctypes.c_uint32), ("stx_blksize", ctypes.c_uint32),
                ("stx_attributes", ctypes.c_uint64), ("stx_nlink", ctypes.c_uint32),
                ("stx_uid", ctypes.c_uint32), ("stx_gid", ctypes.c_uint32), ("stx_mode", ctypes.c_uint16),
                ("_spare0", ctypes.c_uint16), ("stx_ino", ctypes.c_uint64), ("stx_size", ctypes.c_uint64),
                ("stx_blocks", ctypes.c_uint64), ("stx_attributes_mask", ctypes.c_uint64),
                ("stx_atime", _Timestamp), ("stx_btime", _Timestamp), ("stx_ctime", _Timestamp),
                ("stx_mtime", _Timestamp), ("stx_rdev_major", ctypes.c_uint32),
                ("stx_rdev_minor", ctypes.c_uint32), ("stx_dev_major", ctypes.c_uint32),
                ("stx_dev_minor", ctypes.c_uint32), ("stx_mnt_id", ctypes.c_uint64),
                ("_spare2", ctypes.c_uint64 * 13)]


assert ctypes.sizeof(Statx) == 256 and Statx.stx_mnt_id.offset == 0x90

_statx = None


def _libc_statx():
    """glibc's statx (2.28+), looked up once; None where the C library has none."""
    global _statx
    if _statx is None:
        fn = getattr(ctypes.CDLL(None, use_errno=True), "statx", None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(Statx)]
            fn.restype = ctypes.c_int
        _statx = fn or False
    return _statx or None


def prepare() -> None:
    """Load the C library's statx here, before forking probe children, so each child inherits
    it instead of loading it again."""
    _libc_statx()


def mount_id(path: str) -> int:
    """The id of the mount `path` reaches (symlinks followed, no automount triggered)."""
    fn = _libc_statx()
    if fn is not None:
        buf = Statx()
        if fn(AT_FDCWD, os.fsencode(path), AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC, STATX_MNT_ID, ctypes.byref(buf)) == 0:
            if buf.stx_mask & STATX_MNT_ID:
                return int(buf.stx_mnt_id)
            # a kernel older than 5.8 answers without the id: ask /proc instead
        else:
            err = ctypes.get_errno()
            if err != 38:  # ENOSYS: no statx syscall; anything else is the path's own error
                raise OSError(err, os.strerror(err), path)
    return fdinfo_mount_id(path)


def fdinfo_mount_id(path: str) -> int:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as fh:
            for line in fh.read().split(b"\n"):
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    finally:
        os.close(fd)
    raise OSError(0, "no mnt_id in /proc/self/fdinfo", path)
