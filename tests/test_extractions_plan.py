"""Pure layer: integrity checks on crafted files, scanning by name, diff and plan."""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import zipfile
import zlib

import pytest
from extraction_support import write_sample, write_samples
from reconcile_host.common.filechecks.integrity import (
    CONTENT,
    DAMAGED,
    GONE,
    STRUCTURE,
    UNREADABLE,
    WHOLE,
    check_path,
)
from reconcile_host.core.contract import Context
from reconcile_host.reconcilers.extractions import Damaged, ExtractionObserved, ExtractionsReconciler
from reconcile_host.reconcilers.extractions.job import JobObserved
from reconcile_host.reconcilers.extractions.listing import compile_pattern, scan
from reconcile_host.reconcilers.extractions.ranges import format_ranges, to_ranges

REC = ExtractionsReconciler()


# --- integrity -------------------------------------------------------------------------

def reason(path, depth=STRUCTURE):
    """The check's reason for a damaged file, None for a whole one."""
    v = check_path(str(path), depth)
    assert v.state in (WHOLE, DAMAGED), v
    return v.reason or None


def test_whole_ckpt_is_good(tmp_path):
    path = write_sample(tmp_path, 3)
    assert reason(path) is None and reason(path, CONTENT) is None
    # It is what torch.load expects: a ZIP with <stem>/data.pkl (tests/test_extractions_torch.py loads it).
    assert "data_3/data.pkl" in zipfile.ZipFile(path).namelist()


@pytest.mark.parametrize("cut", [1, 100, 300, -30, -1])
def test_ckpt_cut_anywhere_is_damaged(tmp_path, cut):
    full = write_sample(tmp_path, 3).read_bytes()
    path = write_sample(tmp_path, 3, cut=cut if cut > 0 else len(full) + cut)
    assert reason(path) and path.stat().st_size < len(full)


def test_zero_byte_file_is_damaged(tmp_path):
    path = tmp_path / "data_1.ckpt"
    path.write_bytes(b"")
    assert reason(path) == "empty file (0 bytes)"


def test_zip_without_data_pkl_is_damaged(tmp_path):
    path = tmp_path / "data_1.ckpt"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("x/other", b"1")
        zf.writestr("x/version", b"3\n")
    path.write_bytes(buf.getvalue())
    assert "data.pkl" in reason(path)


def test_zeroed_region_is_damaged(tmp_path):
    # Page-cache loss after a VM crash: the size is right but blocks read as zeros.
    path = write_sample(tmp_path, 3)
    data = bytearray(path.read_bytes())
    data[:64] = bytes(64)
    path.write_bytes(bytes(data))
    assert reason(path)


def test_flipped_tensor_byte_only_the_crc_sees(tmp_path):
    path = write_sample(tmp_path, 3, size=8192)
    data = bytearray(path.read_bytes())
    info = zipfile.ZipFile(path).getinfo("data_3/data/0")
    data[info.header_offset + 30 + len(info.filename) + 5000] ^= 4
    path.write_bytes(bytes(data))
    assert reason(path) is None  # structurally whole ...
    assert "CRC-32" in reason(path, CONTENT)  # ... but not what was written


def test_entry_beyond_end_is_damaged(tmp_path):
    path = write_sample(tmp_path, 3, size=4096)
    data = path.read_bytes()
    zf = zipfile.ZipFile(io.BytesIO(data))
    cd = zf.start_dir
    # Drop 1000 bytes of the tensor data before the central directory (offsets now point too far).
    info = zf.getinfo("data_3/data/0")
    start = info.header_offset + 30 + len(info.filename)
    path.write_bytes(data[:start + 10] + data[start + 1010:cd] + data[cd:])
    assert reason(path)


def test_archive_zipfile_refuses_with_an_exception_is_a_damaged_file(tmp_path):
    """A flipped compression method in the central directory made zipfile raise
    NotImplementedError, which turned the whole extraction into an error."""
    path = write_sample(tmp_path, 3)
    data = bytearray(path.read_bytes())
    cd = zipfile.ZipFile(path).start_dir
    data[cd + 10] = 99  # data.pkl's method: not one zipfile knows
    path.write_bytes(bytes(data))
    with pytest.raises(NotImplementedError):
        zipfile.ZipFile(path).read("data_3/data.pkl")
    assert "method 99" in reason(path)


