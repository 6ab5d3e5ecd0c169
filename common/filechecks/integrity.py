"""Is a sample file whole? One function per file, `check_path`, no torch needed.

"Whole" means, per format (docs/extractions.md says the same for users):
- a torch.save ZIP (`.ckpt`, `.pt`, ...): torch.load would load it and it is what was written.
  The structural check reads it as torch.load does (torchzip.py read_layout: the end record, the
  central directory, each local header, the records read at open, data.pkl and every storage
  present where torch would read them; torchfast.py for torch.save's own layout). The content
  check adds every entry's CRC-32, over the bytes torch would read, and walks data.pkl without
  executing it (torchpickle.py): every storage it names present with its exact size. An archive written with CRCs off
  (torch.serialization.set_crc32_options(False)) cannot be proven: it gets the zero-page look
  of safetensors instead, and says so (`no_crc`);
- safetensors: structurally complete (the library's own rules) and, in the content check, no
  crash-zeroed page found in float tensor data and no zeroed tail (safetensors_file.py): the format
  has no checksum. A file ending in zeros where zeros may be data is UNPROVEN: "cannot be proven
  whole", neither whole nor damaged;
- `.gz` (SpecForge's `--compress`): only a full decompression proves it (gzipstream.py, with
  CPython gzip's rules on what may follow the last member); then the content is checked as
  above, with its CRCs. The structural check reads the gzip header only, and such a file is
  never called verified (`gz_shallow`).

Depths: STAT (verify: none: a stat, no read), STRUCTURE (the cheap check, reading a few small
ranges), CONTENT (every byte read once; `walk=False`, verify: at-risk's read of the files a crash
can have torn: a torch.save archive's CRCs prove it, and its pickle is walked only where they
cannot, torchzip.check_torch_zip). Any exception while checking one file makes that
file DAMAGED with the reason, never the extraction an error; a file that cannot be read
(EIO, EACCES, not a regular file) is UNREADABLE, neither done nor damaged. `check_path`
takes and returns plain data, so a pool of processes can run it.
"""

from __future__ import annotations

import os
import zlib
from stat import S_ISREG

from .gzipstream import GzipDamage, ZipStream, check_header, decompress, spool
from .safetensors_file import SafetensorsDamage, check_safetensors
from .torchfast import check_whole_buffer
from .torchpickle import PickleDamage
from .torchzip import PAGE, Missing, ZipDamage, check_torch_zip
from .verdicts import (  # noqa: F401  (the names of a verdict, used with check_path)
    CONTENT,
    DAMAGED,
    GONE,
    STAT,
    STRUCTURE,
    UNCHECKED,
    UNPROVEN,
    UNREADABLE,
    WHOLE,
    Verdict,
)

READ_CHUNK = 256 * 1024  # the content check's reads: a buffer that stays in the CPU's cache for the CRC
# A file up to this size is read whole, in one call, at either depth: a pread of a few pages costs
# about what one more call would, and its local headers then need no read of their own.
WHOLE_READ = 32 * 1024
NEAR = 64  # bytes read on either side of a small read elsewhere in the file (see FileSource)
# O_NONBLOCK: a FIFO with the sample's name must not hang the check (no effect on files).
# O_NOFOLLOW: a file in a user's tree that is a link is never followed (a link to /dev/watchdog would
# arm it, one to another user's file would be read as root); O_NONBLOCK: a FIFO never blocks.
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_SPARE: list[bytearray] = []  # read buffers, reused (list.pop and append are atomic: threads may share it)
_new = tuple.__new__  # a NamedTuple made without its Python-level __new__ (the structural check's hot path)
ZERO_PAGE = bytes(PAGE)
# A zero page counts where at least this much of it is float data (a page across an integer
# tensor and a float one); 1 KiB is 512 bf16 values, none of which a hidden state has exactly 0.
MIN_FLOAT_OVERLAP = 1024
MIN_ZERO_RUN = 64  # a zeroed last page shorter than this (32 bf16 values) is not told from data
ZERO_RUN = bytes(MIN_ZERO_RUN)
_DAMAGE = (ZipDamage, PickleDamage, SafetensorsDamage, GzipDamage)
_NOT_ZIP = (".gz", ".safetensors")  # (kind_of: every other name is a torch.save ZIP)


