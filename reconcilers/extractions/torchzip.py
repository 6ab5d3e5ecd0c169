"""Is a torch.save archive whole? Read as torch.load reads it, without torch.

torch.save writes a ZIP through miniz (torch/csrc: caffe2/serialize/inline_container.cc,
third_party/miniz-3.0.2): every entry stored, its data 64-byte aligned (padding in the local
header's extra field), the local header with CRC and sizes 0 and a data descriptor after the
data; the real CRC-32 and sizes in the central directory; a ZIP64 end record always. torch.load
finds the end record as miniz does (`mz_zip_reader_locate_header_sig`: backwards from the end,
at most ~64 KiB plus one 4 KiB read), reads the central directory, takes the archive's folder
from the first entry's name, requires `version` (1..10), reads `data.pkl` and then each storage
`data/<key>` at the offset its local header gives. It checks no CRC.

So, in that order: the first bytes, the end record (miniz's search and checks, so trailing bytes
are accepted exactly where torch accepts them), the central directory, each local header
(signature, name length, bounds, the 64-byte alignment torch 2.x records), the records torch
reads at open (`version`, `byteorder`, `.storage_alignment`), the pickle (torchpickle.py) and
every storage it names, present with exactly numel × itemsize bytes. That is the structural
check. The content check adds each entry's CRC-32, computed over the bytes torch would read
(or, for an archive written with CRCs off, a look for crash-zeroed pages in float storages).

Everything reads through a Source: a plain file, or the content of a .gz seen once as a stream
(gzipstream.py), which holds only some ranges and says Missing for the others.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from .torchpickle import PickleDamage, PickleInfo, read_pickle

LOCAL_SIG = b"PK\x03\x04"
CENTRAL_SIG = b"PK\x01\x02"
EOCD_SIG = b"PK\x05\x06"
ZIP64_EOCD_SIG = b"PK\x06\x06"
ZIP64_LOCATOR_SIG = b"PK\x06\x07"
DESCRIPTOR_SIG = b"PK\x07\x08"
EOCD = struct.Struct("<4sHHHHIIH")  # 22 bytes
ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")  # 56 bytes
ZIP64_LOCATOR = struct.Struct("<4sIQI")  # 20 bytes
CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # 46 bytes
LOCAL = struct.Struct("<4sHHHHHIIIHH")  # 30 bytes
# miniz: the end record is searched for in the last UINT16_MAX + its size bytes, 4 KiB at a
# time, each read overlapping the previous by 3 bytes.
SEARCH_BACK = 0xFFFF + EOCD.size
TAIL = SEARCH_BACK + 2 * 4096
MAX_VERSION = 10  # caffe2/serialize/versions.h kMaxSupportedFileFormatVersion (0xA)
MAX_PICKLE = 64 * 2**20  # a sample's data.pkl is ~0.5 KiB
PAGE = 4096


class ZipDamage(Exception):
    """The archive is not whole; the message says why."""


class Missing(Exception):
    """The Source does not hold these bytes (a streamed .gz): read it again, keeping them."""


class Source(Protocol):
    size: int

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to n bytes at offset (fewer only at the end)."""

    def crc_of(self, offset: int, n: int) -> int:
        """CRC-32 of the n bytes at offset."""

    def first_zero_page(self, ranges: list[tuple[int, int]]) -> int | None:
        """Offset of the first crash-zeroed page in these byte ranges (integrity.FileSource)."""


@dataclass(frozen=True)
class Entry:
    name: bytes
    flags: int
    method: int
    crc: int
    csize: int
    usize: int
    header: int  # offset of its local header
    ext_attr: int = 0  # external attributes (0x10: an MS-DOS directory, which miniz never extracts)


@dataclass(frozen=True)
class ZipResult:
    trailing: int  # bytes after the end record, ignored as torch.load ignores them
    no_crc: bool  # every non-empty entry has CRC 0: written with CRCs off
    content: bool  # the entries' CRCs (or, without CRCs, float storages' pages) were checked


