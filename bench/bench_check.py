#!/usr/bin/env python3
"""The cold integrity check near the machine's limit: what it costs per file and
per MB beside the floor of the same reads, how it scales on every CPU, and a million files.

1. Structure, one core: the structural check of small torch.save-layout ZIPs on tmpfs, per
   file (CPU time of this one thread, and wall), beside the floor of the same reads in the same
   run: open + fstat + the very preads the check makes (recorded from the check itself) +
   close. Samples: bench/samples.py's (3 entries, ~0.6 KB), and, when a torch interpreter is
   there (tests/torch_support.py), SpecForge's sample as torch 2.x writes it (10 entries, 132 KB).
2. Content: the content check (every entry's CRC-32) in MB/s beside `cat FILES > /dev/null` of
   the same files, on one core and on every CPU (`xargs -P N cat`), with the CRC-32 of ISA-L /
   zlib-ng when installed (the `fast` extra) and with zlib's.
3. Speedup: a cold observe (`verify: at-risk`, no record) of a tree of small samples with the
   check in the observer (RECONCILE_CHECK_WORKERS=1) and on every CPU.
4. A million files: `reconcile diff` on a 1,000,000-file extraction, cold (no record, no
   validation cache) and warm, with its peak RSS (the largest process of the tree, from wait4)
   and the whole tree's memory high-water mark (a cgroup of its own, when one can be made).

    python bench/bench_check.py [--quick] [--dir /dev/shm] [--million] [--runs 5]

As a part of bench/run.py (`--skip check` leaves it out). Results are printed as Markdown.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, log

sys.path.insert(0, str(ROOT / "tests"))
from samples import generate_files  # noqa: E402

TREE_PATTERN = "rows_{group}/data_{index}.ckpt"


def _imports():
    from reconcile_host.common.filechecks import integrity
    from reconcile_host.reconcilers.extractions import pool, tally
    from reconcile_host.reconcilers.extractions.listing import list_tree

    return integrity, pool, tally, list_tree


def tmpfs_base(given: str | None) -> Path:
    """A directory on tmpfs: --dir, else /dev/shm when it is one, else the temp dir (said)."""
    if given:
        return Path(tempfile.mkdtemp(prefix="bench-check-", dir=given))
    kind = subprocess.run(["stat", "-f", "-c", "%T", "/dev/shm"], capture_output=True, text=True).stdout.strip()
    if kind == "tmpfs":
        return Path(tempfile.mkdtemp(prefix="bench-check-", dir="/dev/shm"))
    log("WARNING: /dev/shm is not a tmpfs; the files go to the temp dir")
    return Path(tempfile.mkdtemp(prefix="bench-check-"))


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} on {os.cpu_count()} CPUs"


# --- 1. structure per file --------------------------------------------------------------

def torch_sample(dest: Path) -> bool:
    """SpecForge's sample (63 tokens, hidden 256, bf16) written by the real torch.save."""
    try:
        import torch_support
    except ImportError:
        return False
    python = torch_support.torch_python()
    if python is None:
        return False
    code = ("import sys, torch; sys.path.insert(0, sys.argv[2]); from torch_samples import record; "
            "torch.save(record(63, 256, 'bf16', 7), sys.argv[1])")
    proc = subprocess.run([python, "-c", code, str(dest), str(ROOT / "tests")], capture_output=True, text=True)
    return proc.returncode == 0


def copies(root: Path, data: bytes, n: int, group: int = 2000) -> None:
    """n distinct files with these bytes, in SpecForge's layout, a day old."""
    old = time.time() - 86400
    for g in range(0, n, group):
        d = root / f"rows_{g}-{g + group}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(g, min(n, g + group)):
            p = d / f"data_{i}.ckpt"
            p.write_bytes(data)
            os.utime(p, (old, old))


def recorded_reads(path: Path) -> list[tuple[int, int]]:
    """The (offset, length) of every pread the structural check makes of this file."""
    integrity, *_ = _imports()
    seen: list[tuple[int, int]] = []
    real = os.pread

    def spy(fd, n, offset):
        seen.append((offset, n))
        return real(fd, n, offset)

    os.pread = spy
    try:
        assert integrity.check_path(str(path)).whole
    finally:
        os.pread = real
    return seen


