"""The kernel's mount table (/proc/self/mountinfo) and /etc/fstab, parsed."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

from .observed import FstabEntry, MountInfo

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    r"""The kernel writes space, tab, newline and backslash as \040 \011 \012 \134."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountInfo]:
    """`id parent maj:min root mountpoint opts [optional...] - fstype source superopts`, in mount order.
    The optional fields vary in number, so split on the ' - ' separator (a space inside a field
    is always escaped)."""
    entries = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        left, right = head.split(), tail.split()
        if len(left) < 6 or len(right) < 2:
            continue
        try:
            mount_id, parent_id = int(left[0]), int(left[1])
        except ValueError:
            continue
        entries.append(MountInfo(
            mount_id=mount_id, parent_id=parent_id, devno=left[2], root=unescape(left[3]),
            mount_point=unescape(left[4]), options=tuple(left[5].split(",")),
            fstype=unescape(right[0]), source=unescape(right[1]),
            super_options=tuple(right[2].split(",")) if len(right) > 2 else (),
        ))
    return entries


def find_mount(entries: Sequence[MountInfo], path: str) -> MountInfo | None:
    """The mount visible at path: with mounts stacked on one point, the last one mounted."""
    found = None
    for e in entries:
        if e.mount_point == path:
            found = e
    return found


def parse_fstab(text: str) -> list[FstabEntry]:
    entries = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 3:
            continue
        entries.append(FstabEntry(
            source=unescape(fields[0]), mount_point=posixpath.normpath(unescape(fields[1])),
            fstype=fields[2], options=tuple(fields[3].split(",")) if len(fields) > 3 else ("defaults",),
        ))
    return entries


def find_fstab(entries: Sequence[FstabEntry], path: str) -> FstabEntry | None:
    # mount(8) takes the first fstab line for a mount point.
    return next((e for e in entries if e.mount_point == path), None)


def norm_path(path: str) -> str:
    return "/" + posixpath.normpath(path).lstrip("/")
