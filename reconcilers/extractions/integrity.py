"""Is a sample file complete? Cheap structural checks on an open file, no torch needed.

`torch.save` writes a ZIP archive straight to its final path; the central directory and
the end-of-central-directory record come last, so a file cut off mid-write has none.
`zipfile` reads only the tail; we add each entry's bounds against the file size and a
`*/data.pkl` entry. A gzip file (`.ckpt.gz`) can only be proven whole by decompressing
all of it (its CRC and length are in the last 8 bytes), so that is done only when asked.
Safetensors: 8-byte little-endian header length N, N bytes of JSON, then the tensors;
the file is exactly 8 + N + the largest end offset.

Each check returns None for a good file, else a one-line reason.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
import zlib
from typing import BinaryIO

ZIP_MAGIC = b"PK\x03\x04"
GZIP_MAGIC = b"\x1f\x8b"
LOCAL_HEADER = struct.Struct("<4s2x2x2x2x2x4x4x4xHH")  # signature ... name length, extra length
MAX_SAFETENSORS_HEADER = 100 * 2**20  # the format's own limit
GZIP_TAIL = 4 * 2**20  # decompressed bytes kept to read the inner ZIP's central directory


def kind_of(name: str) -> str:
    """'zip' (torch.save), 'safetensors', or either with '+gz'."""
    base = name[:-3] if name.endswith(".gz") else name
    kind = "safetensors" if base.endswith(".safetensors") else "zip"
    return kind + ("+gz" if name.endswith(".gz") else "")


def check_file(path: str, deep: bool = False) -> tuple[str | None, os.stat_result]:
    """Open, fstat and check one file. `deep` decompresses .gz files whole.
    Returns (reason or None, stat). Raises OSError if the file cannot be opened."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        return check_open(fh, st.st_size, kind_of(path), deep), st


def check_open(fh: BinaryIO, size: int, kind: str, deep: bool = False) -> str | None:
    if size == 0:
        return "empty file (0 bytes)"
    if kind == "zip":
        return check_zip(fh, size)
    if kind == "safetensors":
        return check_safetensors(fh, size)
    head = fh.read(2)
    if head != GZIP_MAGIC:
        return "not a gzip file (bad magic)"
    if not deep:
        return None
    return check_gzip(fh, size, kind[:-3])


def check_zip(fh: BinaryIO, size: int) -> str | None:
    fh.seek(0)
    if fh.read(4) != ZIP_MAGIC:
        return "not a torch.save ZIP archive (no PK signature at the start)"
    try:
        zf = zipfile.ZipFile(fh)
    except zipfile.BadZipFile as exc:
        if "central directory" in str(exc) or "not a zip file" in str(exc).lower():
            return "truncated: no ZIP central directory at the end (cut off mid-write)"
        return f"bad ZIP archive: {exc}"
    except (EOFError, OSError, ValueError) as exc:
        return f"bad ZIP archive: {exc}"
    infos = zf.infolist()
    if not any(i.filename.endswith("/data.pkl") for i in infos):
        return "no */data.pkl entry: not a torch.save archive"
    for info in infos:
        if info.header_offset < 0 or info.header_offset + LOCAL_HEADER.size > size:
            # zipfile shifts offsets by the difference between where the central directory
            # says it is and where it was found: a hole in the middle shows up here.
            return f"entry {info.filename} starts outside the file (bytes missing in the middle?)"
        fh.seek(info.header_offset)
        raw = fh.read(LOCAL_HEADER.size)
        if len(raw) < LOCAL_HEADER.size:
            return f"entry {info.filename}: local header cut off"
        sig, name_len, extra_len = LOCAL_HEADER.unpack(raw)
        if sig != ZIP_MAGIC:
            return f"entry {info.filename}: no local header at offset {info.header_offset} (overwritten?)"
        end = info.header_offset + LOCAL_HEADER.size + name_len + extra_len + info.compress_size
        if end > size:
            return f"entry {info.filename} ends at byte {end}, beyond the file's {size} bytes"
    return None