def find_end_record(tail: bytes, base: int, size: int) -> int | None:
    """Where miniz finds the end-of-central-directory record: the last signature with at
    least 22 bytes after it, searching back from the end 4 KiB at a time (each step 4093
    bytes), giving up once the window starts UINT16_MAX + 22 bytes or more before the end.
    `tail` holds the file from offset `base` to the end."""
    if size < EOCD.size:
        return None
    cur = max(size - 4096, 0)
    while True:
        n = min(4096, size - cur)
        last = min(n - 4, size - EOCD.size - cur)  # the highest start i allowed in this window
        if last >= 0:
            i = tail.rfind(EOCD_SIG, cur - base, cur - base + last + 4)
            if i >= 0:
                return base + i
        if cur == 0 or size - cur >= SEARCH_BACK:
            return None
        cur = max(cur - (4096 - 3), 0)


@dataclass
class Directory:
    entries: list[Entry]
    end_record: int
    trailing: int
    cd_offset: int


def read_directory(src: Source) -> Directory:
    size = src.size
    n_tail = min(size, TAIL)
    tail = src.read_at(size - n_tail, n_tail)
    eocd = find_end_record(tail, size - n_tail, size)
    if eocd is None:
        if tail[-PAGE:] == bytes(min(PAGE, len(tail))):
            raise ZipDamage("the end of the file reads as zeros (lost in a crash?): no ZIP end record")
        raise ZipDamage("truncated: no ZIP central directory at the end (cut off mid-write)")
    _, disk, cd_disk, n_disk, n_total, cd_size, cd_ofs, comment = EOCD.unpack(src.read_at(eocd, EOCD.size))
    # miniz (mz_zip_reader_read_central_dir): a ZIP64 locator just before the end record, and
    # a ZIP64 end record where it points, replace the 32-bit values.
    if eocd >= ZIP64_LOCATOR.size + ZIP64_EOCD.size:
        sig, _, z64, disks = ZIP64_LOCATOR.unpack(src.read_at(eocd - ZIP64_LOCATOR.size, ZIP64_LOCATOR.size))
        if sig == ZIP64_LOCATOR_SIG:
            if z64 > size - ZIP64_EOCD.size:
                raise ZipDamage(f"the ZIP64 locator points to byte {z64}, past the end of the file")
            rec = ZIP64_EOCD.unpack(src.read_at(z64, ZIP64_EOCD.size))
            if rec[0] == ZIP64_EOCD_SIG:
                _, rec_size, _, _, disk, cd_disk, n_disk, n_total, cd_size, cd_ofs = rec
                if rec_size < ZIP64_EOCD.size - 12:
                    raise ZipDamage("bad ZIP64 end record")
                if disks != 1:
                    raise ZipDamage(f"ZIP64 locator says {disks} disks")
                if n_total > 0xFFFFFFFF or n_disk > 0xFFFFFFFF or cd_size > 0xFFFFFFFF:
                    raise ZipDamage("ZIP64 end record: counts beyond what torch reads")
    if n_total != n_disk or (disk | cd_disk and (disk, cd_disk) != (1, 1)):
        raise ZipDamage("ZIP end record says the archive spans several disks")
    if cd_size < n_total * CENTRAL.size or cd_ofs + cd_size > size:
        raise ZipDamage(f"ZIP central directory ({n_total} entries, {cd_size} bytes at {cd_ofs}) does not fit "
                        f"in the file's {size} bytes")
    if n_total == 0:
        raise ZipDamage("the ZIP archive holds no entries")
    cd = src.read_at(cd_ofs, cd_size)
    entries = _central_entries(cd, n_total, disk, size)
    return Directory(entries, eocd, max(0, size - eocd - EOCD.size - comment), cd_ofs)


