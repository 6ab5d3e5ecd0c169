"""The checkpoints kind on diffusers' training examples, litgpt, Lightning Fabric and Orbax,
against each framework's own save and resume (the authority at test time).

Each framework (under .venv-torch: tests/torch_support.py; the runs in tests/ckpt_frameworks.py
reproduce the example scripts' save and resume lines, cited there) trains a tiny model built in
code on CPU. A copy of its run directory is damaged as a crash leaves it (a file cut short, the
files after it never written, a temporary folder left by a killed save). Then:
- without reconcile, the framework's own resume crashes or goes on silently from damage;
- `reconcile diff` names the framework's pick and says it is not whole; `apply` moves the torn
  checkpoints aside (beside dir where the framework's search walks all of dir), a second apply
  does nothing, no file is lost, no file the rule could pick is made;
- the framework's own resume then starts at the newest whole step and its losses equal the
  uninterrupted run's from there; its rule then picks its own next save.
Detection: a layout only from files only that framework writes, else an error naming them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import checkpoints_support as cs
import pytest
from cli_support import reconcile_json

STEPS, EVERY, TOTAL = 8, 2, 10
FABRIC = {"layout": "fabric", "pattern": "'*'", "pick": "lexicographic"}  # the example's rule: every entry
BESIDE = ("litgpt", "fabric")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Per layout: the run directory of a job stopped after step STEPS, and the losses of the same
    job run uninterrupted to TOTAL."""
    made: dict[str, tuple[Path, dict]] = {}

    def get(layout: str) -> tuple[Path, dict]:
        if layout not in made:
            python = cs.framework_python(layout)
            tmp = tmp_path_factory.mktemp(f"ref-{layout}")
            rc, got, err = cs.train(python, layout, tmp / "run", STEPS, EVERY, tmp / "result.json")
            assert rc == 0, err
            rc, whole, err = cs.train(python, layout, tmp / "whole", TOTAL, EVERY, tmp / "whole.json")
            assert rc == 0, err
            assert {k: v for k, v in whole["losses"].items() if int(k) <= STEPS} == got["losses"]
            made[layout] = (tmp / "run", whole)
        return made[layout]

    return get


def _truncate(path: Path, keep: float = 0.5) -> None:
    os.truncate(path, int(path.stat().st_size * keep))