def check_safetensors(fh: BinaryIO, size: int) -> str | None:
    fh.seek(0)
    raw = fh.read(8)
    if len(raw) < 8:
        return f"truncated: {size} bytes, shorter than the 8-byte header length"
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_SAFETENSORS_HEADER:
        return f"bad header length {n}"
    if 8 + n > size:
        return f"truncated: header of {n} bytes does not fit in {size} bytes"
    try:
        header = json.loads(fh.read(n))
    except (ValueError, UnicodeDecodeError):
        return "bad safetensors header: not JSON"
    if not isinstance(header, dict):
        return "bad safetensors header: not a JSON object"
    max_end = 0
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        try:
            begin, end = meta["data_offsets"]
        except (TypeError, KeyError, ValueError):
            return f"bad safetensors header: tensor {key!r} has no data_offsets"
        if not (isinstance(begin, int) and isinstance(end, int)) or not 0 <= begin <= end:
            return f"bad safetensors header: tensor {key!r} has offsets {begin}..{end}"
        max_end = max(max_end, end)
    want = 8 + n + max_end
    if size < want:
        return f"truncated: {size} of {want} bytes"
    if size > want:
        return f"{size - want} bytes after the last tensor ({want} expected)"
    return None


class _TailFile(io.RawIOBase):
    """A read-only view of a stream of which only the first bytes and the last `len(tail)`
    bytes are kept: enough for zipfile to read the central directory of a decompressed file."""

    def __init__(self, head: bytes, tail: bytes, size: int):
        self.head, self.tail, self.size, self.pos = head, tail, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        start = self.size - len(self.tail)
        if self.pos + n <= len(self.head):
            out = self.head[self.pos:self.pos + n]
        elif self.pos >= start:
            out = self.tail[self.pos - start:self.pos - start + n]
        else:
            raise OSError("outside the kept part of the decompressed file")
        self.pos += len(out)
        return out


def check_gzip(fh: BinaryIO, size: int, inner: str) -> str | None:
    """Decompress the whole file (the only way to see its CRC), keeping just the head and
    the tail of the content, then check the content's structure from those."""
    fh.seek(0)
    d = zlib.decompressobj(wbits=31)
    head = b""
    tail = bytearray()
    total = 0
    try:
        while True:
            chunk = fh.read(2**20)
            if not chunk:
                break
            out = d.decompress(chunk)
            if out:
                total += len(out)
                if len(head) < 64:
                    head += out[:64 - len(head)]
                tail += out
                if len(tail) > GZIP_TAIL:
                    del tail[:len(tail) - GZIP_TAIL]
            if d.eof:
                break
        rest = d.flush()
        total += len(rest)
        tail += rest
    except zlib.error as exc:
        return f"corrupt gzip data: {exc}"
    if not d.eof:
        return "truncated: gzip stream ends before its end marker (cut off mid-write)"
    if inner == "safetensors":
        content = bytes(tail)
        if total > len(content):
            return None  # the header is at the start and was not kept; the CRC passed
        return check_safetensors(io.BytesIO(content), len(content))
    if not head.startswith(ZIP_MAGIC):
        return "gzip content is not a torch.save ZIP archive"
    try:
        zf = zipfile.ZipFile(_TailFile(bytes(head), bytes(tail), total))
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        return f"gzip content: bad ZIP archive: {exc}"
    if not any(i.filename.endswith("/data.pkl") for i in zf.infolist()):
        return "gzip content: no */data.pkl entry"
    if any(i.header_offset + i.compress_size > total for i in zf.infolist()):
        return "gzip content: an entry ends beyond the end of the content"
    return None


def check(path: str, verify: str):
    """(reason or None, stat or None when the file vanished)."""
    if verify == "none":
        try:
            return None, os.stat(path)
        except FileNotFoundError:
            return None, None
    try:
        return check_file(path, deep=verify == "all")
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        try:
            st = os.stat(path)
        except OSError:
            return None, None
        return f"unreadable: {exc.strerror}", st