def _central_entries(cd: bytes, count: int, this_disk: int, size: int) -> list[Entry]:
    out = []
    pos = 0
    for _ in range(count):
        if len(cd) - pos < CENTRAL.size or cd[pos:pos + 4] != CENTRAL_SIG:
            raise ZipDamage(f"ZIP central directory entry {len(out)} is damaged (no signature)")
        (_, _, _, flags, method, _, _, crc, csize, usize, n_name, n_extra, n_comment, disk_start, _, ext_attr,
         header) = CENTRAL.unpack_from(cd, pos)
        end = pos + CENTRAL.size + n_name + n_extra + n_comment
        if end > len(cd):
            raise ZipDamage(f"ZIP central directory entry {len(out)} runs past the directory")
        name = cd[pos + CENTRAL.size:pos + CENTRAL.size + n_name]
        if 0xFFFFFFFF in (csize, usize, header):
            usize, csize, header = _zip64_extra(cd[pos + CENTRAL.size + n_name:end - n_comment], usize, csize,
                                                header)
        label = name.decode("utf-8", "replace")
        if (method == 0 and usize != csize) or (usize and not csize):
            raise ZipDamage(f"entry {label}: sizes {csize}/{usize} disagree")
        if disk_start == 0xFFFF or disk_start not in (this_disk, 1):
            raise ZipDamage(f"entry {label}: on another disk")
        if header + LOCAL.size + csize > size:
            raise ZipDamage(f"entry {label} ends beyond the file's {size} bytes (bytes missing in the middle?)")
        if method != 0:
            # torch.save stores every entry: another method is a damaged directory. Whether torch
            # still loads the original tensors then depends on the record and the load mode (an mmap
            # load of a storage ignores the method), so the file is judged by what was written.
            raise ZipDamage(f"entry {label} is compressed (method {method}); torch.save stores entries "
                            "(the directory's bytes are not what was written)")
        out.append(Entry(name, flags, method, crc, csize, usize, header, ext_attr))
        pos = end
    return out