def per_file(root: Path, n: int, runs: int) -> dict:
    """CPU µs and wall µs per file: the floor, check_path alone, and the observe's own loop."""
    integrity, _, tally, list_tree = _imports()
    listing = list_tree(str(root), TREE_PATTERN)
    reads = recorded_reads(root / "rows_0-2000" / "data_0.ckpt")
    names = [(str(root / f"rows_{i // 2000 * 2000}-{i // 2000 * 2000 + 2000}"), f"data_{i}.ckpt") for i in range(n)]
    flags = integrity.OPEN_FLAGS

    def floor():
        dirs = {}
        for d, name in names:
            fd_dir = dirs.get(d)
            if fd_dir is None:
                fd_dir = dirs[d] = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            fd = os.open(name, flags, dir_fd=fd_dir)
            os.fstat(fd)
            for offset, length in reads:
                os.pread(fd, length, offset)
            os.close(fd)
        for fd in dirs.values():
            os.close(fd)

    def check_path_only():
        dirs = {}
        for d, name in names:
            fd_dir = dirs.get(d)
            if fd_dir is None:
                fd_dir = dirs[d] = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            integrity.check_path(name, "structure", dir_fd=fd_dir)
        for fd in dirs.values():
            os.close(fd)

    check = tally.Check(str(root), listing, "structure", set())

    def observe_loop():
        part = check.indices((0, n - 1), lambda k: None, time.time())
        assert part.checked == n, part

    cases = (("floor", floor), ("check_path", check_path_only), ("observe loop", observe_loop))
    out = {name: {"cpu": [], "wall": []} for name, _ in cases}
    for _ in range(runs):  # round-robin: load changes hit all three alike
        for name, fn in cases:
            c0, w0 = time.thread_time(), time.perf_counter()
            fn()
            out[name]["cpu"].append((time.thread_time() - c0) / n * 1e6)
            out[name]["wall"].append((time.perf_counter() - w0) / n * 1e6)
    return {"reads": reads, "size": (root / "rows_0-2000" / "data_0.ckpt").stat().st_size,
            **{k: {m: statistics.median(v[m]) for m in v} for k, v in out.items()}}


def structure(base: Path, n: int, runs: int) -> tuple[list[str], dict]:
    results = {}
    tiny = base / "tiny"
    generate_files(tiny, n, recent=0)
    results["bench sample (3 entries)"] = per_file(tiny, n, runs)
    shutil.rmtree(tiny)
    real = base / "torch.ckpt"
    if torch_sample(real):
        root = base / "torch"
        copies(root, real.read_bytes(), n)
        results["torch 2.x sample (10 entries)"] = per_file(root, n, runs)
        shutil.rmtree(root)
    lines = [f"Structural check, one core, {n:,} distinct files on tmpfs, medians of {runs} "
             f"(µs per file: CPU time of the thread, and wall; {load()}):", "",
             "| sample | bytes | preads | floor (open+fstat+same preads+close) CPU / wall | check_path CPU / wall "
             "| observe's loop CPU / wall | check ÷ floor |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['size']:,} | {len(r['reads'])} "
                     f"| {r['floor']['cpu']:.1f} / {r['floor']['wall']:.1f} "
                     f"| {r['check_path']['cpu']:.1f} / {r['check_path']['wall']:.1f} "
                     f"| {r['observe loop']['cpu']:.1f} / {r['observe loop']['wall']:.1f} "
                     f"| {r['check_path']['cpu'] / r['floor']['cpu']:.1f}× |")
    return lines, results


# --- 2. content MB/s ----------------------------------------------------------------------

def big_samples(root: Path, count: int, mib: int) -> list[Path]:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_integrity import big_sample

    root.mkdir(parents=True, exist_ok=True)
    first = root / "data_0.ckpt"
    big_sample(first, mib)
    out = [first]
    for i in range(1, count):
        p = root / f"data_{i}.ckpt"
        shutil.copyfile(first, p)
        out.append(p)
    return out


