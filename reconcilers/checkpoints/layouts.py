"""Each framework's checkpoint layout: which steps are present, what its loader reads of each
(and whether that is whole), and which one its own resume rule picks. Imported only in the
observer child (it imports the extraction kind's file checks); no framework is imported.

The resume rules, read from upstream (docs/checkpoints.md quotes them):
- hf-trainer: transformers `trainer_utils.get_last_checkpoint`: the highest N of the
  directories named `^checkpoint-(\\d+)$` (os.listdir + isdir), nothing checked;
- lightning: `_CheckpointConnector._parse_ckpt_path(ckpt_path="last")`: of
  `ModelCheckpoint._find_last_checkpoints` (the `.ckpt` files in dirpath whose stem matches
  `^last(-(\\d+))?`, a prefix match) the one with the newest modification time;
- deepspeed: `DeepSpeedEngine.load_checkpoint(tag=None)`: the text of `<dir>/latest`, stripped
  (no file: a warning, nothing loaded; a tag without a model states file: AssertionError);
- dcp: torch.distributed.checkpoint has no rule of its own; torchtitan's
  `CheckpointManager._find_load_step`: the highest N of the `step-N` directories holding a
  `.metadata` file;
- megatron: `checkpointing.read_metadata`: `latest_checkpointed_iteration.txt` holds an
  iteration (or `release`), loaded from `iter_{:07d}` (no tracker: starts from scratch).
"""

from __future__ import annotations

import json
import os
import pickletools
import re
import zipfile
import zlib
from collections.abc import Callable
from stat import S_ISLNK

from ...common.filechecks.integrity import CONTENT, STRUCTURE, check_path
from ...common.filechecks.torchzip import check_torch_zip
from ...common.quarantine import QUARANTINE
from ...common.usertree import JSON_LIMIT, Tree, UnsafeTree, open_file, read_in
from .observed import StepObserved
from .treefiles import zip_crcs

HF_DIR = re.compile(r"^checkpoint-(\d+)$")  # transformers trainer_utils._re_checkpoint
LAST_STEM = re.compile(r"^last(-(\d+))?")  # lightning ModelCheckpoint._find_last_checkpoints
STEP_IN_NAME = re.compile(r"step=(\d+)")  # Lightning's default filename "{epoch}-{step}"
DS_TAG = re.compile(r"(\d+)$")  # DeepSpeed's default tag "global_step{N}"
DS_MODEL = re.compile(r".*model_states\.pt$")
# What DeepSpeedEngine._load_checkpoint does when the tag holds no model states file: its glob
# (_get_all_ckpt_names) finds nothing and state_dict_factory SDLoaderBase.check_ckpt_list asserts
# `len(self.ckpt_list) > 0` (0.19.8). Not a warning: the load raises.
DS_NO_MODEL = ("DeepSpeed's load_checkpoint raises AssertionError (SDLoaderBase.check_ckpt_list: no "
               "*model_states.pt to load)")
DS_ZERO = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
DCP_DIR = re.compile(r"step-(\d+)")  # torchtitan checkpoint.py _find_load_step: re.search, anywhere in the name
MEGATRON_DIR = re.compile(r"^iter_(\d{7,})$")  # megatron checkpointing.get_checkpoint_name
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"  # checkpointing.get_checkpoint_tracker_filename
ACC_FOLDER = "checkpoints"  # accelerate Accelerator.save_state: os.path.join(self.project_dir, "checkpoints")
ACC_DIR = re.compile(r"^checkpoint_(\d+)$")  # save_state: f"checkpoint_{self.save_iteration}"
# Files a checkpoint of some framework is made of (what a declared layout that sees nothing reports).
SHAPED = (".safetensors", ".ckpt", ".distcp", ".pt", ".pth", ".bin", ".metadata")
# Files an interrupted write leaves: huggingface_hub/safetensors temp names, torch DCP's
# `.metadata.tmp` (FileSystemWriter writes it, fsyncs, renames), editors' and rsync's.
# DCP's .metadata (a pickle of the plan): a few MiB for thousands of tensors; read whole, so bounded.
METADATA_LIMIT = 256 << 20
TEMP_NAME = re.compile(r"(^\.?tmp|\.tmp[^/]*$|~$)")

