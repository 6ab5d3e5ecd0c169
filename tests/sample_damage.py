"""Damage done to a sample file's bytes, the ways a crash and a disk do it (stdlib only: used by
the test process and by tests/torch_samples.py under the sample-writer interpreter).

A damage is a small JSON-able dict; `apply(data, damage)` returns the damaged bytes and
`plan(...)` lists the damages a test runs on one pristine file, from its own layout.
"""

from __future__ import annotations

import gzip
import io
import random
import struct
import zipfile

PAGE = 4096


def apply(data: bytes, d: dict) -> bytes:
    kind = d["kind"]
    if kind == "none":
        return data
    if kind == "truncate":
        return data[: d["at"]]
    if kind == "zero":  # pages (or a tail) read back as zeros, the size kept
        a, b = d["start"], min(d["end"], len(data))
        return data[:a] + bytes(b - a) + data[b:]
    if kind == "allzero":
        return bytes(len(data))
    if kind == "empty":
        return b""
    if kind == "flip":
        out = bytearray(data)
        out[d["at"]] ^= 1 << d["bit"]
        return bytes(out)
    if kind == "append":
        return data + _tail(data, d)
    raise ValueError(f"unknown damage {kind}")


def _tail(data: bytes, d: dict) -> bytes:
    what, n = d["what"], d.get("n", 0)
    if what == "zeros":
        return bytes(n)
    if what == "random":
        return random.Random(n).randbytes(n).replace(b"PK", b"pk")  # no stray ZIP signature
    if what == "garbage":
        return b"garbage!"[:n] if n <= 8 else random.Random(n).randbytes(n)
    if what == "copy":
        return data
    if what == "eocd":  # a stray end-of-central-directory record
        return b"PK\x05\x06" + bytes(18)
    if what == "gzip-empty-member":
        return gzip.compress(b"", mtime=0)
    if what == "gzip-member":
        return gzip.compress(b"more", mtime=0)
    if what == "zeros-then-junk":
        return bytes(16) + b"junk"
    if what == "gzip-magic":
        return b"\x1f\x8b"
    raise ValueError(f"unknown tail {what}")


def label(d: dict) -> str:
    """The damage kind a result is counted under."""
    kind = d["kind"]
    if kind in ("flip", "zero", "append", "truncate"):
        return f"{kind}:{d['where']}"
    return kind


# --- plans -------------------------------------------------------------------------------