def _largest(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _damage(run: Path, how: str) -> None:
    if how == "truncate-unet":  # killed while save_pretrained wrote the weights: nothing after them
        c = run / f"checkpoint-{STEPS}"
        _truncate(c / "unet" / "diffusion_pytorch_model.safetensors")
        for f in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
            (c / f).unlink()
    elif how == "optimizer-cut":  # killed while Accelerate wrote optimizer.bin
        c = run / f"checkpoint-{STEPS}"
        _truncate(c / "optimizer.bin", 0.6)
        (c / "scheduler.bin").unlink()
        (c / "random_states_0.pkl").unlink()
    elif how == "random-states-missing":  # killed before the last file of the save
        (run / f"checkpoint-{STEPS}" / "random_states_0.pkl").unlink()
    elif how == "truncate-lit-model":  # killed while fabric.save wrote lit_model.pth
        c = run / f"step-{STEPS:08d}"
        _truncate(c / "lit_model.pth", 0.6)
        for f in ("hyperparameters.yaml", "model_config.yaml"):
            (c / f).unlink()
    elif how == "truncate-newest":  # killed while fabric.save wrote the newest epoch file
        _truncate(run / f"epoch-{STEPS:04d}.ckpt", 0.6)
    elif how == "truncated-value":  # the values' data file of the newest step cut short
        _truncate(_largest(run / str(STEPS) / "default"), 0.7)
    else:
        raise AssertionError(how)


def _state(tmp: Path, name: str, run: Path, layout: str, **extra) -> Path:
    more = dict(FABRIC) if layout == "fabric" else {"layout": layout}
    return cs.state(tmp, name, run, **more, **extra)


def _inventory(run: Path) -> dict[str, set[int]]:
    """cs.inventory, plus what a quarantine beside the run directory holds of it."""
    out = cs.inventory(run)
    beside = run.parent / cs.QUARANTINE
    if beside.is_dir():
        for p in beside.glob(f"*/{run.name}/**/*"):
            if p.is_file():
                rel = p.relative_to(beside).parts[2:]
                out.setdefault("/".join(rel), set()).add(p.lstat().st_size)
    return out


CASES = [
    ("diffusers", "truncate-unet"),  # from_pretrained raises
    ("diffusers", "optimizer-cut"),  # load_state raises
    ("diffusers", "random-states-missing"),  # goes on silently with other random numbers
    ("litgpt", "truncate-lit-model"),  # fabric.load raises
    ("fabric", "truncate-newest"),  # fabric.load raises
    ("orbax", "truncated-value"),  # restore raises
]


@pytest.mark.parametrize("layout,how", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_resume_from_the_newest_whole_checkpoint(reference, tmp_path, layout, how):
    python = cs.framework_python(layout)
    ref_run, ref = reference(layout)
    run = cs.copy_run(ref_run, tmp_path / "run")
    _damage(run, how)

    bare = cs.copy_run(run, tmp_path / "bare")
    rc, got, err = cs.train(python, layout, bare, TOTAL, EVERY, tmp_path / "bare.json", resume=True)
    if rc == 0:  # no crash: it went on from damage
        assert any(v != ref["losses"][k] for k, v in got["losses"].items()), got
    else:
        assert cs.raised(err)[0], err

    state = _state(tmp_path, "run", run, layout)
    res = cs.observed(tmp_path, state)
    o = res["observed"]
    assert res["status"] == "drift", res
    assert o["layout"] == layout and not o["detected"]
    assert {d["field"] for d in res["drift"]} == {"resume_from"}
    # the framework's own pick, as its bare resume took it
    picked = o["resume_path"]
    assert picked is not None and (got is None or got["loaded_from"] is None or got["loaded_from"].startswith(picked))
    newest = next(s for s in o["steps"] if s["path"] == o["newest_whole_path"])
    assert not next(s for s in o["steps"] if s["path"] == picked)["whole"]

    before = _inventory(run)
    names_before = set(os.listdir(run))
    done = cs.apply(tmp_path, state)
    assert done["status"] == "ok", done
    assert [a["action"] for a in done["actions"]] == ["quarantine"], done["actions"]  # never a new pick made
    again = cs.apply(tmp_path, state)
    assert again["actions"] == [] and again["status"] == "ok", again
    cs.nothing_lost(before, _inventory(run))
    assert set(os.listdir(run)) <= names_before | {cs.QUARANTINE}  # nothing new the rule could pick
    if layout in BESIDE:  # the rule walks or lists all of dir: the quarantine is beside it
        assert not (run / cs.QUARANTINE).exists() and (run.parent / cs.QUARANTINE).is_dir()
    manifests = list((run / cs.QUARANTINE).glob("*/manifest.json")) + list(
        (run.parent / cs.QUARANTINE).glob("*/manifest.json"))
    assert manifests and all(json.loads(m.read_text())["why"] for m in manifests)

    after = cs.observed(tmp_path, state)
    assert after["status"] == "ok", after
    assert after["observed"]["resume_path"] == newest["path"]

    # The framework's own resume: from the newest whole step, the same run from there.
    rc, got, err = cs.train(python, layout, run, TOTAL, EVERY, tmp_path / "resumed.json", resume=True)
    assert rc == 0, err
    assert got["loaded_from"] is not None and got["loaded_from"].startswith(newest["path"]), (got, newest)
    assert got["start_step"] == STEPS - EVERY
    assert got["losses"] == {k: v for k, v in ref["losses"].items() if int(k) > got["start_step"]}

    # Its rule then picks its own next save (the newest, TOTAL), and reconcile says the same.
    rc, nxt, err = cs.train(python, layout, run, TOTAL, EVERY, tmp_path / "next.json", resume=True)
    assert rc == 0 and nxt["start_step"] == TOTAL and not nxt["losses"], (nxt, err)
    last = cs.observed(tmp_path, state)
    assert last["status"] == "ok" and nxt["loaded_from"].startswith(last["observed"]["resume_path"]), last


def test_orbax_ignores_a_killed_saves_temporary_folder(reference, tmp_path):
    """A save killed in flight leaves `<step>.orbax-checkpoint-tmp-<time>/`: Orbax ignores it, and so
    does reconcile (ok, nothing to move); Orbax's resume continues from the newest finalized step."""
    python = cs.framework_python("orbax")
    ref_run, ref = reference("orbax")
    run = cs.copy_run(ref_run, tmp_path / "run")
    tmp = run / f"{STEPS + EVERY}.orbax-checkpoint-tmp-1796386975"
    shutil.copytree(run / str(STEPS), tmp)
    (tmp / "_CHECKPOINT_METADATA").unlink()
    (tmp / "commit_success.txt").unlink()
    _truncate(_largest(tmp / "default"), 0.3)
    for declared in ({"layout": "orbax"}, {}):
        res = cs.observed(tmp_path, cs.state(tmp_path, "run", run, **declared))
        assert res["status"] == "ok", res
        assert res["observed"]["resume_path"] == str(STEPS) and res["observed"]["layout"] == "orbax"
    rc, got, err = cs.train(python, "orbax", run, TOTAL, EVERY, tmp_path / "resumed.json", resume=True)
    assert rc == 0 and got["start_step"] == STEPS, err
    assert got["losses"] == {k: v for k, v in ref["losses"].items() if int(k) > STEPS}


@pytest.mark.parametrize("layout", ["diffusers", "litgpt", "orbax", "lightning"])
def test_detected_from_the_frameworks_own_files(reference, tmp_path, layout):
    ref_run, _ = reference(layout)
    run = cs.copy_run(ref_run, tmp_path / "run")
    res = cs.observed(tmp_path, cs.state(tmp_path, "run", run))
    o = res["observed"]
    assert res["status"] == "ok" and o["detected"] and o["layout"] == layout, res
    assert o["resume_step"] == o["newest_whole_step"] == STEPS


@pytest.mark.parametrize("layout,stray", [("diffusers", "checkpoints"), ("litgpt", "step-best")])
def test_an_entry_the_rule_cannot_number_is_blocked_in_the_frameworks_words(reference, tmp_path, layout, stray):
    """An entry the rule takes but cannot number (a `checkpoints/` folder beside a diffusers
    example's saves; a `step-best/` holding a copy of lit_model.pth): the framework's own resume
    raises; reconcile says which exception, and moves nothing (it is not a checkpoint)."""
    python = cs.framework_python(layout)
    ref_run, _ = reference(layout)
    run = cs.copy_run(ref_run, tmp_path / "run")
    (run / stray).mkdir()
    if layout == "litgpt":
        shutil.copy2(run / f"step-{STEPS:08d}" / "lit_model.pth", run / stray / "lit_model.pth")
    rc, _, err = cs.train(python, layout, cs.copy_run(run, tmp_path / "bare"), TOTAL, EVERY, tmp_path / "b.json",
                          resume=True)
    kind, _ = cs.raised(err)
    assert rc != 0 and kind, err
    state = _state(tmp_path, "run", run, layout)
    res = cs.observed(tmp_path, state)
    assert res["status"] == "blocked" and kind in res["drift"][0]["have"], (res, kind)
    before = _inventory(run)
    _, doc, _ = reconcile_json(tmp_path, "apply", str(state), timeout=300)
    (done,) = doc["resources"]
    assert done["status"] == "blocked" and not done["actions"] and _inventory(run) == before, done


def test_fabric_saves_declared_as_lightning_is_an_error(reference, tmp_path):
    """`layout: lightning` on a Fabric script's `.ckpt` files: Lightning's rule (a last*.ckpt)
    is not the job's, and making a last.ckpt would become the example's sorted(listdir) pick for
    good: an error naming the declaration that works, nothing made."""
    ref_run, _ = reference("fabric")
    run = cs.copy_run(ref_run, tmp_path / "run")
    said = _error(tmp_path, cs.state(tmp_path, "run", run, layout="lightning"))
    assert "fabric" in said and "pytorch-lightning_version" in said, said
    code, doc, _ = reconcile_json(tmp_path, "apply", str(cs.state(tmp_path, "run", run, layout="lightning")),
                                  timeout=300)
    assert code != 0 and not (run / "last.ckpt").exists(), doc


def _error(tmp_path: Path, state: Path) -> str:
    code, doc, stderr = reconcile_json(tmp_path, "diff", str(state), timeout=300)
    (res,) = doc["resources"]
    assert code == 1 and res["status"] == "error", (res, stderr)
    return res["message"]


@pytest.mark.parametrize("layout,declared", [("diffusers", "hf-trainer"), ("diffusers", "accelerate"),
                                             ("litgpt", "dcp"), ("orbax", "dcp")])
def test_a_declared_layout_among_another_frameworks_files_is_an_error(reference, tmp_path, layout, declared):
    """Intact runs declared as another framework's: an error naming the files seen and the
    declaration that works (never judged by the other framework's rules, never ok)."""
    ref_run, _ = reference(layout)
    run = cs.copy_run(ref_run, tmp_path / "run")
    said = _error(tmp_path, cs.state(tmp_path, "run", run, layout=declared))
    assert f"`layout: {layout}`" in said, said


def test_fabric_is_never_detected(reference, tmp_path):
    ref_run, _ = reference("fabric")
    run = cs.copy_run(ref_run, tmp_path / "run")
    said = _error(tmp_path, cs.state(tmp_path, "run", run))
    assert "fabric" in said and "pattern" in said and "epoch-0008.ckpt" in said, said


def test_two_frameworks_files_in_one_directory_is_an_error(reference, tmp_path):
    """A diffusers run with a Trainer checkpoint beside it: which one the job resumes with is not
    for reconcile to guess."""
    ref_run, _ = reference("diffusers")
    run = cs.copy_run(ref_run, tmp_path / "run")
    (run / "checkpoint-20").mkdir()
    (run / "checkpoint-20" / "trainer_state.json").write_text(json.dumps({"global_step": 20}))
    said = _error(tmp_path, cs.state(tmp_path, "run", run))
    assert "more than one framework" in said and "hf-trainer" in said and "diffusers" in said, said


def test_composer_run_is_an_honest_error(tmp_path):
    """MosaicML Composer cannot be installed here (it requires torch < 2.7): a run directory of
    its names (its `ep{epoch}-ba{batch}-rank{rank}.pt` saves and the `latest-rank0.pt` link) is
    an error naming it, never ok and never judged as another layout."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "ep1-ba8-rank0.pt").write_bytes(b"PK\x05\x06" + bytes(18))
    os.symlink("ep1-ba8-rank0.pt", run / "latest-rank0.pt")
    said = _error(tmp_path, cs.state(tmp_path, "run", run))
    assert "Composer" in said, said


@pytest.mark.parametrize("layout", ["diffusers", "litgpt", "fabric", "orbax"])
def test_an_empty_pick_in_the_frameworks_words(tmp_path, layout):
    python = cs.framework_python(layout)
    run = tmp_path / "run"
    run.mkdir()
    res = cs.observed(tmp_path, _state(tmp_path, "run", run, layout))
    assert res["status"] == "ok", res
    rc, got, err = cs.train(python, layout, cs.copy_run(run, tmp_path / "bare"), EVERY, EVERY, tmp_path / "r.json",
                            resume=True)
    assert rc == 0 and got["start_step"] == 0, err
    assert "from scratch" in res["message"], res["message"]
