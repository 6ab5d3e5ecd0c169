"""Which framework wrote a run directory, from files only that framework writes (names alone
never decide): a layout is detected when exactly one framework's own files are there; none, or
more than one, is an error naming what was seen and the layouts it could be. Read through the
tree held by fd (common/usertree.py), at the top of the run directory and one folder down (at
most MOST folders looked into). Imported only in the observer child.

What each framework alone writes (its save code, cited in docs/checkpoints.md#detection):
- hf-trainer: `checkpoint-N/trainer_state.json` (transformers Trainer._save_checkpoint);
- diffusers: `checkpoint-N/` holding Accelerate's save_state files (random_states_0.pkl,
  optimizer.bin, scheduler.bin: accelerate checkpointing.save_accelerator_state) at the top of
  the run directory (the examples' `os.path.join(args.output_dir, f"checkpoint-{global_step}")`);
- accelerate: the same files in `checkpoints/checkpoint_N/` (automatic_checkpoint_naming);
- deepspeed: `*model_states.pt` in a tag folder (DeepSpeedEngine._get_ckpt_name);
- dcp: `.metadata` beside `*.distcp` (torch.distributed.checkpoint FileSystemWriter);
- megatron: `iter_NNNNNNN/mp_rank_*/model_optim_rng.pt`, or a DCP save in `iter_NNNNNNN/` with
  `latest_checkpointed_iteration.txt` beside it (megatron checkpointing.get_checkpoint_name);
- lightning: a `.ckpt` whose pickle holds `pytorch-lightning_version`
  (lightning _CheckpointConnector.dump_checkpoint);
- litgpt: `step-*/lit_model.pth` (litgpt pretrain.fit: `out_dir / f"step-{step:08d}" / "lit_model.pth"`);
- orbax: `_CHECKPOINT_METADATA` in a step folder (orbax checkpoint_manager, step metadata);
- MosaicML Composer (`latest-rank0.pt`, `ep*-ba*-rank*.pt`) and NeMo (`*.nemo`, `*-unfinished`
  markers): seen and named, never checked (no layout of theirs).
Fabric saves whatever the user names: it is never detected, only declared (`pattern:`, `pick:`).
"""

from __future__ import annotations

import os
import re
import zipfile

from ...common.quarantine import QUARANTINE
from ...common.usertree import Tree, UnsafeTree
from .observed import NotCheckable

MOST = 256  # folders looked into, one level down
HF_DIR = re.compile(r"^checkpoint-(\d+)$")
ACC_FILES = re.compile(r"^(?:random_states_\d+\.pkl|(?:optimizer|scheduler)(?:_\d+)?\.bin|custom_checkpoint_\d+\.pkl)$")
ACC_DIR = re.compile(r"^checkpoint_(\d+)$")
MEGATRON_DIR = re.compile(r"^iter_(\d{7,})$")
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
COMPOSER = re.compile(r"^(?:latest-rank\d+\.pt|ep\d+-ba\d+-rank\d+\.pt)$")
ORBAX_TMP = ".orbax-checkpoint-tmp"
UNSUPPORTED = {
    "composer": "MosaicML Composer (it requires torch < 2.7: no layout of its own here)",
    "nemo": "NeMo (no layout of its own here)",
}
LIGHTNING_KEY = b"pytorch-lightning_version"  # _CheckpointConnector.dump_checkpoint's first key


def _sub(tree: Tree, name: str) -> list[str]:
    try:
        return [e.name for e in tree.entries(name)]
    except (OSError, UnsafeTree):
        return []


