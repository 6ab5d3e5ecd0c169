"""Helpers for the extraction tests: sample files in SpecForge's layout, state files, the CLI."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

from fake_extract import ckpt_bytes, safetensors_bytes, sample_path

FAKE_EXTRACT = str(Path(__file__).with_name("fake_extract.py"))


def write_sample(out: Path, idx: int, group: int = 10, fmt: str = "ckpt", size: int = 256,
                 cut: int | None = None) -> Path:
    """One sample file; `cut` keeps only that many bytes (a file cut off mid-write)."""
    path = Path(sample_path(str(out), idx, group, fmt))
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        data = safetensors_bytes(idx, size)
    else:
        data = ckpt_bytes(f"data_{idx}", idx, size)
        if fmt == "ckpt.gz":
            data = gzip.compress(data)
    path.write_bytes(data if cut is None else data[:cut])
    return path


def write_samples(out: Path, indices, **kw) -> None:
    for i in indices:
        write_sample(out, i, **kw)


def state_yaml(path: Path, extraction: dict, name: str = "eagle3", units: dict | None = None,
               extra: dict | None = None) -> Path:
    """A state file (JSON is YAML) with one extraction."""
    doc: dict = {"version": 1, "extractions": {name: extraction, **(extra or {})}}
    if units:
        doc["units"] = units
    path.write_text(json.dumps(doc, indent=2))
    return path


def env_for(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["RECONCILE_CACHE_DIR"] = str(tmp / "cache")
    env["RECONCILE_STATE_DIR"] = str(tmp / "state")
    env.pop("RECONCILE_STATE", None)
    return env


def resource(report: dict, rid: str = "extraction:eagle3") -> dict:
    return next(r for r in report["resources"] if r["id"] == rid)


# --- in-process observation, for the check record's tests --------------------------------

def age(path: Path, seconds: float = 3600) -> None:
    """Set a file's or directory's mtime back: a directory this old has a listing that may be kept."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def observe(spec: dict, name: str = "eagle3"):
    """ExtractionsReconciler.observe in this process (RECONCILE_STATE_DIR must be set)."""
    from reconcile_host.local.host import LocalHost
    from reconcile_host.reconcilers.extractions import ExtractionsReconciler

    rec = ExtractionsReconciler()
    (r,) = rec.resources({name: spec})
    obs = rec.observe(LocalHost(), [r])[r.id]
    if isinstance(obs, Exception):
        raise obs
    return obs


def record_path(state: Path, name: str = "eagle3") -> Path:
    return state / "extractions" / f"{name}.check.json"


def read_record(state: Path, name: str = "eagle3") -> dict:
    return json.loads(record_path(state, name).read_text())
