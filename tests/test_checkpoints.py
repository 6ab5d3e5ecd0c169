"""The checkpoints kind: drift and plan from observed facts (pure), and the Megatron layout,
rule-only: Megatron-LM is not installed, so its rule (megatron/training/checkpointing.py
read_metadata, get_checkpoint_name) is held on files torch.save writes in its layout."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import checkpoints_support as cs
import pytest
from cli_support import report_of, run_cli
from reconcile_host.core.contract import Context, Resource
from reconcile_host.reconcilers.checkpoints import CheckpointsReconciler
from reconcile_host.reconcilers.checkpoints.observed import CheckpointsObserved, StepObserved
from torch_support import need, torch_python

R = CheckpointsReconciler()


def _res(**spec) -> Resource:
    (r,) = R.resources({"run": {"dir": "/data/run", **spec}})
    return r


def _obs(steps, pick, layout="hf-trainer", **kw) -> CheckpointsObserved:
    whole = [s for s in steps if s.whole]
    newest = max(whole, key=lambda s: s.step, default=None)
    return CheckpointsObserved(dir="/data/run", layout=layout, detected=False, exists=True, steps=tuple(steps),
                               resume_path=pick, resume_step=next((s.step for s in steps if s.path == pick), None),
                               resume_rule="rule", newest_whole_path=newest and newest.path,
                               newest_whole_step=newest and newest.step,
                               newest_whole_mtime=newest and newest.mtime, **kw)


def _step(n, whole=True, reason="", mtime=None, layout="hf"):
    name = {"hf": f"checkpoint-{n}", "ds": f"global_step{n}"}[layout]
    return StepObserved(n, name, whole, reason, mtime if mtime is not None else time.time() - 100 + n)


def test_whole_pick_is_ok_and_says_the_step():
    o = _obs([_step(2), _step(4)], "checkpoint-4")
    assert R.diff(_res(), o) == []
    plan = R.plan(_res(), o, [], Context())
    assert "will resume from step 4" in plan.message and not plan.actions


def test_torn_pick_moves_the_newer_torn_ones_only():
    steps = [_step(2, False, "old damage"), _step(4), _step(6, False, "cut"), _step(8, False, "cut")]
    o = _obs(steps, "checkpoint-8")
    drift = R.diff(_res(), o)
    assert [d.field for d in drift] == ["resume_from"]
    plan = R.plan(_res(), o, drift, Context())
    (q,) = plan.actions
    assert q.action == "quarantine" and [s["path"] for s in q.params["steps"]] == ["checkpoint-6", "checkpoint-8"]
    assert "after apply it will resume from step 4" in plan.message


def test_deepspeed_points_latest_without_moving_an_older_torn_pick():
    steps = [_step(2, layout="ds"), _step(4, False, "cut", layout="ds"), _step(6, layout="ds")]
    o = _obs(steps, "global_step4", layout="deepspeed", pointer_text="global_step4")
    plan = R.plan(_res(), o, R.diff(_res(), o), Context())
    assert [(a.action, a.params.get("text")) for a in plan.actions] == [("point", "global_step6")]


def test_no_whole_step_is_blocked_and_start_from_scratch_is_drift():
    o = _obs([_step(2, False, "cut")], "checkpoint-2")
    plan = R.plan(_res(), o, R.diff(_res(), o), Context())
    assert plan.blocked and "no whole checkpoint" in plan.blocked and not plan.actions
    o = _obs([_step(2, layout="ds")], None, layout="deepspeed")
    (d,) = R.diff(_res(), o)
    assert d.field == "resume_from" and "start from scratch" in d.have


def test_min_step_and_max_age():
    o = _obs([_step(4, mtime=time.time() - 7200)], "checkpoint-4")
    assert R.diff(_res(min_step=4, max_age="3h"), o) == []
    fields = [d.field for d in R.diff(_res(min_step=5, max_age="1h"), o)]
    assert fields == ["min_step", "max_age"]
    plan = R.plan(_res(min_step=5, max_age="1h"), o, R.diff(_res(min_step=5, max_age="1h"), o), Context())
    assert plan.blocked and "min_step" in plan.blocked and not plan.actions


def test_a_directory_that_is_a_file_is_an_error(tmp_path):
    f = tmp_path / "run"
    f.write_text("not a directory")
    proc = run_cli(tmp_path, "diff", "--format", "json", str(cs.state(tmp_path, "run", f, layout="hf-trainer")))
    assert proc.returncode == 1
    (res,) = report_of(proc)["resources"]
    assert res["status"] == "error" and "Not a directory" in res["message"]


# --- Megatron, rule-only ----------------------------------------------------------------------

@pytest.fixture
def megatron_run(tmp_path):
    python = need(torch_python(), "torch interpreter")
    run = tmp_path / "run"
    code = ("import torch, sys, os\n"
            "for it in (4, 8):\n"
            "    d = os.path.join(sys.argv[1], f'iter_{it:07d}', 'mp_rank_00'); os.makedirs(d)\n"
            "    sd = {'iteration': it, 'model': {'w': torch.randn(4096)}}\n"
            "    torch.save(sd, os.path.join(d, 'model_optim_rng.pt'))\n"
            "open(os.path.join(sys.argv[1], 'latest_checkpointed_iteration.txt'), 'w').write('8')\n")
    subprocess.run([python, "-c", code, str(run)], check=True, timeout=300)
    return run


@pytest.mark.system
def test_megatron_tracker_moved_to_the_newest_whole_iteration(tmp_path, megatron_run):
    run: Path = megatron_run
    p = run / "iter_0000008" / "mp_rank_00" / "model_optim_rng.pt"
    with open(p, "r+b") as fh:
        fh.truncate(p.stat().st_size // 2)
    state = cs.state(tmp_path, "mega", run)
    res = cs.observed(tmp_path, state)
    o = res["observed"]
    assert o["layout"] == "megatron" and o["detected"] and o["resume_step"] == 8 and o["newest_whole_step"] == 4
    before = cs.inventory(run)
    done = cs.apply(tmp_path, state)
    assert done["status"] == "ok" and [a["action"] for a in done["actions"]] == ["quarantine", "point"]
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert cs.apply(tmp_path, state)["actions"] == []
    cs.nothing_lost(before, cs.inventory(run))


@pytest.mark.system
def test_megatron_tracker_garbage_is_drift(tmp_path, megatron_run):
    (megatron_run / "latest_checkpointed_iteration.txt").write_text("")
    res = cs.observed(tmp_path, cs.state(tmp_path, "mega", megatron_run, layout="megatron"))
    assert res["status"] == "drift" and "Invalid metadata file" in res["drift"][0]["have"]


def test_an_unreadable_pick_is_blocked_never_moved():
    steps = [_step(2), _step(4, False, "model.safetensors: unreadable: Input/output error (EIO)")]
    o = _obs(steps, "checkpoint-4")
    plan = R.plan(_res(), o, R.diff(_res(), o), Context())
    assert not plan.actions and plan.blocked and "cannot be read" in plan.blocked


def test_a_blocker_is_blocked_and_nothing_moves():
    """Something apply will not move stops the framework's resume (Accelerate: an entry of
    checkpoints/ without a number): blocked with its words, no action, even beside a torn step."""
    steps = [_step(2), _step(4, False, "cut")]
    o = _obs(steps, "", blocker="checkpoints/notes has no number in its name: ... raise IndexError; move it",
             resume_problem="checkpoints/notes has no number in its name")
    plan = R.plan(_res(), o, R.diff(_res(), o), Context())
    assert not plan.actions and plan.blocked and plan.blocked.startswith("checkpoints/notes has no number")


def test_start_from_scratch_is_said_in_the_frameworks_words():
    words = "load_checkpoint() would warn \"Unable to find latest file\""
    o = _obs([_step(2, layout="ds")], None, layout="deepspeed", empty_pick=words)
    (d,) = R.diff(_res(), o)
    assert d.field == "resume_from" and words in d.have
    assert words in R.plan(_res(), o, [d], Context()).message
