"""The `accelerate` layout against the real Accelerate (.venv-torch): `Accelerator.save_state()`
with automatic checkpoint naming writes <project_dir>/checkpoints/checkpoint_N/, and
`load_state()` resumes from the highest N (tests/ckpt_frameworks.py accelerate_run).

As for the other frameworks (tests/test_checkpoints_frameworks.py): a 10-step job stopped after
step 8 (saves 0..3, every 2 steps, `total_limit` 3: Accelerate's cleanup has already removed
checkpoint_0), its newest checkpoint damaged; without reconcile Accelerate's own resume crashes
or goes on from damage; after `reconcile apply` it resumes from the checkpoint reconcile named
and its losses equal the uninterrupted run's, and its `total_limit` cleanup still works (the
quarantine is beside checkpoints/, where Accelerate never lists). A quarantine folder inside
checkpoints/ is shown to break both, as reconcile says.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import checkpoints_support as cs
import pytest
from cli_support import report_of, run_cli

STEPS, EVERY, TOTAL, LIMIT = 8, 2, 10, 3


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(the project_dir of the job stopped after STEPS, the uninterrupted run's result)."""
    python = cs.framework_python("accelerate")
    tmp = tmp_path_factory.mktemp("ref-accelerate")
    rc, got, err = cs.train(python, "accelerate", tmp / "run", STEPS, EVERY, tmp / "r.json", total_limit=LIMIT)
    assert rc == 0, err
    rc, whole, err = cs.train(python, "accelerate", tmp / "whole", TOTAL, EVERY, tmp / "w.json", total_limit=LIMIT)
    assert rc == 0, err
    assert {k: v for k, v in whole["losses"].items() if int(k) <= STEPS} == got["losses"]
    return tmp / "run", whole


def _newest(run: Path) -> Path:
    """The checkpoint Accelerate's save_state wrote last (its highest number)."""
    return max((run / "checkpoints").iterdir(), key=lambda p: int(p.name.split("_")[1]))