def _zip64_extra(extra: bytes, usize: int, csize: int, header: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            values = list(struct.unpack_from(f"<{n // 8}Q", extra, pos + 4)) if pos + 4 + n <= len(extra) else []
            got = []
            for v in (usize, csize, header):
                got.append(values.pop(0) if v == 0xFFFFFFFF and values else v)
            return got[0], got[1], got[2]
        pos += 4 + n
    return usize, csize, header


def _stoull(text: bytes) -> int | None:
    """std::stoull as torch parses `version`: leading white space, a sign, base-10 digits up
    to the first other character; None when there is no digit or it overflows."""
    s = text.lstrip(b" \t\n\v\f\r")
    neg = s[:1] == b"-"
    if s[:1] in (b"+", b"-"):
        s = s[1:]
    digits = b""
    for c in s:
        if not 48 <= c <= 57:
            break
        digits += bytes((c,))
    if not digits or int(digits) > 2**64 - 1:
        return None
    value = int(digits)
    return (2**64 - value) % 2**64 if neg else value


# Records PyTorchStreamReader / torch.load read besides the storages (getRecord, which checks
# the local header's signature and bounds); their values matter only for these three.
READ_AT_OPEN = ("data.pkl", "version", ".data/version", "byteorder", ".storage_alignment", ".format_version",
                ".data/serialization_id")
# General-purpose flags miniz refuses to extract: encrypted, patched data, strong encryption.
REFUSED_FLAGS = 0x1 | 0x20 | 0x40 | 0x2000


def check_torch_zip(src: Source, content: bool, on_disk: bool = True) -> tuple[ZipResult, PickleInfo]:
    """Raises ZipDamage (or PickleDamage) with the reason; Missing for what the Source lacks.
    `on_disk`: the bytes are a file's, which a disk or a crash may have damaged (not a .gz's
    content, which the gzip CRC has proven): then the data descriptors after data.pkl and the
    storages are checked too, and an archive without CRCs gets the zero-page look."""
    if src.read_at(0, 4) != LOCAL_SIG:  # torch.load's _is_zipfile; otherwise it tries the legacy format
        head = src.read_at(0, PAGE)
        if head == bytes(len(head)):
            raise ZipDamage("the file starts with zeros (lost in a crash?): not a torch.save ZIP archive")
        raise ZipDamage("not a torch.save ZIP archive (no PK signature at the start)")
    d = read_directory(src)
    first = d.entries[0].name
    if b"/" not in first:
        raise ZipDamage(f"entry {first.decode('utf-8', 'replace')} is not in the archive's folder")
    prefix = first[:first.index(b"/") + 1]
    by_name: dict[bytes, Entry] = {}
    for e in d.entries:
        label = e.name.decode("utf-8", "replace")
        try:
            e.name.decode("utf-8")  # torch.load lists the records as str
        except UnicodeDecodeError:
            raise ZipDamage(f"entry name {label!r} is not UTF-8") from None
        if not e.name.startswith(prefix):
            raise ZipDamage(f"entry {label} is not in the archive's folder {prefix.decode('utf-8', 'replace')}")
        if e.flags & REFUSED_FLAGS:
            raise ZipDamage(f"entry {label} is marked encrypted or patched (flags {e.flags:#06x}; "
                            "the directory's bytes are not what was written)")
        if e.name.endswith(b"/") or e.ext_attr & 0x10:  # mz_zip_reader_is_file_a_directory
            # torch.save writes neither; torch 2.x still loads a storage so marked at its offset, so
            # this too is judged by what was written.
            raise ZipDamage(f"entry {label} is marked as a directory: torch would read nothing from it "
                            "(the directory's bytes are not what was written)")
        # miniz looks names up without regard to ASCII case
        if by_name.setdefault(e.name.lower(), e) is not e:
            raise ZipDamage(f"entry {label} is in the archive twice")

    def record(name: str) -> Entry | None:
        return by_name.get((prefix + name.encode()).lower())

    starts = _data_starts(src, d)
    for name in READ_AT_OPEN:
        e = record(name)
        if e is not None:
            _readable(e, starts, src.size)
    aligned = record(".storage_alignment") is not None
    version = record(".data/version") or record("version")
    if version is None:
        raise ZipDamage("no `version` record: not a torch.save archive")
    value = _stoull(_data(src, version, starts, 64))
    if value is None or not 1 <= value <= MAX_VERSION:
        raise ZipDamage(f"`version` record unreadable or unsupported ({_data(src, version, starts, 20)!r})")
    byteorder = record("byteorder")
    if byteorder is not None and _data(src, byteorder, starts, 16) not in (b"little", b"big"):
        raise ZipDamage("`byteorder` record is neither little nor big")
    serial = record(".data/serialization_id")
    if serial is not None:
        try:
            _data(src, serial, starts, 256).decode("utf-8")  # torch hands it to Python as str
        except UnicodeDecodeError:
            raise ZipDamage("`.data/serialization_id` record is not text") from None
    alignment = record(".storage_alignment")
    if alignment is not None:
        try:
            int(_data(src, alignment, starts, 32))
        except ValueError:
            raise ZipDamage("`.storage_alignment` record is not a number") from None
    pkl = record("data.pkl")
    if pkl is None:
        raise ZipDamage("no data.pkl entry: not a torch.save archive")
    if pkl.usize > MAX_PICKLE:
        raise ZipDamage(f"data.pkl of {pkl.usize} bytes: not a sample")
    _placed(src, pkl, starts, aligned, on_disk)
    info = read_pickle(_data(src, pkl, starts, pkl.usize))
    storages = {}
    for key, s in info.storages.items():
        e = record(f"data/{key}")
        if e is None:
            raise ZipDamage(f"storage data/{key} named in data.pkl is not in the archive")
        if e.usize != s.nbytes:
            raise ZipDamage(f"storage data/{key} holds {e.usize} bytes; data.pkl says {s.numel} × {s.cls} = "
                            f"{s.nbytes}")
        _readable(e, starts, src.size)
        _placed(src, e, starts, aligned, on_disk)
        storages[key] = e
    no_crc = all(e.crc == 0 for e in d.entries if e.usize) and any(e.usize for e in d.entries)
    if content:
        if not no_crc:
            for e in d.entries:
                _readable(e, starts, src.size)
                got = src.crc_of(starts[e.name], e.csize)
                if got != e.crc:
                    raise ZipDamage(f"entry {e.name.decode('utf-8', 'replace')}: CRC-32 {got:08x}, the archive "
                                    f"says {e.crc:08x} (its bytes are not what was written)")
        elif on_disk:
            _zero_pages(src, info, storages, starts)
    return ZipResult(d.trailing, no_crc, content), info


def _data_starts(src: Source, d: Directory) -> dict[bytes, int]:
    """Each entry's data offset as torch reads it: after its local header, whose own name and
    extra lengths count (not the central directory's). Entries without a local header signature
    are left out."""
    starts = {}
    for e in d.entries:
        raw = src.read_at(e.header, LOCAL.size)
        if len(raw) == LOCAL.size and raw[:4] == LOCAL_SIG:
            n_name, n_extra = struct.unpack_from("<HH", raw, 26)
            starts[e.name] = e.header + LOCAL.size + n_name + n_extra
    return starts


def _readable(e: Entry, starts: dict[bytes, int], size: int) -> None:
    """miniz's checks when it extracts an entry: a local header, and the data inside the file."""
    label = e.name.decode("utf-8", "replace")
    if e.name not in starts:
        raise ZipDamage(f"entry {label}: no local header at byte {e.header} (overwritten?)")
    if starts[e.name] + e.csize > size:
        raise ZipDamage(f"entry {label} ends beyond the file's {size} bytes")


def _placed(src: Source, e: Entry, starts: dict[bytes, int], aligned: bool, descriptor: bool) -> None:
    """For the entries whose bytes become the tensors, that torch would read them from the right
    place: torch.save writes the same name in the local header as in the central directory,
    (since torch 2.x, which records `.storage_alignment`) the data 64-byte aligned, and right after
    the data a data descriptor repeating the CRC and sizes."""
    label = e.name.decode("utf-8", "replace")
    n_name = struct.unpack("<H", src.read_at(e.header + 26, 2))[0]
    if n_name != len(e.name):
        raise ZipDamage(f"entry {label}: its local header's name length ({n_name}) differs from the central "
                        f"directory's ({len(e.name)}): torch would read its data at the wrong place")
    start = starts[e.name]
    if aligned and start % 64:
        raise ZipDamage(f"entry {label}: data at byte {start}, not 64-byte aligned as torch.save writes")
    if descriptor and e.flags & 0x8:
        raw = src.read_at(start + e.csize, 16)
        if raw[:4] != DESCRIPTOR_SIG or struct.unpack_from("<I", raw, 4)[0] != e.crc:
            raise ZipDamage(f"entry {label}: no data descriptor right after its data (torch would read it from "
                            "the wrong place, or the bytes are not what was written)")


def _data(src: Source, e: Entry, starts: dict[bytes, int], limit: int) -> bytes:
    n = min(e.usize, limit)
    raw = src.read_at(starts[e.name], n)
    if len(raw) < n:
        raise ZipDamage(f"entry {e.name.decode('utf-8', 'replace')} cut off")
    return raw


def _zero_pages(src: Source, info: PickleInfo, storages: dict[str, Entry], starts: dict[bytes, int]) -> None:
    """Without CRCs: a page of zeros in float storage data is what a crash leaves (delayed
    allocation: the size was committed, the data not). Integer storages are left out: a
    loss_mask is zero over every prompt token."""
    floating = {t.storage for t in info.tensors if t.floating}
    keys = sorted(floating - {t.storage for t in info.tensors if not t.floating})
    spans = {key: (starts[storages[key].name], starts[storages[key].name] + storages[key].csize) for key in keys}
    at = src.first_zero_page([s for s in spans.values() if s[1] > s[0]])
    if at is not None:
        key = next((k for k, (a, b) in spans.items() if a < at + PAGE and at < b), "?")
        names = sorted({t.name for t in info.tensors if t.storage == key and t.name})
        raise ZipDamage(f"storage data/{key}{' (' + ', '.join(names) + ')' if names else ''}: a 4 KiB page of "
                        f"zeros at byte {at} in float data (lost in a crash?); the archive has no CRCs to tell")


__all__ = ["ZipDamage", "PickleDamage", "Missing", "Source", "check_torch_zip", "find_end_record"]
