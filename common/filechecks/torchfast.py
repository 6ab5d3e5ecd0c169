"""The structural check of a small torch.save file held whole in memory, in few operations.

A first check of an extraction is tens of thousands of files of 10-16 ZIP entries each; read_layout
(torchzip.py) spends a few µs of Python on every entry. Files as torch.save writes them
(PyTorchStreamWriter through miniz: caffe2/serialize/inline_container.cc) are all alike: every
entry stored, the same flags on every entry, names in one folder, ASCII, no extra field in the
central directory, no external attributes, each local header's name as the central directory's,
the data 64-byte aligned (torch 2.x) and a data descriptor right after it. Here such a file is
checked with the whole central directory unpacked at once (one struct per directory shape,
kept: the files of one extraction have a handful of shapes), the names checked together, and
one short loop over the local headers.

This is a fast path only: it answers "whole" for a file only where every condition read_layout
checks holds (it checks each of them, most of them more strictly), and None for anything else,
damaged or merely unusual: read_layout then decides, and gives the reason. So a verdict never
depends on which path ran (tests/test_extractions_fastpath.py holds the two equal on every
damage the differential suite makes, on torch 2.13's and torch 1.13's own files).
"""

from __future__ import annotations

import struct

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
)

_new = tuple.__new__  # a NamedTuple made without its Python-level __new__ (once a file)
# One central directory record, the fields the check needs: the first 12 bytes (signature,
# versions, flags, method: alike in every record torch.save writes), CRC, sizes, the next 14
# bytes (name, extra and comment lengths, disk, attributes: compared with the shape's, where all
# but the name's length are 0 as torch.save writes them), the local header's offset, the name
# as its folder (the first name's, up to its first /) and the rest.
_RECORD = "12s4xIII14sI{}s{}s"
_FIELDS = 8
_LOCAL = struct.Struct("<I22xI")  # signature; name and extra lengths as one number
# An entry's data descriptor (signature, CRC-32; then its sizes, 16 bytes in all) and the next
# entry's local header (signature; name and extra lengths), which miniz writes right after it.
_LINK = struct.Struct("<II8xI22xI")
DESCRIPTOR_SIZE = 16
_LOCAL_SIG, _DESCRIPTOR_SIG = int.from_bytes(LOCAL_SIG, "little"), int.from_bytes(DESCRIPTOR_SIG, "little")
# torch.save's ending: the ZIP64 end record (its size, disks, counts, the directory's size and
# offset), the ZIP64 locator (the record's offset, disks), the end record (its comment's length).
_END = struct.Struct("<4xQ4xIIQQQQ" "8xQI" "20xH")
MAX_SHAPES = 64  # directory shapes kept (an extraction has a few: the digits of its indices)
# (entry count, directory size) -> [(its struct, the records' length fields, each record's 30 +
# name length, the folder's length)]
_SHAPES: dict[tuple[int, int], list[tuple[struct.Struct, tuple[bytes, ...], tuple[int, ...], int]]] = {}
# The names without their folder -> the indices of the records torch.load reads at open (_names);
# the last one found, to compare with first.
_NAMES: dict[tuple[bytes, ...], tuple[int | None, ...]] = {}
_LAST_NAMES: list = [None, None]
_LEADS: dict[bytes, int] = {}  # a record's first 12 bytes -> its flags, or -1 where read_layout must decide
_VERSIONS: dict[bytes, bool] = {}  # a `version` record's bytes -> whether torch.load takes it


