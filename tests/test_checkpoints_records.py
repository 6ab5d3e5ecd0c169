"""The checkpoints kind's check records (reconcilers/checkpoints/records.py): a step checked once
is not read again while its files are unchanged; any change to them, a reboot or `--recheck`
makes it read again; damage behind a restored mtime is found (the ctime moved).

What is asserted is bytes read, not time: the real CLI runs under a parent that reads the
kernel's I/O accounting of the whole process tree (tests/io_support.py: `rchar`, the bytes
read(2)/pread(2) returned, page cache or disk alike), the forked observer child included. The
run directory is a Hugging Face Trainer layout written by the real torch and safetensors
(tests/trainer_steps.py, random data). The verdicts are compared with a fresh read (no record,
another state directory), never with literals.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv
from io_support import run_counted
from reconcile_host.reconcilers.checkpoints.records import RACY_NS
from torch_support import need, torch_python

WRITER = str(Path(__file__).with_name("trainer_steps.py"))
MODEL, OPTIM, SHARDS, STEPS = 8 << 20, 8 << 20, 2, (2, 4)
PICK = f"checkpoint-{STEPS[-1]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    python = need(torch_python(), "torch 2.x with safetensors")
    run = tmp_path_factory.mktemp("ref") / "run"
    proc = subprocess.run([python, WRITER, str(run), str(MODEL), str(OPTIM), str(SHARDS), *map(str, STEPS)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return run


class Diff:
    """`reconcile diff --format json` of one checkpoints resource, counted (io_support)."""

    def __init__(self, tmp: Path, run: Path, **spec: str):
        self.tmp, self.run = tmp, run
        lines = ["version: 1", "checkpoints:", "  run:", f"    dir: {run}", "    layout: hf-trainer"]
        self.state = tmp / "state.yaml"
        self.state.write_text("\n".join(lines + [f"    {k}: {v}" for k, v in spec.items()]) + "\n")
        self.boot = tmp / "boot_id"
        self.boot.write_text("boot-1\n")
        self.empty = tmp / "empty-run"
        self.empty.mkdir()
        # The same command on an empty run directory: what a diff reads besides the steps (its
        # second run: the first also reads the JSON Schema, then kept in the validation cache).
        base = tmp / "base.yaml"
        base.write_text(f"version: 1\ncheckpoints:\n  run:\n    dir: {self.empty}\n    layout: hf-trainer\n")
        self.base = [self.count(base, "base")[1] for _ in range(2)][-1]

    def count(self, state: Path, records: str = "records", *flags: str) -> tuple[dict, int]:
        env = cli_env(self.tmp, RECONCILE_STATE_DIR=str(self.tmp / records), RECONCILE_BOOT_ID_FILE=str(self.boot))
        got = run_counted(reconcile_argv("diff", "--format", "json", *flags, str(state)), env, str(self.tmp),
                          str(self.tmp / "io.json"))
        assert got.returncode in (0, 2), got.stdout + got.stderr
        (res,) = json.loads(got.stdout)["resources"]
        return res, got.rchar

    def __call__(self, *flags: str, records: str = "records") -> tuple[dict, int]:
        """(the resource's report, bytes read beyond what a diff of an empty run directory reads)."""
        res, rchar = self.count(self.state, records, *flags)
        return res, rchar - self.base

    def fresh(self) -> dict:
        """The verdict of a read with no record at all."""
        shutil.rmtree(self.tmp / "fresh", ignore_errors=True)
        return self(records="fresh")[0]


def pick_bytes(run: Path) -> int:
    return sum(p.stat().st_size for p in (run / PICK).iterdir())


def settle(run: Path) -> None:
    """Wait until every file is older than the racy window (records.RACY_NS): a step changed
    within it is checked but not recorded, so that a write in the same timestamp tick as the
    check is never hidden."""
    newest = max(max(p.stat().st_mtime_ns, p.stat().st_ctime_ns) for p in run.rglob("*"))
    wait = (newest + RACY_NS - time.time_ns()) / 1e9 + 0.05
    if wait > 0:
        time.sleep(wait)


def verdict(res: dict) -> tuple:
    o = res["observed"]
    return (res["status"], o["resume_path"], o["newest_whole_path"],
            tuple((s["path"], s["whole"], s["reason"]) for s in o["steps"]))


@pytest.fixture
def run(reference, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(reference, dst, copy_function=shutil.copy2)
    settle(dst)
    return dst


def test_second_diff_reads_none_of_the_pick(run, tmp_path):
    diff = Diff(tmp_path, run)
    size = pick_bytes(run)
    first, read1 = diff()
    assert first["status"] == "ok" and first["observed"]["resume_path"] == PICK
    assert read1 >= size  # every byte of the pick read (verify: resume)
    assert first["observed"]["from_records"] == 0
    for _ in range(2):
        again, read2 = diff()
        assert read2 < size // 100, (read2, size)
        assert verdict(again) == verdict(first)
        assert again["observed"]["from_records"] == len(STEPS)


def _touch(run: Path) -> None:
    os.utime(run / PICK / "optimizer.pt")


def _rewrite(run: Path) -> None:  # the same bytes written again (a save that wrote the same state)
    p = run / PICK / "model-00001-of-00002.safetensors"
    data = p.read_bytes()
    with open(p, "r+b") as fh:
        fh.write(data)


def _add(run: Path) -> None:
    (run / PICK / "README.md").write_text("notes\n")


def _remove(run: Path) -> None:
    (run / PICK / "rng_state.pth").unlink()


def _reboot(run: Path) -> None:
    (run.parent / "boot_id").write_text("boot-2\n")


@pytest.mark.parametrize("change", [_touch, _rewrite, _add, _remove, _reboot],
                         ids=["touched", "rewritten", "file-added", "file-removed", "reboot"])
def test_a_change_is_read_again(run, tmp_path, change):
    diff = Diff(tmp_path, run)
    first, _ = diff()
    _, steady = diff()
    assert steady < pick_bytes(run) // 100
    change(run)
    after, read = diff()
    assert read >= pick_bytes(run)  # the pick read whole again
    assert verdict(after) == verdict(diff.fresh())


def test_recheck_reads_again_and_keeps_records(run, tmp_path):
    diff = Diff(tmp_path, run)
    diff()
    _, read = diff("--recheck")
    assert read >= pick_bytes(run)
    _, read = diff()
    assert read < pick_bytes(run) // 100


def _zero_page_keeping_mtime(path: Path) -> None:
    """A page of the file's middle zeroed, its mtime set back as it was (os.utime): the ctime,
    which no user call can set, moves."""
    st = path.stat()
    at = st.st_size // 2 // 4096 * 4096
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(bytes(4096))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


def test_damage_behind_a_restored_mtime_is_found_and_a_torn_verdict_is_kept(run, tmp_path):
    diff = Diff(tmp_path, run)
    first, _ = diff()
    assert first["status"] == "ok"
    _zero_page_keeping_mtime(run / PICK / "optimizer.pt")
    found, read = diff()
    assert read >= pick_bytes(run) // 2  # read again, up to the damage at least
    fresh = diff.fresh()
    assert verdict(found) == verdict(fresh) and fresh["status"] == "drift"
    assert not found["observed"]["steps"][-1]["whole"]
    settle(run)  # out of the racy window: the torn verdict is recorded, and reused while nothing changes
    diff()
    kept, read = diff()
    assert verdict(kept) == verdict(fresh) and read < pick_bytes(run) // 100


def test_content_depth_reads_every_pass(run, tmp_path):
    diff = Diff(tmp_path, run, verify="content")
    total = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
    diff()
    again, read = diff()
    assert read >= total and again["observed"]["from_records"] == 0


def test_a_broken_record_is_no_record_and_a_removed_step_leaves_it(run, tmp_path):
    diff = Diff(tmp_path, run)
    diff()
    (path,) = (tmp_path / "records" / "checkpoints").iterdir()
    assert set(json.loads(path.read_text())["steps"]) == {f"checkpoint-{s}" for s in STEPS}
    good = json.loads(path.read_text())
    path.write_text('{"format": 1, "steps": ')  # what no atomic write leaves, but a full disk or a hand may
    res, read = diff()
    assert res["status"] == "ok" and read >= pick_bytes(run)
    for entry in good["steps"].values():  # the right header, entries of the wrong shape (a hand's edit)
        entry["verdicts"] = "whole"
    path.write_text(json.dumps(good))
    res, read = diff()
    assert res["status"] == "ok" and read >= pick_bytes(run)
    shutil.rmtree(run / PICK)
    res, _ = diff()
    assert set(json.loads(path.read_text())["steps"]) == {f"checkpoint-{STEPS[0]}"}
    assert verdict(res) == verdict(diff.fresh())