Check = Callable[[str, str], tuple[bool, str]]  # (path, depth) -> (whole, reason)


def file_check(path: str, depth: str) -> tuple[bool, str]:
    """(whole, reason or what could not be proven). A torch.save archive whose pickle holds
    globals torch.load(weights_only=True) refuses (numpy in rng_state.pth, DeepSpeed's and
    Lightning's own objects: their loaders allow them or load with weights_only=False) is not
    damaged for that: its structure is checked, and at the content depth every entry's CRC-32
    (zipfile.testzip), the pickle not walked."""
    v = check_path(path, depth)
    if v.state == "gone":
        return False, "missing"
    if not v.whole and depth == CONTENT and "torch.load(weights_only=True)" in v.reason:
        s = check_path(path, STRUCTURE)
        if not s.whole:
            return False, s.reason or s.state
        try:
            fd = open_file(path)  # no link followed
        except OSError as exc:
            return False, f"{type(exc).__name__}: {exc}"[:200]
        return zip_crcs(fd)
    if not v.whole:
        return False, v.reason or v.state
    if v.no_crc:
        return True, "written without CRCs: its bytes cannot be proven"
    return True, ""


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (NotADirectoryError, FileNotFoundError):
        return []


def shaped_files(root: str, names: list[str], most: int = 64) -> list[str]:
    """Checkpoint-shaped files (SHAPED) at the top of ROOT and one folder down, at most MOST
    folders looked into: relative paths, sorted."""
    out = [n for n in names if n.endswith(SHAPED)]
    for n in [n for n in names if os.path.isdir(os.path.join(root, n))][:most]:
        out += [f"{n}/{f}" for f in _listdir(os.path.join(root, n)) if f.endswith(SHAPED)]
    return sorted(out)


def _mtime_of(root: str, names: list[str]) -> float:
    out = 0.0
    for n in names:
        try:
            out = max(out, os.lstat(os.path.join(root, n)).st_mtime)
        except FileNotFoundError:
            continue
    return out


def _temp_leftover(names: list[str]) -> str:
    for n in sorted(names):
        if TEMP_NAME.search(n):
            return f"{n}: a temporary file left by an interrupted write"
    return ""


def _size(root: str, names: list[str]) -> int:
    total = 0
    for n in names:
        try:
            total += os.stat(os.path.join(root, n)).st_size
        except OSError:
            continue
    return total


# --- Hugging Face Trainer ------------------------------------------------------------------

def hf_steps(root: str, names: list[str], depth_of: Callable[[str], str], model_only: bool) -> list[StepObserved]:
    out = []
    for n in names:
        m = HF_DIR.match(n)
        if m and os.path.isdir(os.path.join(root, n)):
            out.append(hf_step(root, n, int(m.group(1)), depth_of(n), model_only))
    return out


