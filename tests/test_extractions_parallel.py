"""The integrity check on every CPU gives what the serial check gives.

A tree with every kind of file the check tells apart (whole, cut off, zeroed, a flipped tensor
byte only the CRC sees, zero bytes, .gz, safetensors, no CRCs, a directory and a FIFO with a
sample's name, an index with two files, recent and old modification times) is observed with
the check in the observer itself (RECONCILE_CHECK_WORKERS=1) and with 2, 3 and 7 workers, for
every verify mode and for a first check, a check in the same boot and one after a reboot: the
observations and the check records must be equal. Then the pool's own edges: a worker that dies
or raises, fewer tasks than workers, the worker count from the CPUs, the cgroup quota and the
filesystem type, which must be what `stat -f` (coreutils) says.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zipfile

import pytest
from extraction_support import write_sample
from reconcile_host.local.host import LocalHost
from reconcile_host.reconcilers.extractions import ExtractionsReconciler, pool, tally

N = 2600  # above tally.POOL_MIN_INDICES: the pool is used when workers are allowed
GROUP = 500


def _damage_tree(root) -> dict[int, str]:
    """Write N samples in rows of GROUP and damage some; which index got what."""
    what = {}
    for i in range(N):
        write_sample(root, i, group=GROUP, size=96)
    def path(i, ext=".ckpt"):
        g = i // GROUP * GROUP
        return root / f"rows_{g}-{g + GROUP}" / f"data_{i}{ext}"
    for i in (5, 777, 1999, N - 3):  # cut off
        data = path(i).read_bytes()
        path(i).write_bytes(data[:len(data) // 2])
        what[i] = "cut"
    for i in (12, 1500, N - 7):  # a flipped tensor byte: only the content check sees it
        data = bytearray(path(i).read_bytes())
        info = zipfile.ZipFile(path(i)).getinfo(f"data_{i}/data/0")
        data[info.header_offset + 30 + len(info.filename) + 10] ^= 1
        path(i).write_bytes(bytes(data))
        what[i] = "flip"
    path(40).write_bytes(b"")
    what[40] = "empty"
    for i in (41, N - 11):
        data = bytearray(path(i).read_bytes())
        data[-22:] = bytes(22)  # the end record zeroed
        path(i).write_bytes(bytes(data))
        what[i] = "zeroed end"
    path(60).unlink()
    path(60).mkdir()
    what[60] = "directory"
    path(61).unlink()
    os.mkfifo(path(61))
    what[61] = "fifo"
    path(70).unlink()
    write_sample(root, 70, group=GROUP, fmt="ckpt.gz")
    write_sample(root, 71, group=GROUP, fmt="ckpt.gz")  # two files for one index
    path(80).unlink()
    write_sample(root, 80, group=GROUP, fmt="ckpt.gz", cut=30)  # a .gz cut off: only content sees it
    what[80] = "gz cut"
    # Times: most a day old, the last 400 one second apart up to now, a few odd ones.
    now = time.time()
    for p in root.glob("rows_*/data_*"):
        i = int(p.name.split("_")[1].split(".")[0])
        t = now - (N - i) if i >= N - 400 else now - 86400 - i
        if i in (1500, 777):
            t = now - 30  # recent, in the middle of the tree
        os.utime(p, (t, t))
    for d in root.iterdir():
        os.utime(d, (now - 100, now - 100))
    return what


def _observe(tmp, root, workers: int, verify: str, boot: str) -> tuple[dict, dict]:
    state = tmp / f"state-{workers}-{verify}"
    os.environ["RECONCILE_STATE_DIR"] = str(state)
    os.environ["RECONCILE_CHECK_WORKERS"] = str(workers)
    (tmp / "boot_id").write_text(boot)
    rec = ExtractionsReconciler()
    (r,) = rec.resources({"x": {"dir": str(root), "pattern": "rows_{group}/data_{index}.ckpt", "total": N + 5,
                                "verify": verify, "job": {"command": ["true"]}}})
    obs = rec.observe(LocalHost(), [r])[r.id]
    record = json.loads((state / "extractions" / "x.check.json").read_text())
    record.pop("checked_at")
    return dict(obs.__dict__), record


@pytest.fixture()
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONCILE_BOOT_ID_FILE", str(tmp_path / "boot_id"))
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RECONCILE_CHECK_WORKERS", "1")
    root = tmp_path / "hs"
    root.mkdir()
    return root, _damage_tree(root)


@pytest.mark.parametrize("verify", ["at-risk", "content", "none"])
def test_every_cpu_finds_what_one_finds(tmp_path, tree, verify, monkeypatch):
    root, what = tree
    monkeypatch.setattr(tally, "POOL_MIN_BYTES", 0)  # the recent files read whole on the pool too
    monkeypatch.setattr(tally, "PRUNE_AT", 16)  # held files added up as the newest moves, often
    used = []
    real = pool.map_forked

    def spy(fn, tasks, workers, on_tick, **kw):
        used.append((fn.__name__, workers))
        return real(fn, tasks, workers, on_tick, **kw)

    monkeypatch.setattr(pool, "map_forked", spy)  # tally imports it with the first check
    results = {}
    for workers in (1, 2, 3, 7):
        shutil.rmtree(tmp_path / f"state-{workers}-{verify}", ignore_errors=True)
        runs = [_observe(tmp_path, root, workers, verify, "boot-1"),  # first check
                _observe(tmp_path, root, workers, verify, "boot-1"),  # same boot: the record is used
                _observe(tmp_path, root, workers, verify, "boot-2")]  # after a reboot
        results[workers] = runs
    for workers in (2, 3, 7):
        assert results[workers] == results[1], workers
    if verify != "none":  # (none stats at most 256 new files and the recent ones: never a pool)
        assert ("indices", 7) in used and ("indices", 1) in used
    if verify == "at-risk":
        assert ("content", 7) in used  # the first check's recent files, and those after the reboot
    first, _ = results[1][0]
    if verify == "none":
        assert first["checked"] == 0
        return
    # The serial answer is the one the damage calls for (so equality is not two empty answers).
    damaged = {d.path.rsplit("_", 1)[1].split(".")[0] for d in first["damaged"]}
    want = {str(i) for i, w in what.items() if w not in ("directory", "fifo")}
    if verify == "at-risk":  # a flip or a .gz cut off far from the newest files shows to the content check only
        want -= {str(i) for i, w in what.items() if w in ("flip", "gz cut") and i not in (1500, N - 7)}
    assert damaged == want
    assert {u.path.rsplit("_", 1)[1].split(".")[0] for u in first["unreadable"]} == {"60", "61"}
    assert first["checked"] == N + 1  # every file once (index 71 has two)
    assert [d.path for d in first["damaged"]] == sorted((d.path for d in first["damaged"]),
                                                         key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))


def test_the_pool_runs_a_task_again_when_its_worker_fails(tmp_path):
    parent = os.getpid()

    def fn(task, tick, hint):
        tick(1)
        if os.getpid() != parent and task == 3:
            os._exit(9)  # a worker killed mid-task (OOM killer, a bug in C)
        if os.getpid() != parent and task == 5:
            raise RuntimeError("in a worker")
        return task * task

    seen = []
    assert pool.map_forked(fn, list(range(12)), 3, seen.append) == [n * n for n in range(12)]
    assert sum(seen) >= 12  # every task's ticks came through (the redone ones twice)

    def boom(task, tick, hint):
        raise ValueError(f"task {task}")

    with pytest.raises(ValueError, match="task 0"):  # a task that fails everywhere fails as it would serially
        pool.map_forked(boom, [0, 1], 2, lambda n: None)
    assert pool.map_forked(fn, [2], 4, lambda n: None) == [4]  # fewer tasks than workers


def test_worker_count(tmp_path, monkeypatch):
    monkeypatch.delenv("RECONCILE_CHECK_WORKERS", raising=False)
    cpus = pool.cpus_allowed()
    assert 1 <= cpus <= len(os.sched_getaffinity(0))
    assert pool.worker_count(str(tmp_path), 1000) == (cpus if pool.network_fs(str(tmp_path)) is None
                                                      else min(cpus, pool.NETWORK_WORKERS))
    assert pool.worker_count(str(tmp_path), 1) == 1
    monkeypatch.setenv("RECONCILE_CHECK_WORKERS", "5")
    assert pool.worker_count(str(tmp_path), 1000) == 5
    monkeypatch.setattr(pool, "network_fs", lambda path: "nfs")
    monkeypatch.setattr(pool, "cpus_allowed", lambda: 64)
    monkeypatch.delenv("RECONCILE_CHECK_WORKERS")
    assert pool.worker_count(str(tmp_path), 1000) == pool.NETWORK_WORKERS


def test_statfs_type_is_what_stat_f_says(tmp_path):
    """f_type as coreutils' `stat -f -c %t` prints it (hex), here and on /proc and /dev/shm."""
    for path in (str(tmp_path), "/proc", "/dev/shm", "/"):
        if not os.path.exists(path):
            continue
        theirs = subprocess.run(["stat", "-f", "-c", "%t", path], capture_output=True, text=True, check=True)
        assert pool.statfs_type(path) == int(theirs.stdout.strip(), 16), path
    assert pool.network_fs("/proc") is None


