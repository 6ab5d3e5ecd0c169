"""What a user's sample file can make the check do is bounded by the file: a gzip bomb is
decompressed only up to its bound and called damaged, never spooled whole; a sparse file whose
ZIP end record claims a 4 GiB central directory is damaged without that directory being read;
a stream full of local-header signatures does not make the check keep them all. Each attack
runs in a child process that reports the bytes it read (/proc/self/io rchar) and its peak
memory (VmHWM), under an address-space limit so that an unbounded read fails instead of
exhausting the machine."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from reconcile_host.common.filechecks import gzipstream, torchzip
from reconcile_host.common.filechecks.integrity import CONTENT, DAMAGED, STRUCTURE, WHOLE, check_path

CHILD = r"""
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # an unbounded read fails, not the machine
from reconcile_host.common.filechecks.integrity import check_path
from reconcile_host.common.filechecks import gzipstream, torchzip  # (imported before counting)
from reconcile_host.core import paths

def rchar():
    with open("/proc/self/io") as fh:
        return int(dict(line.split(": ") for line in fh.read().splitlines())["rchar"])

before = rchar()
v = check_path(sys.argv[1], sys.argv[2])
read = rchar() - before
# VmHWM, the peak of this process's own memory: getrusage's ru_maxrss keeps the parent's across
# exec (fs/exec.c exec_mmap: setmax_mm_hiwater_rss), so a large test runner would read as this.
hwm = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:")).split()[1]
print(json.dumps({"state": v.state, "reason": v.reason, "read": read, "maxrss": int(hwm) * 1024}))
"""

MAX_RSS = 256 * 2**20  # the child's peak: the interpreter, the modules and a few MiB of buffers


def check_in_child(path: Path, depth: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), depth], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def content_beyond(path: Path, limit: int) -> bool:
    """Whether CPython's gzip (SpecForge's reader) gets more than `limit` bytes out of the file,
    reading 1 MiB at a time and stopping once it has."""
    total = 0
    with gzip.open(path, "rb") as fh:
        while total <= limit:
            chunk = fh.read(1 << 20)
            if not chunk:
                return False
            total += len(chunk)
    return True


def a_bomb(path: Path) -> bytes:
    """A ~1 MiB .ckpt.gz: gzip members of zeros, 1 GiB of content, which begins as a ZIP and ends
    with an end record pointing to a central directory in the middle (so a checker that cannot
    serve it from what it kept decompresses the whole content again into a file)."""
    zeros = gzip.compress(bytes(8 << 20), 9)
    n = 128
    content_size = n * (8 << 20) + 2 * 4096
    head = torchzip.LOCAL_SIG + bytes(4092)
    eocd = torchzip.EOCD.pack(torchzip.EOCD_SIG, 0, 0, 1, 1, torchzip.CENTRAL.size, content_size // 2, 0)
    tail = bytes(4096 - len(eocd)) + eocd
    data = gzip.compress(head) + zeros * n + gzip.compress(tail)
    path.write_bytes(data)
    return data


def test_a_gzip_bomb_is_damaged_within_its_bound_and_never_spooled(tmp_path):
    path = tmp_path / "rows_0-10" / "data_0.ckpt.gz"
    path.parent.mkdir()
    data = a_bomb(path)
    size = len(data)
    limit = gzipstream.content_limit(size)
    assert size < 1.1 * 2**20 and content_beyond(path, limit)
    tmpdir, state = tmp_path / "tmp", tmp_path / "state"
    tmpdir.mkdir()
    got = check_in_child(path, CONTENT, {"TMPDIR": str(tmpdir), "RECONCILE_STATE_DIR": str(state)})
    assert got["state"] == DAMAGED
    assert "decompression bomb" in got["reason"] and str(limit) in got["reason"]
    # Stopped at the bound: not even the compressed file was read to its end, nothing spooled.
    assert got["read"] < size
    assert got["maxrss"] < MAX_RSS
    assert list(tmpdir.iterdir()) == []
    assert not (state / "spool").exists() or list((state / "spool").iterdir()) == []


def test_a_sparse_file_claiming_a_4_gib_central_directory_is_damaged_unread(tmp_path):
    path = tmp_path / "data_0.ckpt"
    cd_ofs, cd_size = 4096, 0xFFFFFFFF  # the most a (ZIP64-less) end record can claim
    size = cd_ofs + cd_size + torchzip.EOCD.size
    with open(path, "wb") as fh:
        fh.write(torchzip.LOCAL_SIG)
        fh.truncate(size - torchzip.EOCD.size)  # a hole: no disk space, reads as zeros
        fh.seek(0, 2)
        fh.write(torchzip.EOCD.pack(torchzip.EOCD_SIG, 0, 0, 1, 1, cd_size, cd_ofs, 0))
    assert os.stat(path).st_blocks * 512 < 2**20  # sparse indeed
    assert os.stat(path).st_size == size and cd_ofs + cd_size <= size  # it "fits" in the file
    for depth in (STRUCTURE, CONTENT):
        got = check_in_child(path, depth, {})
        assert got["state"] == DAMAGED, got
        assert "central directory" in got["reason"] and str(cd_size) in got["reason"], got
        assert got["read"] < 2**20
        assert got["maxrss"] < MAX_RSS


def test_local_header_signatures_everywhere_do_not_make_the_stream_keep_them_all(tmp_path):
    # Every 30 bytes a local header whose name is 65,535 bytes long: each one, kept until its
    # name has arrived, would hold 64 KiB of the content.
    one = torchzip.LOCAL.pack(torchzip.LOCAL_SIG, 0, 0, 0, 0, 0, 0, 0, 0, 0xFFFF, 0)
    content = one * ((4 << 20) // len(one))
    path = tmp_path / "data_0.ckpt.gz"
    path.write_bytes(gzip.compress(content, 9))
    got = check_in_child(path, CONTENT, {"RECONCILE_STATE_DIR": str(tmp_path / "state")})
    assert got["state"] == DAMAGED
    assert "central directory" in got["reason"], got  # the archive's own damage, not a MemoryError
    assert got["maxrss"] < MAX_RSS


def test_a_content_read_twice_is_spooled_in_the_state_directory(tmp_path, monkeypatch):
    # A whole sample whose stream keeps nothing but its ends (MAX_HELD 0: every local header is
    # too much), so its CRCs must be read from a second decompression, into a file.
    from fake_extract import ckpt_bytes
    from reconcile_host.core import paths

    path = tmp_path / "data_3.ckpt.gz"
    path.write_bytes(gzip.compress(ckpt_bytes("data_3", 3, 3 << 20)))
    state, tmpdir = tmp_path / "state", tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(state))
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(gzipstream, "MAX_HELD", 0)
    where = []
    real = paths.spool_file

    def spool_file():
        fd = real()
        where.append(os.readlink(f"/proc/self/fd/{fd}"))
        return fd

    monkeypatch.setattr(paths, "spool_file", spool_file)
    v = check_path(str(path), CONTENT)
    assert v.state == WHOLE, v
    assert len(where) == 1 and where[0].startswith(str(state / "spool") + "/"), where
    assert (state / "spool").stat().st_mode & 0o777 == 0o700
    assert list(tmpdir.iterdir()) == [] and list((state / "spool").iterdir()) == []  # unnamed, gone


def test_the_spool_refuses_a_directory_another_user_could_write(tmp_path, monkeypatch):
    state = tmp_path / "state"
    (state / "spool").mkdir(parents=True)
    (state / "spool").chmod(0o777)
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(state))
    from reconcile_host.core import paths

    try:
        paths.spool_file()
    except paths.UnsafeOwnFile as exc:
        assert str(exc) == f"{state / 'spool'}: directory is writable by its group and others (mode 0777): " \
            "refusing to trust it (chmod go-w)"
    else:
        raise AssertionError("a world-writable spool directory was used")