def test_an_exception_in_a_checker_is_that_file_damaged(tmp_path, monkeypatch):
    from reconcile_host.common.filechecks import integrity

    path = write_sample(tmp_path, 3)
    for exc in (MemoryError(), OverflowError("int too large"), struct.error("unpack"), RecursionError()):
        def boom(*_a, exc=exc, **_k):
            raise exc
        monkeypatch.setattr(integrity, "check_torch_zip", boom)
        v = check_path(str(path))
        assert v.state == DAMAGED and v.reason.startswith(f"checker raised {type(exc).__name__}"), v


def test_what_cannot_be_read_is_unreadable_not_damaged(tmp_path):
    d = tmp_path / "data_1.ckpt"
    d.mkdir()
    fifo = tmp_path / "data_2.ckpt"
    os.mkfifo(fifo)  # opened without blocking: no writer would ever come
    for p in (d, fifo):
        for depth in (STRUCTURE, CONTENT):
            v = check_path(str(p), depth)
            assert v.state == UNREADABLE and v.reason.startswith("unreadable"), v
    assert check_path(str(tmp_path / "gone.ckpt")).state == GONE


def test_read_error_midway_is_unreadable(tmp_path, monkeypatch):
    """EIO while reading (a bad sector under the file), in the middle of the content check: the
    check could not be done, so the file is unreadable, not damaged (a real EIO, from a FUSE
    filesystem, is in tests/test_extractions_integrity.py)."""
    import errno

    from reconcile_host.common.filechecks import integrity

    # Larger than what the content check reads whole in one call (integrity.READ_CHUNK), so that
    # the content is read entry by entry after the structure was read: the EIO comes midway.
    path = write_sample(tmp_path, 3, size=2 * integrity.READ_CHUNK)

    def eio(*_a):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(integrity.os, "preadv", eio)
    v = check_path(str(path), CONTENT)
    assert v.state == UNREADABLE and v.reason == "unreadable: Input/output error (EIO)", v


