"""The structural check's fast path (common/filechecks/torchfast.py) on small samples written by
the real torch.save: it is taken for torch's own files, it reads each file once, and it never
changes a verdict. Every damage the differential suite makes (tests/sample_damage.py's full plan:
every byte of the last 4 KiB cut off, every metadata byte flipped, zeroed pages and tails,
appended bytes up to and past miniz's search window) gives the same verdict, reason included,
with the fast path as with read_layout alone; where the fast path answers, read_layout calls the
file whole with the same trailing bytes and CRC state. (Against torch.load itself, the small
samples are in tests/test_extractions_torch.py's corpus.)
"""

from __future__ import annotations

import os
import random
import zlib

import pytest
import sample_damage
import torch_support as ts
from reconcile_host.common.filechecks import integrity, torchfast
from reconcile_host.common.filechecks.integrity import CONTENT, STRUCTURE, check_path
from reconcile_host.common.filechecks.torchfast import check_whole_buffer
from reconcile_host.common.filechecks.torchpickle import PickleDamage
from reconcile_host.common.filechecks.torchzip import ZipDamage, check_torch_zip

# SpecForge's sample (tests/torch_samples.py record), small: T tokens, H hidden; the layouts with
# other tensors; one without CRCs.
SMALL = [("specforge", 18, 32, "bf16", True), ("specforge", 5, 16, "fp16", True), ("positions", 9, 32, "bf16", True),
         ("padded-bool", 12, 32, "bf16", True), ("tokens", 40, 32, "bf16", True), ("specforge", 18, 32, "bf16", False)]


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    new = ts.need(ts.torch_python(), "torch 2.x interpreter")
    tmp = tmp_path_factory.mktemp("small")
    spec = [{"path": str(tmp / f"data_{n}.ckpt"), "fmt": "ckpt", "t": t, "h": h, "dtype": dtype, "seed": 7 + n,
             "crc": crc, "layout": layout} for n, (layout, t, h, dtype, crc) in enumerate(SMALL)]
    # the first sample under names of 1 to 12 characters: 12 shapes of directory
    spec += [dict(spec[0], path=str(tmp / f"{'n' * k}.ckpt")) for k in range(1, 13)]
    ts.write(new, spec, tmp)
    old = ts.old_torch_python()
    if old is not None:  # torch 1.13's files: no `.storage_alignment`, no serialization id
        spec_old = [{"path": str(tmp / "old_data_0.ckpt"), "fmt": "ckpt", "t": 18, "h": 32, "dtype": "fp16",
                     "seed": 3, "crc": True}]
        ts.write(old, spec_old, tmp)
        spec += spec_old
    return [(s["path"], open(s["path"], "rb").read()) for s in spec]


@pytest.fixture
def at_once(monkeypatch):
    """Every shape compiled the first time it is seen (torchfast.COMPILE_AFTER: by default after
    32 files of its entry count and directory size), from empty caches."""
    monkeypatch.setattr(torchfast, "COMPILE_AFTER", 1)
    monkeypatch.setattr(torchfast, "_SHAPES", {})
    monkeypatch.setattr(torchfast, "_SEEN", {})


class Memory:
    """A torchzip Source over bytes (read_layout's own reads, no fast path)."""

    def __init__(self, data: bytes):
        self.data, self.size = data, len(data)

    def read_at(self, offset: int, n: int) -> bytes:
        return self.data[offset:offset + n]


def slow(data: bytes):
    """read_layout's verdict: (whole, its ZipResult or the reason)."""
    try:
        result, _ = check_torch_zip(Memory(data), False)
    except (ZipDamage, PickleDamage) as exc:
        return False, str(exc)
    return True, result


