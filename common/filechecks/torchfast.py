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
    ZIP64_LOCATOR,
    ZIP64_LOCATOR_SIG,
    ZipResult,
    _stoull,
)

# One central directory record, the fields the check needs: the first 12 bytes (signature,
# versions, flags, method: alike in every record torch.save writes), CRC, sizes, the next 14
# bytes (name, extra and comment lengths, disk, attributes: compared with the shape's, where all
# but the name's length are 0 as torch.save writes them), the local header's offset, the name.
_RECORD = "12s4xIII14sI{}s"
_FIELDS = 7
_LOCAL = struct.Struct("<4s22xI")  # signature; name and extra lengths as one number
_DESCRIPTOR = struct.Struct("<4sI")  # signature, CRC-32 (miniz: after the data of an entry with flag 8)
_SHAPES: dict[tuple[int, int], list[tuple[struct.Struct, tuple[bytes, ...], tuple[int, ...]]]] = {}
MAX_SHAPES = 64  # directory shapes kept (an extraction has a few: the digits of its indices)
_NAMES: dict[bytes, dict[bytes, int]] = {}  # see _names
_LEADS: dict[bytes, int] = {}  # a record's first 12 bytes -> its flags, or -1 where read_layout must decide


def check_whole_buffer(buf: bytes) -> ZipResult | None:
    """The structural check of the torch.save file whose bytes are all of `buf`: its ZipResult
    when it is whole and in torch.save's own layout, None otherwise (read_layout decides). The
    bytes are a file's (read_layout's `on_disk`): the data descriptors are checked."""
    size = len(buf)
    # (the first local header's flags: torch.save's entries all have a data descriptor)
    if size < 98 or not buf.startswith(LOCAL_SIG) or not buf[6] & 0x8:
        return None
    # The end record where miniz's first window finds it (torchzip._first_window).
    eocd = buf.rfind(EOCD_SIG, max(0, size - PAGE), size - EOCD.size + 4)
    if eocd < 0:
        return None
    _, disk, cd_disk, n_disk, n_total, cd_size, cd_ofs, comment = EOCD.unpack_from(buf, eocd)
    if eocd >= ZIP64_LOCATOR.size + ZIP64_EOCD.size:  # (read_directory's ZIP64 rules)
        sig, _, z64, disks = ZIP64_LOCATOR.unpack_from(buf, eocd - ZIP64_LOCATOR.size)
        if sig == ZIP64_LOCATOR_SIG:
            if z64 > size - ZIP64_EOCD.size:
                return None
            sig, rec_size, _, _, disk, cd_disk, n_disk, n_total, cd_size, cd_ofs = ZIP64_EOCD.unpack_from(buf, z64)
            if sig != ZIP64_EOCD_SIG or rec_size < ZIP64_EOCD.size - 12 or disks != 1:
                return None
    if disk or cd_disk or n_total != n_disk or not 0 < n_total * CENTRAL.size <= cd_size \
            or cd_ofs + cd_size > size:
        return None
    directory = _directory(buf, cd_ofs, n_total, cd_size)
    if directory is None:
        return None
    v, name_sizes = directory
    leads, crcs, csizes, usizes, headers, names = (v[0::_FIELDS], v[1::_FIELDS], v[2::_FIELDS], v[3::_FIELDS],
                                                   v[5::_FIELDS], v[6::_FIELDS])
    flags = _LEADS.get(leads[0])
    if flags is None:
        flags = _lead(leads[0])
    # Every record alike, as torch.save writes them: stored, no refused flag, a data descriptor
    # after the data, sizes equal and below ZIP64's (whose extra fields read_layout reads).
    if flags < 0 or not flags & 0x8 or leads.count(leads[0]) != n_total or csizes != usizes \
            or max(headers) >= 0xFFFFFFFF or max(csizes) >= 0xFFFFFFFF:
        return None
    # The names: one folder (the first name's), ASCII (so UTF-8), none a directory, none twice
    # (ASCII case aside). What the names say once the folder is taken off is kept (_names).
    first = names[0]
    cut = first.find(b"/") + 1
    joined = b"\0".join(names)
    rest = joined.replace(b"\0" + first[:cut], b"\0")[cut:]
    at = _NAMES.get(rest)
    if at is None:
        at = _names(rest, n_total)
    # (`rest` has as many NULs as there are separators, and every separator lost the folder: no
    # name holds a NUL, and each is in the folder; see _names)
    if not cut or not at or len(at) != n_total or len(rest) != len(joined) - n_total * cut or not first.isascii():
        return None
    # Each local header: its signature, its name length as the central directory's, the data
    # inside the file, 64-byte aligned (torch 2.x: `.storage_alignment`), the data descriptor
    # right after it; each check is read_layout's for the storages and data.pkl.
    aligned = b".storage_alignment" in at
    starts = []
    unpack_local, unpack_descriptor = _LOCAL.unpack_from, _DESCRIPTOR.unpack_from
    try:
        for header, n_name, csize, crc in zip(headers, name_sizes, csizes, crcs, strict=True):
            sig, lengths = unpack_local(buf, header)
            start = header + n_name + (lengths >> 16)
            if sig != LOCAL_SIG or lengths & 0xFFFF != n_name - 30 or start + csize > size \
                    or (aligned and start & 63) \
                    or unpack_descriptor(buf, start + csize) != (DESCRIPTOR_SIG, crc):
                return None
            starts.append(start)
    except struct.error:  # a header or descriptor past the end
        return None
    # The records torch.load reads at open (read_layout's rules).
    i = at.get(b".data/version", at.get(b"version"))
    pkl = at.get(b"data.pkl")
    if i is None or pkl is None or usizes[pkl] > MAX_PICKLE:
        return None
    raw = buf[starts[i]:starts[i] + min(usizes[i], 64)]
    value = int(raw) if raw[:1].isdigit() and raw.strip().isdigit() else _stoull(raw)
    if value is None or not 1 <= value <= MAX_VERSION:
        return None
    i = at.get(b"byteorder")
    if i is not None and buf[starts[i]:starts[i] + min(usizes[i], 16)] not in (b"little", b"big"):
        return None
    i = at.get(b".data/serialization_id")
    if i is not None and not buf[starts[i]:starts[i] + min(usizes[i], 256)].isascii():
        return None  # (text that is not ASCII: read_layout decodes it)
    if aligned:
        i = at[b".storage_alignment"]
        try:
            int(buf[starts[i]:starts[i] + min(usizes[i], 32)])
        except ValueError:
            return None
    no_crc = any(usizes) and not any(crc for crc, usize in zip(crcs, usizes, strict=True) if usize)
    return ZipResult(max(0, size - eocd - EOCD.size - comment), no_crc, False)


