#!/usr/bin/env python3
"""Time the extraction observe step on SpecForge-sized trees (not run in CI).

Generates N small sample files (default 37,312, the story's extraction; --million adds
1,000,000) in SpecForge's layout `rows_{g}-{g+2000}/data_{i}.ckpt` in a temporary
directory, then times ExtractionsReconciler.observe with each `verify` mode: the cold
run (no earlier check recorded: `recent` checks every file once) and warm runs (only new
and recent files). Prints the median of --runs runs per row. Each file is a real
torch.save-layout ZIP (~0.5 KiB), so the integrity checks do their real work.

    python bench/bench_scan.py [--runs 5] [--million] [--dir /path/on/the/disk/to/measure]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fake_extract import ckpt_bytes  # noqa: E402
from reconcile_host.local.host import LocalHost  # noqa: E402
from reconcile_host.reconcilers.extractions import ExtractionsReconciler  # noqa: E402
from reconcile_host.reconcilers.extractions.listing import scan  # noqa: E402

from common import median_time as timed  # noqa: E402


def generate(root: Path, n: int, group: int = 2000) -> None:
    for g in range(0, n, group):
        d = root / f"rows_{g}-{g + group}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(g, min(n, g + group)):
            (d / f"data_{i}.ckpt").write_bytes(ckpt_bytes(f"data_{i}", i, 64))
    # Recent files: the last ones written, as on a running job.
    now = time.time()
    for i in range(max(0, n - 2000), n):
        g = i // group * group
        os.utime(root / f"rows_{g}-{g + group}" / f"data_{i}.ckpt", (now - (n - i), now - (n - i)))
    old = now - 86400
    for i in range(0, max(0, n - 2000)):
        g = i // group * group
        os.utime(root / f"rows_{g}-{g + group}" / f"data_{i}.ckpt", (old, old))


def bench(n: int, runs: int, base: str | None) -> list[tuple[str, int, float]]:
    work = Path(tempfile.mkdtemp(prefix="bench-extract-", dir=base))
    state = Path(tempfile.mkdtemp(prefix="bench-state-"))
    os.environ["RECONCILE_STATE_DIR"] = str(state)
    rows = []
    try:
        t0 = time.perf_counter()
        generate(work / "hs", n)
        print(f"generated {n:,} files in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        rec, host = ExtractionsReconciler(), LocalHost()
        rows.append(("scan names only (os.scandir)", n,
                     timed(lambda: scan(str(work / "hs"), "rows_{group}/data_{index}.ckpt", n), runs)))
        for verify in ("none", "at-risk", "content"):
            (r,) = rec.resources({"b": {"dir": str(work / "hs"), "total": n, "verify": verify}})

            def cold(r=r):
                shutil.rmtree(state / "extractions", ignore_errors=True)
                obs = rec.observe(host, [r])[r.id]
                assert obs.done == n, obs

            rows.append((f"observe verify={verify}, cold (no earlier check)", n, timed(cold, runs)))
            rec.observe(host, [r])
            rows.append((f"observe verify={verify}, warm", n, timed(lambda r=r: rec.observe(host, [r]), runs)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--files", type=int, default=37312)
    ap.add_argument("--million", action="store_true", help="also 1,000,000 files (several GiB of inodes)")
    ap.add_argument("--dir", help="where to generate the files (default: the system temp dir)")
    a = ap.parse_args()
    sizes = [a.files] + ([1_000_000] if a.million else [])
    print(f"{'step':<48} {'files':>10} {'median s':>10}")
    for n in sizes:
        for step, count, secs in bench(n, a.runs, a.dir):
            print(f"{step:<48} {count:>10,} {secs:>10.3f}")


if __name__ == "__main__":
    main()