def check_whole_buffer(buf: bytes) -> ZipResult | None:
    """The structural check of the torch.save file whose bytes are all of `buf`: its ZipResult
    when it is whole and in torch.save's own layout, None otherwise (read_layout decides). The
    bytes are a file's (read_layout's `on_disk`): the data descriptors are checked.
    (Each operation here runs once for every file of a first check: what can be decided once
    for a shape of directory or a set of names is, and kept: _SHAPES, _NAMES.)"""
    size = len(buf)
    # (the first local header's flags: torch.save's entries all have a data descriptor)
    if size < 98 or not buf.startswith(LOCAL_SIG) or not buf[6] & 0x8:
        return None
    # The end record where miniz's first window finds it (torchzip._first_window): the last
    # signature with the record's 22 bytes after it, so at size - 22 when there is one there.
    eocd = size - 22 if buf.startswith(EOCD_SIG, size - 22) else buf.rfind(EOCD_SIG, max(0, size - PAGE), size - 18)
    if eocd < 76:  # (room for torch.save's ZIP64 end record and locator before it)
        return None
    if buf.startswith(ZIP64_LOCATOR_SIG, eocd - 20) and buf.startswith(ZIP64_EOCD_SIG, eocd - 76):
        # torch.save's ending, read at once
        rec_size, disk, cd_disk, n_disk, n_total, cd_size, cd_ofs, z64, disks, comment = _END.unpack_from(
            buf, eocd - 76)
        # (read_directory's ZIP64 rules; a locator pointing elsewhere is read_layout's to follow)
        if z64 != eocd - 76 or rec_size < ZIP64_EOCD.size - 12 or disks != 1:
            return None
    else:
        if buf.startswith(ZIP64_LOCATOR_SIG, eocd - 20):
            return None
        _, disk, cd_disk, n_disk, n_total, cd_size, cd_ofs, comment = EOCD.unpack_from(buf, eocd)
    if disk or cd_disk or n_total != n_disk or not 0 < n_total * CENTRAL.size <= cd_size \
            or cd_ofs + cd_size > size:
        return None
    # The central directory, unpacked whole by the struct of its shape (_shape); the folder is
    # the first name's up to its first /.
    for shape in _SHAPES.get((n_total, cd_size), ()):
        v = shape[0].unpack_from(buf, cd_ofs)
        if v[4::_FIELDS] == shape[1] and v[6].find(b"/") == shape[3] - 1:
            break
    else:
        shape = _shape(buf, cd_ofs, n_total, cd_size)
        if shape is None:
            return None
        v = shape[0].unpack_from(buf, cd_ofs)
    lead, folder = v[0], v[6]
    flags = _LEADS.get(lead)
    if flags is None:
        flags = _lead(lead)
    crcs, csizes, usizes, headers, rest = v[1::_FIELDS], v[2::_FIELDS], v[3::_FIELDS], v[5::_FIELDS], v[7::_FIELDS]
    # Every record alike, as torch.save writes them: stored, no refused flag, a data descriptor
    # after the data, sizes equal and below ZIP64's (whose extra fields read_layout reads); every
    # name in the folder, which is ASCII (so UTF-8) and holds no NUL.
    if flags < 0 or not flags & 0x8 or v[0::_FIELDS].count(lead) != n_total or csizes != usizes \
            or 0xFFFFFFFF in csizes or v[6::_FIELDS].count(folder) != n_total or not folder.isascii() \
            or b"\0" in folder:
        return None
    # The names once the folder is taken off: ASCII, none a directory, none twice (ASCII case
    # aside), and the records torch.load reads at open (_names; kept).
    if rest == _LAST_NAMES[0]:
        known = _LAST_NAMES[1]
    else:
        known = _NAMES.get(rest)
        if known is None:
            known = _names(rest)
            if known is None:
                return None
        _LAST_NAMES[:] = rest, known
    version, pkl, byteorder, serial, alignment = known
    # Each local header and data descriptor, as miniz writes them: the first header at 0, each
    # with its signature and the central directory's name length, the data after it (64-byte
    # aligned: torch 2.x, `.storage_alignment`), the descriptor right after the data with the
    # entry's CRC, the next header right after the descriptor, the central directory after the
    # last one. Each check is read_layout's for the storages and data.pkl, or stricter.
    if headers[0]:
        return None
    sig, lengths = _LOCAL.unpack_from(buf, 0)
    mask = 63 if alignment is not None else 0
    header = 0
    starts = []
    append, unpack = starts.append, _LINK.unpack_from
    try:
        for n_name, csize, crc, following in zip(shape[2], csizes, crcs, headers[1:] + (cd_ofs,), strict=True):
            start = header + n_name + (lengths >> 16)
            end = start + csize
            if sig != _LOCAL_SIG or lengths & 0xFFFF != n_name - 30 or start & mask \
                    or end + DESCRIPTOR_SIZE != following:
                return None
            append(start)
            got_sig, got_crc, sig, lengths = unpack(buf, end)  # (the last one's "next header": the directory's)
            if got_sig != _DESCRIPTOR_SIG or got_crc != crc:
                return None
            header = following
    except struct.error:  # a header past the end
        return None
    # The records torch.load reads at open (read_layout's rules).
    if usizes[pkl] > MAX_PICKLE:
        return None
    raw = buf[starts[version]:starts[version] + min(usizes[version], 64)]
    ok = _VERSIONS.get(raw)
    if ok is None:
        ok = _version(raw)
    if not ok or byteorder is not None \
            and buf[starts[byteorder]:starts[byteorder] + min(usizes[byteorder], 16)] not in (b"little", b"big"):
        return None
    if serial is not None and not buf[starts[serial]:starts[serial] + min(usizes[serial], 256)].isascii():
        return None  # (text that is not ASCII: read_layout decodes it)
    if alignment is not None:
        raw = buf[starts[alignment]:starts[alignment] + min(usizes[alignment], 32)]
        if not raw.isdigit():  # (the usual b"64", ASCII digits: no exception to raise and catch)
            try:
                int(raw)
            except ValueError:
                return None
    # (without CRCs: no entry with data has one; an archive with them seldom has an entry with 0)
    no_crc = 0 in crcs and any(usizes) and not any(crc for crc, usize in zip(crcs, usizes, strict=True) if usize)
    return _new(ZipResult, (max(0, size - eocd - EOCD.size - comment), no_crc, False))


