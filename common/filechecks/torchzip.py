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
from typing import NamedTuple, Protocol

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
# The fields of CENTRAL the check uses: flags, method, CRC, sizes, name/extra/comment lengths,
# disk, external attributes, local header offset (the signature is compared on its own).
_CENTRAL_USED = struct.Struct("<8xHH4xIIIHHHH2xII")
# miniz: the end record is searched for in the last UINT16_MAX + its size bytes, 4 KiB at a
# time, each read overlapping the previous by 3 bytes.
SEARCH_BACK = 0xFFFF + EOCD.size
TAIL = SEARCH_BACK + 2 * 4096
MAX_VERSION = 10  # caffe2/serialize/versions.h kMaxSupportedFileFormatVersion (0xA)
MAX_PICKLE = 64 * 2**20  # a sample's data.pkl is ~0.5 KiB
# The central directory is read in one piece, as miniz reads it (mz_zip_reader_read_central_dir),
# so its size is bounded by the file's own and by this: ~100 bytes an entry, room for 600,000
# tensors (a sample holds a handful; a large model's state dict some thousands). miniz bounds it
# by the file's size alone, which a sparse file makes as large as its end record says.
MAX_CENTRAL = 64 * 2**20
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


class Entry(NamedTuple):
    name: bytes
    flags: int
    method: int
    crc: int
    csize: int
    usize: int
    header: int  # offset of its local header
    ext_attr: int = 0  # external attributes (0x10: an MS-DOS directory, which miniz never extracts)


class ZipResult(NamedTuple):
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


class Directory(NamedTuple):
    entries: list[Entry]
    end_record: int
    trailing: int
    cd_offset: int


def read_directory(src: Source) -> Directory:
    size = src.size
    # miniz's first window is the last 4 KiB, where torch.save's end record always is: only
    # when it is not there (trailing bytes) is the whole searched tail read.
    n_tail = min(size, PAGE)
    tail = src.read_at(size - n_tail, n_tail)
    eocd = _first_window(tail, size - n_tail, size)
    if eocd is None and n_tail < min(size, TAIL):
        n_tail = min(size, TAIL)
        tail = src.read_at(size - n_tail, n_tail)
        eocd = find_end_record(tail, size - n_tail, size)
    if eocd is None:
        if tail[-PAGE:] == bytes(min(PAGE, len(tail))):
            raise ZipDamage("the end of the file reads as zeros (lost in a crash?): no ZIP end record")
        raise ZipDamage("truncated: no ZIP central directory at the end (cut off mid-write)")
    base = size - n_tail
    at = eocd - base
    if at + EOCD.size > len(tail):  # the file shrank while it was read
        raise ZipDamage("truncated: no ZIP central directory at the end (cut off mid-write)")
    _, disk, cd_disk, n_disk, n_total, cd_size, cd_ofs, comment = EOCD.unpack_from(tail, at)
    # miniz (mz_zip_reader_read_central_dir): a ZIP64 locator just before the end record, and
    # a ZIP64 end record where it points, replace the 32-bit values.
    if eocd >= ZIP64_LOCATOR.size + ZIP64_EOCD.size:
        if at >= ZIP64_LOCATOR.size:
            sig, _, z64, disks = ZIP64_LOCATOR.unpack_from(tail, at - ZIP64_LOCATOR.size)
        else:
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
    if cd_size > MAX_CENTRAL:
        raise ZipDamage(f"ZIP central directory of {cd_size} bytes ({n_total} entries): more than the "
                        f"{MAX_CENTRAL} bytes a torch.save archive's is read to (not read)")
    cd = tail[cd_ofs - base:cd_ofs - base + cd_size] if cd_ofs >= base else src.read_at(cd_ofs, cd_size)
    entries = _central_entries(cd, n_total, disk, size)
    return _new(Directory, (entries, eocd, max(0, size - eocd - EOCD.size - comment), cd_ofs))


def _first_window(tail: bytes, base: int, size: int) -> int | None:
    """find_end_record's first window alone, `tail` holding the last min(size, 4 KiB) bytes of
    the file from `base` (for a file of 4 KiB or less, the whole search)."""
    i = tail.rfind(EOCD_SIG, 0, size - EOCD.size - base + 4)
    return base + i if i >= 0 and size >= EOCD.size else None


