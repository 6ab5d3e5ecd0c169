"""The diffusers training examples' checkpoints (diffusers 0.42.1; the same lines in its ~85
example scripts: examples/text_to_image/train_text_to_image.py, main(), and the LoRA, DreamBooth,
ControlNet ... scripts). Imported only in the observer child; read through the tree held by fd.

Save (every `--checkpointing_steps`): with `--checkpoints_total_limit`, first the oldest entries
starting with `checkpoint` are removed (shutil.rmtree) until limit - 1 are left, sorted by the
same key as the resume; then `accelerator.save_state(os.path.join(args.output_dir,
f"checkpoint-{global_step}"))`: the script's save hook writes the model first (`unet/` by
save_pretrained, `pytorch_lora_weights.safetensors` for LoRA, or the pipeline's component
folders), then Accelerate (checkpointing.save_accelerator_state) writes `optimizer.bin`,
`scheduler.bin`, `random_states_0.pkl` (and `scaler.pt` with fp16), then custom objects.

Resume (`--resume_from_checkpoint latest`): `dirs = [d for d in os.listdir(args.output_dir) if
d.startswith("checkpoint")]`, sorted by `int(x.split("-")[1])`, the last; none: "Starting a new
training run". `accelerator.load_state(path)`: the load hook reads the model (from_pretrained of
`unet/`: config.json and the weights), then Accelerate torch.loads optimizer.bin, scheduler.bin
(missing: FileNotFoundError) and random_states_0.pkl inside `try/except: logger.info("Could not
load random states")` (missing or torn: the run goes on with other random numbers, silently);
`global_step = int(path.split("-")[1])`.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Callable

from ...common.usertree import Tree, UnsafeTree
from .accelerate import CUSTOM, OPTIONAL, RANDOM, REQUIRED
from .layouts import TEMP_NAME
from .observed import NotCheckable, StepObserved
from .treefiles import check_file, tree_mtime_size

RULE = ("the entry of the output_dir starting with `checkpoint` with the highest int(name.split(\"-\")[1]) (diffusers "
        "examples, train_text_to_image.py main(): --resume_from_checkpoint latest)")
EMPTY_PICK = ("the script would print \"Checkpoint 'latest' does not exist. Starting a new training run.\" and train "
              "from scratch (diffusers examples, --resume_from_checkpoint latest)")
# What every example registers with Accelerate: an optimizer and an lr scheduler (prepare()); and
# Accelerate always writes the random states of each process (save_accelerator_state).
ALWAYS = frozenset({"optimizer.bin", "scheduler.bin", "random_states_0.pkl"})
WEIGHTS = re.compile(r".*\.(?:safetensors|bin)$")
LORA = "pytorch_lora_weights.safetensors"  # the LoRA scripts' save hook (save_lora_weights)
MODEL_FILE = re.compile(r"^(?:model(?:_\d+)?\.safetensors|pytorch_model(?:_\d+)?\.bin)$")  # no hook: Accelerate's


def key(name: str) -> int | None:
    """The rule's key, int(name.split("-")[1]); None where it raises (IndexError, ValueError)."""
    parts = name.split("-")
    if len(parts) < 2:
        return None
    try:
        return int(parts[1])
    except ValueError:
        return None


def candidates(tree: Tree) -> list[str]:
    """The entries the rule sorts, in the directory's own order (list.sort is stable)."""
    return [e.name for e in tree.entries() if e.name.startswith("checkpoint")]


def names(tree: Tree) -> list[str]:
    kinds = {e.name: e.kind for e in tree.entries()}
    return sorted(n for n in candidates(tree) if key(n) is not None and kinds.get(n) == "dir")


def resume(tree: Tree) -> tuple[str | None, str, str]:
    """(pick, why it cannot load, blocker)."""
    cands = candidates(tree)
    if not cands:
        return None, "", ""
    stray = sorted(n for n in cands if key(n) is None)
    if stray:
        why = (f"{stray[0]} starts with `checkpoint` but int(name.split(\"-\")[1]) fails on it: the script's "
               "--resume_from_checkpoint latest (and its checkpoints_total_limit rotation) raise ValueError or "
               "IndexError")
        return "", why, why + "; move it out of the output_dir by hand"
    pick = sorted(cands, key=lambda n: key(n))[-1]  # type: ignore[arg-type,return-value]
    if stat.S_ISLNK(tree.lstat(pick).st_mode):
        raise NotCheckable(f"{tree.path}/{pick}, the script's pick, is a symbolic link: load_state() would read "
                           "where it points; reconcile does not follow links in a user's tree")
    if not stat.S_ISDIR(tree.lstat(pick).st_mode):
        why = f"{pick}, the highest number, is not a folder: load_state() has nothing to load there and raises"
        return pick, why, why + "; move it out of the output_dir by hand"
    return pick, "", ""


