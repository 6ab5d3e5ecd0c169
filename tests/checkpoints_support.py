"""Running the real frameworks (tests/ckpt_frameworks.py under the torch interpreter) and
reconcile on their run directories, for tests/test_checkpoints_*.py."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from cli_support import reconcile_json
from torch_support import torch_python

SCRIPT = str(Path(__file__).with_name("ckpt_frameworks.py"))
MODULES = {"hf-trainer": "transformers", "lightning": "lightning", "deepspeed": "deepspeed",
           "dcp": "torch.distributed.checkpoint", "accelerate": "accelerate", "diffusers": "diffusers",
           "litgpt": "litgpt.model", "fabric": "lightning.fabric", "orbax": "orbax.checkpoint"}
QUARANTINE = ".reconcile-quarantine"


@functools.cache
def _has(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=300).returncode == 0


def framework_python(layout: str) -> str:
    python = torch_python()
    if python is None or not _has(python, MODULES[layout]):
        pytest.skip(f"no {MODULES[layout]} in the torch interpreter (.ci/run installs it into .venv-torch; "
                    "see tests/torch_support.py)")
    return python


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def train(python: str, layout: str, out: Path, steps: int, every: int, result: Path, resume: bool = False,
          zero_stage: int = 0, total_limit: int | None = None):
    """One run of the framework; (returncode, result dict or None, stderr tail). `zero_stage`:
    DeepSpeed's ZeRO stage (1: the optimizer state in zero_pp_rank_*_optim_states.pt);
    `total_limit`: Accelerate's ProjectConfiguration.total_limit."""
    env = {**os.environ, "MASTER_PORT": _port(), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONHASHSEED": "0", "TMPDIR": str(result.parent), "CKPT_ZERO_STAGE": str(zero_stage),
           "CKPT_TOTAL_LIMIT": str(total_limit or "")}
    # DeepSpeed JIT-builds its shm op (torch.utils.cpp_extension) into one folder per Python version;
    # two checkouts' interpreters (other include paths) would rebuild it in turn, each holding its
    # lock file meanwhile: one folder per interpreter path instead.
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(
        os.path.expanduser("~/.cache/torch_extensions"), "by-python-" + hashlib.sha1(python.encode()).hexdigest()[:12]))
    argv = [python, SCRIPT, layout, str(out), str(steps), str(every), str(result)] + (["resume"] if resume else [])
    result.unlink(missing_ok=True)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    got = json.loads(result.read_text()) if proc.returncode == 0 and result.exists() else None
    return proc.returncode, got, proc.stderr[-3000:]


def raised(err: str) -> tuple[str, str]:
    """The exception a framework's run ended with, from its traceback: (type, message)."""
    for line in reversed(err.strip().splitlines()):
        line = re.sub(r"^\[rank\d+\]:\s*", "", line)  # torch.distributed's prefix of a rank's stderr
        head, sep, text = line.partition(": ")
        name = head.rsplit(".", 1)[-1]
        if name.isidentifier() and name.endswith(("Error", "Exception")):
            return name, text if sep else ""
    return "", ""


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True, copy_function=shutil.copy2)  # mtimes kept (Lightning's rule)
    return dst


def state(tmp: Path, name: str, run: Path, **extra) -> Path:
    lines = ["version: 1", "checkpoints:", f"  {name}:", f"    dir: {run}"]
    lines += [f"    {k}: {v}" for k, v in extra.items()]
    path = tmp / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def observed(tmp: Path, state_file: Path) -> dict:
    """`reconcile diff -v --format json`: the one resource's report entry."""
    code, doc, stderr = reconcile_json(tmp, "diff", "-v", str(state_file), timeout=300)
    assert code in (0, 2), stderr
    (res,) = doc["resources"]
    return res


def apply(tmp: Path, state_file: Path) -> dict:
    """`reconcile apply --format json` with its journal in TMP: the one resource's report entry."""
    code, doc, stderr = reconcile_json(tmp, "apply", str(state_file), timeout=300)
    assert code == 0, (doc, stderr)
    (res,) = doc["resources"]
    return res


def inventory(run: Path) -> dict[str, int]:
    """Every file below the run directory, by its path with a quarantine's prefix taken off
    (.reconcile-quarantine/STAMP/X counts as X): name -> set of sizes seen."""
    out: dict[str, set[int]] = {}
    for p in run.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            continue
        rel = p.relative_to(run).parts
        if rel[0] == QUARANTINE:
            if rel[-1] == "manifest.json" and len(rel) == 3:
                continue
            rel = rel[2:]
        out.setdefault("/".join(rel), set()).add(p.lstat().st_size)
    return out


def nothing_lost(before: dict, after: dict) -> None:
    for name, sizes in before.items():
        assert name in after and sizes <= after[name], f"{name} {sizes} lost (after: {after.get(name)})"