def lightning_keys(tree: Tree, name: str) -> bool:
    """The pickle of a `.ckpt` (a torch.save ZIP) names Lightning's version key."""
    try:
        fd = tree.open_regular(name)
    except (OSError, UnsafeTree):
        return False
    try:
        with os.fdopen(fd, "rb") as fh, zipfile.ZipFile(fh) as z:
            pkl = next((i for i in z.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"), None)
            if pkl is None or pkl.file_size > 256 << 20:
                return False
            with z.open(pkl) as p:
                return LIGHTNING_KEY in p.read(1 << 20)  # the top-level dict's keys come first
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, RuntimeError):
        return False


def evidence(tree: Tree) -> dict[str, str]:
    """Per layout, one file only it writes (a path relative to the run directory)."""
    entries = sorted((e for e in tree.entries() if e.name != QUARANTINE), key=lambda e: e.name)
    names = {e.name for e in entries}
    found: dict[str, str] = {}
    dirs = [e.name for e in entries if e.kind == "dir"][:MOST]
    for d in dirs:
        inner = _sub(tree, d)
        if HF_DIR.match(d) and "trainer_state.json" in inner:
            found.setdefault("hf-trainer", f"{d}/trainer_state.json")
        if HF_DIR.match(d) and (acc := sorted(f for f in inner if ACC_FILES.match(f))):
            found.setdefault("diffusers", f"{d}/{acc[0]}")
        if d == "checkpoints":
            for c in sorted(inner)[:MOST]:
                if ACC_DIR.match(c) and (acc := sorted(f for f in _sub(tree, f"{d}/{c}") if ACC_FILES.match(f))):
                    found.setdefault("accelerate", f"{d}/{c}/{acc[0]}")
                    break
        if ms := sorted(f for f in inner if f.endswith("model_states.pt")):
            found.setdefault("deepspeed", f"{d}/{ms[0]}")
        if ".metadata" in inner and any(f.endswith(".distcp") for f in inner):
            if MEGATRON_DIR.match(d) and MEGATRON_TRACKER in names:
                found.setdefault("megatron", f"{d}/.metadata")
            else:
                found.setdefault("dcp", f"{d}/.metadata")
        if MEGATRON_DIR.match(d):
            for r in sorted(f for f in inner if f.startswith("mp_rank_")):
                if "model_optim_rng.pt" in _sub(tree, f"{d}/{r}"):
                    found.setdefault("megatron", f"{d}/{r}/model_optim_rng.pt")
                    break
        if d.startswith("step-") and "lit_model.pth" in inner:
            found.setdefault("litgpt", f"{d}/lit_model.pth")
        if "_CHECKPOINT_METADATA" in inner:
            found.setdefault("orbax", f"{d}/_CHECKPOINT_METADATA")
    for e in entries:
        if (e.kind == "file" and COMPOSER.match(e.name)) or (e.kind == "symlink" and e.name.startswith("latest-rank")):
            found.setdefault("composer", e.name)
        if e.name.endswith((".nemo", "-unfinished")):
            found.setdefault("nemo", e.name)
    ckpts = sorted((e for e in entries if e.kind == "file" and e.name.endswith(".ckpt")),
                   key=lambda e: -e.mtime_ns)[:8]  # the newest few: a torn one proves nothing
    for e in ckpts:
        if lightning_keys(tree, e.name):
            found.setdefault("lightning", e.name)
            break
    return found


def could_be(tree: Tree) -> list[str]:
    """The layouts the names alone would allow (what an error names)."""
    out: list[str] = []
    for e in tree.entries():
        n = e.name
        if n == QUARANTINE:
            continue
        if HF_DIR.match(n):
            out += ["hf-trainer", "diffusers"]
        elif n.startswith("checkpoint") and n != "checkpoints":
            out += ["diffusers"]
        if n == "checkpoints" and e.kind == "dir":
            out += ["accelerate"]
        if re.search(r"step-\d+", n) and e.kind == "dir":
            out += ["dcp", "litgpt"]
        if n.endswith(".ckpt"):
            out += ["lightning", "fabric"]
        elif n.endswith((".pt", ".pth")) and e.kind == "file":
            out += ["fabric"]
        if re.fullmatch(r"\d+", n) or ORBAX_TMP in n:
            out += ["orbax"]
        if n in ("latest", "latest_universal") or n.startswith("global_step"):
            out += ["deepspeed"]
        if n == MEGATRON_TRACKER or MEGATRON_DIR.match(n):
            out += ["megatron"]
    return list(dict.fromkeys(out))


def _what(tree: Tree, most: int = 4) -> str:
    names = sorted(e.name + ("/" if e.kind == "dir" else "") for e in tree.entries() if e.name != QUARANTINE)
    return ", ".join(names[:most]) + (f" (+{len(names) - most} more)" if len(names) > most else "")


def declaration(layout: str) -> str:
    """The declaration that works for LAYOUT, in the state file's words."""
    if layout == "fabric":
        return "`layout: fabric` with the job's own `pattern:` and `pick:`"
    return f"`layout: {layout}`"


def detect(tree: Tree) -> str:
    """The one layout whose own files are there, else NotCheckable naming what was seen."""
    found = evidence(tree)
    unsupported = sorted(k for k in found if k in UNSUPPORTED)
    if unsupported:
        k = unsupported[0]
        raise NotCheckable(f"{tree.path}: holds {found[k]}, a checkpoint of {UNSUPPORTED[k]}; reconcile cannot tell "
                           "what its resume would pick or whether it is whole")
    if len(found) == 1:
        return next(iter(found))
    if found:
        said = "; ".join(f"{v} (only layout {k} writes it)" for k, v in sorted(found.items()))
        raise NotCheckable(f"{tree.path}: files of more than one framework: {said}; declare which one the job "
                           f"resumes with ({' or '.join(declaration(k) for k in sorted(found))}), or keep each run "
                           "in its own directory")
    maybe = could_be(tree)
    if not maybe:
        raise NotCheckable(f"{tree.path}: no checkpoint layout recognised: it holds {_what(tree)} (declare `layout:`)")
    raise NotCheckable(f"{tree.path}: no file only one framework writes: it holds {_what(tree)}, which could be "
                       f"layout {' or '.join(maybe)}; declare it ({' or '.join(declaration(k) for k in maybe)})")
