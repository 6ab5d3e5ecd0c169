"""Whether a declared mount option holds, judged the way the kernel shows mounts.

The kernel does not echo the option string it was given: it shows flags it has (`noatime`, not
`atime`), and each filesystem renders its own options (`->show_options`), often normalised and
omitted when they are the default. So a declared option is judged by what it means:

- options mount(8) keeps to itself (`defaults`, `noauto`, `nofail`, `_netdev`, `x-*`, ...;
  libmount/src/optmap.c `userspace_opts_map`), and flags the kernel never shows (`silent`,
  `iversion`, `bind`, ...), are passed to mount when reconcile mounts and are not compared:
  there is no kernel state to compare them with;
- the fs-independent flags (optmap.c `linux_flags_map`) by the flags the kernel shows in the
  per-mount field (fs/proc_namespace.c `show_mnt_opts`: ro, nosuid, nodev, noexec, noatime,
  nodiratime, relatime, nosymfollow), the superblock field (`show_sb_opts`: sync, dirsync,
  mand, lazytime) and the optional fields (shared:, master:, unbindable); `exec` holds when
  `noexec` is absent, `strictatime` when neither `noatime` nor `relatime` is shown;
- tmpfs's size, nr_blocks, nr_inodes, mode, uid and gid by value (mm/shmem.c
  `shmem_parse_one` reads them, `shmem_show_options` prints them, only when not the default);
- everything else as written: the option must appear in the kernel's fields.
"""

from __future__ import annotations

import re

from .observed import MountInfo

# libmount/src/optmap.c linux_flags_map: name -> how the kernel shows it.
#   ("mnt", X): flag X in the per-mount field;  ("mnt-", X): X absent from it
#   ("sb", X) / ("sb-", X): the same for the superblock field;  None: never shown
_FLAGS: dict[str, tuple[str, str] | None] = {
    "nosuid": ("mnt", "nosuid"), "suid": ("mnt-", "nosuid"),
    "nodev": ("mnt", "nodev"), "dev": ("mnt-", "nodev"),
    "noexec": ("mnt", "noexec"), "exec": ("mnt-", "noexec"),
    "noatime": ("mnt", "noatime"), "atime": ("mnt-", "noatime"),
    "nodiratime": ("mnt", "nodiratime"), "diratime": ("mnt-", "nodiratime"),
    "relatime": ("mnt", "relatime"), "norelatime": ("mnt-", "relatime"),
    "nosymfollow": ("mnt", "nosymfollow"), "symfollow": ("mnt-", "nosymfollow"),
    "sync": ("sb", "sync"), "async": ("sb-", "sync"),
    "dirsync": ("sb", "dirsync"),
    "mand": ("sb", "mand"), "nomand": ("sb-", "mand"),
    "lazytime": ("sb", "lazytime"), "nolazytime": ("sb-", "lazytime"),
    "iversion": None, "noiversion": None, "silent": None, "loud": None,
    "remount": None, "bind": None, "rbind": None, "move": None, "sub": None, "nosub": None,
    "nostrictatime": None,
}
_SPECIAL_FLAGS = {"ro", "rw", "strictatime", "private", "rprivate", "shared", "rshared", "slave", "rslave",
                  "unbindable", "runbindable"}
VFS_FLAGS = frozenset(_FLAGS) | _SPECIAL_FLAGS

# libmount/src/optmap.c userspace_opts_map: (name, takes): "" no value, "=" a value, "[=]" either
_USERSPACE = {"defaults": "", "auto": "", "noauto": "", "user": "[=]", "nouser": "", "users": "", "nousers": "",
              "owner": "", "noowner": "", "group": "", "nogroup": "", "_netdev": "", "comment": "=",
              "loop": "[=]", "offset": "=", "sizelimit": "=", "encryption": "=", "nofail": "", "uhelper": "=",
              "helper": "=", "verity.hashdevice": "=", "verity.roothash": "=", "verity.hashoffset": "=",
              "verity.roothashfile": "=", "verity.fecdevice": "=", "verity.fecoffset": "=",
              "verity.fecroots": "=", "verity.roothashsig": "=", "verity.oncorruption": "="}


def classify(option: str) -> str:
    """Where libmount files an option of an fstab line (optstr.c `mnt_split_optstr`): "vfs" (an
    fs-independent flag), "user" (mount(8)'s own), "fs" (passed to the filesystem), or "none"
    (`defaults`, which only stands for the defaults). findmnt's VFS-OPTIONS and FS-OPTIONS.
    A map entry without `=` given a value (`ro=1`, `nofail=x`) is not that entry: it goes to
    the filesystem (`mnt_optmap_entry_novalue`)."""
    name, eq, _value = option.partition("=")
    if option.startswith(("x-", "X-")):
        return "user"
    if name == "defaults":
        return "none"
    if name in VFS_FLAGS:
        return "fs" if eq else "vfs"
    takes = _USERSPACE.get(name)
    if takes is None or (takes == "" and eq):
        return "fs"
    return "user"