def _damage(run: Path, how: str) -> None:
    newest = _newest(run)
    if how == "truncate-weights":  # load_state crashes (safetensors)
        p = newest / "model.safetensors"
        os.truncate(p, p.stat().st_size // 2)
    elif how == "random-states-truncated":  # load_state logs "Could not load random states" at info and goes on
        p = newest / "random_states_0.pkl"
        os.truncate(p, p.stat().st_size // 2)
    elif how == "custom-deleted":  # load_state raises RuntimeError (custom checkpoints != registered objects)
        (newest / "custom_checkpoint_0.pkl").unlink()
    else:
        raise AssertionError(how)


CASES = ["truncate-weights", "random-states-truncated", "custom-deleted"]


@pytest.mark.parametrize("how", CASES)
def test_resume_from_the_newest_whole_checkpoint(reference, tmp_path, how):
    python = cs.framework_python("accelerate")
    ref_run, ref = reference
    run = cs.copy_run(ref_run, tmp_path / "run")
    torn = _newest(run).relative_to(run).as_posix()
    _damage(run, how)

    bare = cs.copy_run(run, tmp_path / "bare")
    rc, got, err = cs.train(python, "accelerate", bare, TOTAL, EVERY, tmp_path / "bare.json", resume=True,
                             total_limit=LIMIT)
    if rc == 0:  # no crash: it went on from the torn checkpoint, with what it could not load replaced
        assert got["loaded_from"] == torn
        assert any(v != ref["losses"][k] for k, v in got["losses"].items()), got
    else:
        assert cs.raised(err)[0], err

    state = cs.state(tmp_path, "run", run, layout="accelerate")
    res = cs.observed(tmp_path, state)
    o = res["observed"]
    assert res["status"] == "drift" and {d["field"] for d in res["drift"]} == {"resume_from"}, res
    assert o["resume_path"] == torn and o["layout"] == "accelerate"
    have = res["drift"][0]["have"]
    if rc != 0 and "raises" in have:  # the words say what Accelerate does
        assert cs.raised(err)[0] in have, (have, err)
    if rc == 0:
        assert "silently" in have, have

    before = cs.inventory(run)
    done = cs.apply(tmp_path, state)
    assert done["status"] == "ok" and [a["action"] for a in done["actions"]] == ["quarantine"], done
    assert cs.apply(tmp_path, state)["actions"] == []
    cs.nothing_lost(before, cs.inventory(run))
    assert not (run / "checkpoints" / cs.QUARANTINE).exists()  # beside checkpoints/, never in it
    quarantined = {p.relative_to(run).as_posix(): p.stat().st_size
                   for p in (run / cs.QUARANTINE).rglob("*") if p.is_file()}
    assert any(k.endswith(torn + "/model.safetensors") for k in quarantined), quarantined

    after = cs.observed(tmp_path, state)
    assert after["status"] == "ok", after
    rc, got, err = cs.train(python, "accelerate", run, TOTAL, EVERY, tmp_path / "resumed.json", resume=True,
                             total_limit=LIMIT)
    assert rc == 0, err
    assert got["loaded_from"] == after["observed"]["resume_path"] == o["newest_whole_path"]
    assert got["losses"] == {k: v for k, v in ref["losses"].items() if int(k) > got["start_step"]}
    # Accelerate's own total_limit cleanup ran (the oldest went, LIMIT are left) and the quarantine
    # it never lists is as apply left it.
    oldest = min(s["path"] for s in o["steps"])
    assert not (run / oldest).exists() and len(list((run / "checkpoints").iterdir())) == LIMIT
    assert {p.relative_to(run).as_posix(): p.stat().st_size
            for p in (run / cs.QUARANTINE).rglob("*") if p.is_file()} == quarantined


def test_the_pick_is_accelerates_by_number_not_by_name(reference, tmp_path):
    """Accelerate sorts by the first number in each name, not the name: copies of a whole
    checkpoint named checkpoint_9, checkpoint_10 and keep_7_best beside checkpoint_1..3;
    reconcile's pick is the folder Accelerate's load_state() says it loads."""
    python = cs.framework_python("accelerate")
    ref_run, _ = reference
    run = cs.copy_run(ref_run, tmp_path / "run")
    whole = _newest(run)
    for name in ("checkpoint_9", "checkpoint_10", "keep_7_best"):
        shutil.copytree(whole, run / "checkpoints" / name)
    o = cs.observed(tmp_path, cs.state(tmp_path, "run", run, layout="accelerate"))["observed"]
    rc, got, err = cs.train(python, "accelerate", run, TOTAL, EVERY, tmp_path / "r.json", resume=True)
    assert rc == 0, err
    assert o["resume_path"] == got["loaded_from"], (o["resume_path"], got)


def test_a_quarantine_inside_checkpoints_breaks_accelerate(reference, tmp_path):
    """Why the quarantine is beside checkpoints/: a folder without a number inside it crashes
    Accelerate's load_state() (and save_state()'s cleanup); reconcile reports such an entry as
    blocking, in Accelerate's words, and moves nothing."""
    python = cs.framework_python("accelerate")
    ref_run, _ = reference
    run = cs.copy_run(ref_run, tmp_path / "run")
    (run / "checkpoints" / cs.QUARANTINE).mkdir()
    rc, _, err = cs.train(python, "accelerate", cs.copy_run(run, tmp_path / "bare"), TOTAL, EVERY,
                          tmp_path / "bare.json", resume=True, total_limit=LIMIT)
    kind, _ = cs.raised(err)
    assert rc != 0 and kind, err
    state = cs.state(tmp_path, "run", run, layout="accelerate")
    res = cs.observed(tmp_path, state)
    assert res["status"] == "blocked", res
    assert kind in res["message"] and f"checkpoints/{cs.QUARANTINE}" in res["message"], res
    before = cs.inventory(run)
    proc = run_cli(tmp_path, "apply", "--format", "json", "--journal", str(tmp_path / "journal.jsonl"), str(state),
                   timeout=300)
    (done,) = report_of(proc)["resources"]
    assert done["status"] == "blocked" and not done["actions"]
    assert cs.inventory(run) == before


def test_hf_trainer_declared_on_accelerate_checkpoints_is_not_ok(reference, tmp_path):
    """`layout: hf-trainer` on a project_dir of Accelerate checkpoints (the newest torn): the
    Trainer's resume_from_checkpoint=True raises there, and reconcile says so, naming what is
    there and the layout it looks like, instead of "0 checkpoints, start from scratch"."""
    ref_run, _ = reference
    run = cs.copy_run(ref_run, tmp_path / "run")
    _damage(run, "truncate-weights")
    hf = cs.framework_python("hf-trainer")
    rc, _, err = cs.train(hf, "hf-trainer", cs.copy_run(run, tmp_path / "bare"), TOTAL, EVERY,
                          tmp_path / "hf.json", resume=True)
    kind, text = cs.raised(err)
    assert rc != 0 and kind == "ValueError", err
    proc = run_cli(tmp_path, "diff", "--format", "json", str(cs.state(tmp_path, "run", run, layout="hf-trainer")),
                      timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (res,) = report_of(proc)["resources"]
    assert res["status"] == "error", res
    said = res["message"]
    assert "layout accelerate" in said and "checkpoints/checkpoint_" in said, said
    assert kind in said and text.split(" (")[0] in said, (said, text)


def test_the_checkpoints_folder_itself_as_dir_is_an_error_naming_the_parent(reference, tmp_path):
    ref_run, _ = reference
    run = cs.copy_run(ref_run, tmp_path / "run")
    for layout in (None, "accelerate"):
        extra = {"layout": layout} if layout else {}
        proc = run_cli(tmp_path, "diff", "--format", "json",
                          str(cs.state(tmp_path, "run", run / "checkpoints", **extra)), timeout=300)
        (res,) = report_of(proc)["resources"]
        assert proc.returncode == 1 and res["status"] == "error", res
        assert "accelerate" in res["message"] and "parent" in res["message"], res


def test_empty_project_dir_words_are_accelerates(tmp_path):
    """Nothing saved yet: ok, and the words are what Accelerate's load_state() does then, asked of
    Accelerate itself: no checkpoints/ folder, and an empty one."""
    python = cs.framework_python("accelerate")
    for name, make in (("none", lambda p: None), ("empty", lambda p: (p / "checkpoints").mkdir())):
        run = tmp_path / name
        run.mkdir()
        make(run)
        rc, _, err = cs.train(python, "accelerate", cs.copy_run(run, tmp_path / f"{name}-bare"), TOTAL, EVERY,
                              tmp_path / f"{name}.json", resume=True)
        kind, _ = cs.raised(err)
        assert rc != 0 and kind, err
        res = cs.observed(tmp_path, cs.state(tmp_path, name, run, layout="accelerate"))
        assert res["status"] == "ok" and kind in res["message"] and "raise" in res["message"], (res, err)