def zip_regions(data: bytes) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges of a torch.save ZIP by role: the pickle, the records' local headers, the
    central directory with the end records, the float tensor data (from a pristine file)."""
    zf = zipfile.ZipFile(io.BytesIO(data))
    out: dict[str, list[tuple[int, int]]] = {"pickle": [], "local": [], "tensor": [], "small": []}
    for info in zf.infolist():
        n_name, n_extra = struct.unpack_from("<HH", data, info.header_offset + 26)
        start = info.header_offset + 30 + n_name + n_extra
        out["local"].append((info.header_offset, info.header_offset + 30 + n_name))
        if info.filename.endswith("/data.pkl"):
            out["pickle"].append((start, start + info.file_size))
        elif "/data/" in info.filename and info.file_size >= 4 * PAGE:
            out["tensor"].append((start, start + info.file_size))
        elif "/data/" not in info.filename:
            out["small"].append((start, start + info.file_size))
    out["directory"] = [(zf.start_dir, len(data))]
    return out


def plan(data: bytes, fmt: str, rng: random.Random, full: bool) -> list[dict]:
    """The damages run on one pristine file. `full`: every byte of the last 4 KiB and every
    byte of the metadata; otherwise a sample of each kind."""
    size = len(data)
    out: list[dict] = [{"kind": "none"}, {"kind": "empty"}, {"kind": "allzero"}]
    last = range(max(1, size - PAGE), size) if full else sorted(rng.sample(range(max(1, size - PAGE), size), 64))
    out += [{"kind": "truncate", "at": n, "where": "last 4 KiB"} for n in last]
    bounds = list(range(PAGE, size, PAGE))
    some = bounds if full or len(bounds) <= 48 else sorted(rng.sample(bounds, 48))
    out += [{"kind": "truncate", "at": n, "where": "page boundary"} for n in some]
    out += [{"kind": "truncate", "at": size // 2, "where": "half"}]
    # (a last page shorter than 64 bytes is below what the zero-page rule can tell from data)
    out += [{"kind": "zero", "start": n, "end": size, "where": "tail from page boundary"} for n in some
            if size - n >= 64]
    out += [{"kind": "zero", "start": size - k, "end": size, "where": "tail, unaligned"} for k in (1, 100, 3000)]
    pages = list(range(0, size - PAGE, PAGE))
    mid = pages[1:] if full or len(pages) <= 48 else sorted(rng.sample(pages[1:], 48))
    out += [{"kind": "zero", "start": p, "end": p + PAGE, "where": "one page"} for p in mid]
    for _ in range(12 if full else 6):
        p = rng.choice(pages[1:] or [0])
        k = rng.randint(2, 8)
        out.append({"kind": "zero", "start": p, "end": min(size, p + k * PAGE), "where": "several pages"})
    out += _appends(fmt)
    if full and fmt == "zip":  # around the ~64 KiB that torch.load (miniz) looks back for the end record
        out += [{"kind": "append", "what": "random", "n": n, "where": "random, near the limit"}
                for n in range(65_500, 69_700, 7)]
    if fmt.startswith("zip"):
        out += _zip_flips(data, rng, full)
    elif fmt == "gz":
        out += _gz_flips(data, rng, full)
    elif fmt == "safetensors":
        out += _st_flips(data, rng, full)
    return out


def _appends(fmt: str) -> list[dict]:
    what = [("zeros", n) for n in (1, 100, PAGE, 65_000, 70_000, 1 << 20)]
    what += [("random", n) for n in (1, 100, PAGE, 65_000, 65_514, 65_540, 69_000, 70_000, 1 << 20)]
    what += [("garbage", 8), ("copy", 0), ("eocd", 0)]
    if fmt == "gz":
        what += [("gzip-empty-member", 0), ("gzip-member", 0), ("zeros-then-junk", 0), ("gzip-magic", 0)]
    return [{"kind": "append", "what": w, "n": n, "where": w} for w, n in what]


def _flips(where: str, ranges: list[tuple[int, int]], rng: random.Random, every: bool, k: int) -> list[dict]:
    spots = [i for a, b in ranges for i in range(a, b)]
    if not every and len(spots) > k:
        spots = sorted(rng.sample(spots, k))
    return [{"kind": "flip", "at": i, "bit": (i * 5 + 3) % 8, "where": where} for i in spots]


def _zip_flips(data: bytes, rng: random.Random, full: bool) -> list[dict]:
    r = zip_regions(data)
    return (_flips("pickle", r["pickle"], rng, full, 64) + _flips("local header", r["local"], rng, full, 64)
            + _flips("small record", r["small"], rng, full, 16) + _flips("directory", r["directory"], rng, full, 96)
            + _flips("tensor data", r["tensor"], rng, False, 48 if full else 16))


def _gz_flips(data: bytes, rng: random.Random, full: bool) -> list[dict]:
    name_end = data.index(b"\0", 10) + 1 if data[3] & 8 else 10
    return (_flips("gzip header", [(0, name_end)], rng, True, 0)
            + _flips("gzip trailer", [(len(data) - 8, len(data))], rng, True, 0)
            + _flips("deflate data", [(name_end, len(data) - 8)], rng, False, 48 if full else 16))


def _st_flips(data: bytes, rng: random.Random, full: bool) -> list[dict]:
    (n,) = struct.unpack_from("<Q", data)
    return (_flips("header length", [(0, 8)], rng, True, 0) + _flips("header", [(8, 8 + n)], rng, full, 96)
            + _flips("tensor data", [(8 + n, len(data))], rng, False, 48 if full else 16))