def holds(option: str, m: MountInfo, ram_pages: int = 0, page_size: int = 0) -> bool | None:
    """Whether the mount shows `option` in effect; None when the kernel keeps no such state
    (a userspace option or an unshown flag): such an option cannot be compared."""
    kind = classify(option)
    if kind in ("user", "none"):
        return None
    if kind == "vfs":
        return _flag_holds(option, m)
    if m.fstype == "tmpfs":
        verdict = _tmpfs_holds(option, m, ram_pages, page_size)
        if verdict is not None:
            return verdict
    return option in m.options or option in m.super_options


def _flag_holds(flag: str, m: MountInfo) -> bool | None:
    if flag == "ro":
        return m.read_only
    if flag == "rw":
        return not m.read_only
    if flag == "strictatime":
        return "noatime" not in m.options and "relatime" not in m.options
    if flag in ("private", "rprivate"):
        return not any(f.startswith(("shared:", "master:")) or f == "unbindable" for f in m.optional_fields)
    if flag in ("shared", "rshared"):
        return any(f.startswith("shared:") for f in m.optional_fields)
    if flag in ("slave", "rslave"):
        return any(f.startswith("master:") for f in m.optional_fields)
    if flag in ("unbindable", "runbindable"):
        return "unbindable" in m.optional_fields
    rule = _FLAGS[flag]
    if rule is None:
        return None
    where, shown = rule
    field = m.options if where.startswith("mnt") else m.super_options
    return (shown in field) != where.endswith("-")


# --- tmpfs (mm/shmem.c) ---------------------------------------------------------------------

def _c_strtoull(s: str, base: int) -> tuple[int, str] | None:
    """simple_strtoull/kstrtouint: base 0 takes 0x (hex) and a leading 0 (octal)."""
    if base == 0:
        if re.match(r"0[xX][0-9a-fA-F]", s):
            base, s = 16, s[2:]
        elif s.startswith("0"):
            base = 8
        else:
            base = 10
    digits = {8: "[0-7]", 10: "[0-9]", 16: "[0-9a-fA-F]"}[base]
    m = re.match(f"{digits}+", s)
    if not m:
        return None
    return int(m.group(0), base), s[m.end():]


def _memparse(s: str) -> tuple[int, str] | None:
    """lib/cmdline.c memparse(): a number (base 0) and an optional binary suffix K M G T P E."""
    parsed = _c_strtoull(s, 0)
    if parsed is None:
        return None
    value, rest = parsed
    shift = "KMGTPE".find(rest[:1].upper()) + 1 if rest else 0
    if shift:
        value, rest = value << (10 * shift), rest[1:]
    return value, rest


def tmpfs_shown(option: str, ram_pages: int, page_size: int) -> tuple[str, str | None] | None:
    """(key, what shmem_show_options prints for it: None when it prints nothing, the default)
    for a tmpfs option reconcile knows the rendering of; None for any other option, or a value
    the model is not sure of (the caller then compares the option as written)."""
    key, eq, value = option.partition("=")
    if not eq or not value:
        return None
    pages_default = ram_pages // 2  # shmem_default_max_blocks / _max_inodes on 64-bit (no highmem)
    if key in ("size", "nr_blocks"):
        parsed = _memparse(value)
        if parsed is None or not ram_pages or not page_size:
            return None
        amount, rest = parsed
        if key == "size":
            if rest == "%":
                amount, rest = (amount * page_size) * ram_pages // 100, ""
            blocks = -(-amount // page_size)  # DIV_ROUND_UP(size, PAGE_SIZE)
        else:
            blocks = amount
        if rest or blocks >= 2**63:
            return None
        return "size", (None if blocks == pages_default else f"{blocks * page_size // 1024}k")
    if key == "nr_inodes":
        parsed = _memparse(value)
        if parsed is None or parsed[1] or not ram_pages:
            return None
        return "nr_inodes", (None if parsed[0] == pages_default else str(parsed[0]))
    if key == "mode":
        parsed = _c_strtoull(value.lstrip("+"), 8)
        if parsed is None or parsed[1]:
            return None
        mode = parsed[0] & 0o7777
        return "mode", (None if mode == 0o1777 else f"{mode:03o}")
    if key in ("uid", "gid"):
        parsed = _c_strtoull(value, 0)
        if parsed is None or parsed[1] or parsed[0] >= 2**32:
            return None
        return key, (None if parsed[0] == 0 else str(parsed[0]))
    return None


def _tmpfs_holds(option: str, m: MountInfo, ram_pages: int, page_size: int) -> bool | None:
    model = tmpfs_shown(option, ram_pages, page_size)
    if model is None:
        return None
    key, want = model
    shown = [o.partition("=")[2] for o in m.super_options if o.partition("=")[0] == key]
    return (shown[-1] if shown else None) == want
