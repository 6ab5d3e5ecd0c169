r"""The kernel's mount table (/proc/self/mountinfo) and /etc/fstab, read as libmount reads them.

Both are read as bytes. A line ends at `\n` only (one `\r` before it is dropped); fields are
separated by runs of spaces and tabs, and by nothing else: every other byte, `\r`, `\v`, `\f`,
`\x1c`, U+0085, U+2028, a no-break space, is part of a field, as the kernel writes it. Escapes
`\ooo` are decoded per field, and the bytes become `str` through `os.fsdecode`, so a byte that
is not UTF-8 survives as a surrogate (surrogateescape) and goes back to the same byte on its way
to a syscall or a command line.

Rules and their sources (util-linux, libmount/src/tab_parse.c unless named):
- a line is read with getline(); one trailing `\r` is cut; a line holding a NUL byte is a parse
  error; blank lines and lines whose first non-blank byte is `#` are skipped
  (`mnt_table_parse_next`);
- mountinfo fields per `mnt_parse_mountinfo_line`; the source is empty when two spaces follow
  the filesystem type (`- tmpfs  rw`);
- fstab fields per `mnt_parse_table_line`: source, target and type are required; options, freq
  and passno are optional; freq and passno must be decimal numbers (`next_s32`, strtol) or the
  line is rejected; anything after passno is ignored; a rejected line affects only itself;
- `\` and three octal digits is one byte, anything else is literal (lib/mangle.c `unmangle`);
- fstab target lookup as `mount --target PATH` does it (libmount/src/tab.c
  `mnt_table_find_target`, lib/strutils.c `streq_paths`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from .observed import FstabEntry, MountInfo

_OCTAL = re.compile(rb"\\([0-7]{3})")
_SEPARATORS = re.compile(rb"[ \t]+")
_INT32 = 2**31


def unmangle(field: bytes) -> bytes:
    r"""lib/mangle.c unmangle(): `\ooo` is the byte 64a+8b+c, modulo 256 (`\777` is 0xff); a
    backslash not followed by three octal digits stays. The C string ends at a decoded NUL."""
    out = _OCTAL.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field)
    return out.split(b"\0", 1)[0]


def unescape(field: str) -> str:
    """`unmangle` for a field already decoded to str."""
    return os.fsdecode(unmangle(os.fsencode(field)))


def split_options(optstr: str) -> tuple[str, ...]:
    """An option string split at commas, except inside double quotes
    (libmount/src/optstr.c `mnt_optstr_next_option`): `context="a,b",ro` is two options."""
    out, start, quoted = [], 0, False
    for i, ch in enumerate(optstr):
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            out.append(optstr[start:i])
            start = i + 1
    out.append(optstr[start:])
    return tuple(o for o in out if o)


def _lines(data: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(1-based line number, content) for every line that is not blank or a comment; content
    None for a line libmount rejects outright (a NUL byte before its newline)."""
    lines = data.split(b"\n")
    last = len(lines) - 1
    for n, line in enumerate(lines, 1):
        if n - 1 == last:
            if not line:
                break  # the file ended with a newline
            line = line.split(b"\0", 1)[0]  # no final newline: the C string ends at a NUL
        elif b"\0" in line:
            yield n, None
            continue
        if line.endswith(b"\r"):
            line = line[:-1]
        line = line.lstrip(b" \t")
        if not line or line.startswith(b"#"):
            continue
        yield n, line


def _fields(s: bytes) -> list[bytes]:
    return [f for f in _SEPARATORS.split(s) if f]


def _s32(field: bytes, last: bool = False) -> int | None:
    """libmount's next_s32(): strtol(field, 10) that must consume the whole field (strtol skips
    leading white space and takes a sign). A value beyond a C long sets ERANGE, which rejects the
    line unless the field is the last of the line (`if (s && *s && rc)`: the end pointer is then
    at the NUL); the value, clamped to a long, is truncated into an int as the C assignment does."""
    m = re.fullmatch(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)", field)
    if not m:
        return None
    value = int(m.group(1))
    if not -(2**63) <= value < 2**63:
        if not last:
            return None
        value = 2**63 - 1 if value > 0 else -(2**63)
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= _INT32 else value


def parse_mountinfo(data: bytes, bad: list[int] | None = None) -> list[MountInfo]:
    """`id parent maj:min root mountpoint opts [optional...] - fstype source superopts`, in the
    kernel's order (which says nothing about which mount is visible: ask the kernel, see
    probe.py). Line numbers of rejected lines are appended to `bad`."""
    entries = []
    for n, line in _lines(data):
        entry = _mountinfo_line(line) if line is not None else None
        if entry is None:
            if bad is not None:
                bad.append(n)
            continue
        entries.append(entry)
    return entries


