"""The checkpoints kind against the frameworks' own resume (the authority at test time).

Each framework (Hugging Face Trainer, DeepSpeed, Lightning, under .venv-torch: see
tests/torch_support.py) trains a tiny model built in code on CPU, saving real checkpoints;
a copy of the run directory is damaged as a crash damages it. Then:
- without reconcile, the framework's own resume crashes, or goes on silently from damage
  (its losses differ from the uninterrupted run's);
- `reconcile diff` names the step the framework will pick by its own rule and says it is not
  whole; `reconcile apply` moves the torn checkpoints aside and points the framework's pointer
  at the newest whole step; a second apply does nothing; no file is lost;
- the framework's own resume then starts at the step reconcile said, and its losses equal the
  uninterrupted run's from there (CPU runs are deterministic).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path

import checkpoints_support as cs
import pytest

STEPS, EVERY, TOTAL = 8, 2, 10  # the crashed run saved steps 2..8 of a job of 10


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Per layout (and DeepSpeed ZeRO stage): the run directory of a job stopped after step
    STEPS (what the crash left, before the damage), and the losses of the same job run
    uninterrupted to TOTAL."""
    made: dict[tuple[str, int], tuple[Path, dict]] = {}

    def get(layout: str, zero: int = 0) -> tuple[Path, dict]:
        if (layout, zero) not in made:
            python = cs.framework_python(layout)
            tmp = tmp_path_factory.mktemp(f"ref-{layout}-{zero}")
            rc, got, err = cs.train(python, layout, tmp / "run", STEPS, EVERY, tmp / "result.json", zero_stage=zero)
            assert rc == 0, err
            rc, whole, err = cs.train(python, layout, tmp / "whole", TOTAL, EVERY, tmp / "whole.json",
                                      zero_stage=zero)
            assert rc == 0, err
            assert {k: v for k, v in whole["losses"].items() if int(k) <= STEPS} == got["losses"]
            made[(layout, zero)] = (tmp / "run", whole)
        return made[(layout, zero)]

    return get


def _truncate(path: Path, keep: float = 0.5) -> None:
    os.truncate(path, int(path.stat().st_size * keep))


