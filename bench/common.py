"""What every part of the benchmark shares: paths, the scenario's sizes, the targets, small helpers."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS = HERE / ".peers"
RECONCILE_VENV = HERE / ".reconcile"
RESULTS = HERE / "results"
VLLM = "vllm-kimi-k25-int4.service"
PEER_PACKAGES = ("ansible-core", "pyinfra", "pytest-testinfra")
SEED_TOTAL = 37_312
GPU_COUNT, GPU_TOTAL_MIB, VLLM_MIB = 8, 97_887, 72_289  # 75.8 GB per GPU, as in the seed
MIN_FREE = "100MiB"
MIN_FREE_BYTES = 100 * 1024 * 1024

# The speed targets (medians, same run); the floor's ratio was tightened from 3 to 2.
TARGET_FLOOR_RATIO = 2.0
TARGET_PYINFRA, TARGET_TESTINFRA, TARGET_ANSIBLE = 4.0, 3.0, 50.0
TARGET_MILLION_S, TARGET_500_UNITS_S = 1.0, 0.3
# The fleet targets (wall time at the largest host count, same run).
TARGET_FLEET_ANSIBLE, TARGET_FLEET_PYINFRA = 3.0, 1.5


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update({"LC_ALL": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", "NO_COLOR": "1"})
    return env


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def median_time(fn, runs: int) -> float:
    """The median wall time of RUNS calls of fn(), in seconds."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def parse_list(text: str) -> list[int]:
    return [int(x.replace("_", "").replace(",", "")) for x in text.split("/") if x.strip()]
