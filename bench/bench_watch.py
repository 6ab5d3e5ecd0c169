#!/usr/bin/env python3
"""The continuous path: `reconcile watch --textfile` on a host, what one pass costs it.

The seed's host (bench/scenario.py: a namespaced systemd with the vLLM unit, 8 fake GPUs, /data
a tmpfs with 37,312 samples) and the incident's state on it (units, gpus, mounts, extractions with
`verify: at-risk`). `reconcile watch --interval 30s --textfile DIR` runs inside the namespace;
the first pass converges the host (stops the vLLM unit), every later one finds it converged:
that steady state is what a fleet pays on every host, every interval. Per pass (between two
writes of DIR/reconcile.prom): the CPU of the watch and of every child it waited for
(/proc/PID/stat utime+stime+cutime+cstime), the bytes it read (/proc/PID/io rchar: every
read(2), page cache included; read_bytes: from storage), and the textfile's size. Beside it in
the same run, its floor: one `reconcile diff` of the same state (a fresh process, the start-up
a pass does not pay).

    sudo .venv/bin/python bench/bench_watch.py [--passes 5] [--interval 30]

Bounded: --passes passes (at most 20), and (passes + 2) × interval + 120 s in all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from scenario import Scenario

from common import RESULTS, SEED_TOTAL, log


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / ticks  # utime stime cutime cstime


def proc_io(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        k, v = line.split(":")
        out[k] = int(v)
    return out


def child_of(pid: int, timeout: float = 30) -> int:
    """nsenter's one child (it forks to enter the PID namespace): the watch itself."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.05)
    raise RuntimeError("the watch did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--interval", type=float, default=30.0)
    a = ap.parse_args()
    passes = max(2, min(a.passes, 20))
    args = SimpleNamespace(installed=True, no_gpus=False, done=SEED_TOTAL, keep=False, runs=3, ansible_runs=3,
                           files=[SEED_TOTAL], units=[1])
    sc = Scenario(args)
    res: dict = {"load_start": os.getloadavg(), "interval": a.interval}
    try:
        sc.start()
        sc.kinds = {"units", "mounts", "extractions"} | ({"gpus"} if sc.gpus else set())
        state = sc.work / "state.yaml"
        state.write_text(sc.state_yaml())
        text = sc.work / "textfile"
        text.mkdir()
        prom = text / "reconcile.prom"
        journal = sc.work / "journal.jsonl"
        proc = sc.nsd.popen([*sc.rec, "watch", str(state), "--interval", f"{a.interval:g}s", "--textfile", str(text),
                             "--journal", str(journal)], env=sc.env, stdout=subprocess.DEVNULL,
                            stderr=open(sc.work / "watch.log", "wb"))  # noqa: SIM115
        try:
            pid = child_of(proc.pid)
            rows, last_mtime, last = [], None, None
            deadline = time.monotonic() + (passes + 2) * a.interval + 120
            while len(rows) < passes and time.monotonic() < deadline and proc.poll() is None:
                try:
                    m = prom.stat().st_mtime_ns
                except FileNotFoundError:
                    m = None
                if m is not None and m != last_mtime:
                    now = {"t": time.monotonic(), "cpu": proc_cpu(pid), **proc_io(pid), "bytes": prom.stat().st_size}
                    if last is not None:
                        rows.append({"cpu": now["cpu"] - last["cpu"], "rchar": now["rchar"] - last["rchar"],
                                     "read_bytes": now["read_bytes"] - last["read_bytes"],
                                     "syscr": now["syscr"] - last["syscr"], "every": now["t"] - last["t"],
                                     "textfile": now["bytes"]})
                        log(f"watch pass {len(rows)}: CPU {rows[-1]['cpu']:.3f}s, read {rows[-1]['rchar']:,} B "
                            f"({rows[-1]['syscr']} reads), from storage {rows[-1]['read_bytes']:,} B")
                    else:
                        res["first_pass_cpu"] = now["cpu"]
                    last_mtime, last = m, now
                time.sleep(0.2)
        finally:
            os.killpg(proc.pid, 15)  # our own watch (nsenter's session): it stops after its step
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        res["passes"] = rows
        res["textfile_head"] = prom.read_text()[:4000] if prom.exists() else ""
        # The floor: the same state observed once by a fresh `reconcile diff` (start-up included).
        diffs = []
        for _ in range(3):
            t0 = time.perf_counter()
            r = sc.nsd.run([*sc.rec, "diff", str(state), "--format", "json"], env=sc.env, timeout=300)
            diffs.append(time.perf_counter() - t0)
        res["diff_wall"] = statistics.median(diffs)
        res["diff_rc"] = r.returncode
    finally:
        sc.stop()
    res["load_end"] = os.getloadavg()
    rows = res.get("passes") or []
    if rows:
        med = {k: statistics.median([r[k] for r in rows]) for k in ("cpu", "rchar", "read_bytes", "syscr", "every")}
        res["median"] = med
        print(f"watch --interval {a.interval:g}s --textfile on the incident's host, {len(rows)} steady passes: "
              f"CPU {med['cpu'] * 1000:.0f} ms a pass ({med['cpu'] / a.interval * 100:.2f} % of one CPU), "
              f"read {med['rchar'] / 1e6:.2f} MB a pass ({med['syscr']:.0f} reads; {med['read_bytes']:,.0f} B "
              f"from storage); textfile {rows[-1]['textfile']:,} B; passes every {med['every']:.1f} s; "
              f"one `reconcile diff` of the same state {res['diff_wall']:.2f} s wall (exit {res['diff_rc']}); "
              f"load {res['load_start'][0]:.1f} → {res['load_end'][0]:.1f} on {os.cpu_count()} CPUs")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "watch.json").write_text(json.dumps(res, indent=1, default=str))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
