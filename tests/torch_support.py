"""The sample-writer interpreters: Pythons with the real torch (and safetensors), kept apart
from reconcile's own virtual environment, which must never need torch.

- torch 2.x with safetensors: $RECONCILE_SAMPLE_PYTHON, else `.venv-torch/bin/python` in the
  repository (`.ci/run` makes it: `python3 -m venv .venv-torch && .venv-torch/bin/pip install
  torch==2.13.0 safetensors`, the CPU wheel);
- torch 1.13: Debian 12's python3-torch for /usr/bin/python3 (`apt-get install python3-torch`),
  or $RECONCILE_SAMPLE_PYTHON_OLD.

Tests that need one skip without it; under CI (where .ci/run installs both) a skip fails the run.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = str(Path(__file__).with_name("torch_samples.py"))


@functools.cache
def _probe(python: str) -> str | None:
    """torch's version under this interpreter, or None."""
    if not python or not os.access(python, os.X_OK):
        return None
    try:
        proc = subprocess.run([python, "-c", "import torch, sys; sys.stdout.write(torch.__version__)"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def torch_python() -> str | None:
    for p in (os.environ.get("RECONCILE_SAMPLE_PYTHON", ""), str(REPO / ".venv-torch" / "bin" / "python")):
        if p and _probe(p) and _probe(p).split(".")[0] != "1":
            return p
    return None


def old_torch_python() -> str | None:
    for p in (os.environ.get("RECONCILE_SAMPLE_PYTHON_OLD", ""), "/usr/bin/python3"):
        if p and _probe(p) and _probe(p).startswith("1."):
            return p
    return None


def need(python: str | None, what: str) -> str:
    if python is None:
        pytest.skip(f"no {what} to write and load real samples with (see tests/torch_support.py)")
    return python


def has_safetensors(python: str) -> bool:
    return subprocess.run([python, "-c", "import safetensors.torch"], capture_output=True).returncode == 0


def write(python: str, spec: list[dict], tmp: Path) -> str:
    """Write samples (tests/torch_samples.py write); the writer's torch version."""
    path = tmp / f"write-{os.getpid()}-{len(spec)}.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run([python, SCRIPT, "write", str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["torch"]


def same(python: str, spec: list[dict], tmp: Path) -> None:
    """Assert that each file loads, with every loader, as the sample `spec` describes."""
    path = tmp / f"same-{os.getpid()}-{len(spec)}.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run([python, SCRIPT, "same", str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr


def start_judge(python: str, plan: list[dict], tmp: Path, name: str) -> tuple[subprocess.Popen, Path]:
    """Start judging damaged copies with the real loaders (tests/torch_samples.py judge)."""
    src, out = tmp / f"{name}.plan.json", tmp / f"{name}.verdicts.json"
    src.write_text(json.dumps(plan))
    # MALLOC_PERTURB_: glibc fills memory it hands out with a pattern, so a loader that reads
    # nothing into a tensor (an entry flagged as a directory: miniz extracts nothing) shows
    # garbage, not by luck the same tensor freed by the copy judged before.
    env = {**os.environ, "RECONCILE_JUDGE_TMP": str(tmp), "MALLOC_PERTURB_": "165"}
    proc = subprocess.Popen([python, SCRIPT, "judge", str(src), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    return proc, out


def finish_judge(proc: subprocess.Popen, out: Path) -> dict:
    _, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0, err
    return json.loads(out.read_text())


__all__ = ["torch_python", "old_torch_python", "need", "write", "same", "start_judge", "finish_judge", "sys"]
