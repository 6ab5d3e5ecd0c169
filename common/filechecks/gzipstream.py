"""A .gz sample decompressed once, as a stream, in bounded memory, the way SpecForge reads it.

SpecForge loads `.ckpt.gz` with `torch.load(io.BytesIO(gzip.open(p, "rb").read()))`, so the
rules are CPython's gzip module (Lib/gzip.py `_GzipReader.read`, `_read_gzip_header`,
`_read_eof`, 3.11): members one after another, each a header, raw deflate data, CRC-32 and
length; after a member any run of zero bytes ("Gzip files can be padded with zeroes") and then
either the end or another member. Anything else after the last member is BadGzipFile
("Not a gzipped file"); a stream cut short is EOFError. The content is every member's output.

The content, a torch.save ZIP, is then checked as a file would be (torchzip.py), from what the
stream left behind: its first and last MiB (data.pkl and the small records; the central
directory), the local headers met on the way, and the running CRC-32 at every place an entry
can start or end (after each local header; at each data descriptor, local or central header
signature), from which any entry's CRC follows (zlib's crc32_combine, run backwards). A
content that needs anything else (a damaged or unusual inner archive) is decompressed again
into an unnamed file in reconcile's state directory (core/paths.py spool_file: not $TMPDIR) and
checked as a plain file.

Bounds: what a user's file makes reconcile do is proportional to the file's size. The content
may be at most MAX_RATIO times the compressed size (or MIN_LIMIT, for a small file): deflate can
expand 1,032-fold, so a 1 MiB stream could otherwise be 1 GiB decompressed, or spooled, on every
pass. A sample's content is its hidden states, floats that gzip shrinks by less than half;
a stream that expands beyond the bound is damaged ("a decompression bomb"), and decompression
stops there. What a ZipStream keeps of the content is bounded too (MAX_HELD, MAX_POINTS).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from typing import BinaryIO

from .torchzip import CENTRAL_SIG, DESCRIPTOR_SIG, LOCAL, LOCAL_SIG, Missing

IN_CHUNK = 256 * 1024
OUT_MAX = 1024 * 1024  # decompressed bytes per call: bounds memory on a highly compressible stream
KEEP = 1024 * 1024  # bytes kept of the content's start and of its end
MAX_POINTS = 100_000  # signatures recorded; random data holds one in ~4 GiB
MAX_HELD = 16 * 1024 * 1024  # bytes of local headers kept (a sample holds a few dozen of ~100 bytes)
MAX_RATIO = 64  # content bytes per compressed byte (see the docstring)
MIN_LIMIT = 64 * 1024 * 1024  # the content bound of a file under MIN_LIMIT / MAX_RATIO bytes
FTEXT, FHCRC, FEXTRA, FNAME, FCOMMENT = 1, 2, 4, 8, 16
POLY = 0xEDB88320


class GzipDamage(Exception):
    pass


def content_limit(compressed: int) -> int:
    """The most content a .gz of `compressed` bytes may hold (see the docstring)."""
    return max(MIN_LIMIT, MAX_RATIO * compressed)


class _Input:
    """The compressed file with CPython's `prepend` (gzip._PaddedFile)."""

    def __init__(self, fh: BinaryIO):
        self.fh = fh
        self.pending = b""
        self.started = False  # a member was read: what follows is "after the last member"

    def read(self, n: int) -> bytes:
        if self.pending:
            out, self.pending = self.pending[:n], self.pending[n:]
            return out
        return self.fh.read(n)

    def prepend(self, data: bytes) -> None:
        self.pending = data + self.pending

    def exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            got = self.read(n - len(out))
            if not got:
                raise GzipDamage("truncated: gzip stream cut off (Compressed file ended before the end-of-stream "
                                 "marker was reached)")
            out += got
        return out

    def skip_past(self, stop: bytes) -> None:
        """Read up to and including the byte `stop`, or to the end (gzip reads FNAME so)."""
        while True:
            chunk = self.read(IN_CHUNK)
            if not chunk:
                return
            i = chunk.find(stop)
            if i >= 0:
                self.prepend(chunk[i + 1:])
                return

    def skip_zeros(self) -> None:
        while True:
            chunk = self.read(IN_CHUNK)
            if not chunk:
                return
            rest = chunk.lstrip(b"\0")
            if rest:
                self.prepend(rest)
                return