def kind_of(name: str) -> str:
    """'zip' (torch.save), 'safetensors', or either with '+gz'."""
    base = name[:-3] if name.endswith(".gz") else name
    kind = "safetensors" if base.endswith(".safetensors") else "zip"
    return kind + ("+gz" if name.endswith(".gz") else "")


class FileSource:
    """A torchzip/safetensors Source over an open file (positional reads: no shared offset).

    The structural check reads a few small ranges: the first and last page are read at once
    (the whole file, in one call, when it is no larger than WHOLE_READ), and a small read elsewhere
    (a local header) takes a little on either side (the data descriptor before it), so each range
    costs one system call. `whole`: the file's bytes, already read (then nothing more is read:
    the content check's CRCs are computed over them)."""

    __slots__ = ("fd", "size", "head", "tail", "tail_at", "_near", "_whole")

    def __init__(self, fd: int, size: int, whole: bytes | None = None):
        self.fd, self.size = fd, size
        # head: the file's first bytes; tail: its last ones, from tail_at (torchzip reads these
        # directly, without a call per range)
        if whole is None and size <= WHOLE_READ:
            whole = read_whole(fd, size)
        self._whole = whole is not None
        if whole is not None:
            self.head = self.tail = whole
            self.tail_at = 0
        else:
            self.head = self._pread(0, PAGE)
            self.tail_at = size - PAGE
            self.tail = self._pread(self.tail_at, PAGE)
        self._near: list[tuple[int, bytes]] = []

    def _pread(self, offset: int, n: int) -> bytes:
        return _pread(self.fd, offset, n)

    def read_at(self, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if end <= offset:
            return b""
        if offset >= self.tail_at:  # (fewer bytes if the file shrank since it was opened)
            return self.tail[offset - self.tail_at:end - self.tail_at]
        if end <= len(self.head):
            return self.head[offset:end]
        for at, buf in self._near:
            if at <= offset and end <= at + len(buf):
                return buf[offset - at:end - at]
        if end - offset > NEAR:
            return self._pread(offset, end - offset)
        lo, hi = max(0, offset - NEAR), min(self.size, end + NEAR)
        buf = self._pread(lo, hi - lo)
        if len(self._near) < 64:
            self._near.append((lo, buf))
        return buf[offset - lo:end - lo]

    def _chunks(self, offset: int, n: int):
        if self._whole:  # the file is in memory: its bytes, READ_CHUNK at a time
            end = offset + n
            if end > len(self.tail):
                raise ZipDamage(f"the file ends at byte {len(self.tail)}, before its own end (truncated while read?)")
            view = memoryview(self.tail)
            for at in range(offset, end, READ_CHUNK):
                yield at, view[at:min(end, at + READ_CHUNK)]
            return
        buf = _SPARE.pop() if _SPARE else bytearray(READ_CHUNK)
        try:
            view = memoryview(buf)
            end = offset + n
            while offset < end:
                got = os.preadv(self.fd, [view[:min(READ_CHUNK, end - offset)]], offset)
                if got == 0:
                    raise ZipDamage(f"the file ends at byte {offset}, before its own end (truncated while read?)")
                yield offset, view[:got]
                offset += got
        finally:
            _SPARE.append(buf)

    def crc_of(self, offset: int, n: int) -> int:
        crc32 = _crc32()
        crc = 0
        for _, chunk in self._chunks(offset, n):
            crc = crc32(chunk, crc)
        return crc

    def first_zero_page(self, ranges: list[tuple[int, int]]) -> int | None:
        """The first file page (PAGE-aligned, as the page cache's; the last one ends at the end
        of the file) that is all zeros and holds at least MIN_FLOAT_OVERLAP bytes of `ranges`,
        or all of a shorter tensor or last page (at least MIN_ZERO_RUN bytes): what a crash
        leaves where data was not written back."""
        spans = sorted(ranges)
        for a, b in spans:
            start = a // PAGE * PAGE
            end = min(-(-b // PAGE) * PAGE, self.size)
            for at, chunk in self._chunks(start, end - start):
                if bytes(chunk).find(ZERO_RUN) < 0:  # fast path: no run of zeros long enough
                    continue
                for i in range(0, len(chunk), PAGE):
                    page = chunk[i:i + PAGE]
                    if len(page) < MIN_ZERO_RUN or page != ZERO_PAGE[:len(page)]:
                        continue
                    p0, p1 = at + i, at + i + len(page)
                    inside = sum(max(0, min(p1, y) - max(p0, x)) for x, y in spans)
                    if inside >= min(MIN_FLOAT_OVERLAP, b - a, len(page)):
                        return p0
        return None


def _pread(fd: int, offset: int, n: int) -> bytes:
    out = os.pread(fd, n, offset)
    while 0 < len(out) < n:
        got = os.pread(fd, n - len(out), offset + len(out))
        if not got:
            break  # shorter than its size now: the caller finds what is missing
        out += got
    return out


def read_whole(fd: int, size: int) -> bytes:
    """The file's `size` bytes in one call (fewer if it shrank since its fstat)."""
    return _pread(fd, 0, size)


_CRC32 = None


def _crc32():
    """CRC-32 as zlib computes it, from ISA-L or zlib-ng where one is installed (the `fast` extra:
    3-5 times zlib's speed, so the content check reads at the page cache's speed), else zlib."""
    global _CRC32
    if _CRC32 is None:
        _CRC32 = zlib.crc32
        for mod in ("isal.isal_zlib", "zlib_ng.zlib_ng"):
            try:
                _CRC32 = __import__(mod, fromlist=["crc32"]).crc32
                break
            except ImportError:
                continue
    return _CRC32


def check_path(path: str, depth: str = STRUCTURE, dir_fd: int | None = None, walk: bool = True,
               crcs_from: int | None = None) -> Verdict:
    """Check one file. Never raises for what the file holds; see the module docstring.
    With `dir_fd`, `path` is relative to that open directory (no walk of the whole path per file).
    `walk=False` (verify: at-risk's whole reads): at the content depth, a torch.save archive's
    pickle is walked only where it has no CRCs (torchzip.check_torch_zip). `crcs_from` (at the
    structure depth): a small torch.save file modified at this time (ns) or later, which at-risk
    may read whole next, has its CRCs checked in the same read, and says so (`crcs_proven`)."""
    if depth == STAT:
        try:
            return Verdict(UNCHECKED, depth=STAT, st=os.stat(path, dir_fd=dir_fd))
        except FileNotFoundError:
            return Verdict(GONE, depth=STAT)
        except OSError as exc:
            return Verdict(UNREADABLE, f"unreadable: {_oserror(exc)}", STAT)
    try:
        fd = os.open(path, OPEN_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return Verdict(GONE, depth=depth)
    except OSError as exc:
        try:
            st = os.stat(path, dir_fd=dir_fd)
        except OSError:
            st = None
        return Verdict(UNREADABLE, f"unreadable: {_oserror(exc)}", depth, st)
    try:
        st = os.fstat(fd)
        if not S_ISREG(st.st_mode):
            return Verdict(UNREADABLE, "unreadable: not a regular file", depth, st)
        try:
            size = st.st_size
            if (depth == STRUCTURE or (depth == CONTENT and not walk)) and 0 < size <= WHOLE_READ \
                    and not path.endswith(_NOT_ZIP):
                # A small torch.save file (nearly every file of a first check): read in one call,
                # torch.save's own layout checked in few operations (torchfast.py), at-risk's
                # whole read with its CRCs; anything else, damaged, unusual or without CRCs, is
                # read_layout's and the pickle's to decide and explain.
                whole = os.pread(fd, size, 0)
                if len(whole) == size:
                    crcs = depth == CONTENT or (crcs_from is not None and st.st_mtime_ns >= crcs_from)
                    result = check_whole_buffer(whole, _crc32() if crcs else None)
                    if result is None and crcs and depth == STRUCTURE:  # (a CRC differs: the structure's verdict)
                        crcs, result = False, check_whole_buffer(whole)
                    if result is not None and (depth == STRUCTURE or not result[1]):
                        return _new(Verdict, (WHOLE, "", depth, st, result[1], False, result[0],
                                              crcs and not result[1] and depth == STRUCTURE))
                elif whole:  # (a short read: on to the end, as read_whole reads)
                    whole += _pread(fd, len(whole), size - len(whole))
                return _check(fd, st, "zip", depth, whole, walk)
            return _check(fd, st, kind_of(path), depth, walk=walk)
        except _DAMAGE as exc:
            return Verdict(DAMAGED, str(exc), depth, st)
        except OSError as exc:
            return Verdict(UNREADABLE, f"unreadable: {_oserror(exc)}", depth, st)
        except Exception as exc:  # damage we did not foresee is still damage of this one file
            return Verdict(DAMAGED, f"checker raised {type(exc).__name__}: {exc}"[:300], depth, st)
    finally:
        os.close(fd)


def _oserror(exc: OSError) -> str:
    import errno

    if exc.errno == errno.ELOOP:
        return "a symbolic link (never followed in a tree another user controls)"
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{exc.strerror or exc}" + (f" ({name})" if name else "")


def _check(fd: int, st: os.stat_result, kind: str, depth: str, whole: bytes | None = None,
           walk: bool = True) -> Verdict:
    """`whole`: the file's bytes, already read (check_path's fast path); `walk`: check_path's."""
    size = st.st_size
    if size == 0:
        return Verdict(DAMAGED, "empty file (0 bytes)", depth, st)
    content = depth == CONTENT
    if kind == "zip":
        if whole is None and (size <= WHOLE_READ or (content and size <= READ_CHUNK)):
            whole = read_whole(fd, size)
        result, _ = check_torch_zip(FileSource(fd, size, whole), content, walk=walk)
        return _new(Verdict, (WHOLE, "", depth, st, result.no_crc, False, result.trailing, False))  # (hot path)
    if kind == "safetensors":
        unproven = check_safetensors(FileSource(fd, size), content)
        return Verdict(UNPROVEN, unproven, depth, st) if unproven else Verdict(WHOLE, depth=depth, st=st)
    with os.fdopen(os.dup(fd), "rb") as fh:
        if not content:
            check_header(fh)  # the first member's header parses; the rest is unread
            return Verdict(WHOLE, depth=depth, st=st, gz_shallow=True)
        return _check_gz(fh, st, kind[:-3], walk)


def _check_gz(fh, st: os.stat_result, inner: str, walk: bool = True) -> Verdict:
    stream = ZipStream()
    total = decompress(fh, stream)
    stream.finish()
    if total == 0:
        return Verdict(DAMAGED, "gzip content is empty", CONTENT, st)
    try:
        return _check_content(stream.view(), st, inner, walk)
    except Missing:
        pass  # an inner layout the stream did not keep: decompress again into a temporary file
    tmp, size = spool(fh)
    with tmp:
        return _check_content(FileSource(tmp.fileno(), size), st, inner, walk)


def _check_content(src, st: os.stat_result, inner: str, walk: bool = True) -> Verdict:
    """The decompressed content, as a file of its own. The gzip CRC has proven it is what was
    compressed, so the zero-page rule (for content without CRCs) does not apply."""
    try:
        if inner == "safetensors":
            check_safetensors(src, True, on_disk=False)
            return Verdict(WHOLE, depth=CONTENT, st=st)
        result, _ = check_torch_zip(src, True, on_disk=False, walk=walk)
        return Verdict(WHOLE, depth=CONTENT, st=st, trailing=result.trailing)
    except _DAMAGE as exc:
        return Verdict(DAMAGED, f"gzip content: {exc}", CONTENT, st)