def content(base: Path, count: int, mib: int, runs: int) -> tuple[list[str], dict]:
    import zlib

    integrity, pool, _, _ = _imports()
    files = big_samples(base / "big", count, mib)
    mb = sum(p.stat().st_size for p in files) / 1e6
    cpus = pool.cpus_allowed()
    impl = integrity._crc32()
    impl_name = f"{impl.__module__}.crc32" if impl is not zlib.crc32 else "zlib.crc32"
    paths = [str(p) for p in files]

    def check_all(workers: int):
        def task(chunk, tick, _hint):
            for p in chunk:
                assert integrity.check_path(p, "content").whole
                tick(1)
            return None
        pool.map_forked(task, [[p] for p in paths], workers, lambda k: None)

    def with_zlib():
        integrity._CRC32 = zlib.crc32
        try:
            check_all(1)
        finally:
            integrity._CRC32 = impl

    cases = [("cat FILES > /dev/null (one process)", lambda: subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL,
                                                                            check=True)),
             (f"content check, one core ({impl_name})", lambda: check_all(1)),
             ("content check, one core, zlib.crc32 forced" if impl is not zlib.crc32
              else "content check, one core, zlib.crc32 (again)", with_zlib),
             (f"xargs -P {cpus} cat (every CPU)", lambda: subprocess.run(
                 ["xargs", "-P", str(cpus), "-n", "1", "cat"], input="\n".join(paths), text=True,
                 stdout=subprocess.DEVNULL, check=True)),
             (f"content check, {cpus} workers ({impl_name})", lambda: check_all(cpus))]
    times: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(runs):
        for name, fn in cases:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) for name, t in times.items()}
    cat1, catn = med[cases[0][0]], med[cases[3][0]]
    lines = [f"Content check (every entry's CRC-32), {count} × {mib} MiB torch.save-layout samples on tmpfs "
             f"({mb:,.0f} MB), warm page cache, medians of {runs} ({load()}):", "",
             "| | s | MB/s | ÷ the read rate of cat (same CPUs) |", "|---|---:|---:|---:|"]
    for i, (name, _) in enumerate(cases):
        ref = cat1 if i < 3 else catn
        lines.append(f"| {name} | {med[name]:.3f} | {mb / med[name]:,.0f} | {ref / med[name]:.2f}× |")
    shutil.rmtree(base / "big")
    return lines, {"mb": mb, "cpus": cpus, "crc32": impl_name, "seconds": med, "runs": times}


# --- 3. speedup ---------------------------------------------------------------------------

def observe_cold(root: Path, n: int, state: Path, workers: int | None) -> tuple[float, float]:
    """One cold observe in a fresh interpreter: (wall s, its CPU s and its workers')."""
    env = dict(os.environ, RECONCILE_STATE_DIR=str(state))
    env.pop("RECONCILE_CHECK_WORKERS", None)
    if workers:
        env["RECONCILE_CHECK_WORKERS"] = str(workers)
    shutil.rmtree(state, ignore_errors=True)
    code = ("import sys, time; from reconcile_host.local.host import LocalHost; "
            "from reconcile_host.reconcilers.extractions import ExtractionsReconciler as E; "
            "rec = E(); (r,) = rec.resources({'b': {'dir': sys.argv[1], 'total': int(sys.argv[2])}}); "
            "t = time.perf_counter(); o = rec.observe(Host(), [r])[r.id]; w = time.perf_counter() - t; "
            "assert o.done == int(sys.argv[2]) and o.checked == o.done, o; print(w)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(root), str(n)], stdout=subprocess.PIPE, text=True, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read()
    proc.stdout.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"observe failed: {out}")
    return float(out.strip()), usage.ru_utime + usage.ru_stime