def _roles(tree: Tree, rel: str) -> dict[str, list[str]]:
    """The parts of a checkpoint load_state reads: role -> the files to check."""
    out: dict[str, list[str]] = {}
    for e in sorted(tree.entries(rel), key=lambda e: e.name):
        f = e.name
        if e.kind == "dir":
            inner = {x.name: x for x in tree.entries(f"{rel}/{f}")}
            weights = sorted(n for n, x in inner.items() if x.kind == "file" and WEIGHTS.match(n))
            if "config.json" in inner or weights:  # a diffusers/transformers save_pretrained folder
                out[f"{f}/"] = [f"{f}/config.json"] + [f"{f}/{w}" for w in weights]
            continue
        if f == LORA or MODEL_FILE.match(f) or REQUIRED.match(f) or OPTIONAL.match(f) or RANDOM.match(f) \
                or CUSTOM.match(f):
            out[f] = [f]
    return out


def expected(tree: Tree, rels: list[str]) -> dict[str, frozenset[str]]:
    """Per checkpoint, the roles it must hold: ALWAYS, the model (any of its forms), and what its
    neighbour holds (the next newer one's, for the newest the one before): what the script
    registered is written nowhere (accelerate.expected's reasoning)."""
    held = {rel: frozenset(_roles(tree, rel)) for rel in rels}
    order = sorted(rels, key=lambda r: (key(r) or 0, r))
    out = {}
    for i, rel in enumerate(order):
        j = i + 1 if i + 1 < len(order) else i - 1
        out[rel] = ALWAYS | (held[order[j]] if j >= 0 else frozenset())
    return out


def steps(tree: Tree, rels: list[str], depth_of: Callable[[str], str],
          roles: dict[str, frozenset[str]]) -> list[StepObserved]:
    return [step(tree, rel, depth_of(rel), roles.get(rel, ALWAYS)) for rel in rels]


def step(tree: Tree, rel: str, depth: str, want: frozenset[str]) -> StepObserved:
    mtime, files, size = tree_mtime_size(tree, rel)
    n = key(rel)
    try:
        have = _roles(tree, rel)
    except (OSError, UnsafeTree) as exc:
        return StepObserved(n, rel, False, f"unreadable: {exc}", mtime, files, size)
    problem = next((f"{x.name}: a temporary file left by an interrupted write" for x in tree.entries(rel)
                    if TEMP_NAME.search(x.name)), "")
    models = [r for r in have if r.endswith("/") or r == LORA or MODEL_FILE.match(r)]
    if not problem and not models:
        problem = ("no model (no unet/ or other component folder, no pytorch_lora_weights.safetensors, no "
                   "model.safetensors): the script's load hook (from_pretrained) or load_state raises")
    for role in sorted(want - set(have)):
        if problem:
            break
        if role.endswith("/") or role == LORA or MODEL_FILE.match(role):
            problem = f"{role} missing (the checkpoint beside it holds it): the script's load hook raises"
        elif RANDOM.match(role):
            problem = (f"{role} missing: load_state() logs \"Could not load random states\" and the run goes on with "
                       "other random numbers, silently (the save was cut before its last file)")
        elif REQUIRED.match(role):
            problem = f"{role} missing: load_state() raises FileNotFoundError"
        elif CUSTOM.match(role):
            problem = f"{role} missing: load_state() raises RuntimeError (custom checkpoints do not match)"
        else:
            problem = f"{role} missing: load_state() goes on without restoring that dataloader's state, silently"
    for role in sorted(r for r in have if r.endswith("/")):
        if not problem and len(have[role]) < 2:  # save_pretrained writes config.json, then the weights
            problem = f"{role}: no weights file beside config.json: from_pretrained raises (the save was cut)"
    unproven = ""
    for role in sorted(have):
        if problem:
            break
        for f in have[role]:
            path = f"{rel}/{f}"
            if f.endswith("config.json"):
                problem = _json(tree, path)
                if problem:
                    break
                continue
            ok, why = check_file(tree, path, depth)
            if not ok:
                problem = f"{f}: {why}" + (" (load_state() goes on without restoring the random states, silently)"
                                           if RANDOM.match(f) else "")
                break
            if why:
                unproven = unproven or f"{f}: {why}"
            elif f.endswith(".safetensors") and not unproven:
                unproven = ("safetensors has no checksum: a page zeroed behind an intact header is found only by "
                            "the content check" if depth != "content" else
                            "safetensors has no checksum: no zeroed page found, but other damage cannot be proven")
    return StepObserved(n, rel, not problem, problem, mtime, files, size, "" if problem else unproven)


def _json(tree: Tree, rel: str) -> str:
    try:
        json.loads(tree.read_bounded(rel, 16 << 20))
    except FileNotFoundError:
        return f"{rel}: missing"
    except (OSError, UnsafeTree) as exc:
        return f"{rel}: unreadable: {exc}"
    except ValueError as exc:
        return f"{rel}: does not parse ({exc}): from_pretrained raises"
    return ""
