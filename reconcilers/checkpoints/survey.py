"""One run directory observed: the steps (each checked to the structure), the framework's
pick by its own rule, then every byte of that pick, and of the steps below it down to the
first whole one when the pick is not whole (`verify: at-risk`, the default). Runs in the
observer child; imports the file checks (layouts.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ...common.filechecks.integrity import CONTENT, STRUCTURE
from ...common.quarantine import QUARANTINE
from . import layouts as L
from .observed import CheckpointsObserved, StepObserved

RULES = {
    "hf-trainer": "the highest checkpoint-N directory (transformers trainer_utils.get_last_checkpoint)",
    "lightning": "the newest-mtime last*.ckpt in dirpath (lightning _CheckpointConnector._parse_ckpt_path "
                 "'last', ModelCheckpoint._find_last_checkpoints)",
    "deepspeed": "the tag named by `latest` (deepspeed DeepSpeedEngine.load_checkpoint, tag=None)",
    "dcp": "the highest step-N directory holding .metadata (torchtitan CheckpointManager._find_load_step)",
    "megatron": "the iteration in latest_checkpointed_iteration.txt (megatron checkpointing.read_metadata)",
}


def survey(spec: dict[str, Any], beat: Callable[[], None] | None = None) -> CheckpointsObserved:
    root, layout = spec["dir"], spec.get("layout")
    try:
        names = sorted(n for n in os.listdir(root) if n != QUARANTINE)
    except FileNotFoundError:
        return CheckpointsObserved(dir=root, layout=layout or "unknown", detected=not layout, exists=False)
    detected = not layout
    if detected:
        layout = L.detect(root, names)
        if layout is None:
            return CheckpointsObserved(dir=root, layout="unknown", detected=True, exists=True)
    verify = spec.get("verify", "at-risk")
    base = STRUCTURE if verify != "content" else CONTENT
    steps = _steps(root, layout, names, lambda n: base, spec, None)
    if beat:
        beat()
    pick, problem, text = _pick(root, layout, names, steps)
    if verify == "at-risk":
        steps = _deepen(root, layout, names, steps, pick, spec)
    whole = [s for s in steps if s.whole and s.step is not None]
    newest = max(whole, key=lambda s: (s.step, s.mtime), default=None)
    pick_step = next((s.step for s in steps if s.path == pick), None)
    return CheckpointsObserved(
        dir=root, layout=layout, detected=detected, exists=True,
        steps=tuple(sorted(steps, key=lambda s: (s.step if s.step is not None else -1, s.path))),
        resume_path=pick, resume_step=pick_step, resume_rule=RULES[layout], resume_problem=problem,
        pointer_text=text, newest_whole_path=newest.path if newest else None,
        newest_whole_step=newest.step if newest else None, newest_whole_mtime=newest.mtime if newest else None,
        depth=CONTENT if verify != "structure" else STRUCTURE)


def _steps(root: str, layout: str, names: list[str], depth_of: Callable[[str], str], spec: dict[str, Any],
           ranks: int | None) -> list[StepObserved]:
    if layout == "hf-trainer":
        return L.hf_steps(root, names, depth_of, bool(spec.get("model_only")))
    if layout == "deepspeed":
        return L.ds_steps(root, names, depth_of, ranks)
    if layout == "lightning":
        return L.pl_steps(root, names, depth_of)
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


def _deepen(root: str, layout: str, names: list[str], steps: list[StepObserved], pick: str | None,
            spec: dict[str, Any]) -> list[StepObserved]:
    """Every byte of the pick; when it is not whole, of the steps below it, newest first, until
    one is whole (the one apply would make the framework resume from)."""
    by_path = {s.path: s for s in steps}
    ranks = None
    if layout == "deepspeed":
        ranks = L.zero_ranks([(s.path, os.listdir(os.path.join(root, s.path))) for s in steps])
    order = sorted((s for s in steps if s.step is not None), key=lambda s: (s.step, s.mtime), reverse=True)
    first = by_path.get(pick) if pick else None
    queue = ([first] if first else []) + [s for s in order if s is not first]
    for s in queue:
        if not s.whole:
            continue
        again = _steps(root, layout, [s.path], lambda n: CONTENT, spec, ranks)
        if again:
            by_path[s.path] = again[0]
            if again[0].whole:
                break
    return list(by_path.values())

