"""kill -9 of `apply` while it quarantines: every moved file keeps its record, the next apply
finishes the half-done quarantine and converges.

The point of the kill is reached in the work, never after a sleep: the mover blocks on a FIFO
(reconcilers/extractions/quarantine.py's test seam) once it has written its Nth record or made
its Nth move, and the test kills the whole process group when, and only when, the mover is
there. What is asserted comes from the filesystem: the files in the quarantine directory, the
originals' size and mtime as os.stat gave them before the apply, the records and manifests.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import reconcile_json
from extraction_support import env_for, resource, state_yaml, write_sample, write_samples
from reconcile_host.common.filechecks.integrity import CONTENT, check_path

QDIR = ".reconcile-quarantine"
DAMAGED = 730  # more than the 724 moves of the largest kill seen
GOOD = 20


def _tree(tmp: Path) -> tuple[Path, Path, dict[str, os.stat_result]]:
    """GOOD whole samples, then DAMAGED damaged ones (empty, or cut off), each with its own old
    mtime, declared allowed-missing: once they are moved aside the extraction is ok."""
    out = tmp / "hs"
    write_samples(out, range(GOOD), group=1000)
    full = len(write_sample(out, GOOD, group=1000).read_bytes())
    damaged = range(GOOD, GOOD + DAMAGED)
    base = time.time() - 86400
    originals = {}
    for k, i in enumerate(damaged):
        p = write_sample(out, i, group=1000, cut=0 if k % 3 else full // 2)
        os.utime(p, ns=(int((base + k) * 1e9) + 123, int((base + k) * 1e9) + 123))
        originals[str(p.relative_to(out))] = p.stat()
    state = state_yaml(tmp / "s.yaml", {"dir": str(out), "total": GOOD + DAMAGED, "pattern":
                                        "rows_{group}/data_{index}.ckpt", "allow_missing": list(damaged)})
    return out, state, originals


def _apply_killed_at(tmp: Path, state: Path, point: str) -> None:
    """Run apply until its mover reaches `point` ("moved:N", "recorded:N"), then SIGKILL its group."""
    fifo = tmp / "pause.fifo"
    os.mkfifo(fifo)
    env = {**env_for(tmp), "RECONCILE_TEST_QUARANTINE_PAUSE": point, "RECONCILE_TEST_QUARANTINE_FIFO": str(fifo)}
    proc = subprocess.Popen([sys.executable, "-m", "reconcile_host", "apply", str(state), "--format", "json",
                             "--journal", str(tmp / "journal.jsonl")], env=env, cwd=tmp, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:  # the FIFO opens for writing only once the mover holds it open for reading
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
            assert proc.poll() is None, f"apply ended before {point}: {proc.stderr.read().decode()}"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # at the point: the mover is blocked there
        proc.wait()
        os.close(fd)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _records(qdir: Path) -> dict[str, dict]:
    return {r["path"]: r for r in map(json.loads, (qdir / "moves.jsonl").read_text().splitlines())}


def _moved_files(qdir: Path) -> set[str]:
    return {str(p.relative_to(qdir)) for p in qdir.rglob("*") if p.is_file()} - {"moves.jsonl", "manifest.json"}


def _assert_converges(tmp: Path, out: Path, state: Path, originals: dict[str, os.stat_result]) -> None:
    rc, rep, err = reconcile_json(tmp, "apply", str(state))
    r = resource(rep)
    assert rc == 0 and r["status"] == "ok", (r, err)
    assert [a["action"] for a in r["actions"]][0] == "finish-quarantine"
    listed: dict[str, dict] = {}
    for qdir in (out / QDIR).iterdir():
        manifest = json.loads((qdir / "manifest.json").read_text())
        files = {f["path"]: f for f in manifest["files"]}
        assert set(files) == _moved_files(qdir)  # the manifest lists exactly what is there
        assert not set(files) & set(listed)
        listed.update(files)
    # Every damaged file: moved once, listed with its reason, original size and mtime.
    assert set(listed) == set(originals)
    for rel, st in originals.items():
        assert not (out / rel).exists()
        f = listed[rel]
        assert f["size"] == st.st_size and f["mtime"] == st.st_mtime and f["reason"]
        moved = check_path(str(out / f["moved_to"]), CONTENT)
        assert moved.reason == f["reason"] and moved.st.st_mtime_ns == st.st_mtime_ns
    rc, rep, _ = reconcile_json(tmp, "diff", str(state))
    assert rc == 0, rep
    rc, rep, _ = reconcile_json(tmp, "apply", str(state))
    assert rc == 0 and resource(rep)["actions"] == []


@pytest.mark.parametrize("point", ["moved:1", "moved:8", "moved:724", "recorded:1", "recorded:8"])
def test_kill_while_quarantining_keeps_every_record_and_the_next_apply_finishes(tmp_path, point):
    out, state, originals = _tree(tmp_path)
    _apply_killed_at(tmp_path, state, point)
    what, n = point.split(":")
    n = int(n)
    (qdir,) = (out / QDIR).iterdir()
    assert not (qdir / "manifest.json").exists()  # killed before it
    moved, records = _moved_files(qdir), _records(qdir)
    assert len(moved) == (n if what == "moved" else n - 1) and len(records) == n
    for rel in moved:  # every moved file has its record, with the original's reason, size and mtime
        st = originals[rel]
        assert records[rel]["reason"] and records[rel]["size"] == st.st_size and records[rel]["mtime"] == st.st_mtime
        assert (qdir / rel).stat().st_mtime_ns == st.st_mtime_ns
    for rel in set(records) - moved:  # recorded, not moved: still in place
        assert (out / rel).exists()

    rc, rep, _ = reconcile_json(tmp_path, "diff", str(state))
    r = resource(rep)
    assert rc == 2 and {"field": "unfinished_quarantine", "want": 0, "have": 1} in r["drift"]
    _assert_converges(tmp_path, out, state, originals)
    manifest = json.loads((qdir / "manifest.json").read_text())
    assert "interrupted" in manifest
    assert [f["path"] for f in manifest["not_moved"]] == sorted(set(records) - moved)


def test_quarantine_left_without_records_by_an_older_reconcile_is_accounted_for(tmp_path):
    out, state, originals = _tree(tmp_path)
    # What a killed apply of an earlier version left: files moved, no records, no manifest.
    legacy = out / QDIR / "20260101T000000Z"
    some = sorted(originals)[:8]
    for rel in some:
        (legacy / rel).parent.mkdir(parents=True, exist_ok=True)
        os.rename(out / rel, legacy / rel)
    _assert_converges(tmp_path, out, state, originals)
    manifest = json.loads((legacy / "manifest.json").read_text())
    assert sorted(f["path"] for f in manifest["files"]) == some
    assert all(f["recorded"] is False for f in manifest["files"])