def test_a_fuse_filesystem_is_remote(tmp_path):
    """On FUSE (tests/fuse_eio.py's filesystem, mounted for real in a private namespace) statfs
    says FUSE, as `stat -f` does, and the check takes at most NETWORK_WORKERS workers however many
    CPUs there are."""
    import sys
    from pathlib import Path

    import mounts_support as ms

    why = ms.namespaces_missing() or ms.fuse_missing()
    if why:
        pytest.skip(why)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    src = write_sample(tmp_path / "src", 1)
    probe = ("from reconcile_host.reconcilers.extractions import pool; import sys; "
             "pool.cpus_allowed = lambda: 64; m = sys.argv[1]; "
             "print(hex(pool.statfs_type(m)), pool.network_fs(m), pool.worker_count(m, 1000), "
             "pool.worker_count(sys.argv[2], 1000))")
    py, fuse = sys.executable, Path(__file__).with_name("fuse_eio.py")
    env = {k: v for k, v in os.environ.items() if k != "RECONCILE_CHECK_WORKERS"}
    proc = ms.in_namespace(f"""
        {py} {fuse} {mnt} {tmp_path / 'ready'} none data_1.ckpt={src} &
        server=$!
        for i in $(seq 200); do [ -e {tmp_path / 'ready'} ] && break; sleep 0.05; done
        stat -f -c %t {mnt} > {tmp_path / 'stat.txt'} || true
        {py} -c "{probe}" {mnt} {tmp_path} > {tmp_path / 'probe.txt'} || true
        kill $server
    """, env)
    assert proc.returncode == 0, proc.stderr
    theirs = int((tmp_path / "stat.txt").read_text().strip(), 16)
    f_type, name, workers, local = (tmp_path / "probe.txt").read_text().split()
    assert int(f_type, 16) == theirs == 0x65735546 and name == "fuse"
    assert int(workers) == pool.NETWORK_WORKERS
    assert int(local) == (64 if pool.network_fs(str(tmp_path)) is None else pool.NETWORK_WORKERS)