def hf_step(root: str, name: str, step: int, depth: str, model_only: bool) -> StepObserved:
    """What `Trainer.train(resume_from_checkpoint=...)` reads: `_load_from_checkpoint` (the
    weights: model.safetensors, else pytorch_model.bin, else every shard an index names),
    `TrainerState.load_from_json(trainer_state.json)` (the step it continues from),
    `_load_optimizer_and_scheduler` (only when optimizer.pt AND scheduler.pt exist: one
    without the other silently drops both), `_load_rng_state` (rng_state*.pth when present)."""
    d = os.path.join(root, name)
    files = os.listdir(d)
    mtime = max(_mtime_of(d, files), os.lstat(d).st_mtime)
    base = {"step": step, "path": name, "mtime": mtime, "files": len(files), "size": _size(d, files)}
    problem = _temp_leftover(files)
    unproven = ""
    weights: list[str] = []
    fs = set(files)
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json"),
                          ("adapter_model.safetensors", ""), ("adapter_model.bin", "")):
        if single in fs:
            weights = [single]
            break
        if index and index in fs:
            try:
                weights = sorted(set(json.loads(read_in(d, index, JSON_LIMIT))["weight_map"].values()))
            except UnsafeTree as exc:
                problem = problem or str(exc)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                problem = problem or f"{index}: does not parse ({type(exc).__name__})"
            if not weights and not problem:
                problem = f"{index}: names no shard"
            break
    else:
        problem = problem or "no weights file (transformers raises \"Can't find a valid checkpoint\")"
    needed = list(weights)
    opt = "optimizer.pt" if "optimizer.pt" in fs else ("optimizer.bin" if "optimizer.bin" in fs else None)
    if not model_only or opt or "scheduler.pt" in fs:
        if opt is None or "scheduler.pt" not in fs:
            missing = "optimizer.pt" if opt is None else "scheduler.pt"
            problem = problem or (f"{missing} missing: the Trainer then loads neither optimizer nor "
                                  "scheduler and goes on with a fresh one")
        else:
            needed += [opt, "scheduler.pt"]
    needed += sorted(n for n in files if re.fullmatch(r"rng_state(_\d+)?\.pth|scaler\.pt", n))
    if not problem:
        problem = _trainer_state(d, step)
    for f in needed:
        if problem:
            break
        ok, why = file_check(os.path.join(d, f), depth)
        if not ok:
            problem = f"{f}: {why}"
        elif why:
            unproven = unproven or f"{f}: {why}"
        if f.endswith(".safetensors") and ok and not unproven:
            unproven = ("safetensors has no checksum: a page zeroed behind an intact header is found only "
                        "by the content check" if depth != CONTENT else
                        "safetensors has no checksum: no zeroed page found, but other damage cannot be proven")
    return StepObserved(**base, whole=not problem, reason=problem, unproven=unproven if not problem else "")


def _trainer_state(d: str, step: int) -> str:
    try:
        state = json.loads(read_in(d, "trainer_state.json", JSON_LIMIT))
    except FileNotFoundError:
        return "trainer_state.json missing: the Trainer would restart at step 0 with these weights"
    except UnsafeTree as exc:
        return str(exc)
    except ValueError as exc:
        return f"trainer_state.json: does not parse ({exc})"
    got = state.get("global_step") if isinstance(state, dict) else None
    if got != step:
        return f"trainer_state.json: global_step is {got!r}, not {step}"
    return ""


def hf_resume(names: list[str], root: str) -> tuple[str | None, str]:
    """transformers trainer_utils.get_last_checkpoint."""
    dirs = [n for n in names if HF_DIR.match(n) and os.path.isdir(os.path.join(root, n))]
    if not dirs:
        return None, ""
    return max(dirs, key=lambda n: int(HF_DIR.match(n).group(1))), ""  # type: ignore[union-attr]


# --- DeepSpeed -------------------------------------------------------------------------------

def ds_steps(root: str, names: list[str], depth_of: Callable[[str], str],
             ranks: int | None = None) -> list[StepObserved]:
    """Each tag directory: every `*model_states.pt` and ZeRO `*optim_states.pt` it holds must
    be whole (engine._load_checkpoint, _load_zero_checkpoint), and it must hold the ZeRO
    ranks the run's other steps hold (a rank's file missing: its optimizer shard is lost)."""
    tags = []
    for n in names:
        p = os.path.join(root, n)
        if n != QUARANTINE and os.path.isdir(p):
            files = os.listdir(p)
            if any(DS_MODEL.match(f) or DS_ZERO.match(f) for f in files) or n.startswith("global_step"):
                tags.append((n, files))
    if ranks is None:
        ranks = zero_ranks(tags)
    out = []
    for n, files in tags:
        d = os.path.join(root, n)
        m = DS_TAG.search(n)
        depth = depth_of(n)
        problem = _temp_leftover(files)
        zero = sorted(f for f in files if DS_ZERO.match(f))
        model = sorted(f for f in files if DS_MODEL.match(f))
        if not problem and not model:
            problem = f"no *model_states.pt: {DS_NO_MODEL}"
        have = {DS_ZERO.match(f).group(2) for f in zero}  # type: ignore[union-attr]
        if not problem and len(have) < ranks:
            lost = sorted(set(map(str, range(ranks))) - have, key=int)
            problem = f"ZeRO optimizer file of rank {', '.join(lost)} missing (other steps hold {ranks} ranks)"
        for f in model + zero:
            if problem:
                break
            ok, why = file_check(os.path.join(d, f), depth)
            if not ok:
                problem = f"{f}: {why}"
        mtime = max(_mtime_of(d, files), os.lstat(d).st_mtime)
        out.append(StepObserved(int(m.group(1)) if m else None, n, not problem, problem, mtime, len(files),
                                _size(d, files)))
    return out


