"""litgpt's checkpoints (litgpt 0.5.13). Imported only in the observer child; read through the
tree held by fd.

Save (litgpt/pretrain.py fit() and save_checkpoint()): `out_dir / f"step-{step_count:08d}" /
"lit_model.pth"`: `fabric.save(checkpoint_file, state)` (one torch.save archive written in place:
model, optimizer, train_dataloader, iter_num, step_count), then `hyperparameters.yaml`, the
tokenizer's files and `model_config.yaml`.

Resume (`--resume auto`, litgpt/utils.py find_resume_path()): `max(out_dir.rglob("step-*/*.pth"),
key=lambda p: int(p.parent.name.split("-")[1]), default=None)`: every `*.pth` in every folder
named `step-*` anywhere below out_dir (rglob walks hidden folders too, and does not follow
symbolic links), the highest number; a `step-*` name whose second part is not a number raises
ValueError; none: the run starts from scratch (`--resume True` raises FileNotFoundError). Then
`fabric.load(resume, state)`: the whole archive. The yaml files are not read by the resume
(litgpt's other commands on that folder, generate or convert, read model_config.yaml).
So no quarantine inside out_dir: it is beside it (fix.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

from ...common.usertree import Tree, UnsafeTree
from .observed import NotCheckable, StepObserved
from .treefiles import check_file, tree_mtime_size

RULE = ("the highest int(folder.split(\"-\")[1]) of the *.pth files in step-* folders anywhere below dir (litgpt "
        "utils.find_resume_path: max(out_dir.rglob(\"step-*/*.pth\")), --resume auto)")
EMPTY_PICK = ("litgpt --resume auto would start from scratch (utils.find_resume_path returned None; with --resume True "
              "it raises FileNotFoundError)")
MOST = 20_000  # folders walked: rglob's walk, bounded


def key(folder: str) -> int | None:
    parts = folder.rsplit("/", 1)[-1].split("-")
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None


def matches(tree: Tree) -> list[tuple[str, str]]:
    """rglob("step-*/*.pth"): (folder, file) pairs relative to the run directory, in walk order."""
    out: list[tuple[str, str]] = []
    todo, seen = [""], 0
    while todo:
        d = todo.pop(0)
        for e in sorted(tree.entries(d or "."), key=lambda e: e.name):
            seen += 1
            if seen > MOST:
                raise NotCheckable(f"{tree.path}: more than {MOST} entries below it: litgpt's rglob would walk them "
                                   "all; not walked")
            rel = f"{d}/{e.name}" if d else e.name
            if e.kind == "symlink" and (fnmatch.fnmatchcase(e.name, "step-*") or fnmatch.fnmatchcase(e.name, "*.pth")):
                raise NotCheckable(f"{tree.path}/{rel}: a symbolic link litgpt's rglob would follow (its last two "
                                   "parts match through links); reconcile does not follow links in a user's tree")
            if e.kind == "dir":
                todo.append(rel)
            elif fnmatch.fnmatchcase(d.rsplit("/", 1)[-1], "step-*") and fnmatch.fnmatchcase(e.name, "*.pth"):
                out.append((d, e.name))
    return out


def names(tree: Tree) -> list[str]:
    return sorted(dict.fromkeys(d for d, _ in matches(tree) if key(d) is not None))


def resume(tree: Tree) -> tuple[str | None, str, str]:
    found = matches(tree)
    if not found:
        return None, "", ""
    stray = sorted(d for d, _ in found if key(d) is None)
    if stray:
        why = (f"{stray[0]}: int(name.split(\"-\")[1]) fails on its name: litgpt's find_resume_path raises ValueError")
        return "", why, why + "; move it out of the run directory by hand"
    best = max(found, key=lambda m: key(m[0]))  # type: ignore[arg-type,return-value]
    return best[0], "", ""


def steps(tree: Tree, rels: list[str], depth_of: Callable[[str], str]) -> list[StepObserved]:
    files: dict[str, list[str]] = {}
    for d, f in matches(tree):
        files.setdefault(d, []).append(f)
    return [step(tree, rel, sorted(files.get(rel, [])), depth_of(rel)) for rel in rels]


def step(tree: Tree, rel: str, pths: list[str], depth: str) -> StepObserved:
    mtime, count, size = tree_mtime_size(tree, rel)
    problem = unproven = ""
    for f in pths:  # what fabric.load reads: the whole archive (every *.pth the rule may pick)
        ok, why = check_file(tree, f"{rel}/{f}", depth)
        if not ok:
            problem = f"{f}: {why}"
            break
        unproven = unproven or (f"{f}: {why}" if why else "")
    if not problem:
        try:
            have = {e.name for e in tree.entries(rel)}
        except (OSError, UnsafeTree):
            have = set()
        lost = [y for y in ("hyperparameters.yaml", "model_config.yaml") if y not in have]
        if lost:  # written after lit_model.pth: a save cut short; the resume does not read them
            unproven = unproven or (f"{', '.join(lost)} missing (the save was cut after lit_model.pth): litgpt's "
                                    "resume does not read it, its generate and convert commands do")
    return StepObserved(key(rel), rel, not problem, problem, mtime, count, size, "" if problem else unproven)
