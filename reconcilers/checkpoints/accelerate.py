"""Accelerate's automatic checkpoint naming (accelerate 1.x, `accelerator.py` and
`checkpointing.py`): `Accelerator.save_state()` with
`ProjectConfiguration(automatic_checkpoint_naming=True)` writes `<project_dir>/checkpoints/
checkpoint_<iteration>/` (iteration: the count of saves, `ProjectConfiguration.iteration`, not a
training step), and `load_state()` without an input_dir loads the last entry of `checkpoints/`
sorted by the first number in its name. Imported only in the observer child.

The rule, as `Accelerator.load_state` and `save_state`'s `total_limit` cleanup both apply it:
every entry of `os.listdir(checkpoints)` (files too, no `isdir`), sorted by `_inner`: the
first run of digits in the entry's name (`re.findall(r"[\\/]?([0-9]+)(?=[^\\/]*$)", path)[0]`);
an entry without one raises IndexError, in the resume and in the cleanup alike; an empty or
missing `checkpoints/` raises IndexError / FileNotFoundError. `list.sort` is stable, so between
two entries with one number the later in listdir order wins: the order is the directory's own,
read here the same way.

What `load_state` reads of the pick (`load_accelerator_state`, `load_custom_state`), for the
objects the script registered, which the files alone do not name (a neighbouring checkpoint's
files are taken as the script's set: `expected`):
- per model: `model[_i].safetensors` (safetensors `load_model`), else `pytorch_model[_i].bin`
  (torch.load); missing: FileNotFoundError;
- `optimizer[_i].bin`, `scheduler[_i].bin`, `sampler[_i].bin`, `scaler.pt`: torch.load,
  missing: FileNotFoundError;
- `dl_state_dict[_i].bin`: loaded only when present (missing: the dataloader state is silently
  not restored);
- `random_states_<rank>.pkl`: inside `try: ... except Exception: logger.info("Could not load
  random states")`: missing or torn, the run goes on with other random states, silently;
- `custom_checkpoint_<i>.pkl`: their count must equal the registered objects' (RuntimeError),
  each torch.load(weights_only=False).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from .layouts import ACC_FOLDER as FOLDER
from .layouts import _mtime_of, _size, _temp_leftover, file_check
from .observed import NotCheckable, StepObserved

NUMBER = re.compile(r"[\/]?([0-9]+)(?=[^\/]*$)")  # load_state's and save_state's `_inner`
# What save_accelerator_state / save_custom_state write at the top of a checkpoint folder.
MODEL = re.compile(r"^(?:model(?:_(\d+))?\.safetensors|pytorch_model(?:_(\d+))?\.bin)$")
REQUIRED = re.compile(r"^(?:(?:optimizer|scheduler|sampler)(?:_\d+)?\.bin|scaler\.pt)$")
OPTIONAL = re.compile(r"^dl_state_dict(?:_\d+)?\.bin$")
RANDOM = re.compile(r"^random_states_\d+\.pkl$")
CUSTOM = re.compile(r"^custom_checkpoint_\d+\.pkl$")


def number(name: str) -> int | None:
    """`_inner`'s number of an entry of checkpoints/ (None: load_state raises IndexError)."""
    found = NUMBER.findall(name)
    return int(found[0]) if found else None


def listing(root: str) -> list[str] | None:
    """The entries of <root>/checkpoints in the directory's own order (None: no such folder)."""
    try:
        return os.listdir(os.path.join(root, FOLDER))
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return []


def names(root: str) -> list[str]:
    """The checkpoint folders (by Accelerate's rule: any folder whose name holds a number),
    as paths relative to the run directory."""
    out = []
    for n in listing(root) or []:
        if number(n) is not None and os.path.isdir(os.path.join(root, FOLDER, n)):
            out.append(f"{FOLDER}/{n}")
    return sorted(out)


def resume(root: str) -> tuple[str | None, str, str]:
    """Accelerator.load_state() with automatic naming: (pick, why it cannot load, blocker)."""
    entries = listing(root)
    if not entries:
        return None, "", ""
    stray = sorted(n for n in entries if number(n) is None)
    if stray:
        why = (f"{FOLDER}/{stray[0]} has no number in its name: Accelerate's load_state() and save_state()'s "
               f"total_limit cleanup sort every entry of {FOLDER}/ by its number and raise IndexError")
        return "", why, why + "; move it out of " + FOLDER + "/ by hand"
    pick = sorted(entries, key=lambda n: number(n))[-1]  # type: ignore[arg-type,return-value]
    rel = f"{FOLDER}/{pick}"
    if not os.path.isdir(os.path.join(root, rel)):
        why = f"{rel}, the highest number, is not a folder: load_state() has nothing to load there and raises"
        return rel, why, why + "; move it out of " + FOLDER + "/ by hand"
    return rel, "", ""


