#!/usr/bin/env python3
"""`reconcile diff` on training run directories (issue 25), beside the floor.

1. A Hugging Face Trainer run of 100 checkpoints (checkpoint-N: model.safetensors of 1 MiB,
   optimizer.pt, scheduler.pt, rng_state.pth as small torch.save-layout ZIPs, trainer_state.json),
   with `verify: structure` and with the default `verify: at-risk` (every byte of the pick too).
2. One checkpoint of a sharded model: 8 safetensors shards of 4 GiB each, sparse (the structural
   check reads the header and the size; the content check would read 32 GiB of zeros, so
   `verify: structure` only), with its model.safetensors.index.json.

Cold: a new process and no validation cache; warm: the validation cache made by the run
before (the page cache is warm in both: dropping it would disturb the machine's other users).
The floor: the same directory listed and, per file the check opens, an open, the header and the
last page read, a close, and the index and trainer_state.json parsed, in one Python process
(no interpreter start-up counted in it: that start-up is printed apart).

    python bench/bench_checkpoints.py [--runs 5] [--dir DIR]

Results are printed as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, clean_env, log, median

sys.path.insert(0, str(ROOT / "tests"))
from fake_extract import ckpt_bytes  # noqa: E402

PAGE = 4096


def _safetensors(path: Path, nbytes: int, sparse: bool) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        if sparse:
            fh.truncate(8 + len(header) + nbytes)
        else:
            fh.write(os.urandom(nbytes))


def make_hf_run(root: Path, n: int) -> None:
    for i in range(1, n + 1):
        step = i * 100
        d = root / f"checkpoint-{step}"
        d.mkdir(parents=True)
        _safetensors(d / "model.safetensors", 1 << 20, sparse=False)
        for name, size in (("optimizer.pt", 4096), ("scheduler.pt", 16), ("rng_state.pth", 64)):
            (d / name).write_bytes(ckpt_bytes(name.split(".")[0], i, size))
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))


def make_sharded(root: Path, shards: int = 8, size: int = 4 << 30) -> None:
    d = root / "checkpoint-1000"
    d.mkdir(parents=True)
    names = [f"model-{k:05d}-of-{shards:05d}.safetensors" for k in range(1, shards + 1)]
    for name in names:
        _safetensors(d / name, size, sparse=True)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": shards * size}, "weight_map": {f"layer{k}.w": n for k, n in enumerate(names)}}))
    for name, nbytes in (("optimizer.pt", 4096), ("scheduler.pt", 16), ("rng_state.pth", 64)):
        (d / name).write_bytes(ckpt_bytes(name.split(".")[0], 0, nbytes))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 1000}))


def floor(root: Path) -> float:
    """One pass of the floor's reads; seconds."""
    t = time.perf_counter()
    for n in os.listdir(root):
        d = root / n
        if not n.startswith("checkpoint-"):
            continue
        files = os.listdir(d)
        for f in files:
            p = d / f
            if f.endswith(".json"):
                json.loads(p.read_bytes())
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                os.pread(fd, PAGE, 0)
                os.pread(fd, PAGE, max(0, size - PAGE))
            finally:
                os.close(fd)
    return time.perf_counter() - t


def reconcile_argv() -> list[str]:
    exe = ROOT / ".venv" / "bin" / "reconcile"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "reconcile_host"]


def run_diff(state: Path, cache: Path) -> float:
    env = {**clean_env(), "RECONCILE_CACHE_DIR": str(cache)}
    t = time.perf_counter()
    proc = subprocess.run(reconcile_argv() + ["diff", str(state)], capture_output=True, text=True, env=env)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"diff exited {proc.returncode}: {proc.stdout[-400:]}{proc.stderr[-400:]}")
    return took


def bench(label: str, root: Path, verify: str, runs: int, tmp: Path) -> str:
    state = tmp / f"state-{label}-{verify}.yaml"
    state.write_text(f"version: 1\ncheckpoints:\n  run:\n    dir: {root}\n    layout: hf-trainer\n"
                     f"    verify: {verify}\n")
    cold, warm = [], []
    for r in range(runs):
        cache = tmp / f"cache-{label}-{verify}-{r}"
        cold.append(run_diff(state, cache))
        warm.append(run_diff(state, cache))
        shutil.rmtree(cache, ignore_errors=True)
    fl = median([floor(root) for _ in range(runs)])
    return (f"| {label} | {verify} | {median(cold) * 1000:.0f} ms | {median(warm) * 1000:.0f} ms | "
            f"{fl * 1000:.1f} ms |")


def startup(runs: int) -> float:
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        ts.append(time.perf_counter() - t)
    return median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to make the run directories (default: a temp dir)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        log("making 100 checkpoints and an 8-shard sparse model")
        make_hf_run(tmp / "hf100", 100)
        make_sharded(tmp / "sharded")
        rows = ["| run directory | verify | diff cold | diff warm | floor (reads in-process) |",
                "|---|---|---|---|---|"]
        rows.append(bench("100 checkpoints (1 MiB model each)", tmp / "hf100", "structure", args.runs, tmp))
        rows.append(bench("100 checkpoints (1 MiB model each)", tmp / "hf100", "at-risk", args.runs, tmp))
        rows.append(bench("8 shards x 4 GiB (sparse)", tmp / "sharded", "structure", args.runs, tmp))
        empty = tmp / "empty.yaml"
        empty.write_text("version: 1\n")
        base = median([run_diff(empty, tmp / "cache-empty") for _ in range(args.runs)])
        rows.append(f"| (a state declaring nothing: the fixed cost) | | | {base * 1000:.0f} ms | |")
        print("\n".join(rows))
        print(f"\nPython start-up (`{sys.executable} -c pass`): {startup(args.runs) * 1000:.0f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
