"""One run directory observed: the steps (each checked to the structure), the framework's
pick by its own rule, then every byte of that pick, and of the steps below it down to the
first whole one when the pick is not whole (`verify: at-risk`, the default). A step whose
files are unchanged since it was checked is not read again: its verdict comes from the run
directory's check record (records.py). Runs in the observer child; imports the file checks
(layouts.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ...common.filechecks.integrity import CONTENT, STRUCTURE
from ...common.quarantine import QUARANTINE, refuse_planted
from ...common.usertree import Tree
from . import accelerate as A
from . import added, records
from . import detect as D
from . import layouts as L
from .observed import CheckpointsObserved, NotCheckable, StepObserved

RULES = {
    "hf-trainer": "the highest checkpoint-N directory (transformers trainer_utils.get_last_checkpoint)",
    "lightning": "the newest-mtime last*.ckpt in dirpath (lightning _CheckpointConnector._parse_ckpt_path "
                 "'last', ModelCheckpoint._find_last_checkpoints)",
    "deepspeed": "the tag named by `latest` (deepspeed DeepSpeedEngine.load_checkpoint, tag=None)",
    "dcp": "the highest step-N directory holding .metadata (torchtitan CheckpointManager._find_load_step)",
    "megatron": "the iteration in latest_checkpointed_iteration.txt (megatron checkpointing.read_metadata)",
    "accelerate": "the entry of checkpoints/ with the highest number in its name (accelerate Accelerator.load_state "
                  "with automatic_checkpoint_naming)",
}

# What each framework does when its rule picks nothing, from its code.
EMPTY_PICK = {
    "hf-trainer": "Trainer.train(resume_from_checkpoint=True) would raise ValueError \"No valid checkpoint found in "
                  "output directory\" (transformers Trainer.train: get_last_checkpoint returned None)",
    "lightning": "fit(ckpt_path=\"last\") would warn that there is no last checkpoint and train from scratch "
                 "(lightning _CheckpointConnector._parse_ckpt_path)",
    "deepspeed": "load_checkpoint() would warn \"Unable to find latest file\", load nothing and return (None, None): "
                 "the job starts from scratch (deepspeed DeepSpeedEngine.load_checkpoint)",
    "dcp": "torchtitan would load nothing and start from scratch (CheckpointManager.load: _find_load_step "
           "returned -1)",
    "megatron": "Megatron would warn \"could not find the metadata file\" and start from random weights "
                "(checkpointing._load_base_checkpoint; with --exit-on-missing-checkpoint it exits)",
    "accelerate": "Accelerator.load_state() would raise IndexError (checkpoints/ empty) or FileNotFoundError "
                  "(no checkpoints/) (accelerate Accelerator.load_state)",
}


def survey(spec: dict[str, Any], beat: Callable[[], None] | None = None) -> CheckpointsObserved:
    root, layout = spec["dir"], spec.get("layout")
    try:
        refuse_planted(root)  # the declared root reached safely, its quarantine folder reconcile's own
        names = sorted(n for n in os.listdir(root) if n != QUARANTINE)
    except FileNotFoundError:
        return CheckpointsObserved(dir=root, layout=layout or "unknown", detected=not layout, exists=False)
    detected = not layout
    if detected:
        if not names:
            return CheckpointsObserved(dir=root, layout="unknown", detected=True, exists=True)
        if _accelerate_folder(names) and not _evidence(root):
            raise NotCheckable(f"{root}: no checkpoint layout recognised; it looks like layout "
                               f"{_accelerate_folder(names)}")
        with Tree.open(root) as tree:
            layout = D.detect(tree)  # from files only one framework writes, else NotCheckable
    if layout in added.LAYOUTS:
        obs = added.survey(spec, layout, detected, beat)
        if not detected and layout != "fabric":  # (Fabric's files are whatever the script names)
            _other_framework(root, layout)
        return obs
    if layout == "accelerate":
        names = A.names(root)
    verify = spec.get("verify", "at-risk")
    base = STRUCTURE if verify != "content" else CONTENT
    # --- check records (records.py): every step checked through `book`, saved at the end ---
    ranks: Any = None  # what the other checkpoints hold: DeepSpeed's ZeRO ranks, Accelerate's files
    if layout == "deepspeed":
        ranks = _ds_ranks(root, names)
    elif layout == "accelerate":
        ranks = A.expected(root, names)
    book = records.Book(root, layout, {"model_only": bool(spec.get("model_only")), "ranks": records.plain(ranks)},
                        use=verify != "content")  # `verify: content` reads every byte every time

    def check(step_names: list[str], depth: str) -> list[StepObserved]:
        return _steps(root, layout, step_names, lambda n: depth, spec, ranks)
    # ---
    steps = book.steps(names, base, check)
    if beat:
        beat()
    if layout == "accelerate":  # (no pointer file: the third is what a person must move)
        (pick, problem, blocker), text = A.resume(root), None
    else:
        (pick, problem, text), blocker = _pick(root, layout, names, steps), ""
    if not steps and pick is None and not detected:
        _sees_nothing(root, layout)
    if not detected:
        _other_framework(root, layout)
        if layout == "lightning":
            _not_lightnings(root, steps)
    if verify == "at-risk":
        steps = _deepen(steps, pick, book, check)
    book.save()
    whole = [s for s in steps if s.whole and s.step is not None]
    newest = max(whole, key=lambda s: (s.step, s.mtime), default=None)
    pick_step = next((s.step for s in steps if s.path == pick), None)
    return CheckpointsObserved(
        dir=root, layout=layout, detected=detected, exists=True,
        steps=tuple(sorted(steps, key=lambda s: (s.step if s.step is not None else -1, s.path))),
        resume_path=pick, resume_step=pick_step, resume_rule=RULES[layout], resume_problem=problem,
        empty_pick=EMPTY_PICK[layout], blocker=blocker, pointer_text=text,
        newest_whole_path=newest.path if newest else None,
        newest_whole_step=newest.step if newest else None, newest_whole_mtime=newest.mtime if newest else None,
        depth=CONTENT if verify != "structure" else STRUCTURE, from_records=len(book.reused))


def _steps(root: str, layout: str, names: list[str], depth_of: Callable[[str], str], spec: dict[str, Any],
           ranks: Any) -> list[StepObserved]:
    if layout == "hf-trainer":
        return L.hf_steps(root, names, depth_of, bool(spec.get("model_only")))
    if layout == "deepspeed":
        return L.ds_steps(root, names, depth_of, ranks)
    if layout == "lightning":
        return L.pl_steps(root, names, depth_of)
    if layout == "accelerate":
        return A.steps(root, names, depth_of, ranks if ranks is not None else A.expected(root, names))
    out = []
    rx = L.DCP_DIR if layout == "dcp" else L.MEGATRON_DIR
    one = L.dcp_step if layout == "dcp" else L.megatron_step
    for n in names:
        m = rx.search(n) if layout == "dcp" else rx.match(n)
        if m and os.path.isdir(os.path.join(root, n)):
            out.append(one(root, n, int(m.group(1)), depth_of(n)))
    return out


def _pick(root: str, layout: str, names: list[str], steps: list[StepObserved]) -> tuple[str | None, str, str | None]:
    """The framework's pick: (path or None for a start from scratch, why it cannot load, pointer text)."""
    if layout == "hf-trainer":
        return L.hf_resume(names, root)[0], "", None
    if layout == "deepspeed":
        return L.ds_resume(root)
    if layout == "lightning":
        return L.pl_resume(root, steps), "", None
    if layout == "megatron":
        return L.megatron_resume(root)
    with_meta = [s for s in steps if os.path.isfile(os.path.join(root, s.path, ".metadata"))]
    return (max(with_meta, key=lambda s: s.step).path if with_meta else None), "", None