def _central_entries(cd: bytes, count: int, this_disk: int, size: int) -> list[Entry]:
    out: list[Entry] = []
    pos = 0
    unpack, fixed, n_cd, new = _CENTRAL_USED.unpack_from, CENTRAL.size, len(cd), tuple.__new__
    for _ in range(count):
        if n_cd - pos < fixed or not cd.startswith(CENTRAL_SIG, pos):
            raise ZipDamage(f"ZIP central directory entry {len(out)} is damaged (no signature)")
        flags, method, crc, csize, usize, n_name, n_extra, n_comment, disk_start, ext_attr, header = unpack(cd, pos)
        name_at = pos + fixed
        pos = name_at + n_name + n_extra + n_comment
        if pos > n_cd:
            raise ZipDamage(f"ZIP central directory entry {len(out)} runs past the directory")
        name = cd[name_at:name_at + n_name]
        if csize == 0xFFFFFFFF or usize == 0xFFFFFFFF or header == 0xFFFFFFFF:
            usize, csize, header = _zip64_extra(cd[name_at + n_name:pos - n_comment], usize, csize, header)
        if method != 0 or usize != csize or disk_start == 0xFFFF or (disk_start != this_disk and disk_start != 1) \
                or header + 30 + csize > size:
            _refuse(name, method, csize, usize, disk_start, this_disk, header, size)
        out.append(new(Entry, (name, flags, method, crc, csize, usize, header, ext_attr)))
    return out


def _refuse(name: bytes, method: int, csize: int, usize: int, disk_start: int, this_disk: int, header: int,
            size: int) -> None:
    """Why a central directory entry is refused, in the order the checks were made."""
    label = _label(name)
    if (method == 0 and usize != csize) or (usize and not csize):
        raise ZipDamage(f"entry {label}: sizes {csize}/{usize} disagree")
    if disk_start == 0xFFFF or disk_start not in (this_disk, 1):
        raise ZipDamage(f"entry {label}: on another disk")
    if header + LOCAL.size + csize > size:
        raise ZipDamage(f"entry {label} ends beyond the file's {size} bytes (bytes missing in the middle?)")
    if method != 0:
        # (torch 2.13 and 1.13 load an archive whose `version` or `.data/serialization_id` says so:
        # they never inflate those; the flag is still not what torch.save wrote)
        raise ZipDamage(f"entry {label} is compressed (method {method}); torch.save stores entries: its bytes are "
                        "not what was written")


def _label(name: bytes) -> str:
    return name.decode("utf-8", "replace")


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
    digits = text.strip()
    if digits.isdigit():  # the usual "3\n": ASCII digits between white space
        value = int(digits)
        return value if value <= 2**64 - 1 else None
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


class Layout(NamedTuple):
    """What the structural check found: the entries, where each one's data starts, and the
    records by their name inside the archive's folder, lower-case, as torch.load looks them up
    (miniz compares names without regard to ASCII case)."""
    directory: Directory
    prefix: bytes
    starts: dict[bytes, int]
    local_names: dict[bytes, int]  # each local header's name length
    records: dict[bytes, Entry]
    no_crc: bool  # every non-empty entry has CRC 0: written with CRCs off

    def record(self, name: str) -> Entry | None:
        return self.records.get(name.encode().lower())


_AT_OPEN = frozenset(n.encode() for n in READ_AT_OPEN)