def _version(raw: bytes) -> bool:
    """Whether torch.load takes this `version` record (read_layout's rule: 1..MAX_VERSION as
    std::stoull reads it); kept."""
    value = int(raw) if raw[:1].isdigit() and raw.strip().isdigit() else _stoull(raw)
    ok = value is not None and 1 <= value <= MAX_VERSION
    if len(_VERSIONS) < 64:
        _VERSIONS[raw] = ok
    return ok


def _names(rest: tuple[bytes, ...]) -> tuple[int | None, ...] | None:
    """The names of an archive's entries, their folder taken off, when they are ASCII, none
    empty, none a directory (ending in /), none holding a NUL, none twice (by its lower-case
    name: torch.load's lookup), and the records torch.load reads at open are among them: the
    indices of `version` (or `.data/version`), data.pkl, and of byteorder,
    `.data/serialization_id` and `.storage_alignment` or None; else None. Kept: the files of an
    extraction have the same names but for their folder."""
    at = {name.lower(): i for i, name in enumerate(rest)}
    if len(at) != len(rest) or not all(rest) or any(not p.isascii() or p.endswith(b"/") or b"\0" in p for p in rest):
        return None
    known = (at.get(b".data/version", at.get(b"version")), at.get(b"data.pkl"), at.get(b"byteorder"),
             at.get(b".data/serialization_id"), at.get(b".storage_alignment"))
    if known[0] is None or known[1] is None:
        return None
    if len(_NAMES) >= MAX_SHAPES:
        _NAMES.clear()
    _NAMES[rest] = known
    return known


def _lead(lead: bytes) -> int:
    """A record's first 12 bytes: its flags when it is a central directory record of a stored
    entry without a flag miniz refuses, else -1; kept."""
    sig, _, _, flags, method = struct.unpack("<4sHHHH", lead)
    ok = sig == CENTRAL_SIG and method == 0 and not flags & REFUSED_FLAGS
    if len(_LEADS) < 256:
        _LEADS[lead] = flags if ok else -1
    return flags if ok else -1


def _shape(buf: bytes, cd_ofs: int, n_total: int, cd_size: int) -> tuple | None:
    """The struct that unpacks this central directory whole, its records' length fields (what
    makes two directories the same shape), each record's 30 + name length and the length of the
    folder (the first name's up to its first /, which every name is longer than); kept by entry
    count and size. None when the directory is not one torch.save writes (read_layout decides)."""
    fmt = ["<"]
    lens = []
    name_sizes = []
    pos, end = cd_ofs, cd_ofs + cd_size
    first = buf[pos + CENTRAL.size:pos + CENTRAL.size + int.from_bytes(buf[pos + 28:pos + 30], "little")]
    cut = first.find(b"/") + 1
    if not cut:
        return None
    for _ in range(n_total):
        if end - pos < CENTRAL.size or not buf.startswith(CENTRAL_SIG, pos):
            return None
        n_name, n_extra, n_comment, disk, attrs, ext_attrs = struct.unpack_from("<HHHHHI", buf, pos + 28)
        if n_extra or n_comment or disk or attrs or ext_attrs or n_name <= cut:
            return None
        fmt.append(_RECORD.format(cut, n_name - cut))
        lens.append(buf[pos + 28:pos + 42])
        name_sizes.append(30 + n_name)
        pos += CENTRAL.size + n_name
    if pos != end:
        return None
    shape = (struct.Struct("".join(fmt)), tuple(lens), tuple(name_sizes), cut)
    if sum(map(len, _SHAPES.values())) >= MAX_SHAPES:
        _SHAPES.clear()
    _SHAPES.setdefault((n_total, cd_size), []).append(shape)
    return shape