def test_a_filesystem_statfs_cannot_name_is_treated_as_remote(tmp_path, monkeypatch):
    monkeypatch.delenv("RECONCILE_CHECK_WORKERS", raising=False)
    monkeypatch.setattr(pool, "statfs_type", lambda path: None)  # a FUSE server without STATFS: ENOSYS
    monkeypatch.setattr(pool, "cpus_allowed", lambda: 64)
    assert pool.network_fs(str(tmp_path)) == "unknown"
    assert pool.worker_count(str(tmp_path), 1000) == pool.NETWORK_WORKERS


def test_tally_keeps_few_files_one_by_one(tmp_path, tree):
    """What crosses between processes for a tree of whole, old files is ranges, not verdicts."""
    root, _ = tree
    from reconcile_host.reconcilers.extractions.listing import list_tree

    listing = list_tree(str(root), "rows_{group}/data_{index}.ckpt")
    check = tally.Check(str(root), listing, "structure", set())
    part = check.indices((100, 399), lambda n: None)  # old, whole files, 299 s apart: any may be recent
    assert len(part.held) == 300 and part.good == [] and part.checked == 0
    newest = max(h.v.st.st_mtime_ns for h in part.held) / 1e9
    part = check.indices((100, 399), lambda n: None, newest + 400)  # a newer file was seen before
    assert part.held == [] and part.good == [(100, 399)] and part.checked == 300


def test_files_in_is_paths_for_every_index():
    """Listing.files_in (the check's walk over a run of indices) gives what paths() gives."""
    import random

    from reconcile_host.reconcilers.extractions.listing import Leaf, LeafForm, Listing
    from reconcile_host.reconcilers.extractions.ranges import to_ranges

    rng = random.Random(1)
    form = LeafForm("data_", ".ckpt", True)
    for _ in range(300):
        leaves = []
        for n in range(rng.randrange(1, 5)):
            plain = {rng.randrange(0, 60) for _ in range(rng.randrange(0, 30))}
            gz = {rng.randrange(0, 60) for _ in range(rng.randrange(0, 10))}
            named = [(rng.randrange(0, 60), f"data_0{rng.randrange(0, 60)}.ckpt") for _ in range(rng.randrange(0, 4))]
            leaves.append(Leaf(f"rows_{n}/", to_ranges(plain), to_ranges(gz), named))
        listing = Listing(leaves, form)
        lo = rng.randrange(0, 60)
        hi = rng.randrange(lo, 70)
        assert list(listing.files_in(lo, hi)) == [(i, listing.paths(i)) for i in range(lo, hi + 1)]