def expected(root: str, rels: list[str]) -> dict[str, frozenset[str]]:
    """Per checkpoint, the file roles it must hold: what the script registered is written
    nowhere, so its neighbour's set stands for it — the next newer checkpoint's, for the newest
    the one before it. A crash leaves only the newest save short (one file after another:
    weights, optimizer, scheduler, ..., random states, custom objects); a script whose registered
    objects changed between saves changes every later checkpoint alike, and none is torn for it.
    A model's role is its index, whichever format holds it."""
    held = {rel: frozenset(r for f in _listdir(os.path.join(root, rel)) if (r := _role(f))) for rel in rels}
    order = sorted(rels, key=lambda rel: (number(os.path.basename(rel)) or 0, rel))
    out = {}
    for i, rel in enumerate(order):
        j = i + 1 if i + 1 < len(order) else i - 1
        out[rel] = held[order[j]] if j >= 0 else frozenset()
    return out


def _role(f: str) -> str:
    m = MODEL.match(f)
    if m:
        return f"model {m.group(1) or m.group(2) or 0}"
    if REQUIRED.match(f) or OPTIONAL.match(f) or RANDOM.match(f) or CUSTOM.match(f):
        return f
    return ""


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def steps(root: str, rels: list[str], depth_of: Callable[[str], str],
          roles: dict[str, frozenset[str]]) -> list[StepObserved]:
    return [step(root, rel, depth_of(rel), roles.get(rel, frozenset())) for rel in rels]


def step(root: str, rel: str, depth: str, roles: frozenset[str]) -> StepObserved:
    d = os.path.join(root, rel)
    files = os.listdir(d)
    sub = sorted(f for f in files if os.path.isdir(os.path.join(d, f)))
    if sub:  # FSDP (pytorch_model_fsdp_0/, optimizer_0/) or DeepSpeed (pytorch_model/) state
        raise NotCheckable(f"{rel}/{sub[0]}: an FSDP or DeepSpeed save inside an Accelerate checkpoint; "
                           "the accelerate layout checks the plain (one-process or DDP) save only")
    mtime = max(_mtime_of(d, files), os.lstat(d).st_mtime)
    problem = _temp_leftover(files)
    have: dict[str, str] = {}
    for f in sorted(files):
        role = _role(f)
        if role and not (role in have and f.startswith("pytorch_model")):  # safetensors first, as load_state
            have[role] = f
    if not problem:
        problem = _missing(sorted(roles - set(have)), have)
    unproven = ""
    for role in sorted(have):
        if problem:
            break
        f = have[role]
        ok, why = file_check(os.path.join(d, f), depth)
        if not ok:
            problem = f"{f}: {why}" + (" (load_state goes on without restoring the random states, silently)"
                                       if RANDOM.match(f) else "")
        elif why:
            unproven = unproven or f"{f}: {why}"
        elif f.endswith(".safetensors") and not unproven:
            unproven = ("safetensors has no checksum: a page zeroed behind an intact header is found only "
                        "by the content check" if depth != "content" else
                        "safetensors has no checksum: no zeroed page found, but other damage cannot be proven")
    return StepObserved(number(os.path.basename(rel)), rel, not problem, problem, mtime, len(files),
                        _size(d, files), "" if problem else unproven)


def _missing(lost: list[str], have: dict[str, str]) -> str:
    if not any(r.startswith("model ") for r in have):
        return "no model.safetensors or pytorch_model.bin: load_state() raises FileNotFoundError"
    for role in lost:
        if role.startswith("model "):
            i = role.split()[1]
            tail = "" if i == "0" else f"_{i}"
            return (f"model{tail}.safetensors and pytorch_model{tail}.bin missing (the checkpoint beside it holds "
                    "one): "
                    "load_state() raises FileNotFoundError")
        if REQUIRED.match(role):
            return f"{role} missing (the checkpoint beside it holds it): load_state() raises FileNotFoundError"
        if CUSTOM.match(role):
            return (f"{role} missing (the checkpoint beside it holds it): load_state() raises RuntimeError "
                    "(the number of custom checkpoints does not match the registered objects)")
        if RANDOM.match(role):
            return f"{role} missing: load_state() goes on without restoring the random states, silently"
        return f"{role} missing: load_state() goes on without restoring that dataloader's state, silently"
    return ""
