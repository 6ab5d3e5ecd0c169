#!/usr/bin/env python3
"""The first check of a real extraction: 37,312 samples written by torch 2.13's own
torch.save, each against its floor in the same run, interleaved, medians.

The tree: SpecForge's sample (bench/torch_tree.py: input_ids, loss_mask, aux_hidden_state,
hidden_state; about 6.8 KB, 10 ZIP entries), in SpecForge's layout, written once with the torch
interpreter of tests/torch_support.py into --dir (default /var/tmp/reconcile-bench; kept between
runs) and dated as a job writing --rate samples a second leaves them (`verify: at-risk` reads the
last 5 minutes of them whole on a first check). `--wide`: also the 10-tensor sample (16 entries).

1. In-process, one core, on a copy of the tree on tmpfs: `check_path` per file at the structure
   and at the content depth, beside the floor: open + read + close of the same files (through the
   same directory fds). CPU time of the thread and wall, µs a file, medians of --runs rounds
   (floor and check alternating). And the structure over the whole tree on the workers
   (pool.map_forked, every CPU, and one), wall per file.
2. `reconcile diff` with no record (the first check: every structure, the recent files whole),
   in a fresh process, caches dropped before each run (`sync; echo 3 > /proc/sys/vm/drop_caches`,
   as root; otherwise said) and again with the page cache warm, with the check on every CPU and
   in the observer alone (RECONCILE_CHECK_WORKERS=1); beside `find DIR -type f | wc -l` and
   `find DIR -type f -exec cat {} + > /dev/null` under the same conditions. Round-robin.

    python bench/bench_firstcheck.py [--quick] [--runs 5] [--cold-runs 3] [--dir D] [--wide]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, log

N = 37_312
PATTERN = "rows_{group}/data_{index}.ckpt"


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} on {os.cpu_count()} CPUs"


def tree(base: Path, kind: str, n: int, rate: float) -> Path:
    """The tree of n torch.save samples (written once), dated as a job writing `rate` a second."""
    root = base / f"{kind}-{n}"
    if not root.is_dir():
        sys.path.insert(0, str(ROOT / "tests"))
        import torch_support

        python = torch_support.torch_python()
        if python is None:
            sys.exit("bench_firstcheck: no torch interpreter (tests/torch_support.py: .venv-torch or "
                     "$RECONCILE_SAMPLE_PYTHON) to write the samples with")
        log(f"writing {n:,} {kind} samples with {python} into {root} (once; about 2 minutes)")
        base.mkdir(parents=True, exist_ok=True)
        subprocess.run([python, str(ROOT / "bench" / "torch_tree.py"), str(root), str(n), kind], check=True)
    end = time.time() - 60
    for i in range(n):
        g = i // 2000 * 2000
        t = end - (n - 1 - i) / rate
        os.utime(root / f"rows_{g}-{g + 2000}" / f"data_{i}.ckpt", (t, t))
    return root


def names(root: Path, n: int) -> list[tuple[str, str]]:
    return [(str(root / f"rows_{i // 2000 * 2000}-{i // 2000 * 2000 + 2000}"), f"data_{i}.ckpt") for i in range(n)]


# --- 1. in-process ------------------------------------------------------------------------

def per_file(files: list[tuple[str, str]], depth: str, runs: int) -> dict:
    from reconcile_host.common.filechecks import integrity

    flags, check_path = integrity.OPEN_FLAGS, integrity.check_path
    dirs = {d: os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in {d for d, _ in files}}
    pairs = [(dirs[d], name) for d, name in files]

    def floor():  # (a 64 KiB read: a 1 MiB one would cost an mmap and munmap of its buffer each time)
        for dfd, name in pairs:
            fd = os.open(name, flags, dir_fd=dfd)
            if len(os.read(fd, 1 << 16)) >= 1 << 16:
                raise AssertionError(f"{name}: not a small sample")
            os.close(fd)

    def check():
        for dfd, name in pairs:
            if not check_path(name, depth, dir_fd=dfd).whole:
                raise AssertionError(f"{name}: not whole")

    def before():  # read_layout alone, as before torchfast.py (the whole file read when <= 8 KiB)
        fast, whole = integrity.check_whole_buffer, integrity.WHOLE_READ
        integrity.check_whole_buffer, integrity.WHOLE_READ = (lambda _buf, _crc32=None: None), 8192
        try:
            check()
        finally:
            integrity.check_whole_buffer, integrity.WHOLE_READ = fast, whole

    cases = (("floor", floor), ("check", check)) + ((("before", before),) if depth == "structure" else ())
    out: dict[str, dict[str, list[float]]] = {name: {"cpu": [], "wall": []} for name, _ in cases}
    try:
        check()  # (warm: the page cache, the fast path's shapes)
        for _ in range(runs):
            for name, fn in cases:
                c0, w0 = time.thread_time(), time.perf_counter()
                fn()
                out[name]["cpu"].append((time.thread_time() - c0) / len(pairs) * 1e6)
                out[name]["wall"].append((time.perf_counter() - w0) / len(pairs) * 1e6)
    finally:
        for fd in dirs.values():
            os.close(fd)
    return {k: {m: statistics.median(v) for m, v in d.items()} | {"runs": d} for k, d in out.items()}


def pooled(root: Path, n: int, runs: int) -> dict:
    """The structure of every file on the workers (tally.Check.indices on pool.map_forked): wall
    µs a file with every CPU and with one, alternating."""
    from reconcile_host.reconcilers.extractions import pool, tally
    from reconcile_host.reconcilers.extractions.listing import list_tree

    listing = list_tree(str(root), PATTERN)
    check = tally.Check(str(root), listing, "structure", set())
    check.check_path  # noqa: B018  (imported before the fork, as tally.run does)
    spans = tally._spans([(0, n - 1)], max(64, min(tally.CHUNK, n // 64)))[::-1]
    cpus = pool.cpus_allowed()
    out: dict[int, list[float]] = {1: [], cpus: []}
    used: dict[int, list[float]] = {1: [], cpus: []}
    for _ in range(runs):
        for w in out:
            r0, c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time(), time.perf_counter()
            parts = pool.map_forked(check.indices, spans, w, lambda k: None, hint=lambda: time.time())
            wall = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = time.process_time() - c0 + (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
            out[w].append(wall / n * 1e6)
            used[w].append(cpu / wall)
            assert sum(p.checked + len(p.held) for p in parts) == n
    return {"cpus": cpus, "tasks": len(spans), **{str(w): statistics.median(v) for w, v in out.items()},
            "cpus_used": {str(w): statistics.median(v) for w, v in used.items()}}


# --- 2. reconcile diff, no record -----------------------------------------------------------

def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True
    except OSError:
        return False


def timed(argv: list[str], env: dict | None = None, shell: bool = False) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, shell=shell)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.stdout.close()
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime, out.decode(errors="replace")


def diffs(root: Path, n: int, runs: int, cold: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-firstcheck-"))
    state = work / "state.json"
    state.write_text(json.dumps({"version": 1, "extractions": {"x": {"dir": str(root), "total": n}}}))
    cpus = len(os.sched_getaffinity(0))
    cases = {
        "find DIR -type f | wc -l": (f"find {root} -type f | wc -l", None, True),
        "find DIR -type f -exec cat {} + > /dev/null": (f"find {root} -type f -exec cat {{}} + > /dev/null", None,
                                                       True),
        f"reconcile diff, {cpus} workers": ([sys.executable, "-m", "reconcile_host", "diff", str(state), "--format",
                                            "json"], {}, False),
        "reconcile diff, the observer alone (RECONCILE_CHECK_WORKERS=1)": (
            [sys.executable, "-m", "reconcile_host", "diff", str(state), "--format", "json"],
            {"RECONCILE_CHECK_WORKERS": "1"}, False),
    }
    out: dict[str, dict] = {k: {"wall": [], "cpu": []} for k in cases}
    dropped = True
    try:
        for _ in range(runs):
            for name, (argv, extra, shell) in cases.items():
                env = None
                if extra is not None:
                    env = {k: v for k, v in os.environ.items() if k != "RECONCILE_CHECK_WORKERS"}
                    env.update(extra, RECONCILE_STATE_DIR=str(work / "state"), RECONCILE_CACHE_DIR=str(work / "cache"))
                    subprocess.run(["rm", "-rf", str(work / "state"), str(work / "cache")], check=True)
                if cold:
                    dropped = drop_caches() and dropped
                wall, cpu, text = timed(argv, env, shell)
                out[name]["wall"].append(wall)
                out[name]["cpu"].append(cpu)
                if extra is not None:
                    obs = json.loads(text)["resources"][0]["observed"]
                    assert obs["checked"] == n, obs
                    out[name]["content_checked"] = obs["content_checked"]
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=True)
    return {"cold": cold, "caches_dropped": cold and dropped,
            **{k: {"wall": statistics.median(v["wall"]), "cpu": statistics.median(v["cpu"]), "runs": v,
                   "content_checked": v.get("content_checked")} for k, v in out.items()}}


# --- the report -----------------------------------------------------------------------------

def run(quick: bool = False, base_dir: str | None = None, runs: int | None = None, cold_runs: int | None = None,
        wide: bool = False, rate: float = 20.0, diff: bool = True,
        warm_only: bool = False) -> tuple[str, list[tuple[bool, str]], dict]:
    runs = runs or (3 if quick else 5)
    cold_runs = cold_runs or (1 if quick else 3)
    base = Path(base_dir or "/var/tmp/reconcile-bench")
    cpu = Path("/proc/cpuinfo").read_text().split("model name")[1].split(":")[1].splitlines()[0].strip()
    results: dict = {"load_start": os.getloadavg(), "machine": f"{os.cpu_count()} CPUs, {cpu}",
                     "python": sys.version.split()[0]}
    text = ["## The first check of a real extraction", ""]
    targets: list[tuple[bool, str]] = []
    kinds = ["specforge"] + (["wide"] if wide else [])
    rows = []
    shm = Path(tempfile.mkdtemp(prefix="bench-firstcheck-", dir="/dev/shm" if fs_of(Path("/dev/shm")) == "tmpfs"
                                else None))
    for kind in kinds:
        # In-process: a copy on tmpfs, which no other process's drop_caches can evict mid-run.
        root = shm / kind
        shutil.copytree(tree(base, kind, N, rate), root)
        files = names(root, N)
        size = sum(os.stat(os.path.join(d, f)).st_size for d, f in files[:2000]) / 2000
        log(f"firstcheck: {kind}, structure per file ({load()})")
        s = per_file(files, "structure", runs)
        log(f"firstcheck: {kind}, content per file ({load()})")
        c = per_file(files[-4000:], "content", runs)
        results[kind] = {"bytes": size, "structure": s, "content": c}
        rows.append((kind, size, s, c))
    text += [f"In-process, one core, µs a file (CPU time of the thread / wall), on tmpfs, medians of {runs} rounds, "
             f"floor and check alternating; structure on all {N:,} files, content on the newest 4,000 ({load()}):", "",
             "| sample | bytes | floor: open + read + close | structure | ÷ floor (CPU) | before (read_layout alone) "
             "| ÷ floor | floor | content | ÷ floor (CPU) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, size, s, c in rows:
        label = "SpecForge's, 10 entries" if kind == "specforge" else "10 tensors, 16 entries"
        text.append(f"| {label} | {size:,.0f} | {s['floor']['cpu']:.1f} / {s['floor']['wall']:.1f} "
                    f"| **{s['check']['cpu']:.1f}** / {s['check']['wall']:.1f} "
                    f"| **{s['check']['cpu'] / s['floor']['cpu']:.1f}×** "
                    f"| {s['before']['cpu']:.1f} / {s['before']['wall']:.1f} "
                    f"| {s['before']['cpu'] / s['floor']['cpu']:.1f}× "
                    f"| {c['floor']['cpu']:.1f} / {c['floor']['wall']:.1f} "
                    f"| {c['check']['cpu']:.1f} / {c['check']['wall']:.1f} "
                    f"| {c['check']['cpu'] / c['floor']['cpu']:.1f}× |")
    s = results["specforge"]["structure"]
    ratio = s["check"]["cpu"] / s["floor"]["cpu"]
    targets.append((ratio <= 3.0, f"structure check of torch 2.13's own samples ≤ 3× open+read+close, one core: "
                                  f"{ratio:.1f}× ({s['check']['cpu']:.1f} µs against {s['floor']['cpu']:.1f} µs CPU)"))
    log(f"firstcheck: the workers ({load()})")
    p = results["pool"] = pooled(shm / "specforge", N, runs)
    shutil.rmtree(shm)
    root = base / f"specforge-{N}"
    one, every = p["1"], p[str(p["cpus"])]
    text += ["", f"The structure of all {N:,} files on the workers (pool.map_forked, {p['tasks']} tasks), wall µs a "
             f"file, medians of {runs} ({load()}):", "",
             "| workers | wall µs a file | CPUs used (CPU s ÷ wall s) | speedup | ÷ the floor's wall |",
             "|---|---:|---:|---:|---:|",
             f"| 1 (in this process) | {one:.1f} | {p['cpus_used']['1']:.2f} | 1.00× "
             f"| {one / s['floor']['wall']:.1f}× |",
             f"| {p['cpus']} | {every:.1f} | {p['cpus_used'][str(p['cpus'])]:.2f} | {one / every:.2f}× "
             f"| {every / s['floor']['wall']:.1f}× |"]
    for cold in ((False,) if warm_only else (True, False)) if diff else ():
        log(f"firstcheck: reconcile diff, {'caches dropped' if cold else 'warm'} ({load()})")
        d = results["diff_cold" if cold else "diff_warm"] = diffs(root, N, cold_runs, cold)
        if cold and not d["caches_dropped"]:
            text += ["", "(caches could NOT be dropped: not root; the 'cold' rows are warm)"]
        find = d["find DIR -type f | wc -l"]["wall"]
        cat = d["find DIR -type f -exec cat {} + > /dev/null"]["wall"]
        text += ["", f"`reconcile diff` with no record (`verify: at-risk`: every structure, the last 5 minutes "
                 f"({rate:g} samples/s) read whole), {N:,} files on {fs_of(root)}, "
                 f"{'caches dropped before each run' if cold else 'page cache warm'}, medians of {cold_runs} "
                 f"({load()}):", "",
                 "| | wall s | CPU s | ÷ find \\| wc -l | ÷ find -exec cat |", "|---|---:|---:|---:|---:|"]
        for name, r in d.items():
            if not isinstance(r, dict):
                continue
            text.append(f"| {name} | {r['wall']:.2f} | {r['cpu']:.2f} | {r['wall'] / find:.1f}× "
                        f"| {r['wall'] / cat:.2f}× |")
        content = next(r["content_checked"] for r in d.values() if isinstance(r, dict) and r.get("content_checked"))
        text.append(f"\n(read whole: {content:,} files)")
        if not cold:
            # The whole command a file against the in-process floor (open + read + close) of the
            # same run: what a user waits for, against the least any checker pays.
            for name, r in d.items():
                if isinstance(r, dict) and name.startswith("reconcile diff"):
                    per = r["wall"] / N * 1e6
                    text.append(f"- {name}: {per:.1f} µs a file, {per / s['floor']['wall']:.1f}× the floor's "
                                f"{s['floor']['wall']:.1f} µs (wall)")
                    if "workers" in name:
                        targets.append((per <= 3.5 * s["floor"]["wall"],
                                        f"whole `reconcile diff`, warm, no record ≤ 3.5× open+read+close: "
                                        f"{per / s['floor']['wall']:.1f}× ({per:.1f} µs against "
                                        f"{s['floor']['wall']:.1f} µs a file)"))
    results["load_end"] = os.getloadavg()
    text += ["", f"Machine: {results['machine']}, Python {results['python']}; load average at the start "
             f"{results['load_start'][0]:.1f}, at the end {results['load_end'][0]:.1f}."]
    return "\n".join(text) + "\n", targets, results


def fs_of(path: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds, 1 cold run")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--cold-runs", type=int)
    ap.add_argument("--dir", help="where the trees are written and kept (default /var/tmp/reconcile-bench)")
    ap.add_argument("--wide", action="store_true", help="also the 10-tensor sample (16 ZIP entries)")
    ap.add_argument("--rate", type=float, default=20.0, help="samples a second the job wrote (default 20)")
    ap.add_argument("--no-diff", action="store_true", help="the in-process parts only")
    ap.add_argument("--warm-only", action="store_true",
                    help="no run with caches dropped (drop_caches empties every process's page cache: not on a "
                         "shared machine)")
    a = ap.parse_args()
    text, targets, results = run(a.quick, a.dir, a.runs, a.cold_runs, a.wide, a.rate, not a.no_diff, a.warm_only)
    print(text)
    for ok, t in targets:
        print(f"- {'PASS' if ok else 'FAIL'}: {t}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "firstcheck.json").write_text(json.dumps({"results": results, "targets": targets}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