def speedup(base: Path, n: int, runs: int) -> tuple[list[str], dict]:
    _, pool, _, _ = _imports()
    root = base / "tree"
    generate_files(root, n)
    cpus = pool.cpus_allowed()
    rows = {1: [], cpus: []}
    for _ in range(runs):
        for w in rows:
            rows[w].append(observe_cold(root, n, base / "state", w))
    shutil.rmtree(root)
    med = {w: (statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)) for w, r in rows.items()}
    one = med[1][0]
    lines = [f"Cold observe (`verify: at-risk`, no record: every structure, the last 2,000 files read whole), "
             f"{n:,} files, medians of {runs} ({load()}). CPUs used = CPU s ÷ wall s: what the machine "
             "gave the run (on a machine shared with other work, less than the workers asked for):", "",
             "| check on | wall s | CPU s (all processes) | CPUs used | files/s | speedup |",
             "|---|---:|---:|---:|---:|---:|"]
    for w, (wall, cpu) in med.items():
        label = "the observer (RECONCILE_CHECK_WORKERS=1)" if w == 1 else f"{w} workers (every CPU)"
        lines.append(f"| {label} | {wall:.2f} | {cpu:.2f} | {cpu / wall:.2f} | {n / wall:,.0f} | {one / wall:.2f}× |")
    return lines, {"files": n, "cpus": cpus, "median": {str(k): v for k, v in med.items()}}


# --- 4. a million files -------------------------------------------------------------------

GNU_TIME = "/usr/bin/time"


def reconcile_diff(state_file: Path, env: dict[str, str], group=None) -> dict:
    """One `reconcile diff`: wall, CPU, the peak RSS of its largest process and of the tree.

    The peak RSS comes from GNU time when installed: a child forked straight from this process
    starts with this process's RSS as its high-water mark, which would put this benchmark's own
    memory under the figure (harness.py does the same). Without it, wait4's figure is kept."""
    argv = [sys.executable, "-m", "reconcile_host", "diff", str(state_file), "--format", "json"]
    rss_file = state_file.with_suffix(".rss")
    gnu_time = os.access(GNU_TIME, os.X_OK)
    if gnu_time:
        argv = [GNU_TIME, "-o", str(rss_file), "-f", "%M", *argv]
    if group is not None:
        argv = group.wrap(argv)
        group.reset_peak()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.stdout.close()
    import json

    report = json.loads(out)
    obs = report["resources"][0]["observed"]
    maxrss_kib = int(rss_file.read_text().split()[-1]) if gnu_time else usage.ru_maxrss
    return {"wall": wall, "maxrss_mib": maxrss_kib / 1024, "cpu": usage.ru_utime + usage.ru_stime,
            "rss_from": "GNU time" if gnu_time else "wait4 (an upper bound: this process's RSS at the fork)",
            "rc": os.waitstatus_to_exitcode(status), "checked": obs["checked"], "done": obs["done"],
            "tree_peak_mib": (group.peak_bytes() / 2**20) if group is not None and group.peak_bytes() else None}