def read_layout(src: Source, on_disk: bool = True) -> Layout:
    """The structural check: the first bytes, the end record, the central directory, every
    local header, the records torch reads at open, and for data.pkl and every storage
    (`data/...`) that torch would read their bytes from the right place. Reads the tail and
    each local header once; the pickle is not read (check_torch_zip does, with the content).
    (One pass over the entries, and few calls: it runs for every file of a first check.)"""
    if src.read_at(0, 4) != LOCAL_SIG:  # torch.load's _is_zipfile; otherwise it tries the legacy format
        head = src.read_at(0, PAGE)
        if head == bytes(len(head)):
            raise ZipDamage("the file starts with zeros (lost in a crash?): not a torch.save ZIP archive")
        raise ZipDamage("not a torch.save ZIP archive (no PK signature at the start)")
    d = read_directory(src)
    first = d.entries[0].name
    slash = first.find(b"/")
    if slash < 0:
        raise ZipDamage(f"entry {_label(first)} is not in the archive's folder")
    prefix = first[:slash + 1]
    cut = slash + 1
    records: dict[bytes, Entry] = {}
    starts: dict[bytes, int] = {}
    local_names: dict[bytes, int] = {}
    # A FileSource's first and last bytes, read directly (no call per local header)
    head, tail, tail_at = getattr(src, "head", b""), getattr(src, "tail", b""), getattr(src, "tail_at", 1 << 62)
    n_head, tail_end = len(head) - LOCAL.size, tail_at + len(tail) - LOCAL.size
    unpack = _NAME_EXTRA.unpack_from
    has_data = has_crc = False
    for e in d.entries:
        name, flags, _, crc, _, usize, header, ext_attr = e
        if not name.isascii():
            try:
                name.decode("utf-8")  # torch.load lists the records as str
            except UnicodeDecodeError:
                raise ZipDamage(f"entry name {_label(name)!r} is not UTF-8") from None
        if not name.startswith(prefix):
            raise ZipDamage(f"entry {_label(name)} is not in the archive's folder {_label(prefix)}")
        if flags & REFUSED_FLAGS:
            raise ZipDamage(f"entry {_label(name)} is marked encrypted or patched (flags {flags:#06x}): "
                            "its bytes are not what was written")
        if ext_attr & 0x10 or name.endswith(b"/"):  # mz_zip_reader_is_file_a_directory
            # (miniz extracts nothing from one; torch never reads `.format_version` or
            # `.data/serialization_id` at load, so there the flag only shows the bytes changed)
            raise ZipDamage(f"entry {_label(name)} is marked as a directory: torch would read nothing from it, and "
                            "its bytes are not what was written")
        if records.setdefault(name[cut:].lower(), e) is not e:
            raise ZipDamage(f"entry {_label(name)} is in the archive twice")
        if usize:
            has_data = True
            has_crc = has_crc or crc != 0
        # Its data starts after its local header, whose own name and extra lengths count (not the
        # central directory's); an entry without a local header signature gets no start.
        if header <= n_head:
            buf, at = head, header
        elif tail_at <= header <= tail_end:
            buf, at = tail, header - tail_at
        else:
            buf, at = src.read_at(header, LOCAL.size), 0
            if len(buf) < LOCAL.size:
                continue
        if buf.startswith(LOCAL_SIG, at):
            n_name, n_extra = unpack(buf, at + 26)
            starts[name] = header + 30 + n_name + n_extra
            local_names[name] = n_name
    size = src.size
    get = records.get
    alignment = get(b".storage_alignment")
    aligned = alignment is not None
    for key, e in records.items():
        storage = key.startswith(b"data/")  # the storages: torch.save writes no other `data/` entry
        if storage or key in _AT_OPEN:
            start = starts.get(e.name)  # (_readable, inline: once per entry of every file)
            if start is None or start + e.csize > size:
                _readable(e, starts, size)
            if storage:
                _placed(src, e, starts, local_names, aligned, on_disk)
    version = get(b".data/version") or get(b"version")
    if version is None:
        raise ZipDamage("no `version` record: not a torch.save archive")
    raw = _data(src, version, starts, 64)
    value = int(raw) if raw[:1].isdigit() and raw.strip().isdigit() else _stoull(raw)  # (the usual b"3\n")
    if value is None or not 1 <= value <= MAX_VERSION:
        raise ZipDamage(f"`version` record unreadable or unsupported ({_data(src, version, starts, 20)!r})")
    byteorder = get(b"byteorder")
    if byteorder is not None and _data(src, byteorder, starts, 16) not in (b"little", b"big"):
        raise ZipDamage("`byteorder` record is neither little nor big")
    serial = get(b".data/serialization_id")
    if serial is not None:
        try:
            _data(src, serial, starts, 256).decode("utf-8")  # torch hands it to Python as str
        except UnicodeDecodeError:
            raise ZipDamage("`.data/serialization_id` record is not text") from None
    if alignment is not None:
        try:
            int(_data(src, alignment, starts, 32))
        except ValueError:
            raise ZipDamage("`.storage_alignment` record is not a number") from None
    pkl = get(b"data.pkl")
    if pkl is None:
        raise ZipDamage("no data.pkl entry: not a torch.save archive")
    if pkl.usize > MAX_PICKLE:
        raise ZipDamage(f"data.pkl of {pkl.usize} bytes: not a sample")
    _placed(src, pkl, starts, local_names, aligned, on_disk)
    return _new(Layout, (d, prefix, starts, local_names, records, has_data and not has_crc))


