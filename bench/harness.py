"""Inside the namespace: the timing harness (`run.py --inner JOBFILE`), one process per timed command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import HERE

GNU_TIME = "/usr/bin/time"


def _run_once(job: dict, out_path: str) -> tuple[float, int, int]:
    """Run a job's command once; return (wall seconds, peak RSS KiB, exit code).

    Peak RSS comes from GNU time when installed: a child spawned straight from this harness
    inherits the harness's own peak RSS (vfork shares its memory until exec), which would
    put a floor of ~20 MiB under every tool. Without GNU time, wait4's figure is kept:
    exact for tools bigger than the harness, an upper bound for the small ones."""
    argv = job["argv"]
    rss_file = out_path + ".rss"
    use_time = os.access(GNU_TIME, os.X_OK)
    if use_time:
        argv = [GNU_TIME, "-o", rss_file, "-f", "%M", *argv]
    with open(out_path, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=job["env"], cwd=job.get("cwd") or "/",
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        # wait4: this child's own rusage; ru_maxrss covers its waited-for descendants too
        # (Ansible's forked workers).
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    rss = usage.ru_maxrss
    if use_time:
        try:
            rss = int(Path(rss_file).read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            pass
    return wall, rss, os.waitstatus_to_exitcode(status)


def _reset(job: dict) -> None:
    for argv in job.get("reset", ()):
        subprocess.run(argv, env=job["env"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)


def inner_commands(jobs: list[dict]) -> dict:
    """Warm up every job, then run them round-robin, so that load changes on the machine
    during the run touch every tool alike."""
    results = {}
    for job in jobs:
        first = None
        for i in range(job.get("warmup", 1)):
            _reset(job)
            wall, rss, rc = _run_once(job, job["log"])
            if i == 0:
                first = {"wall": wall, "rss_kib": rss, "rc": rc,
                         "output": _kept(job["log"])}
        results[job["name"]] = {"walls": [], "rss_kib": [], "rcs": [], "first": first}
        print(f"  warm-up {job['name']}: {first['wall']:.3f}s exit {first['rc']}", file=sys.stderr, flush=True)
    for rep in range(max(job["reps"] for job in jobs)):
        for job in jobs:
            if rep >= job["reps"]:
                continue
            _reset(job)
            wall, rss, rc = _run_once(job, job["log"])
            r = results[job["name"]]
            r["walls"].append(wall)
            r["rss_kib"].append(rss)
            r["rcs"].append(rc)
        print(f"  round {rep + 1} done", file=sys.stderr, flush=True)
    for job in jobs:
        results[job["name"]]["last_output"] = _kept(job["log"])
    return results


def _kept(log: str) -> str:
    """What a check looks for may be at either end of a long output (a JSON report names the
    resources at its start): its first and last 6,000 characters."""
    text = Path(log).read_text(errors="replace")
    return text if len(text) <= 12000 else text[:6000] + "\n...\n" + text[-6000:]


def inner_scan(job: dict) -> dict:
    """Time reconcile's extraction scan in-process (no interpreter start-up)."""
    sys.path.insert(0, str(HERE))
    os.environ.update(job["env"])
    from reconcile_host.local.host import LocalHost
    from reconcile_host.reconcilers.extractions import ExtractionsReconciler
    from reconcile_host.reconcilers.extractions.listing import list_tree

    rec, host = ExtractionsReconciler(), LocalHost()
    (res,) = rec.resources({"kimi-k25-eagle3": {"dir": job["dir"], "total": job["total"], "verify": job["verify"]}})
    out: dict = {}

    def timed(fn, reps):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times

    pattern = "rows_{group}/data_{index}.ckpt"
    # Every directory listed, no listing cache: what the first observe (or one after the tree
    # changed everywhere) pays for the names.
    out["list_cold"] = timed(lambda: list_tree(job["dir"], pattern), job["reps"])
    state = Path(job["env"]["RECONCILE_STATE_DIR"])

    def cold():
        shutil.rmtree(state, ignore_errors=True)  # no earlier integrity check recorded
        return rec.observe(host, [res])

    out["observe_cold"] = timed(cold, job.get("cold_reps", 1))
    obs = rec.observe(host, [res])[res.id]
    out["done"] = getattr(obs, "done", None)
    out["observe_warm"] = timed(lambda: rec.observe(host, [res]), job["reps"])
    return out


def inner(jobfile: str) -> None:
    jobs = json.loads(Path(jobfile).read_text())
    results = {}
    for job in jobs:
        if job.get("type") == "scan":
            print(f"  {job['name']}", file=sys.stderr, flush=True)
            results[job["name"]] = inner_scan(job)
    commands = [job for job in jobs if job.get("type") != "scan"]
    if commands:
        results.update(inner_commands(commands))
    print(json.dumps(results))
