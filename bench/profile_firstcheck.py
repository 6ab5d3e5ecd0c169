#!/usr/bin/env python3
"""Where a first check's microseconds go: the extractions kind's observe of torch 2.13's 37,312
samples (bench_firstcheck.py's tree), no record, page cache warm, cut into its steps by timing
the functions it calls (wrapped here, the package unchanged):

- start-up: `python -m reconcile_host diff` of a state with no resource (the interpreter, the
  imports, the CLI), a fresh process;
- the walk: listing.list_tree (every directory listed, no listing cache);
- the check, phase 1 (the structure of every file; the files that may be recent with their CRCs
  in the same read) and phase 2 (`verify: at-risk`: the files of the last 5 minutes whose CRCs
  phase 1 did not prove, read whole), with the pool's round trips: tally.run, on every CPU and on
  one; phase 2 alone: tally._recent_pass;
- the records: records.write_json, and the rest of _observe_files (ranges, the observation);
- per file, in this process on one core: integrity.check_path at each depth (the structure; the
  structure with the CRCs, as phase 1 reads a file that may be recent; at-risk's whole read; the
  content check of verify: content) and the floor (open + read + close through the same directory
  fd), so that tally.run's time splits into the checks and what is around them (the loop's
  bookkeeping, the workers' forks and pipes);
- the whole `reconcile diff` (a fresh process, no record), on every CPU and on one: what is left
  after the start-up and the observe is the report (and the engine around the observe).

Then a cProfile of the observe on one worker (top functions by own time).

    .venv/bin/python bench/profile_firstcheck.py [--dir /var/tmp/reconcile-bench] [--runs 3]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
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


def clocks() -> tuple[float, float]:
    """(wall, CPU of this process and of the children it waited for), seconds."""
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), time.process_time() + ch.ru_utime + ch.ru_stime


def timed_calls(mod, name: str, sink: list[tuple[float, float]]):
    fn = getattr(mod, name)

    def wrapper(*a, **kw):
        w0, c0 = clocks()
        try:
            return fn(*a, **kw)
        finally:
            w1, c1 = clocks()
            sink.append((w1 - w0, c1 - c0))

    setattr(mod, name, wrapper)
    return fn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/reconcile-bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-observe", action="store_true", help="skip the start-up and the observes (per file only)")
    a = ap.parse_args()
    root = Path(a.dir) / f"specforge-{N}"
    if not root.is_dir():
        sys.exit(f"no tree at {root}: run bench/bench_firstcheck.py once first")
    sys.path.insert(0, str(ROOT.parent))
    work = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    os.environ["RECONCILE_STATE_DIR"] = str(work / "state")
    os.environ["RECONCILE_CACHE_DIR"] = str(work / "cache")
    out: dict = {"load_start": os.getloadavg(), "cpus": len(os.sched_getaffinity(0))}
    try:
        # start-up: a fresh process, no resource
        empty = work / "empty.json"
        empty.write_text(json.dumps({"version": 1}))
        walls, cpus = [], []
        for _ in range(0 if a.no_observe else a.runs + 1):
            w0, c0 = clocks()
            subprocess.run([sys.executable, "-m", "reconcile_host", "diff", str(empty), "--format", "json"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            w1, c1 = clocks()
            walls.append(w1 - w0)
            cpus.append(c1 - c0)
        if walls:
            out["startup_wall"], out["startup_cpu"] = statistics.median(walls[1:]), statistics.median(cpus[1:])

        from reconcile_host.local.host import LocalHost
        from reconcile_host.reconcilers import extractions as ext
        from reconcile_host.reconcilers.extractions import records, tally

        sinks: dict[str, list[tuple[float, float]]] = {"walk": [], "check": [], "phase2": [], "records": []}
        timed_calls(ext, "list_tree", sinks["walk"])
        timed_calls(ext.tally, "run", sinks["check"])
        timed_calls(ext.tally, "_recent_pass", sinks["phase2"])
        timed_calls(ext, "write_json", sinks["records"])
        rec, host = ext.ExtractionsReconciler(), LocalHost()
        (res,) = rec.resources({"x": {"dir": str(root), "total": N}})

        def observe_once(workers: str | None) -> dict:
            if workers is None:
                os.environ.pop("RECONCILE_CHECK_WORKERS", None)
            else:
                os.environ["RECONCILE_CHECK_WORKERS"] = workers
            shutil.rmtree(work / "state", ignore_errors=True)  # no record: a first check
            for s in sinks.values():
                s.clear()
            w0, c0 = clocks()
            obs = rec.observe(host, [res])[res.id]
            w1, c1 = clocks()
            assert obs.checked == N, obs
            return {"observe_wall": w1 - w0, "observe_cpu": c1 - c0,
                    **{f"{k}_wall": sum(x[0] for x in v) for k, v in sinks.items()},
                    **{f"{k}_cpu": sum(x[1] for x in v) for k, v in sinks.items()},
                    "content_checked": obs.content_checked}

        for workers in () if a.no_observe else (None, "1"):
            rows = [observe_once(workers) for _ in range(a.runs)]
            out[f"observe_workers_{workers or 'all'}"] = {k: statistics.median([r[k] for r in rows]) for k in rows[0]}
            log(f"observe (workers {workers or 'all'}): " + json.dumps(out[f"observe_workers_{workers or 'all'}"]))

        # The whole `reconcile diff`, a fresh process, no record: every CPU and one.
        state = work / "state.json"
        state.write_text(json.dumps({"version": 1, "extractions": {"x": {"dir": str(root), "total": N}}}))
        for workers in () if a.no_observe else (None, "1"):
            env = {k: v for k, v in os.environ.items() if k != "RECONCILE_CHECK_WORKERS"}
            env.update({"RECONCILE_CHECK_WORKERS": workers} if workers else {})
            walls, cpus = [], []
            for _ in range(a.runs):
                shutil.rmtree(work / "state", ignore_errors=True)
                w0, c0 = clocks()
                subprocess.run([sys.executable, "-m", "reconcile_host", "diff", str(state), "--format", "json"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env)
                w1, c1 = clocks()
                walls.append(w1 - w0)
                cpus.append(c1 - c0)
            out[f"diff_workers_{workers or 'all'}"] = {"wall": statistics.median(walls), "cpu": statistics.median(cpus)}
            log(f"diff (workers {workers or 'all'}): " + json.dumps(out[f"diff_workers_{workers or 'all'}"]))

        # Per file, one core: the checks at each depth and the floor, the same files, the same dir fds.
        from reconcile_host.common.filechecks.integrity import check_path
        from reconcile_host.common.filechecks.verdicts import CONTENT, STRUCTURE

        names = []
        for d in sorted(os.listdir(root)):
            names += [(d, f) for f in sorted(os.listdir(root / d))]
        fds = {d: os.open(root / d, os.O_RDONLY | os.O_DIRECTORY) for d in {d for d, _ in names}}

        def floor(files):
            for d, f in files:
                fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC, dir_fd=fds[d])
                os.read(fd, 65536)
                os.close(fd)

        def depth(files, dp, **kw):
            for d, f in files:
                check_path(f, dp, dir_fd=fds[d], **kw)

        cases = (("floor", floor, names), ("structure", lambda fs: depth(fs, STRUCTURE), names),
                 ("structure + CRCs", lambda fs: depth(fs, STRUCTURE, crcs_from=0), names),
                 ("at-risk whole read", lambda fs: depth(fs, CONTENT, walk=False), names[-4000:]),
                 ("content", lambda fs: depth(fs, CONTENT), names[-4000:]))
        per: dict[str, list[float]] = {label: [] for label, *_ in cases}
        per_cpu: dict[str, list[float]] = {label: [] for label, *_ in cases}
        for _ in range(a.runs):
            for label, fn, files in cases:
                t0, c0 = time.perf_counter(), time.thread_time()
                fn(files)
                per[label].append((time.perf_counter() - t0) / len(files) * 1e6)
                per_cpu[label].append((time.thread_time() - c0) / len(files) * 1e6)
        out["per_file_us_wall"] = {k: statistics.median(v) for k, v in per.items()}
        out["per_file_us_cpu"] = {k: statistics.median(v) for k, v in per_cpu.items()}
        for fd in fds.values():
            os.close(fd)

        # cProfile of one observe, one worker (in this process)
        os.environ["RECONCILE_CHECK_WORKERS"] = "1"
        shutil.rmtree(work / "state", ignore_errors=True)
        prof = cProfile.Profile()
        prof.enable()
        rec.observe(host, [res])
        prof.disable()
        st = pstats.Stats(prof)
        st.sort_stats("tottime")
        rows = []
        for (file, line, fn), (_cc, nc, tt, ct, _callers) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:25]:
            rows.append({"fn": f"{Path(file).name}:{line}({fn})", "calls": nc, "tottime": tt, "cumtime": ct})
        out["cprofile_top"] = rows
        del records, tally
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["load_end"] = os.getloadavg()
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "profile_firstcheck.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