def million(base: Path, n: int, warm_runs: int) -> tuple[list[str], dict]:
    root = base / "million"
    t0 = time.perf_counter()
    generate_files(root, n)
    log(f"generated {n:,} files in {time.perf_counter() - t0:.1f}s")
    state = base / "state.yaml"
    state.write_text(f'{{"version": 1, "extractions": {{"m": {{"dir": "{root}", "total": {n}}}}}}}\n')
    env = dict(os.environ, RECONCILE_STATE_DIR=str(base / "state-m"), RECONCILE_CACHE_DIR=str(base / "cache-m"))
    env.pop("RECONCILE_CHECK_WORKERS", None)
    try:
        sys.path.insert(0, str(ROOT / "bench"))
        from cgroups import Group

        group = Group(f"reconcile-bench-check-{os.getpid()}")
        group = group if group.mem_dir is not None else None
    except Exception:
        group = None
    try:
        cold = reconcile_diff(state, env, group)
        warm = [reconcile_diff(state, env, group) for _ in range(warm_runs)]
    finally:
        if group is not None:
            group.remove()
    shutil.rmtree(root)
    w = statistics.median(x["wall"] for x in warm)
    rss = max(x["maxrss_mib"] for x in warm)
    tree = [x["tree_peak_mib"] for x in warm if x["tree_peak_mib"]]

    def fmt(v):
        return f"{v:.0f}" if v else "—"

    lines = [f"`reconcile diff` on {n:,} files (`verify: at-risk`; the last 2,000 written a second apart), "
             f"{load()}; peak RSS from {cold['rss_from']}, the tree's from its cgroup's memory.peak:", "",
             "| run | wall s | CPU s | checked | peak RSS of its largest process MiB | whole tree's peak MiB |",
             "|---|---:|---:|---:|---:|---:|",
             f"| cold (no record, no cache) | {cold['wall']:.2f} | {cold['cpu']:.2f} | {cold['checked']:,} "
             f"| {cold['maxrss_mib']:.0f} | {fmt(cold['tree_peak_mib'])} |",
             f"| warm (median of {warm_runs}) | {w:.3f} | {statistics.median(x['cpu'] for x in warm):.2f} "
             f"| {warm[0]['checked']:,} | {rss:.0f} | {fmt(max(tree) if tree else None)} |"]
    return lines, {"files": n, "cold": cold, "warm": warm}


def run(quick: bool, base_dir: str | None = None, runs: int | None = None, with_million: bool | None = None,
        ) -> tuple[str, list[tuple[bool, str]], dict]:
    """Every part; (Markdown, targets, raw results)."""
    runs = runs or (3 if quick else 5)
    with_million = (not quick) if with_million is None else with_million
    base = tmpfs_base(base_dir)
    text: list[str] = ["## The cold check", ""]
    targets: list[tuple[bool, str]] = []
    results: dict = {"load_start": os.getloadavg()}
    try:
        log("check: structure per file")
        lines, results["structure"] = structure(base, 5_000 if quick else 20_000, runs)
        text += lines + [""]
        small = results["structure"]["bench sample (3 entries)"]
        targets.append((small["check_path"]["cpu"] <= 15.0,
                        f"structural check of a small ZIP sample ≤ 15 µs per file on one core: "
                        f"{small['check_path']['cpu']:.1f} µs CPU ({small['check_path']['wall']:.1f} µs wall; "
                        f"the floor of the same reads {small['floor']['cpu']:.1f} µs)"))
        log("check: content MB/s")
        lines, results["content"] = content(base, 4 if quick else 8, 64, runs)
        text += lines + [""]
        s = results["content"]["seconds"]
        names = list(s)
        ratio = s[names[0]] / s[names[1]]
        targets.append((ratio >= 0.5, f"content check ≥ 0.5× the read rate of cat on one core: {ratio:.2f}× "
                                      f"({results['content']['crc32']}; with zlib.crc32 "
                                      f"{s[names[0]] / s[names[2]]:.2f}×)"))
        log("check: speedup")
        lines, results["speedup"] = speedup(base, 37_312 if quick else 200_000, runs)
        text += lines + [""]
        if with_million:
            log("check: a million files")
            lines, results["million"] = million(base, 1_000_000, 3)
            text += lines + [""]
            m = results["million"]
            peak = max([m["cold"]["maxrss_mib"]] + [x["maxrss_mib"] for x in m["warm"]])
            targets.append((peak < 100, f"1,000,000-file observe under 100 MiB peak RSS, cold and warm: "
                                        f"{m['cold']['maxrss_mib']:.0f} / "
                                        f"{max(x['maxrss_mib'] for x in m['warm']):.0f} MiB"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    results["load_end"] = os.getloadavg()
    return "\n".join(text) + "\n", targets, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer files and runs, no million")
    ap.add_argument("--million", action="store_true", default=None,
                    help="the 1,000,000-file part (default: not --quick)")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--dir", help="where to write the files (default /dev/shm)")
    a = ap.parse_args()
    text, targets, _ = run(a.quick, a.dir, a.runs, a.million)
    print(text)
    for ok, t in targets:
        print(f"- {'PASS' if ok else 'FAIL'}: {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
