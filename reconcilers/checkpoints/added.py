"""One run directory of the layouts read through the tree held by fd (common/usertree.py):
diffusers, litgpt, fabric, orbax. As survey.py: the steps (each to the structure), the
framework's pick by its own rule, then every byte of that pick and, when it is torn, of the
steps below it down to the first whole one. No check records (a step is read again each time).
Imported only in the observer child."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...common.filechecks.integrity import CONTENT, STRUCTURE
from ...common.usertree import Tree
from . import diffusers as DF
from . import fabric as FB
from . import litgpt as LG
from . import orbax as OB
from .observed import QUARANTINE_BESIDE, CheckpointsObserved, StepObserved

LAYOUTS = ("diffusers", "litgpt", "fabric", "orbax")
BESIDE = QUARANTINE_BESIDE  # their quarantine is beside dir (observed.py says why)
RULES = {"diffusers": DF.RULE, "litgpt": LG.RULE, "orbax": OB.RULE}
EMPTY_PICK = {"diffusers": DF.EMPTY_PICK, "litgpt": LG.EMPTY_PICK, "fabric": FB.EMPTY_PICK, "orbax": OB.EMPTY_PICK}


def survey(spec: dict[str, Any], layout: str, detected: bool, beat: Callable[[], None] | None = None,
           tree: Tree | None = None) -> CheckpointsObserved:
    root = spec["dir"]
    own = tree is None
    tree = tree or Tree.open(root)
    try:
        return _survey(tree, spec, layout, detected, beat)
    finally:
        if own:
            tree.close()


def _survey(tree: Tree, spec: dict[str, Any], layout: str, detected: bool,
            beat: Callable[[], None] | None) -> CheckpointsObserved:
    verify = spec.get("verify", "at-risk")
    base = STRUCTURE if verify != "content" else CONTENT
    roles: dict[str, frozenset[str]] = {}
    blocker = ""
    if layout == "diffusers":
        names = DF.names(tree)
        roles = DF.expected(tree, names)
    elif layout == "litgpt":
        names = LG.names(tree)
    elif layout == "fabric":
        names = FB.ordered(tree, spec)
    else:
        names = OB.names(tree)

    def check(rels: list[str], depth: str) -> list[StepObserved]:
        if layout == "diffusers":
            return DF.steps(tree, rels, lambda n: depth, roles)
        if layout == "litgpt":
            return LG.steps(tree, rels, lambda n: depth)
        if layout == "fabric":
            return FB.steps(tree, rels, lambda n: depth, spec)
        return OB.steps(tree, rels, lambda n: depth)

    steps = check(names, base)
    if beat:
        beat()
    problem = ""
    if layout == "diffusers":
        pick, problem, blocker = DF.resume(tree)
    elif layout == "litgpt":
        pick, problem, blocker = LG.resume(tree)
    elif layout == "fabric":
        pick = FB.resume(tree, spec)
    else:
        pick = OB.resume(names)
    if verify == "at-risk":
        steps = _deepen(steps, pick, check)
    whole = [s for s in steps if s.whole and s.step is not None]
    newest = max(whole, key=lambda s: (s.step, s.mtime), default=None)
    return CheckpointsObserved(
        dir=tree.path, layout=layout, detected=detected, exists=True,
        steps=tuple(sorted(steps, key=lambda s: (s.step if s.step is not None else -1, s.path))),
        resume_path=pick, resume_step=next((s.step for s in steps if s.path == pick), None),
        resume_rule=FB.rule(spec) if layout == "fabric" else RULES[layout], resume_problem=problem,
        empty_pick=EMPTY_PICK[layout], blocker=blocker, pointer_text=None,
        newest_whole_path=newest.path if newest else None,
        newest_whole_step=newest.step if newest else None, newest_whole_mtime=newest.mtime if newest else None,
        depth=CONTENT if verify != "structure" else STRUCTURE)


def _deepen(steps: list[StepObserved], pick: str | None,
            check: Callable[[list[str], str], list[StepObserved]]) -> list[StepObserved]:
    """Every byte of the pick; when it is not whole, of the steps below it, newest first, until
    one is whole (survey._deepen's order)."""
    by_path = {s.path: s for s in steps}
    order = sorted((s for s in steps if s.step is not None), key=lambda s: (s.step, s.mtime), reverse=True)
    first = by_path.get(pick) if pick else None
    for s in ([first] if first else []) + [s for s in order if s is not first]:
        if not s.whole:
            continue
        again = check([s.path], CONTENT)
        if again:
            by_path[s.path] = again[0]
            if again[0].whole:
                break
    return list(by_path.values())