def test_fast_path_is_taken_for_torchs_own_files(samples, at_once):
    for path, data in samples:
        assert len(data) <= integrity.WHOLE_READ, (path, len(data))
        got = check_whole_buffer(data)
        assert got is not None, path
        assert slow(data) == (True, got), path
        # at-risk's whole read: the CRCs too (an archive without them is the full check's)
        assert check_whole_buffer(data, zlib.crc32) == got, path
        bad = bytearray(data)
        bad[len(data) // 2] ^= 1
        assert got.no_crc or check_whole_buffer(bytes(bad), zlib.crc32) is None, path


def test_fast_path_never_changes_a_verdict(samples, tmp_path, monkeypatch, at_once):
    rng = random.Random(31)
    answered = damages = 0
    scratch = tmp_path / "data_9.ckpt"
    for path, pristine in samples:
        if os.path.basename(path).startswith("n"):
            continue  # (the same sample under other names: test_the_compiled_shapes_are_bounded)
        full = path.endswith("data_0.ckpt")
        for d in sample_damage.plan(pristine, "zip", rng, full):
            data = sample_damage.apply(pristine, d)
            damages += 1
            fast = check_whole_buffer(data) if data else None
            if fast is not None:
                answered += 1
                assert slow(data) == (True, fast), (path, d)
            if damages % 8 and not (fast is not None and d["kind"] != "none"):
                continue  # (through the files: an eighth of the damages, and each one the fast path answers)
            scratch.write_bytes(data)
            # the structure, and at-risk's whole read (its CRCs: the compiled check's crc32)
            for depth, walk in ((STRUCTURE, True), (CONTENT, False)):
                with_fast = check_path(str(scratch), depth, walk=walk)
                with monkeypatch.context() as m:
                    m.setattr(integrity, "check_whole_buffer", lambda _buf, _crc32=None: None)
                    without = check_path(str(scratch), depth, walk=walk)
                assert with_fast._replace(st=None) == without._replace(st=None), (path, d, depth)
    # (the damages the fast path answers are the harmless ones: a flip in tensor data, bytes appended
    # past miniz's window, ...; the rest it leaves to read_layout)
    assert damages > 5000 and 0 < answered < damages / 2, (answered, damages)


def _reads(monkeypatch) -> list[tuple[str, int]]:
    calls: list[tuple[str, int]] = []
    for name in ("pread", "read", "preadv", "readv"):
        real = getattr(os, name)

        def spy(*args, _real=real, _name=name):
            got = _real(*args)
            calls.append((_name, got if isinstance(got, int) else len(got)))
            return got

        monkeypatch.setattr(os, name, spy)
    return calls


def test_a_shape_is_compiled_once_it_is_common(samples, monkeypatch):
    """Until COMPILE_AFTER files of one entry count and directory size are seen, read_layout checks
    them (a compilation costs about a millisecond); from then on the shape's check takes them,
    and every file of that shape after it, with the same answer as read_layout's."""
    monkeypatch.setattr(torchfast, "_SHAPES", {})
    monkeypatch.setattr(torchfast, "_SEEN", {})
    path, data = samples[0]
    answers = [check_whole_buffer(data) for _ in range(torchfast.COMPILE_AFTER + 3)]
    assert answers[:torchfast.COMPILE_AFTER - 1] == [None] * (torchfast.COMPILE_AFTER - 1)
    assert answers[torchfast.COMPILE_AFTER - 1:] == [slow(data)[1]] * 4
    assert sum(map(len, torchfast._SHAPES.values())) == 1
    # another sample of the same shape but for its sizes and CRCs: taken at once
    same = [d for p, d in samples[1:] if torchfast._SHAPES.get(_key(d))]
    assert same  # (data_5.ckpt: data_0.ckpt's shape, without CRCs)
    for d in same:
        assert check_whole_buffer(d) == slow(d)[1]


def test_the_compiled_shapes_are_bounded(samples, monkeypatch, at_once):
    """Files of ever new shapes (torch.save's own, under names of 1 to 12 characters: the archive's
    folder is the file's name) never keep more than MAX_SHAPES compiled checks; each answers as
    read_layout does."""
    monkeypatch.setattr(torchfast, "MAX_SHAPES", 4)
    named = [d for p, d in samples if os.path.basename(p).startswith("n")]
    assert len({_key(d) for d in named}) == len(named) == 12
    for data in named:
        assert check_whole_buffer(data) == slow(data)[1] is not None
        assert sum(map(len, torchfast._SHAPES.values())) <= 4


def _key(data: bytes) -> tuple[int, int]:
    """(entry count, directory size) from a torch.save file's ZIP64 end record."""
    z64 = len(data) - 98
    return int.from_bytes(data[z64 + 32:z64 + 40], "little"), int.from_bytes(data[z64 + 40:z64 + 48], "little")


@pytest.mark.parametrize("depth, walk", [(STRUCTURE, True), (CONTENT, True), (CONTENT, False)])
def test_a_small_file_is_read_once(samples, monkeypatch, depth, walk):
    path, data = samples[0]
    calls = _reads(monkeypatch)
    v = check_path(path, depth, walk=walk)
    monkeypatch.undo()
    assert v.whole, v
    assert calls == [("pread", len(data))]


def test_a_large_file_reads_a_few_pages_at_the_structure_depth(tmp_path, monkeypatch):
    new = ts.need(ts.torch_python(), "torch 2.x interpreter")
    path = tmp_path / "data_0.ckpt"
    ts.write(new, [{"path": str(path), "fmt": "ckpt", "t": 63, "h": 256, "dtype": "bf16", "seed": 1}], tmp_path)
    size = path.stat().st_size
    assert size > 4 * integrity.WHOLE_READ
    calls = _reads(monkeypatch)
    v = check_path(str(path), STRUCTURE)
    monkeypatch.undo()
    assert v.whole, v
    assert len(calls) <= 6 and sum(n for _, n in calls) <= 4 * 4096, calls