def _mountinfo_line(s: bytes) -> MountInfo | None:
    m = re.match(rb"([+-]?[0-9]+)[ \t]+([+-]?[0-9]+)[ \t]+([0-9]+):([0-9]+)", s)
    if not m:
        return None
    mount_id, parent_id = _s32(m.group(1)), _s32(m.group(2))
    if mount_id is None or parent_id is None:
        return None
    rest = s[m.end():]
    # maj:min is followed by the rest of its field (sscanf reads the numbers only).
    rest = re.sub(rb"^[^ \t]*", b"", rest)
    head = _fields_n(rest, 3)
    if head is None:
        return None
    (root, target, vfs), rest = head
    sep = rest.find(b" - ")
    if sep < 0:
        return None
    optional = rest[1:sep] if sep > 1 else b""
    tail = rest[sep + 3:].lstrip(b" \t")
    fstype_end = re.search(rb"[ \t]|$", tail).start()
    fstype, tail = tail[:fstype_end], tail[fstype_end:]
    if not fstype or not tail:
        return None
    if tail.startswith(b"  "):
        source, tail = b"", tail
    else:
        tail = tail.lstrip(b" \t")
        end = re.search(rb"[ \t]|$", tail).start()
        if end == 0:
            return None
        source, tail = unmangle(tail[:end]), tail[end:]
    tail = tail.lstrip(b" \t")
    super_opts = tail[:re.search(rb"[ \t]|$", tail).start()]
    if not super_opts:
        return None
    dec = os.fsdecode
    return MountInfo(
        mount_id=mount_id, parent_id=parent_id, devno=f"{int(m.group(3))}:{int(m.group(4))}",
        root=dec(unmangle(root)), mount_point=dec(unmangle(target)),
        options=split_options(dec(unmangle(vfs))), fstype=dec(unmangle(fstype)), source=dec(source),
        super_options=split_options(dec(unmangle(super_opts))),
        optional_fields=tuple(dec(f) for f in _fields(optional)),
    )


def _fields_n(s: bytes, count: int) -> tuple[list[bytes], bytes] | None:
    """The next `count` fields after leading separators, and the rest (from the separator on)."""
    out = []
    for _ in range(count):
        s = s.lstrip(b" \t")
        end = re.search(rb"[ \t]|$", s).start()
        if end == 0:
            return None
        out.append(s[:end])
        s = s[end:]
    return out, s


def parse_fstab(data: bytes, bad: list[int] | None = None) -> list[FstabEntry]:
    """fstab (or /proc/mounts, mtab) entries in file order; line numbers of the lines libmount
    rejects ("parse error at line N -- ignored") are appended to `bad`."""
    entries = []
    for n, line in _lines(data):
        entry = _fstab_line(line, n) if line is not None else None
        if entry is None:
            if bad is not None:
                bad.append(n)
            continue
        entries.append(entry)
    return entries


def _fstab_line(s: bytes, n: int) -> FstabEntry | None:
    fields = _fields(s)
    if len(fields) < 3:
        return None
    source, target, fstype = (unmangle(f) for f in fields[:3])
    options = unmangle(fields[3]) if len(fields) > 3 else b""
    freq = passno = 0
    # "last": the number ends the line, nothing after it, not even a blank.
    ends = not s.endswith((b" ", b"\t"))
    if len(fields) > 4:
        freq = _s32(fields[4], last=ends and len(fields) == 5)
        if freq is None:
            return None
    if len(fields) > 5:
        passno = _s32(fields[5], last=ends and len(fields) == 6)  # what follows passno is never read
        if passno is None:
            return None
    dec = os.fsdecode
    return FstabEntry(source=dec(source), mount_point=dec(target), fstype=dec(fstype),
                      options=split_options(dec(options)), freq=freq, passno=passno, line=n, optstr=dec(options))


# --- which line is about a path ------------------------------------------------------------

def streq_paths(a: str, b: str) -> bool:
    """lib/strutils.c streq_paths(): equal but for repeated slashes and one trailing slash;
    `.` and `..` are not interpreted."""
    return _squash(a) == _squash(b)


def _squash(p: str) -> str:
    p = re.sub("/+", "/", p)
    return p[:-1] if len(p) > 1 and p.endswith("/") else p


def find_fstab(entries: Sequence[FstabEntry], path: str, canonical: str | None = None,
               resolve: Callable[[str], str] | None = None,
               mounted_targets: Iterable[str] = ()) -> FstabEntry | None:
    """The fstab line `mount --target PATH` uses (libmount/src/tab.c mnt_table_find_target,
    forward: the first match wins): PATH compared as a string with every target; then PATH's
    canonical form (realpath, `canonical`) with every target; then with every target
    canonicalized (`resolve`), skipping swap and `/`, and, as libmount's cache does
    (cache.c mnt_resolve_target), taking a target that is a mount point in the kernel's table
    as it is instead of resolving it (which could hang on a dead NFS server)."""
    for e in entries:
        if streq_paths(e.mount_point, path):
            return e
    if canonical is None:
        return None
    for e in entries:
        if streq_paths(e.mount_point, canonical):
            return e
    if resolve is None:
        return None
    kernel = {_squash(t) for t in mounted_targets}
    for e in entries:
        if e.fstype == "swap" or e.mount_point == "/":
            continue
        target = e.mount_point if _squash(e.mount_point) in kernel else resolve(e.mount_point)
        if target == canonical:
            return e
    return None


def by_id(entries: Sequence[MountInfo], mount_id: int) -> MountInfo | None:
    return next((e for e in entries if e.mount_id == mount_id), None)


def mounts_at(entries: Sequence[MountInfo], path: str) -> list[MountInfo]:
    """Every line whose mount point is `path`: stacked ones, and ones hidden under a mount of
    an ancestor; which of them (if any) is visible only the kernel says (see probe.py)."""
    return [e for e in entries if e.mount_point == path]


def top_of_stack(entries: Sequence[MountInfo], path: str) -> MountInfo | None:
    """For data without a kernel (tests, captured tables): the mount at `path` that no other
    mount at `path` sits on. Right for stacks, mount --move and move-beneath; it cannot see a
    mount hidden by an overmounted parent, which only the kernel's mount id can."""
    here = mounts_at(entries, path)
    parents = {e.parent_id for e in here}
    tops = [e for e in here if e.mount_id not in parents]
    return tops[-1] if tops else None


def norm_path(path: str) -> str:
    """A declared path as reconcile keys it: repeated and trailing slashes dropped, as
    streq_paths ignores them; `.`, `..` and symlinks are left for realpath in the probe child."""
    return _squash("/" + path.lstrip("/"))
