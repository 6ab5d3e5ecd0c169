"""The structural check of a small torch.save file held whole in memory, in few operations.

A first check of an extraction is tens of thousands of files of 10-16 ZIP entries each; read_layout
(torchzip.py) spends a few µs of Python on every entry. Files as torch.save writes them
(PyTorchStreamWriter through miniz: caffe2/serialize/inline_container.cc) are all alike: every
entry stored, the same flags on every entry, names in one folder, ASCII, no extra field in the
central directory, no external attributes, each local header's name as the central directory's,
the data 64-byte aligned (torch 2.x), a data descriptor right after it and the next local
header right after that, the central directory after the last descriptor, a ZIP64 end record,
its locator and the end record last. The files of one extraction differ in their folder (the
file's name), their sizes, CRCs and offsets; what else their central directory holds (how many
entries, the lengths of the names, the names without the folder) takes a handful of values, its
*shape*.

So a shape seen often (COMPILE_AFTER files) gets a check of its own, written for it as Python
source (_source) and compiled once, as collections.namedtuple and dataclasses write theirs: its
central directory unpacked into local variables by one struct, compared with the shape's
constants (the records' lengths, the names, the flags) in a few tuple comparisons, and one
straight run of a few operations for each local header and data descriptor. Before that, and
for any file of another shape, this returns None: read_layout checks it (a shape seen only a few
times is not worth a compilation, about a millisecond).

This is a fast path only: it answers "whole" for a file only where every condition read_layout
checks holds (it checks each of them, most of them more strictly), and None for anything else,
damaged or merely unusual: read_layout then decides, and gives the reason. So a verdict never
depends on which path ran (tests/test_extractions_fastpath.py holds the two equal on every
damage the differential suite makes, on torch 2.13's and torch 1.13's own files).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from .torchzip import (
    CENTRAL,
    CENTRAL_SIG,
    DESCRIPTOR_SIG,
    EOCD,
    EOCD_SIG,
    LOCAL_SIG,
    MAX_PICKLE,
    MAX_VERSION,
    PAGE,
    REFUSED_FLAGS,
    ZIP64_EOCD,
    ZIP64_EOCD_SIG,
    ZIP64_LOCATOR_SIG,
    ZipResult,
    _stoull,
    numbered_storages,
)

COMPILE_AFTER = 32  # files of one (entry count, directory size) before a shape is compiled
MAX_SHAPES = 64  # compiled shapes kept (an extraction has a few: the digits of its indices)
DESCRIPTOR_SIZE = 16  # miniz's data descriptor without ZIP64: signature, CRC-32, the two sizes
_LOCAL = struct.Struct("<I22xHH")  # a local header's signature, its name and extra lengths
# An entry's data descriptor (signature, CRC-32; its sizes skipped) and the local header right
# after it (signature, name and extra lengths).
_LINK = struct.Struct("<II8xI22xHH")
_LOCAL_SIG, _DESCRIPTOR_SIG = int.from_bytes(LOCAL_SIG, "little"), int.from_bytes(DESCRIPTOR_SIG, "little")
# torch.save's ending: the ZIP64 end record (its size, disks, counts, the directory's size and
# offset), the ZIP64 locator (the record's offset, disks), the end record (its comment's length).
_END = struct.Struct("<4xQ4xIIQQQQ" "8xQI" "20xH")
_new = tuple.__new__  # a NamedTuple made without its Python-level __new__ (once a file)
OTHER = object()  # a shape's answer for a directory of another shape
# (entry count, directory size) -> the compiled checks of its shapes
_SHAPES: dict[tuple[int, int], list[Callable]] = {}
_SEEN: dict[tuple[int, int], int] = {}  # files of that key no compiled shape took
_VERSIONS: dict[bytes, bool] = {}  # a `version` record's bytes -> whether torch.load takes it


def check_whole_buffer(buf: bytes, crc32: Callable | None = None) -> ZipResult | None:
    """The structural check of the torch.save file whose bytes are all of `buf`: its ZipResult
    when it is whole and in torch.save's own layout, None otherwise (read_layout decides). The
    bytes are a file's (read_layout's `on_disk`): the data descriptors are checked. With `crc32`
    (verify: at-risk's whole read), every entry's CRC-32 too: None where one differs (read_layout
    and the CRCs say which), and the caller takes a ZipResult saying no_crc to the full check."""
    size = len(buf)
    # (the first local header's flags: torch.save's entries all have a data descriptor)
    if size < 98 or not buf.startswith(LOCAL_SIG) or not buf[6] & 0x8:
        return None
    # The end record where miniz's first window finds it (torchzip._first_window): the last
    # signature with the record's 22 bytes after it, so at size - 22 when there is one there.
    eocd = size - 22 if buf.startswith(EOCD_SIG, size - 22) else buf.rfind(EOCD_SIG, max(0, size - PAGE), size - 18)
    # torch.save's ending, read at once (read_directory's ZIP64 rules; a locator pointing
    # elsewhere, or none, is read_layout's to follow)
    if eocd < 76 or not buf.startswith(ZIP64_LOCATOR_SIG, eocd - 20) \
            or not buf.startswith(ZIP64_EOCD_SIG, eocd - 76):
        return None
    rec_size, disk, cd_disk, n_disk, n_total, cd_size, cd_ofs, z64, disks, comment = _END.unpack_from(buf, eocd - 76)
    if z64 != eocd - 76 or rec_size < ZIP64_EOCD.size - 12 or disks != 1 or disk or cd_disk \
            or n_total != n_disk or not 0 < n_total * CENTRAL.size <= cd_size or cd_ofs + cd_size > eocd - 76:
        return None
    trailing = max(0, size - eocd - EOCD.size - comment)
    key = n_total, cd_size
    for check in _SHAPES.get(key, ()):
        result = check(buf, cd_ofs, trailing, crc32)
        if result is not OTHER:
            return result
    # A directory no compiled shape takes: read_layout checks it, and after COMPILE_AFTER such
    # files of this entry count and size, this one's shape is compiled (if it is torch.save's).
    seen = _SEEN.get(key, 0) + 1
    if seen < COMPILE_AFTER:
        if len(_SEEN) >= 16 * MAX_SHAPES:
            _SEEN.clear()
        _SEEN[key] = seen
        return None
    check = _compile(buf, cd_ofs, n_total, cd_size)
    if check is None:  # (not torch.save's: the next file of this key tries again)
        return None
    _SEEN.pop(key, None)
    if sum(map(len, _SHAPES.values())) >= MAX_SHAPES:
        _SHAPES.clear()
    _SHAPES.setdefault(key, []).append(check)
    result = check(buf, cd_ofs, trailing, crc32)
    return None if result is OTHER else result


def _compile(buf: bytes, cd_ofs: int, n_total: int, cd_size: int) -> Callable | None:
    """The compiled check of this central directory's shape (see the module docstring), or None
    when the directory is not one torch.save writes (read_layout decides)."""
    pos, end = cd_ofs, cd_ofs + cd_size
    lead = buf[pos:pos + 12]
    if not buf.startswith(CENTRAL_SIG, pos):
        return None
    _, _, _, flags, method = struct.unpack("<4sHHHH", lead)
    if method != 0 or flags & REFUSED_FLAGS or not flags & 0x8:  # stored, a data descriptor after the data
        return None
    n_first = int.from_bytes(buf[pos + 28:pos + 30], "little")
    cut = buf[pos + CENTRAL.size:pos + CENTRAL.size + n_first].find(b"/") + 1  # the folder's length
    if not cut:
        return None
    tails, n_names, names = [], [], []
    for _ in range(n_total):
        if end - pos < CENTRAL.size or not buf.startswith(lead, pos):
            return None
        n_name, n_extra, n_comment, disk, attrs, ext_attrs = struct.unpack_from("<HHHHHI", buf, pos + 28)
        if n_extra or n_comment or disk or attrs or ext_attrs or n_name <= cut:
            return None
        tails.append(buf[pos + 28:pos + 42])
        n_names.append(n_name)
        names.append(buf[pos + CENTRAL.size + cut:pos + CENTRAL.size + n_name])
        pos += CENTRAL.size + n_name
    if pos != end:
        return None
    # The names without their folder: ASCII, none empty, none a directory (ending in /), none
    # holding a NUL, none twice by its lower-case name (torch.load's lookup); the records
    # torch.load reads at open among them.
    at = {name.lower(): i for i, name in enumerate(names)}
    if len(at) != n_total or any(not p.isascii() or p.endswith(b"/") or b"\0" in p for p in names):
        return None
    records = {"version": at.get(b".data/version", at.get(b"version")), "pkl": at.get(b"data.pkl"),
               "byteorder": at.get(b"byteorder"), "serial": at.get(b".data/serialization_id"),
               "alignment": at.get(b".storage_alignment")}
    if records["version"] is None or records["pkl"] is None:
        return None
    # The struct: the first record's first 12 bytes (signature, versions, flags, method); for
    # each record its CRC and sizes, its 14 bytes of lengths, disk and attributes, its local
    # header's offset, its folder, and its name's rest with the next record's first 12 bytes.
    fmt = "<12s" + "".join(f"4xIII14sI{cut}s{n - cut + (12 if k + 1 < n_total else 0)}s"
                            for k, n in enumerate(n_names))
    rests = tuple(name + (lead if k + 1 < n_total else b"") for k, name in enumerate(names))
    namespace = {"unpack": struct.Struct(fmt).unpack_from, "LEAD": lead, "TAILS": tuple(tails), "RESTS": rests,
                 "local": _LOCAL.unpack_from, "link": _LINK.unpack_from, "error": struct.error, "OTHER": OTHER,
                 "versions": _VERSIONS, "version_ok": _version_ok, "no_crc_of": _no_crc, "new": _new,
                 "ZipResult": ZipResult}
    exec(_source(n_total, cut, n_names, records, numbered_storages(at)), namespace)  # noqa: S102  (our own text: numbers and names only)
    return namespace["check"]


def _source(n: int, cut: int, n_names: list[int], records: dict[str, int | None], numbered: bool) -> str:
    """The text of a shape's check: `check(buf, cd_ofs, trailing, crc32)` -> ZipResult, None, or
    OTHER (not this shape). Only numbers of the shape and names of ours go into it."""
    def each(fmt: str, sep: str = ", ") -> str:
        return sep.join(fmt.format(k=k) for k in range(n))

    version, pkl, byteorder, serial, alignment = (records[k] for k in ("version", "pkl", "byteorder", "serial",
                                                                       "alignment"))
    fields = ", ".join(f"c{k}, s{k}, u{k}, t{k}, h{k}, f{k}, r{k}" for k in range(n))
    out = [
        "def check(buf, cd_ofs, trailing, crc32):",
        f"    lead, {fields}, = unpack(buf, cd_ofs)",
        # the shape: the records' lengths, the names, the flags; the folder the first name's
        f"    if ({each('r{k}')},) != RESTS or ({each('t{k}')},) != TAILS or lead != LEAD"
        f" or f0.find(b'/') != {cut - 1}:",
        "        return OTHER",
        # every name in the folder (ASCII, so UTF-8; no NUL), sizes equal, the first header at 0
        f"    if h0 or not {each('f{k}', ' == ')} or not f0.isascii() or b'\\0' in f0"
        f" or ({each('s{k}')},) != ({each('u{k}')},):",
        "        return None",
        "    sig, n_name, n_extra = local(buf, 0)",
        "    try:",
    ]
    # Each entry: its local header (signature, the name's length as the directory's), its data
    # after it (64-byte aligned where `.storage_alignment` says torch 2.x wrote it), the
    # descriptor right after the data with the entry's CRC, the next header (or the directory)
    # right after the descriptor. (Offsets and sizes are then inside the file: no ZIP64 field.)
    for k in range(n):
        following = f"h{k + 1}" if k + 1 < n else "cd_ofs"
        aligned = " or a & 63" if alignment is not None else ""
        out += [
            f"        a = h{k} + {30 + n_names[k]} + n_extra",
            f"        if sig != {_LOCAL_SIG} or n_name != {n_names[k]}{aligned}"
            f" or a + s{k} + {DESCRIPTOR_SIZE} != {following}:",
            "            return None",
            f"        d, crc, sig, n_name, n_extra = link(buf, a + s{k})",
            f"        if d != {_DESCRIPTOR_SIG} or crc != c{k}:",
            "            return None",
        ]
        out.append(f"        a{k} = a")
    out += [
        "    except error:  # a header past the end",
        "        return None",
        # the records torch.load reads at open (read_layout's rules)
        f"    if s{pkl} > {MAX_PICKLE}:",
        "        return None",
        f"    raw = buf[a{version}:a{version} + min(s{version}, 64)]",
        "    ok = versions.get(raw)",
        "    if not (version_ok(raw) if ok is None else ok):",
        "        return None",
    ]
    if byteorder is not None:
        out += [f"    if buf[a{byteorder}:a{byteorder} + min(s{byteorder}, 16)] not in (b'little', b'big'):",
                "        return None"]
    if serial is not None:  # (text that is not ASCII: read_layout decodes it)
        out += [f"    if not buf[a{serial}:a{serial} + min(s{serial}, 256)].isascii():",
                "        return None"]
    if alignment is not None:  # (the usual b"64", ASCII digits: no exception to raise and catch)
        out += [f"    raw = buf[a{alignment}:a{alignment} + min(s{alignment}, 32)]",
                "    if not raw.isdigit():",
                "        try:",
                "            int(raw)",
                "        except ValueError:",
                "            return None"]
    # With crc32: every entry's bytes against its CRC (torchzip.check_torch_zip's loop), where
    # the archive has CRCs (without them the caller runs the full check: the pickle, zero pages).
    out += [
        f"    crcs = ({each('c{k}')},)",
        f"    no_crc = 0 in crcs and no_crc_of(crcs, ({each('s{k}')},))",
        "    if crc32 is not None and not no_crc:",
        # (storages named otherwise than torch.save names them: the pickle walk's, check_torch_zip)
        *(["        return None"] if not numbered else []),
        "        view = memoryview(buf)",
        f"        if ({each('crc32(view[a{k}:a{k} + s{k}])')},) != crcs:",
        "            return None",
        "    return new(ZipResult, (trailing, no_crc, False))",
    ]
    return "\n".join(out) + "\n"


def _no_crc(crcs: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """Written without CRCs: some entry has data, and none with data has a CRC."""
    return any(sizes) and not any(crc for crc, n in zip(crcs, sizes, strict=True) if n)


def _version_ok(raw: bytes) -> bool:
    """Whether torch.load takes this `version` record (read_layout's rule: 1..MAX_VERSION as
    std::stoull reads it); kept."""
    value = int(raw) if raw[:1].isdigit() and raw.strip().isdigit() else _stoull(raw)
    ok = value is not None and 1 <= value <= MAX_VERSION
    if len(_VERSIONS) < 64:
        _VERSIONS[raw] = ok
    return ok