def _ds_ranks(root: str, names: list[str]) -> int:
    """The ZeRO ranks the run's steps hold (layouts.ds_steps' rule, over every folder: only a
    tag folder holds ZeRO files)."""
    return L.zero_ranks([(n, os.listdir(p)) for n in names if os.path.isdir(p := os.path.join(root, n))])


def _deepen(steps: list[StepObserved], pick: str | None, book: records.Book,
            check: records.Check) -> list[StepObserved]:
    """Every byte of the pick; when it is not whole, of the steps below it, newest first, until
    one is whole (the one apply would make the framework resume from)."""
    by_path = {s.path: s for s in steps}
    order = sorted((s for s in steps if s.step is not None), key=lambda s: (s.step, s.mtime), reverse=True)
    first = by_path.get(pick) if pick else None
    queue = ([first] if first else []) + [s for s in order if s is not first]
    for s in queue:
        if not s.whole:
            continue
        again = book.steps([s.path], CONTENT, check)
        if again:
            by_path[s.path] = again[0]
            if again[0].whole:
                break
    return list(by_path.values())



def _sees_nothing(root: str, layout: str) -> None:
    """A declared layout that finds no checkpoint in a directory holding checkpoint-shaped files
    (another layout's names, weights or checkpoint files) is a wrong declaration, not "nothing
    saved yet": NotCheckable, naming what is there and the layout it looks like."""
    names = sorted(n for n in os.listdir(root) if n != QUARANTINE)
    seen = _evidence(root)
    looks = next(iter(sorted(seen)), None) or _accelerate_folder(names)
    shaped = L.shaped_files(root, names)
    if looks == layout or layout in seen or (looks is None and not shaped):
        return
    found = shaped or (A.names(root) if looks == "accelerate" else []) or names
    what = ", ".join(found[:3]) + (f" (+{len(found) - 3} more)" if len(found) > 3 else "")
    like = f"; it looks like layout {looks}" if looks else ""
    works = f" (declare {D.declaration(looks)})" if looks in seen else ""
    raise NotCheckable(f"layout {layout} finds no checkpoint in {root}, which holds {what}{like}{works}; "
                       f"{_empty(layout)}")