def _zero_page(path: Path, frac: float = 0.5) -> None:
    """A 4 KiB page of zeros where data was: what a crash leaves when the size was committed
    and the data not (delayed allocation). At a page boundary inside the file."""
    size = path.stat().st_size
    at = max(4096, int(size * frac) // 4096 * 4096)
    assert at + 4096 <= size, (path, size)
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(bytes(4096))


def _damage(layout: str, run: Path, how: str) -> None:
    newest = {"hf-trainer": f"checkpoint-{STEPS}", "deepspeed": f"global_step{STEPS}"}.get(layout)
    if how == "truncate-weights":
        _truncate(run / newest / "model.safetensors")
    elif how == "optimizer-deleted":
        (run / newest / "optimizer.pt").unlink()
    elif how == "zeroed-weights-page":
        _zero_page(run / newest / "model.safetensors")
    elif how == "torn-latest":  # `latest` opened for writing ('w' truncates), then the crash
        (run / "latest").write_text("")
        _truncate(run / newest / "mp_rank_00_model_states.pt", 0.3)
    elif how == "latest-deleted":  # the crash came before `latest` was written for the first save kept
        (run / "latest").unlink()
    elif how == "zero1-optim-deleted":  # ZeRO-1: DeepSpeed then silently rebuilds the optimizer from the weights
        (run / newest / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    elif how == "tag-folder-deleted":  # a clean-up script removed the tag `latest` still names
        shutil.rmtree(run / newest)
    elif how == "model-states-deleted":  # the tag folder left without its model states file
        (run / newest / "mp_rank_00_model_states.pt").unlink()
    elif how == "zeroed-model-states-page":
        _zero_page(run / newest / "mp_rank_00_model_states.pt", 0.3)
    elif how == "torn-last":  # last.ckpt and the newest step file both cut off mid-write
        _truncate(run / "last.ckpt")
        _truncate(run / f"epoch=0-step={STEPS}.ckpt", 0.7)
    elif how == "renamed-torn-last":  # a person moved the torn last.ckpt "out of the way"
        _truncate(run / "last.ckpt")
        _truncate(run / f"epoch=0-step={STEPS}.ckpt", 0.7)
        (run / "last.ckpt").rename(run / "last.torn.ckpt")
    elif how == "zeroed-last-page":  # saved at the same moment: the crash reaches both
        _zero_page(run / "last.ckpt", 0.3)
        _zero_page(run / f"epoch=0-step={STEPS}.ckpt", 0.3)
    elif how == "truncated-distcp":
        _truncate(run / f"step-{STEPS}" / "__0_0.distcp", 0.6)
    elif how == "flipped-tensor-bit":
        _flip_tensor_bit(run / f"step-{STEPS}" / "__0_0.distcp")
    else:
        raise AssertionError(how)


def _flip_tensor_bit(path: Path) -> None:
    """An exponent bit flipped in the middle of the largest tensor's data (a disk's bit rot, not a
    crash): inside the largest `data/0` entry of the torch.save items DCP concatenates."""
    raw = bytearray(path.read_bytes())
    best = None
    at = raw.find(b"PK\x03\x04")
    while at >= 0:
        _, _, _, _, _, _, csize, _, nlen, xlen = struct.unpack_from("<IHHHHHIIIHH", raw, at)[1:]
        name = bytes(raw[at + 30:at + 30 + nlen])
        if name.endswith(b"/data/0") and (best is None or csize > best[1]):
            best = (at + 30 + nlen + xlen, csize)
        at = raw.find(b"PK\x03\x04", at + 4)
    assert best, path
    start, size = best
    raw[start + size // 2 // 4 * 4 + 3] ^= 0x40
    path.write_bytes(bytes(raw))


CASES = [
    ("hf-trainer", "truncate-weights"),  # the Trainer's resume crashes
    ("hf-trainer", "optimizer-deleted"),  # silently goes on with a fresh optimizer
    ("hf-trainer", "zeroed-weights-page"),  # silently loads zeroed weights
    ("deepspeed", "torn-latest"),  # crashes (an empty tag)
    ("deepspeed", "latest-deleted"),  # silently starts from scratch (and would overwrite the steps)
    ("deepspeed", "zero1-optim-deleted"),  # silently goes on with a fresh optimizer state
    ("deepspeed", "zeroed-model-states-page"),  # silently loads damage (torch.load checks no CRC)
    ("deepspeed", "tag-folder-deleted"),  # AssertionError (no model states file to load)
    ("deepspeed", "model-states-deleted"),  # AssertionError, likewise
    ("lightning", "torn-last"),  # crashes
    ("lightning", "renamed-torn-last"),  # still Lightning's pick (a prefix match): crashes
    ("lightning", "zeroed-last-page"),  # silently loads damage
    ("dcp", "truncated-distcp"),  # dcp.load raises CheckpointException
    ("dcp", "flipped-tensor-bit"),  # dcp.load loads it silently (no CRC checked)
]


# Where the report must say the framework raises (and the exception is then checked to be its own).
RAISES = {"tag-folder-deleted", "model-states-deleted", "torn-latest"}


@pytest.mark.parametrize("layout,how", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_resume_from_the_newest_whole_checkpoint(reference, tmp_path, layout, how):
    python = cs.framework_python(layout)
    zero = 1 if how.startswith("zero1-") else 0
    ref_run, ref = reference(layout, zero)
    run = cs.copy_run(ref_run, tmp_path / "run")
    _damage(layout, run, how)

    # Without reconcile: the framework's own resume crashes or continues from damage.
    bare = cs.copy_run(run, tmp_path / "bare")
    rc, got, err = cs.train(python, layout, bare, TOTAL, EVERY, tmp_path / "bare.json", resume=True,
                             zero_stage=zero)
    if rc == 0:  # no crash: it started over (the saved work lost) or went on from damage
        assert got["start_step"] == 0 or any(v != ref["losses"][k] for k, v in got["losses"].items()), got
    else:
        assert cs.raised(err)[0], err

    state = cs.state(tmp_path, "run", run, layout=layout)
    res = cs.observed(tmp_path, state)
    o = res["observed"]
    assert res["status"] == "drift", res
    assert o["layout"] == layout and not o["detected"]
    assert {d["field"] for d in res["drift"]} == {"resume_from"}
    have = res["drift"][0]["have"]
    if "raises" in have:  # the words name what the framework's own resume raised
        assert rc != 0 and cs.raised(err)[0] in have, (have, err)
    if how in RAISES:
        assert "raises" in have, have
    newest_whole = o["newest_whole_step"]
    # the damage was to step STEPS's files (a lost pointer leaves every step whole)
    assert newest_whole == (STEPS if how == "latest-deleted" else STEPS - EVERY), o

    before = cs.inventory(run)
    done = cs.apply(tmp_path, state)
    assert done["status"] == "ok", done
    assert all(a["result"] == "done" for a in done["actions"]), done["actions"]
    again = cs.apply(tmp_path, state)
    assert again["actions"] == [] and again["status"] == "ok", again
    cs.nothing_lost(before, cs.inventory(run))
    manifests = list((run / cs.QUARANTINE).glob("*/manifest.json"))
    assert all(json.loads(m.read_text())["why"] for m in manifests)
    assert manifests or how == "latest-deleted"  # (only a pointer written: nothing moved, no old text)

    after = cs.observed(tmp_path, state)["observed"]
    assert after["resume_step"] == newest_whole and after["resume_path"] is not None

    # The framework's own resume: from the step reconcile said, and the same run from there.
    rc, got, err = cs.train(python, layout, run, TOTAL, EVERY, tmp_path / "resumed.json", resume=True,
                             zero_stage=zero)
    assert rc == 0, err
    assert got["start_step"] == after["resume_step"]
    assert got["losses"] == {k: v for k, v in ref["losses"].items() if int(k) > got["start_step"]}


def test_detected_layout_and_whole_run(reference, tmp_path):
    """An undamaged run: ok, the layout detected and said, the pick the framework's own."""
    ref_run, _ = reference("hf-trainer")
    run = cs.copy_run(ref_run, tmp_path / "run")
    res = cs.observed(tmp_path, cs.state(tmp_path, "run", run, min_step=STEPS))
    o = res["observed"]
    assert res["status"] == "ok" and o["detected"] and o["layout"] == "hf-trainer"
    assert "(detected)" in res["message"]
    assert o["resume_step"] == o["newest_whole_step"] == STEPS
    bad = cs.observed(tmp_path, cs.state(tmp_path, "high", run, min_step=STEPS + 1))
    assert bad["status"] == "blocked" and [d["field"] for d in bad["drift"]] == ["min_step"]


def test_lightning_symlinked_last_by_its_targets_time(reference, tmp_path):
    """Lightning picks among last*.ckpt by fs.modified, which fsspec's LocalFileSystem.info reads
    through a symbolic link (the target's mtime). A case where the link's own time and its
    target's disagree: `last.ckpt` -> step 8's file (old), its own mtime the newest; `last-v1.ckpt`
    a copy of step 6 in between. Reconcile's pick must be the one Lightning resumes from."""
    python = cs.framework_python("lightning")
    ref_run, ref = reference("lightning")
    run = cs.copy_run(ref_run, tmp_path / "run")
    (run / "last.ckpt").unlink()
    target = run / f"epoch=0-step={STEPS}.ckpt"
    os.symlink(target.name, run / "last.ckpt")
    shutil.copy2(run / f"epoch=0-step={STEPS - EVERY}.ckpt", run / "last-v1.ckpt")
    now = time.time()
    os.utime(target, (now - 300, now - 300))
    os.utime(run / "last-v1.ckpt", (now - 200, now - 200))
    os.utime(run / "last.ckpt", (now - 100, now - 100), follow_symlinks=False)
    link_own, link_target = os.lstat(run / "last.ckpt").st_mtime, os.stat(run / "last.ckpt").st_mtime
    assert link_target < os.stat(run / "last-v1.ckpt").st_mtime < link_own  # the two rules disagree

    o = cs.observed(tmp_path, cs.state(tmp_path, "run", run, layout="lightning"))["observed"]
    rc, got, err = cs.train(python, "lightning", cs.copy_run(run, tmp_path / "resumed"), TOTAL, EVERY,
                             tmp_path / "resumed.json", resume=True)
    assert rc == 0, err
    assert o["resume_step"] == got["start_step"], (o["resume_path"], got["start_step"])
    assert got["losses"] == {k: v for k, v in ref["losses"].items() if int(k) > got["start_step"]}


EMPTY = ["hf-trainer", "lightning", "deepspeed", "accelerate"]


@pytest.mark.parametrize("layout", EMPTY)
def test_an_empty_pick_in_the_frameworks_words(tmp_path, layout):
    """Nothing saved yet (an empty run directory): ok, and the words say what the framework's
    own resume does then, asked of the framework: it raises (the exception named), or it
    trains from scratch."""
    python = cs.framework_python(layout)
    run = tmp_path / "run"
    run.mkdir()
    res = cs.observed(tmp_path, cs.state(tmp_path, "run", run, layout=layout))
    assert res["status"] == "ok", res
    rc, got, err = cs.train(python, layout, cs.copy_run(run, tmp_path / "bare"), TOTAL, EVERY, tmp_path / "r.json",
                             resume=True)
    if rc == 0:
        assert got["start_step"] == 0 and "from scratch" in res["message"] and "raise" not in res["message"], res
    else:
        kind, _ = cs.raised(err)
        assert kind and kind in res["message"] and "raise" in res["message"], (res["message"], err)