def test_the_fast_crc32_is_zlibs(tmp_path, monkeypatch):
    """ISA-L's CRC-32 (the `fast` extra), when installed, is zlib's on any data, chunked as the
    content check chunks it; and without it the content check gives the same verdicts."""
    import random
    import zlib

    from reconcile_host.common.filechecks import integrity

    isal = pytest.importorskip("isal.isal_zlib")
    monkeypatch.setattr(integrity, "_CRC32", None)
    assert integrity._crc32() is isal.crc32
    rng = random.Random(20)
    for _ in range(200):
        data = rng.randbytes(rng.randrange(0, 300_000))
        view, crc_a, crc_b, pos = memoryview(data), 0, 0, 0
        while pos < len(data):
            step = rng.randrange(1, 70_000)
            crc_a, crc_b = isal.crc32(view[pos:pos + step], crc_a), zlib.crc32(view[pos:pos + step], crc_b)
            pos += step
        assert crc_a == crc_b == zlib.crc32(data)
    good = write_sample(tmp_path, 1, size=300_000)
    bad = write_sample(tmp_path, 2, size=300_000)
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x40
    bad.write_bytes(bytes(data))
    verdicts = []
    for impl in (isal.crc32, zlib.crc32):
        monkeypatch.setattr(integrity, "_CRC32", impl)
        verdicts.append([integrity.check_path(str(p), integrity.CONTENT)[:3] for p in (good, bad)])
    assert verdicts[0] == verdicts[1] and verdicts[0][0][0] == "whole" and "CRC-32" in verdicts[0][1][1]


def test_a_worker_stuck_on_a_read_ends_the_observation_at_its_deadline(tmp_path):
    """The heartbeat deadline is kept with the check on workers: one file of a FUSE directory
    whose read is never answered (tests/fuse_eio.py hang:NAME) holds a worker in the kernel;
    the other workers' files keep coming for a while, then nothing does, and the extraction
    is reported `error` after observe_timeout without progress instead of waited on."""
    import json
    import sys
    from pathlib import Path

    import mounts_support as ms
    from extraction_support import state_yaml, write_samples

    why = ms.namespaces_missing() or ms.fuse_missing()
    if why:
        pytest.skip(why)
    n = 1200
    assert n >= tally.POOL_MIN_INDICES  # the check runs on workers
    src = tmp_path / "src"
    write_samples(src, range(n), group=2000)
    out = tmp_path / "hs"
    (out / "rows_0-2000").mkdir(parents=True)
    pairs = " ".join(f"data_{i}.ckpt={src / 'rows_0-2000' / f'data_{i}.ckpt'}" for i in range(n))
    (tmp_path / "pairs").write_text(pairs)
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": n, "verify": "content", "observe_timeout": "2s"})
    env = {**os.environ, "RECONCILE_STATE_DIR": str(tmp_path / "state"), "RECONCILE_CACHE_DIR": str(tmp_path / "c"),
           "RECONCILE_CHECK_WORKERS": "2"}
    py, fuse = sys.executable, Path(__file__).with_name("fuse_eio.py")
    proc = ms.in_namespace(f"""
        {py} {fuse} {out / 'rows_0-2000'} {tmp_path / 'ready'} hang:data_600.ckpt $(cat {tmp_path / 'pairs'}) &
        server=$!
        for i in $(seq 200); do [ -e {tmp_path / 'ready'} ] && break; sleep 0.05; done
        date +%s.%N > {tmp_path / 'elapsed'}
        {py} -m reconcile_host diff {state} --format json > {tmp_path / 'diff.json'} || true
        date +%s.%N >> {tmp_path / 'elapsed'}
        kill $server
    """, env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "diff.json").read_text())
    res = report["resources"][0]
    assert res["status"] == "error" and res["message"].startswith("observing extraction made no progress for 2s"), res
    start, end = (float(x) for x in (tmp_path / "elapsed").read_text().split())
    assert end - start < 60, f"diff took {end - start:.1f}s"