def check_torch_zip(src: Source, content: bool, on_disk: bool = True,
                    walk: bool = True) -> tuple[ZipResult, PickleInfo | None]:
    """Raises ZipDamage (or PickleDamage) with the reason; Missing for what the Source lacks.
    The structure always (read_layout); with `content`, the pickle walked as torch.load walks
    it, every storage it names present with its exact size, and every entry's CRC-32.
    `on_disk`: the bytes are a file's, which a disk or a crash may have damaged (not a .gz's
    content, which the gzip CRC has proven): then the data descriptors after data.pkl and the
    storages are checked too, and an archive without CRCs gets the zero-page look.
    `walk=False` (verify: at-risk's whole reads, which look for what a crash tore): the pickle
    is walked only where the archive has no CRCs, or its entries are not named as torch.save
    names them. Where it has CRCs, every entry's CRC over the bytes torch reads proves data.pkl
    and every storage are what the writer wrote (a changed size moves the bytes the CRC covers);
    what no CRC covers is the central directory's names, by which torch finds the storages
    data.pkl names: torch.save names them 0..n-1 (torch.serialization._save: `str(len(id_map))`),
    so with only its own records beside storages named exactly so, they are the ones data.pkl
    names; any other naming is walked."""
    layout = read_layout(src, on_disk)
    d, starts, record, no_crc = layout.directory, layout.starts, layout.record, layout.no_crc
    if not content:
        return _new(ZipResult, (d.trailing, no_crc, False)), None
    info = None
    storages = {}
    if walk or no_crc or not numbered_storages(layout.records):
        pkl = record("data.pkl")
        assert pkl is not None  # read_layout has checked
        info = read_pickle(_data(src, pkl, starts, pkl.usize))
        for key, s in info.storages.items():
            e = record(f"data/{key}")
            if e is None:
                raise ZipDamage(f"storage data/{key} named in data.pkl is not in the archive")
            if e.usize != s.nbytes:
                raise ZipDamage(f"storage data/{key} holds {e.usize} bytes; data.pkl says {s.numel} × {s.cls} = "
                                f"{s.nbytes}")
            storages[key] = e
    if not no_crc:
        for e in d.entries:
            _readable(e, starts, src.size)
            got = src.crc_of(starts[e.name], e.csize)
            if got != e.crc:
                raise ZipDamage(f"entry {_label(e.name)}: CRC-32 {got:08x}, the archive says {e.crc:08x} (its "
                                "bytes are not what was written)")
    elif on_disk:
        assert info is not None  # (walked: no CRCs)
        _zero_pages(src, info, storages, starts)
    return ZipResult(d.trailing, no_crc, True), info


def numbered_storages(records) -> bool:
    """Whether the records (lower-case names within the archive's folder) are torch.save's own
    (READ_AT_OPEN) and storages data/0 .. data/n-1, as it names them (check_torch_zip): a storage
    whose name changed is then neither one of n numbers in a row nor another record."""
    keys = [k for k in records if k not in _AT_OPEN]
    return set(keys) == {b"data/%d" % i for i in range(len(keys))}


_NAME_EXTRA = struct.Struct("<HH")
_new = tuple.__new__  # a NamedTuple made without its Python-level __new__ (the structural check's hot path)


def _readable(e: Entry, starts: dict[bytes, int], size: int) -> None:
    """miniz's checks when it extracts an entry: a local header, and the data inside the file."""
    start = starts.get(e.name)
    if start is None:
        raise ZipDamage(f"entry {_label(e.name)}: no local header at byte {e.header} (overwritten?)")
    if start + e.csize > size:
        raise ZipDamage(f"entry {_label(e.name)} ends beyond the file's {size} bytes")


def _placed(src: Source, e: Entry, starts: dict[bytes, int], names: dict[bytes, int], aligned: bool,
            descriptor: bool) -> None:
    """For the entries whose bytes become the tensors, that torch would read them from the right
    place: torch.save writes the same name in the local header as in the central directory,
    (since torch 2.x, which records `.storage_alignment`) the data 64-byte aligned, and right after
    the data a data descriptor repeating the CRC and sizes."""
    start = starts[e.name]
    n_name = names[e.name]
    if n_name != len(e.name):
        raise ZipDamage(f"entry {_label(e.name)}: its local header's name length ({n_name}) differs from the "
                        f"central directory's ({len(e.name)}): torch would read its data at the wrong place")
    if aligned and start % 64:
        raise ZipDamage(f"entry {_label(e.name)}: data at byte {start}, not 64-byte aligned as torch.save writes")
    if descriptor and e.flags & 0x8:
        at = start + e.csize
        tail_at = getattr(src, "tail_at", None)
        raw = src.tail[at - tail_at:at - tail_at + 8] if tail_at is not None and at >= tail_at else src.read_at(at, 8)
        if not raw.startswith(DESCRIPTOR_SIG) or raw[4:8] != e.crc.to_bytes(4, "little"):
            raise ZipDamage(f"entry {_label(e.name)}: no data descriptor right after its data (torch would read it "
                            "from the wrong place, or the bytes are not what was written)")


def _data(src: Source, e: Entry, starts: dict[bytes, int], limit: int) -> bytes:
    n = min(e.usize, limit)
    raw = src.read_at(starts[e.name], n)
    if len(raw) < n:
        raise ZipDamage(f"entry {_label(e.name)} cut off")
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


__all__ = ["ZipDamage", "PickleDamage", "Missing", "Source", "check_torch_zip", "find_end_record", "read_layout"]