def _member_header(inp: _Input) -> bool:
    """gzip._read_gzip_header: False at a clean end."""
    magic = inp.read(2)
    if magic == b"":
        return False
    if magic != b"\037\213":
        raise GzipDamage(f"gzip: Not a gzipped file ({magic!r})" + (" after the last member" if inp.started else ""))
    method, flag = struct.unpack("<BB", inp.exact(8)[:2])
    if method != 8:
        raise GzipDamage("gzip: Unknown compression method")
    if flag & FEXTRA:
        (n,) = struct.unpack("<H", inp.exact(2))
        inp.exact(n)
    if flag & FNAME:
        inp.skip_past(b"\0")
    if flag & FCOMMENT:
        inp.skip_past(b"\0")
    if flag & FHCRC:
        inp.exact(2)
    return True


def check_header(fh: BinaryIO) -> None:
    """The first member's header only (the structural check of a .gz: nothing decompressed)."""
    inp = _Input(fh)
    if not _member_header(inp):
        raise GzipDamage("gzip: empty file")


def decompress(fh: BinaryIO, sink: Callable[[bytes], None], limit: int | None = None) -> int:
    """Feed the content to `sink` chunk by chunk; its length. Raises GzipDamage as CPython's
    gzip would raise BadGzipFile, EOFError or zlib.error, and once the content passes `limit`
    bytes (content_limit of the file's size by default): nothing past it is decompressed."""
    if limit is None:
        limit = content_limit(os.fstat(fh.fileno()).st_size)
    inp = _Input(fh)
    total = 0
    while _member_header(inp):
        inp.started = True
        d = zlib.decompressobj(-zlib.MAX_WBITS)
        crc = n = 0
        while not d.eof:
            buf = d.unconsumed_tail or inp.read(IN_CHUNK)
            if not buf:
                raise GzipDamage("truncated: gzip stream cut off (Compressed file ended before the end-of-stream "
                                 "marker was reached)")
            try:
                out = d.decompress(buf, OUT_MAX)
            except zlib.error as exc:
                raise GzipDamage(f"corrupt gzip data: {exc}") from None
            if out:
                if total + n + len(out) > limit:
                    raise GzipDamage(f"gzip content larger than {limit} bytes, the most a file of this size may hold "
                                     f"({MAX_RATIO} times its size, at least {MIN_LIMIT >> 20} MiB): a decompression "
                                     "bomb, not a sample (decompression stopped there)")
                crc = zlib.crc32(out, crc)
                n += len(out)
                sink(out)
        if d.unused_data:
            inp.prepend(d.unused_data)
        want_crc, want_size = struct.unpack("<II", inp.exact(8))
        if want_crc != crc:
            raise GzipDamage(f"gzip: CRC check failed {hex(want_crc)} != {hex(crc)}")
        if want_size != n & 0xFFFFFFFF:
            raise GzipDamage("gzip: Incorrect length of data produced")
        total += n
        inp.skip_zeros()
    return total


# --- CRC-32 of a range from running CRCs (zlib crc32.c multmodp / x2nmodp) ----------------

def _multmodp(a: int, b: int) -> int:
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1


_X2N = [1 << 30]
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def crc_of_suffix(crc_whole: int, crc_prefix: int, n: int) -> int:
    """CRC-32 of B from crc32(A + B), crc32(A) and len(B): crc32_combine(A, B, n) =
    x^(8n) · crc(A) ^ crc(B) in GF(2) modulo the CRC polynomial."""
    p, k = 1 << 31, 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return crc_whole ^ _multmodp(p, crc_prefix)