def test_gz_checked_shallow_unless_content(tmp_path):
    good = write_sample(tmp_path, 1, fmt="ckpt.gz")
    full = good.read_bytes()
    cut = write_sample(tmp_path, 2, fmt="ckpt.gz", cut=len(full) // 2)
    assert check_path(str(good)).gz_shallow and reason(good) is None
    v = check_path(str(good), CONTENT)
    assert v.whole and not v.gz_shallow
    assert reason(cut) is None  # only the header is read without decompressing
    assert "truncated" in reason(cut, CONTENT)
    junk = tmp_path / "data_3.ckpt.gz"
    junk.write_bytes(full + b"junk")  # SpecForge's gzip.open(...).read() raises BadGzipFile
    assert "Not a gzipped file" in reason(junk, CONTENT)
    padded = tmp_path / "data_4.ckpt.gz"
    padded.write_bytes(full + bytes(100))  # zero padding: what gzip readers accept
    assert reason(padded, CONTENT) is None


def test_gz_of_truncated_ckpt_is_damaged_when_deep(tmp_path):
    inner = write_sample(tmp_path, 1).read_bytes()
    path = tmp_path / "data_9.ckpt.gz"
    path.write_bytes(gzip.compress(inner[: len(inner) - 40]))
    assert reason(path, CONTENT).startswith("gzip content:")


def test_safetensors(tmp_path):
    good = write_sample(tmp_path, 1, fmt="safetensors")
    full = good.read_bytes()
    assert reason(good) is None
    cut = write_sample(tmp_path, 2, fmt="safetensors", cut=len(full) - 1)
    assert reason(cut).startswith("truncated")
    header = write_sample(tmp_path, 3, fmt="safetensors", cut=20)
    assert reason(header).startswith("truncated")
    long = tmp_path / "data_4.safetensors"
    long.write_bytes(full + b"\0")
    assert "after the last tensor" in reason(long)
    bad = tmp_path / "data_5.safetensors"
    bad.write_bytes((5).to_bytes(8, "little") + b"{nope")
    assert "not JSON" in reason(bad)


def _safetensors(tensors: list[tuple[str, str, bytes]]) -> bytes:
    header, pos = {}, 0
    for name, dtype, data in tensors:
        width = {"I64": 8, "BF16": 2, "F32": 4}[dtype]
        header[name] = {"dtype": dtype, "shape": [len(data) // width], "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + b"".join(d for *_, d in tensors)


def test_safetensors_zero_page_in_float_data_only(tmp_path):
    """A crash-zeroed page is seen by the content check in float data; an integer tensor full of
    zeros (a loss_mask over a long prompt) is left alone."""
    import random

    rng = random.Random(3)
    floats = bytes(b | 1 for b in rng.randbytes(32768))  # no zero anywhere, as in real hidden states
    path = tmp_path / "data_1.safetensors"
    path.write_bytes(_safetensors([("loss_mask", "I64", bytes(16384)), ("hidden_state", "BF16", floats)]))
    assert reason(path) is None and reason(path, CONTENT) is None
    data = bytearray(path.read_bytes())
    start = len(data) - len(floats)
    page = -(-(start + 5000) // 4096) * 4096
    data[page:page + 4096] = bytes(4096)
    path.write_bytes(bytes(data))
    assert reason(path) is None  # the structure is intact
    assert "page of zeros" in reason(path, CONTENT) and "hidden_state" in reason(path, CONTENT)


def test_crc_of_a_range_from_running_crcs():
    import random
    import zlib

    from reconcile_host.common.filechecks.gzipstream import crc_of_suffix

    rng = random.Random(5)
    for _ in range(200):
        a, b = rng.randbytes(rng.randrange(0, 3000)), rng.randbytes(rng.randrange(0, 70000))
        assert crc_of_suffix(zlib.crc32(a + b), zlib.crc32(a), len(b)) == zlib.crc32(b)


def _gzip_variants(payload: bytes) -> list[bytes]:
    good = gzip.compress(payload, mtime=0)
    named = bytearray(good)
    named[3] |= 8  # FNAME set, but there is no name: gzip reads into the deflate data
    hcrc = bytearray(good)
    hcrc[3] |= 2
    out = [good, good + bytes(1), good + bytes(5000), good + gzip.compress(b"", mtime=0),
           good + gzip.compress(b"more", mtime=0), good + bytes(3) + gzip.compress(b"x", mtime=0),
           good + b"x", good + bytes(16) + b"junk", good + b"\x1f\x8b", good + b"\x1f", bytes(named), bytes(hcrc),
           b"", bytes(len(good)), b"\x1f\x8b\x07" + good[3:]]
    out += [good[:n] for n in (1, 2, 9, 10, 11, len(good) // 2, len(good) - 8, len(good) - 4, len(good) - 1)]
    for i in (4, 20, len(good) // 2, len(good) - 8, len(good) - 5, len(good) - 1):  # mtime, data, crc, isize
        flipped = bytearray(good)
        flipped[i] ^= 0x10
        out.append(bytes(flipped))
    return out


def test_gzip_rules_are_cpythons(tmp_path):
    """What follows the last member, truncation, flips: our streaming reader accepts exactly
    what `gzip.open(p).read()` (SpecForge's reader) accepts, with the same content."""
    from reconcile_host.common.filechecks.gzipstream import GzipDamage, decompress

    payload = write_sample(tmp_path, 1, size=20000).read_bytes()
    for n, data in enumerate(_gzip_variants(payload)):
        p = tmp_path / f"v{n}.gz"
        p.write_bytes(data)
        try:
            with gzip.open(p, "rb") as f:
                theirs = f.read()
        except (OSError, EOFError, zlib.error):
            theirs = None
        got = []
        try:
            with open(p, "rb") as fh:
                decompress(fh, got.append)
            ours = b"".join(got)
        except GzipDamage:
            ours = None
        assert ours == theirs, (n, data[-20:])


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 4096, 1 << 20])
def test_zip_stream_serves_what_the_zip_check_needs(tmp_path, chunk):
    """A ZIP content fed in chunks of any size: every entry's CRC-32 from the running CRCs and
    every local header, as a file would give them."""
    import zlib

    from reconcile_host.common.filechecks.gzipstream import ZipStream

    data = write_sample(tmp_path, 1, size=9000).read_bytes()
    s = ZipStream()
    for i in range(0, len(data), chunk):
        s(data[i:i + chunk])
    s.finish()
    view = s.view()
    for info in zipfile.ZipFile(io.BytesIO(data)).infolist():
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        assert view.crc_of(start, info.compress_size) == zlib.crc32(data[start:start + info.compress_size])
        assert view.read_at(info.header_offset, 30) == data[info.header_offset:info.header_offset + 30]


# --- scanning --------------------------------------------------------------------------

def test_pattern_matches_specforge_names():
    d, f = compile_pattern("rows_{group}/data_{index}.ckpt")
    assert d.fullmatch("rows_0-2000") and not d.fullmatch("other")
    assert f.fullmatch("data_17.ckpt").group("index") == "17"
    assert f.fullmatch("data_17.ckpt.gz") and not f.fullmatch("data_17.ckpt.tmp")


def test_scan_counts_by_name(tmp_path):
    write_samples(tmp_path, [0, 1, 2, 11, 35])
    write_sample(tmp_path, 12, fmt="ckpt.gz")
    write_sample(tmp_path, 2, fmt="ckpt.gz")
    (tmp_path / "rows_0-10" / "notes.txt").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / ".reconcile-quarantine" / "t" / "rows_0-10").mkdir(parents=True)
    (tmp_path / ".reconcile-quarantine" / "t" / "rows_0-10" / "data_5.ckpt").write_bytes(b"")
    found, extra, stray = scan(str(tmp_path), "rows_{group}/data_{index}.ckpt", 30)
    assert sorted(found) == [0, 1, 2, 11, 12]
    assert found[12] == "rows_10-20/data_12.ckpt.gz"
    assert sorted([found[2], *extra[2]]) == ["rows_0-10/data_2.ckpt", "rows_0-10/data_2.ckpt.gz"]
    assert stray == 1  # index 35 >= total


def test_ranges():
    assert to_ranges([5, 1, 2, 3, 9]) == [(1, 3), (5, 5), (9, 9)]
    assert format_ranges([(1, 3), (5, 5)], 2) == "1-3, 5 (+2 more ranges)"


# --- diff and plan ---------------------------------------------------------------------

def resource(**spec):
    base = {"dir": "/data/hs", "total": 100}
    base.update(spec)
    return REC.resources({"eagle3": base})[0]


def observed(counted=50, damaged=(), running=False, how="unit", exists=True, rate=None, eta=None):
    return ExtractionObserved(
        dir="/data/hs", exists=True, total=100, done=counted, counted=counted, files=counted,
        missing=100 - counted, missing_ranges=((counted, 99),) if counted < 100 else (), missing_ranges_more=0,
        damaged=tuple(damaged), writing=0, verify="at-risk", checked=0, unverified_gz=0, out_of_range=0,
        rate=rate, newest=None, eta_s=eta,
        job=JobObserved(how, "eagle3-extract.service" if how == "unit" else "", running, "x", 0, exists))


def test_done_is_ok():
    r = resource(min_done=90, job={"unit": "eagle3-extract.service"})
    obs = observed(counted=95)
    assert REC.diff(r, obs) == []
    assert REC.plan(r, obs, [], Context()).actions == ()


def test_short_and_stopped_plans_start():
    r = resource(job={"unit": "eagle3-extract.service"})
    obs = observed(counted=40)
    drift = REC.diff(r, obs)
    assert [(d.field, d.want, d.have) for d in drift] == [("done", ">= 100", 40)]
    plan = REC.plan(r, obs, drift, Context())
    assert [(a.action, a.target) for a in plan.actions] == [("start", "eagle3-extract.service")]
    assert not plan.converging and not plan.blocked
    assert "missing 40-99" in plan.message


def test_running_is_converging_with_eta():
    r = resource(job={"unit": "eagle3-extract.service"})
    obs = observed(counted=40, running=True, rate=1.09, eta=55.0)
    plan = REC.plan(r, obs, REC.diff(r, obs), Context())
    assert plan.actions == () and "1.09 samples/s" in plan.converging and "ETA 55s" in plan.converging


def test_damaged_quarantined_before_start():
    r = resource(job={"command": ["python", "x.py"]})
    obs = observed(counted=40, damaged=[Damaged("rows_0-10/data_7.ckpt", "truncated", 10, 0.0)], how="command")
    drift = REC.diff(r, obs)
    assert ("damaged", 0, 1) in [(d.field, d.want, d.have) for d in drift]
    plan = REC.plan(r, obs, drift, Context())
    assert [a.action for a in plan.actions] == ["quarantine", "start"]
    assert plan.actions[0].params["files"] == [{"path": "rows_0-10/data_7.ckpt", "reason": "truncated"}]


def test_no_resume_or_missing_unit_is_blocked():
    r = resource()
    obs = observed(counted=40, how="none")
    assert "no job declared" in REC.plan(r, obs, REC.diff(r, obs), Context()).blocked
    r = resource(job={"unit": "eagle3-extract.service"})
    obs = observed(counted=40, exists=False)
    assert "not found" in REC.plan(r, obs, REC.diff(r, obs), Context()).blocked


def test_min_done_defaults_to_total():
    assert resource().spec["min_done"] == 100


def test_observation_serialises():
    from reconcile_host.core.contract import to_plain

    text = json.dumps(to_plain(observed(damaged=[Damaged("a", "b", 1, 2.0)])))
    assert json.loads(text)["damaged"][0]["reason"] == "b"


def test_to_ranges_matches_a_plain_walk_on_random_sets():
    import random

    from reconcile_host.reconcilers.extractions.ranges import to_ranges

    def plain(indices):
        out = []
        for i in sorted(set(indices)):
            if out and i == out[-1][1] + 1:
                out[-1] = (out[-1][0], i)
            else:
                out.append((i, i))
        return out

    rng = random.Random(7)
    for _ in range(500):
        indices = [rng.randrange(100) for _ in range(rng.randrange(80))]
        assert to_ranges(indices) == plain(indices)
    assert to_ranges(range(37312)) == [(0, 37311)]


def test_bulk_name_parsing_agrees_with_the_regex_name_by_name():
    """Leaf.parse reads a directory of canonical names with a few string passes; whatever it
    returns must be what matching each name with the pattern's regex gives."""
    import random

    from reconcile_host.reconcilers.extractions.listing import Leaf, canonical_indices, leaf_form

    rng = random.Random(11)
    odd = ["data_007.ckpt", "data_0.ckpt", "data_00.ckpt", "data_.ckpt", "data_\u0663.ckpt", "data_5.ckpt.gz",
           "data_5.ckptx", "xdata_5.ckpt", "data_data_5.ckpt", "data_+5.ckpt", "data_5_0.ckpt", "data_ 5.ckpt",
           "data_5\n.ckpt", "notes.txt", "data_5.ckpt.gz.gz", "data_12.ckpt", "data_12.ckpt.gz"]
    for pattern in ("rows_{group}/data_{index}.ckpt", "data_{index}.ckpt.gz", "{index}", "x{index}0.pt"):
        rx = compile_pattern(pattern)[-1]
        form = leaf_form(pattern)
        for _ in range(400):
            base = rng.sample(range(60), rng.randrange(12))
            names = [f"{form.prefix}{i}{form.suffix}" for i in base]
            if rng.random() < 0.3:
                names += [f"{form.prefix}{i}{form.suffix}.gz" for i in base[:3]]
            if rng.random() < 0.5:
                names.append(rng.choice(odd))
            names = list(dict.fromkeys(names))
            rng.shuffle(names)
            leaf = Leaf.parse("", names, rx, form)
            got = sorted([(i, f"{form.prefix}{i}{form.suffix}") for i in _each(leaf.plain)]
                         + [(i, f"{form.prefix}{i}{form.suffix}.gz") for i in _each(leaf.gz)] + leaf.named)
            want = sorted((int(m.group("index")), n) for n in names if (m := rx.fullmatch(n)))
            assert got == want, (pattern, names)
            bulk = canonical_indices(names, form.prefix, form.suffix)
            canonical = all(n == f"{form.prefix}{i}{form.suffix}" for i, n in want) and len(want) == len(names)
            assert (bulk is not None) == canonical, (pattern, names)
            if bulk is not None:
                assert sorted(bulk) == sorted(i for i, _ in want)


def _each(ranges):
    return [i for a, b in ranges for i in range(a, b + 1)]


def test_range_operations_match_sets():
    import random

    from reconcile_host.reconcilers.extractions.ranges import contains, intersect, last, normalize, size, subtract

    rng = random.Random(5)
    for _ in range(500):
        x = {rng.randrange(60) for _ in range(rng.randrange(50))}
        y = {rng.randrange(60) for _ in range(rng.randrange(50))}
        rx, ry = to_ranges(x), to_ranges(y)
        assert intersect(rx, ry) == to_ranges(x & y)
        assert subtract(rx, ry) == to_ranges(x - y)
        assert normalize(rx + ry) == to_ranges(x | y)
        assert size(rx) == len(x)
        n = rng.randrange(10)
        assert last(rx, n) == to_ranges(sorted(x)[-n:] if n else [])
        assert all(contains(rx, i) == (i in x) for i in range(-1, 61))