def _empty(layout: str) -> str:
    return EMPTY_PICK.get(layout) or added.EMPTY_PICK[layout]


def _evidence(root: str) -> dict[str, str]:
    with Tree.open(root) as tree:
        return D.evidence(tree)


def _not_lightnings(root: str, steps: list[StepObserved]) -> None:
    """`layout: lightning` on `.ckpt` files none of which Lightning wrote (no whole one's pickle
    names `pytorch-lightning_version`: a Fabric script's saves): its rule would look for a
    last*.ckpt the job never reads, and apply would make one the job's own rule might then pick."""
    whole = sorted((s for s in steps if s.whole), key=lambda s: -s.mtime)[:8]
    if not whole:
        return
    with Tree.open(root) as tree:
        if any(D.lightning_keys(tree, s.path) for s in whole):
            return
    raise NotCheckable(f"layout lightning declared, but no .ckpt in {root} holds Lightning's keys "
                       f"(pytorch-lightning_version), e.g. {whole[0].path}: not Lightning's saves (a Fabric "
                       f"script's?); declare {D.declaration('fabric')}")


def _other_framework(root: str, layout: str) -> None:
    """A declared layout among another framework's own files (and none of its own) is judged by
    rules that are not the job's: an error naming them and the declaration that works."""
    seen = _evidence(root)
    if not seen or layout in seen:
        return
    other = sorted(seen)
    said = "; ".join(f"{seen[k]} (only layout {k} writes it)" for k in other)
    raise NotCheckable(f"layout {layout} declared, but {root} holds another framework's files: {said}; "
                       f"declare {' or '.join(D.declaration(k) for k in other)}")


def _accelerate_folder(names: list[str]) -> str | None:
    """Accelerate's checkpoints/ folder itself declared as the run directory."""
    if any(L.ACC_DIR.match(n) for n in names):
        return "accelerate (this is its checkpoints/ folder: its dir is the project_dir, the parent)"
    return None