class ZipStream:
    """The sink that remembers what torchzip needs of a ZIP content (see the docstring).

    The running CRC lags 3 bytes behind the content received, so that a signature split
    between two chunks is still ahead of it when it is found."""

    def __init__(self) -> None:
        self.size = 0
        self.crc = 0
        self.crc_pos = 0  # the CRC covers content[:crc_pos]
        self.carry = b""  # content[crc_pos:size]
        self.head = bytearray()
        self.tail = bytearray()
        self.points: dict[int, int] = {0: 0}  # offset -> CRC-32 of the content before it
        self.future: set[int] = set()  # points not reached yet
        self.open: dict[int, bytearray] = {}  # local headers still being read: offset -> bytes so far
        self.headers: dict[int, bytes] = {}  # complete local headers (30 bytes + name)
        self.held = 0  # bytes in `open` and `headers`
        self.overflow = False  # too much to keep (MAX_POINTS, MAX_HELD): torchzip is told Missing

    def __call__(self, out: bytes) -> None:
        first = self.crc_pos
        buf = self.carry + out
        self.size += len(out)
        if not self.overflow:
            for sig in (LOCAL_SIG, DESCRIPTOR_SIG, CENTRAL_SIG):
                i = buf.find(sig)
                while i >= 0:  # each signature is found once: it ends in the new bytes
                    self.future.add(first + i)
                    if sig == LOCAL_SIG:
                        self.open.setdefault(first + i, bytearray())
                    i = buf.find(sig, i + 1)
            self._read_headers(buf, first)
            if len(self.future) + len(self.points) + len(self.open) > MAX_POINTS:
                self.overflow = True
            if self.overflow:
                self.open.clear()  # (what was kept is still served; the CRC points are no longer)
        self._advance(buf, first, max(first, self.size - 3))
        if len(self.head) < KEEP:
            self.head += out[:KEEP - len(self.head)]
        self.tail += out
        if len(self.tail) > KEEP:
            del self.tail[:len(self.tail) - KEEP]

    def finish(self) -> None:
        self._advance(self.carry, self.crc_pos, self.size)

    def _advance(self, buf: bytes, first: int, upto: int) -> None:
        """Run the CRC over buf (content from `first`) up to `upto`, noting it at each point."""
        view = memoryview(buf)
        crc, last = self.crc, first
        for p in sorted(p for p in self.future if p <= upto):
            self.future.discard(p)
            if p >= first:  # (never behind: see the class docstring)
                crc = zlib.crc32(view[last - first:p - first], crc)
                self.points[p] = crc
                last = p
        self.crc = zlib.crc32(view[last - first:upto - first], crc)
        self.crc_pos = upto
        self.carry = bytes(view[upto - first:])

    def _read_headers(self, buf: bytes, first: int) -> None:
        """Complete the local headers whose bytes have arrived; schedule each one's data start.
        A header still open has read everything received before `buf`'s new bytes."""
        for start in sorted(self.open):
            got = self.open[start]
            while True:
                fixed = len(got) >= LOCAL.size  # the fixed part is in: the name length is known
                want = LOCAL.size + (struct.unpack_from("<H", got, 26)[0] if fixed else 0)
                at = start + len(got) - first
                had = len(got)
                got += buf[at:at + want - len(got)]
                self.held += len(got) - had
                if self.held > MAX_HELD:
                    self.overflow = True  # (checked per header: one chunk can start 35,000 of them)
                    return
                if len(got) < want:
                    break  # the rest comes with a later chunk
                if not fixed:
                    continue
                n_name, n_extra = struct.unpack_from("<HH", got, 26)
                self.headers[start] = bytes(got)
                self.future.add(start + LOCAL.size + n_name + n_extra)
                del self.open[start]
                break

    def view(self) -> ContentView:
        return ContentView(self)


class ContentView:
    """A torchzip Source over what a ZipStream kept."""

    def __init__(self, s: ZipStream):
        self.size = s.size
        self._s = s

    def read_at(self, offset: int, n: int) -> bytes:
        s = self._s
        n = max(0, min(n, self.size - offset))
        if offset + n <= len(s.head):
            return bytes(s.head[offset:offset + n])
        t0 = self.size - len(s.tail)
        if offset >= t0:
            return bytes(s.tail[offset - t0:offset - t0 + n])
        h = s.headers.get(offset)
        if h is not None and n <= len(h):
            return h[:n]
        for start, h in s.headers.items():
            if start <= offset and offset + n <= start + len(h):
                return h[offset - start:offset - start + n]
        raise Missing(offset, n)

    def crc_of(self, offset: int, n: int) -> int:
        pts = self._s.points
        if offset in pts and offset + n in pts and not self._s.overflow:
            return crc_of_suffix(pts[offset + n], pts[offset], n)
        raise Missing(offset, n)

    def first_zero_page(self, ranges: list[tuple[int, int]]) -> int | None:
        return None  # not asked: the gzip CRC already proves the content (see integrity.py)


def spool(fh: BinaryIO, limit: int | None = None) -> tuple[BinaryIO, int]:
    """Decompress again (within the same bound) into an unnamed file in reconcile's state
    directory (the rare content a ZipStream cannot serve); the caller closes it."""
    from ...core.paths import spool_file

    fh.seek(0)
    tmp = os.fdopen(spool_file(), "w+b")
    try:
        size = decompress(fh, tmp.write, limit)
        tmp.flush()
    except BaseException:
        tmp.close()
        raise
    return tmp, size