def zero_ranks(tags: list[tuple[str, list[str]]]) -> int:
    return max((len({m.group(2) for f in fs if (m := DS_ZERO.match(f))}) for _, fs in tags), default=0)


def read_pointer(root: str, name: str) -> str | None:
    """A pointer file (DeepSpeed's `latest`, Megatron's tracker), read as its framework reads it but
    only if it is a regular file of at most 4 KiB under ROOT, reached with no link followed
    (common/usertree.py); anything else is refused (UnsafeTree), never followed or read to its end."""
    try:
        with Tree.open(root) as t:
            return t.read_pointer(name)
    except FileNotFoundError:
        return None
    except UnsafeTree as exc:
        if exc.what.startswith("a directory"):
            return ""
        raise


def ds_resume(root: str) -> tuple[str | None, str, str | None]:
    """engine.load_checkpoint(tag=None): `latest` read and stripped; (pick, problem, text)."""
    text = read_pointer(root, "latest")  # a link or a special file named `latest` is refused, not skipped
    if text is None:
        return None, "", None
    tag = text.strip()
    if not tag:
        here = any(DS_MODEL.match(f) for f in os.listdir(root))
        return "", ("`latest` is empty (a torn write): DeepSpeed loads the model states it finds in the run "
                    "directory itself" if here else "`latest` is empty (a torn write): DeepSpeed looks for the "
                    f"model states in the run directory itself: {DS_NO_MODEL}"), text
    if not os.path.isdir(os.path.join(root, tag)):
        return tag, f"`latest` names {tag!r}, which does not exist: {DS_NO_MODEL}", text
    return tag, "", text


# --- Lightning ----------------------------------------------------------------------------

def pl_steps(root: str, names: list[str], depth_of: Callable[[str], str]) -> list[StepObserved]:
    """Every `.ckpt` in dirpath: one torch.save archive, read whole by torch.load. Its step is
    the `global_step` its pickle holds (what Lightning resumes at), else the `step=N` of its name."""
    out = []
    for n in names:
        p = os.path.join(root, n)
        if not n.endswith(".ckpt") or os.path.isdir(p):
            continue
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        mtime = st.st_mtime
        if S_ISLNK(st.st_mode):
            # Lightning's save_last="link" writes a relative link to a step file beside it: resolved
            # inside dirpath only (common/usertree.py), never followed to whatever a user names.
            try:
                with Tree.open(root) as t:
                    target = t.readlink_inside(n)
                    mtime = t.lstat(target).st_mtime  # fsspec LocalFileSystem.info: the target's mtime
                p = os.path.join(root, target)
            except FileNotFoundError:
                pass  # a dangling link: never Lightning's pick (fs.exists is False); checked below as missing
            except UnsafeTree as exc:
                out.append(StepObserved(None, n, False, str(exc), mtime, 1, st.st_size, "",
                                        bool(LAST_STEM.match(n[:-5])), True))
                continue
        ok, why = file_check(p, depth_of(n))
        step = _global_step(p) if ok else None
        if step is None:
            m = STEP_IN_NAME.search(n)
            step = int(m.group(1)) if m else None
        pointer = bool(LAST_STEM.match(n[:-5]))
        out.append(StepObserved(step, n, ok, "" if ok else why, mtime, 1, st.st_size,
                                why if ok else "", pointer, S_ISLNK(st.st_mode)))
    return out


