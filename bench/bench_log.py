#!/usr/bin/env python3
"""Time `reconcile log` on a large journal (not run in CI).

Writes a journal of --lines lines (default 1,000,000: apply runs of intent/result/verified
lines, one run a minute back from now, with a watch pass now and then), then times the CLI
(a fresh interpreter, start-up included) reading the last 2 hours (`--since 2h`: read backwards,
stops early), the same as JSON, one run by id, and the whole journal. Prints the median of
--runs runs per row and the journal's size.

    python bench/bench_log.py [--runs 3] [--lines 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import median_time as timed


def write_journal(path: str, lines: int) -> str:
    """Runs of 4 actions (12 lines) one a minute, newest last; returns the id of a recent run."""
    from reconcile_host.core.contract import utc_iso

    now = time.time()
    runs = lines // 13 + 1
    recent = ""
    with open(path, "w") as fh:
        written = 0
        for k in range(runs):
            t = now - (runs - k) * 60
            run = f"{k:012x}"
            recent = run if k == runs - 30 else recent
            for a in range(4):
                res = f"unit:svc-{a}.service"
                base = {"time": utc_iso(t + a, millis=True), "run": run, "pid": 1000 + k, "resource": res,
                        "action": "stop", "target": f"svc-{a}.service", "description": f"stop svc-{a}.service"}
                fh.write(json.dumps({"event": "intent", **base, "before": {"active_state": "active"}}) + "\n")
                fh.write(json.dumps({"event": "result", **base, "started": base["time"], "result": "done",
                                     "message": ""}) + "\n")
                fh.write(json.dumps({"event": "verified", "time": base["time"], "run": run, "resource": res,
                                     "after": {"active_state": "inactive"}}) + "\n")
            fh.write(json.dumps({"time": utc_iso(t + 5, millis=True), "event": "watch-pass", "pass": k, "pid": 1,
                                 "resources": {"unit:svc-0.service": "ok"}, "actions_done": 4,
                                 "actions_failed": 0, "interrupted": False}) + "\n")
            written += 13
            if written >= lines:
                break
    return recent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lines", type=int, default=1_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "journal.jsonl")
        run = write_journal(path, args.lines)
        size = os.path.getsize(path)
        print(f"journal: {args.lines:,} lines, {size / 2**20:.1f} MiB")
        base = [sys.executable, "-m", "reconcile_host", "log", "--journal", path]
        rows = [("--since 2h (text)", ["--since", "2h"]), ("--since 2h --format json", ["--since", "2h", "--format",
                                                                                          "json"]),
                (f"--run {run[:8]} (whole journal read)", ["--run", run[:8]]), ("everything (text)", [])]
        for name, extra in rows:
            def once(extra=extra):
                subprocess.run(base + extra, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            print(f"{name:45s} {timed(once, args.runs):8.3f} s")


if __name__ == "__main__":
    main()