def _names(rest: bytes, n_total: int) -> dict[bytes, int] | None:
    """The names of an archive's entries, its folder taken off and NUL-separated: each one's index
    by its lower-case name (torch.load's lookup) when there are n_total of them, ASCII, none empty,
    none a directory (ending in /), none twice; else None. Kept: the files of an extraction have
    the same names but for their folder."""
    parts = rest.split(b"\0")
    at = dict(zip(rest.lower().split(b"\0"), range(n_total), strict=False))  # (lengths: below)
    if len(parts) != n_total or len(at) != n_total or not rest.isascii() or not all(parts) \
            or any(p.endswith(b"/") for p in parts):
        return None
    if len(_NAMES) >= MAX_SHAPES:
        _NAMES.clear()
    _NAMES[rest] = at
    return at


def _lead(lead: bytes) -> int:
    """A record's first 12 bytes: its flags when it is a central directory record of a stored
    entry without a flag miniz refuses, else -1; kept."""
    sig, _, _, flags, method = struct.unpack("<4sHHHH", lead)
    ok = sig == CENTRAL_SIG and method == 0 and not flags & REFUSED_FLAGS
    if len(_LEADS) < 256:
        _LEADS[lead] = flags if ok else -1
    return flags if ok else -1


def _directory(buf: bytes, cd_ofs: int, n_total: int, cd_size: int) -> tuple[tuple, tuple[int, ...]] | None:
    """The central directory unpacked whole (_FIELDS values a record) and each record's 30 + name
    length; None when it is not one torch.save writes."""
    for layout, tails, name_sizes in _SHAPES.get((n_total, cd_size), ()):
        v = layout.unpack_from(buf, cd_ofs)
        if v[4::_FIELDS] == tails:
            return v, name_sizes
    shape = _shape(buf, cd_ofs, n_total, cd_size)  # a shape not seen yet
    if shape is None:
        return None
    return shape[0].unpack_from(buf, cd_ofs), shape[2]


def _shape(buf: bytes, cd_ofs: int, n_total: int, cd_size: int) -> tuple | None:
    """The struct that unpacks this central directory whole, its records' length fields (what
    makes two directories the same shape) and each record's 30 + name length; kept by entry
    count and size. None when the directory is not one torch.save writes (read_layout decides)."""
    fmt = ["<"]
    lens = []
    name_sizes = []
    pos, end = cd_ofs, cd_ofs + cd_size
    for _ in range(n_total):
        if end - pos < CENTRAL.size or not buf.startswith(CENTRAL_SIG, pos):
            return None
        n_name, n_extra, n_comment, disk, attrs, ext_attrs = struct.unpack_from("<HHHHHI", buf, pos + 28)
        if n_extra or n_comment or disk or attrs or ext_attrs:
            return None
        fmt.append(_RECORD.format(n_name))
        lens.append(buf[pos + 28:pos + 42])
        name_sizes.append(30 + n_name)
        pos += CENTRAL.size + n_name
    if pos != end:
        return None
    shape = (struct.Struct("".join(fmt)), tuple(lens), tuple(name_sizes))
    if sum(map(len, _SHAPES.values())) >= MAX_SHAPES:
        _SHAPES.clear()
    _SHAPES.setdefault((n_total, cd_size), []).append(shape)
    return shape