PICKLE_LIMIT = 64 << 20  # a Lightning checkpoint's data.pkl: keys, hyperparameters, loop state (a few MiB)


def _global_step(path: str) -> int | None:
    """The top-level `global_step` of a Lightning checkpoint's pickle, read with pickletools (no
    object is built, nothing executed): the first BINUNICODE 'global_step' followed by an int."""
    try:
        with os.fdopen(open_file(path), "rb") as fh, zipfile.ZipFile(fh) as z:  # no link followed
            info = next((i for i in z.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"),
                        None)
            if info is None or info.file_size > PICKLE_LIMIT:
                return None  # the step then comes from the file's name
            with z.open(info) as member:
                data = member.read(PICKLE_LIMIT + 1)
            if len(data) > PICKLE_LIMIT:
                return None
        prev = None
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("BINPUT", "LONG_BINPUT", "MEMOIZE"):
                continue  # the key string memoised: still the key
            if prev == "global_step" and isinstance(arg, int) and "INT" in op.name:
                return arg
            prev = arg if isinstance(arg, str) and "UNICODE" in op.name else None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, RuntimeError):
        return None
    return None


def pl_resume(root: str, steps: list[StepObserved]) -> str | None:
    """_CheckpointConnector._parse_ckpt_path("last"): the newest-mtime last*.ckpt (fs.modified:
    fsspec's LocalFileSystem.info(str) stats a symbolic link's target, so a link's time is its
    target's; pl_steps records it so); it must exist (a dangling link is skipped)."""
    cands = [s for s in steps if s.pointer and os.path.exists(os.path.join(root, s.path))]
    if not cands:
        return None
    return max(cands, key=lambda s: s.mtime).path


# --- DCP (torchtitan's rule) and Megatron ---------------------------------------------------

def dcp_step(root: str, name: str, step: int, depth: str) -> StepObserved:
    """torch.distributed.checkpoint FileSystemReader: `.metadata` (written last, temp + fsync +
    rename) names each item's file, offset and length; every `.distcp` it names must be present
    and hold its items. Each item is a torch.save archive (filesystem._write_item): at the
    content depth every item's CRC-32s are checked (dcp.load checks none)."""
    d = os.path.join(root, name)
    files = os.listdir(d)
    mtime = max(_mtime_of(d, files), os.lstat(d).st_mtime)
    problem = ""
    if ".metadata" not in files:
        problem = ".metadata missing: the save never finished" + (
            " (.metadata.tmp left over)" if ".metadata.tmp" in files else "")
    else:
        problem = _dcp_items(d, depth)
    unproven = "" if depth == CONTENT else "items' bytes not read (sizes only)"
    return StepObserved(step, name, not problem, problem, mtime, len(files), _size(d, files),
                        "" if problem else unproven)


def _dcp_items(d: str, depth: str) -> str:
    try:
        data = read_in(d, ".metadata", METADATA_LIMIT)
        flat = _scalars(data)
    except Exception as exc:  # a torn pickle: whatever genops raises
        return f".metadata: does not parse ({type(exc).__name__})"
    items: dict[str, list[tuple[int, int]]] = {}
    for i, v in enumerate(flat):
        if v == "relative_path" and i + 5 < len(flat) and flat[i + 2] == "offset" and flat[i + 4] == "length":
            rel, off, n = flat[i + 1], flat[i + 3], flat[i + 5]
            if isinstance(rel, str) and isinstance(off, int) and isinstance(n, int):
                items.setdefault(rel, []).append((off, n))
    if not items:
        return ".metadata names no item file"
    for rel, spans in sorted(items.items()):
        if os.path.isabs(rel) or ".." in rel.split("/"):
            return f".metadata names {rel!r}, outside the checkpoint"
        path = os.path.join(d, rel)
        try:
            size = os.stat(path, follow_symlinks=False).st_size
        except FileNotFoundError:
            return f"{rel}: missing (named by .metadata)"
        end = max(o + n for o, n in spans)
        if size < end:
            return f"{rel}: {size} bytes, .metadata names items up to byte {end} (truncated)"
        if depth == CONTENT:
            try:
                fh = os.fdopen(open_file(path), "rb")  # no link followed, no FIFO or device opened
            except UnsafeTree as exc:
                return str(exc)
            with fh:
                for off, n in sorted(set(spans)):
                    fh.seek(off)
                    try:  # as torch.load would read it: the extraction kind's torch.save check
                        check_torch_zip(BytesSource(fh.read(n)), True)
                    except Exception as exc:  # ZipDamage, PickleDamage, or damage not foreseen
                        why = str(exc)
                        if "torch.load(weights_only=True)" not in why:  # dcp.load: weights_only=False
                            return f"{rel}: the item at byte {off}: {why}"[:240]
    return ""


