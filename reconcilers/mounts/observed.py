"""What the mounts kind observes: mount table and fstab entries, the resolved source, free space.

Paths and other text from the kernel are `str` decoded with surrogateescape (os.fsdecode): a
byte that is not UTF-8 is kept as a lone surrogate and turns back into the same byte in a
syscall, a command line or the report (JSON escapes it as \\udcXX; the text view writes the byte).
"""

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
    source: str  # "" when the mount has an empty source (`- tmpfs  rw`)
    super_options: tuple[str, ...]  # per-filesystem options: rw/ro, size=..., ...
    optional_fields: tuple[str, ...] = ()  # shared:N, master:N, propagate_from:N, unbindable

    @property
    def all_options(self) -> tuple[str, ...]:
        return self.options + tuple(o for o in self.super_options if o not in self.options)

    @property
    def read_only(self) -> bool:
        # Either level can make it read-only: `mount -o remount,bind,ro` or a ro superblock.
        return "ro" in self.options or "ro" in self.super_options


@dataclass(frozen=True)
class FstabEntry:
    """One line of /etc/fstab (see fstab(5))."""

    source: str
    mount_point: str  # as written (unescaped): libmount compares it as a path, see tables.find_fstab
    fstype: str
    options: tuple[str, ...]  # () when the line has no options field (mount uses the defaults)
    freq: int = 0
    passno: int = 0
    line: int = 0  # 1-based line number in the file
    optstr: str = ""  # the options field as written (unescaped), what findmnt shows as OPTIONS


@dataclass(frozen=True)
class ResolvedSource:
    """A mount source as written, and the device it names."""

    given: str  # as written: /dev/nvme1n1, UUID=..., LABEL=..., tmpfs, server:/export
    path: str | None  # the device it names (symlinks resolved), the text itself for non-devices
    devno: str | None  # major:minor when it is a block device
    note: str = ""  # why it could not be resolved, or how it was (`by libblkid's scan`)


@dataclass(frozen=True)
class Space:
    """Size and free space of a mounted filesystem (statvfs(3))."""

    total_bytes: int  # f_blocks * f_frsize
    free_bytes: int  # f_bavail * f_frsize: what df calls Avail (without root-reserved blocks)
    total_inodes: int  # f_files (0: the filesystem has no fixed inode count)
    free_inodes: int  # f_favail


@dataclass(frozen=True)
class MountObserved:
    """A declared mount point as the kernel shows it, with its fstab line and free space."""

    path: str  # as declared (slashes normalised)
    mount: MountInfo | None  # the mount visible at the path (the kernel's mount id), None when not mounted
    fstab: FstabEntry | None  # the line `mount --target PATH` would use
    space: Space | None = None
    writable: bool | None = None  # the write probe's verdict; None when not probed
    write_error: str = ""
    sources: tuple[ResolvedSource, ...] = ()  # declared, mounted and fstab sources, resolved
    resolved: str = ""  # the path with symlinks, `.` and `..` resolved (realpath), "" when not resolved
    exists: bool = True  # False: the path (or the target of its symlink) does not exist
    on: MountInfo | None = None  # not mounted: the mount the path lies on (an ancestor's)
    hidden: tuple[MountInfo, ...] = ()  # other mounts at the path: stacked beneath, or overmounted
    fstab_errors: tuple[int, ...] = ()  # lines of /etc/fstab libmount rejects (and mount ignores)
    ram_pages: int = 0  # totalram pages and page size, for tmpfs's defaults (0: not read)
    page_size: int = 0

    def resolved_source(self, given: str | None) -> ResolvedSource | None:
        return next((s for s in self.sources if s.given == given), None)

    def where(self) -> str:
        """The path as the report names it: `PATH`, or `PATH (-> RESOLVED)` through a symlink."""
        if self.resolved and self.resolved != self.path:
            return f"{self.path} (-> {self.resolved})"
        return self.path


def _mountinfo(d: dict | None) -> MountInfo | None:
    if d is None:
        return None
    return MountInfo(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def observed_from(path: str, ans: dict) -> MountObserved:
    """The probe child's JSON answer (probe.probe_mount) as a MountObserved."""
    f = ans.get("fstab")
    return MountObserved(
        path, _mountinfo(ans.get("mount")),
        FstabEntry(**{**f, "options": tuple(f["options"])}) if f else None,
        space=Space(**ans["space"]) if ans.get("space") else None,
        writable=ans.get("writable"), write_error=ans.get("write_error", ""),
        sources=tuple(ResolvedSource(**s) for s in ans.get("sources", ())),
        resolved=ans.get("resolved", ""), exists=ans.get("exists", True),
        on=_mountinfo(ans.get("on")), hidden=tuple(_mountinfo(m) for m in ans.get("hidden", ())),
        fstab_errors=tuple(ans.get("fstab_errors", ())),
        ram_pages=ans.get("ram_pages", 0), page_size=ans.get("page_size", 0),
    )
