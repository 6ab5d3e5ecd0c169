"""What the mounts kind observes: mount table and fstab entries, the resolved source, free space."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MountInfo:
    """One line of /proc/self/mountinfo (see proc(5))."""

    mount_id: int
    parent_id: int
    devno: str  # major:minor of the filesystem (st_dev)
    root: str  # the directory of the filesystem mounted here ("/" unless a bind mount of a subtree)
    mount_point: str
    options: tuple[str, ...]  # per-mount options: rw/ro, nosuid, relatime, ...
    fstype: str
    source: str
    super_options: tuple[str, ...]  # per-filesystem options: rw/ro, size=..., ...

    @property
    def all_options(self) -> tuple[str, ...]:
        return self.options + tuple(o for o in self.super_options if o not in self.options)

    @property
    def read_only(self) -> bool:
        # Either level can make it read-only: `mount -o remount,bind,ro` or a ro superblock.
        return "ro" in self.options or "ro" in self.super_options


@dataclass(frozen=True)
class FstabEntry:
    source: str
    mount_point: str
    fstype: str
    options: tuple[str, ...]


@dataclass(frozen=True)
class ResolvedSource:
    given: str  # as written: /dev/nvme1n1, UUID=..., LABEL=..., tmpfs, server:/export
    path: str | None  # the device it names (symlinks resolved), the text itself for non-devices
    devno: str | None  # major:minor when it is a block device
    note: str = ""  # why it could not be resolved


@dataclass(frozen=True)
class Space:
    total_bytes: int  # f_blocks * f_frsize
    free_bytes: int  # f_bavail * f_frsize: what df calls Avail (without root-reserved blocks)
    total_inodes: int  # f_files (0: the filesystem has no fixed inode count)
    free_inodes: int  # f_favail


@dataclass(frozen=True)
class MountObserved:
    path: str
    mount: MountInfo | None  # the topmost mount at path, None when not mounted
    fstab: FstabEntry | None
    space: Space | None = None
    writable: bool | None = None  # the write probe's verdict; None when not probed
    write_error: str = ""
    sources: tuple[ResolvedSource, ...] = ()  # declared, mounted and fstab sources, resolved

    def resolved(self, given: str | None) -> ResolvedSource | None:
        return next((s for s in self.sources if s.given == given), None)