class BytesSource:
    """A torchzip Source over bytes in memory (one DCP item)."""

    def __init__(self, data: bytes):
        self.data, self.size = data, len(data)
        self.head, self.tail, self.tail_at = data, data, 0

    def read_at(self, offset: int, n: int) -> bytes:
        return self.data[offset:offset + n]

    def crc_of(self, offset: int, n: int) -> int:
        return zlib.crc32(memoryview(self.data)[offset:offset + n])

    def first_zero_page(self, ranges: list[tuple[int, int]]) -> int | None:
        return None  # an item written without CRCs: not proven (torch writes them by default)


def _scalars(data: bytes) -> list[object]:
    """The strings and ints of a pickle in order, memo references resolved (pickletools only)."""
    memo: dict[int, object] = {}
    out: list[object] = []
    last: object = None
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("BINGET", "LONG_BINGET", "GET"):
            last = memo.get(int(arg))
            out.append(last)
        elif op.name == "MEMOIZE":
            memo[len(memo)] = last
        elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[int(arg)] = last
        elif isinstance(arg, (str, int)) and not isinstance(arg, bool):
            last = arg
            out.append(arg)
        else:
            last = None
    return out


def megatron_step(root: str, name: str, step: int, depth: str) -> StepObserved:
    """checkpointing.get_checkpoint_name: `iter_{:07d}/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt`
    (plus `distrib_optim.pt` with the distributed optimizer); a torch_dist save is DCP inside."""
    d = os.path.join(root, name)
    files = os.listdir(d)
    if ".metadata" in files or any(f.endswith(".distcp") for f in files):
        s = dcp_step(root, name, step, depth)
        return s
    mtime = max(_mtime_of(d, files), os.lstat(d).st_mtime)
    ranks = sorted(f for f in files if f.startswith("mp_rank_") and os.path.isdir(os.path.join(d, f)))
    problem = "" if ranks else "no mp_rank_* directory"
    total = 0
    for r in ranks:
        inner = os.listdir(os.path.join(d, r))
        total += _size(os.path.join(d, r), inner)
        problem = problem or _temp_leftover(inner)
        if not problem and "model_optim_rng.pt" not in inner:
            problem = f"{r}/model_optim_rng.pt missing"
        for f in sorted(x for x in inner if x.endswith(".pt")):
            if problem:
                break
            ok, why = file_check(os.path.join(d, r, f), depth)
            if not ok:
                problem = f"{r}/{f}: {why}"
    return StepObserved(step, name, not problem, problem, mtime, len(files), total)


def megatron_resume(root: str) -> tuple[str | None, str, str | None]:
    """checkpointing.read_metadata: int(text) or 'release'; anything else exits the job."""
    text = read_pointer(root, MEGATRON_TRACKER)
    if text is None:
        return None, "", None
    s = text.strip()
    if s == "release":
        return "release", "", text
    try:
        it = int(s)
    except ValueError:
        return "", f"{MEGATRON_TRACKER} holds {s[:40]!r}: Megatron exits with 'Invalid metadata file'", text
    name = f"iter_{it:07d}"
    if not os.path.isdir(os.path.join(root, name)):
        return name, f"{MEGATRON_TRACKER} names iteration {it}, whose {name} does not exist", text
    return name, "", text


