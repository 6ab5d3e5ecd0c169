#!/usr/bin/env python3
"""Time reading and validating large and hostile state files (not run in CI).

Rows: N units (each `active`, `enabled`; with --needs every unit needs the one before it, a
chain), validated cold (no cache) and warm (from the validation cache), in this process
(`statefile.load`) and through the CLI (`reconcile validate`, a fresh interpreter: start-up
included); a 1 MB comment line; refusals: a file over the size limit, an alias bomb, 10,000
levels of nesting. Prints the median of --runs runs per row.

    python bench/bench_statefile.py [--runs 5] [--sizes 1000,10000,20000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from reconcile_host.pipeline.statefile import StateFileError, load

from common import median_time as timed


def units(n: int, needs: bool = False) -> str:
    out = ["version: 1", "units:"]
    for i in range(n):
        out += [f"  svc-{i}.service:", "    active: false", "    enabled: false"]
        if needs and i:
            out.append(f"    needs: [unit:svc-{i - 1}.service]")
    return "\n".join(out) + "\n"


def bomb(levels: int = 9) -> str:
    out = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    out += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "version: 1\n" + "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", default="1000,10000,20000")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-statefile-")
    env = {**os.environ, "RECONCILE_CACHE_DIR": os.path.join(tmp, "cache")}
    cli = [sys.executable, "-m", "reconcile_host", "validate"]

    def cli_run(path: str, cold: bool) -> None:
        if cold:
            subprocess.run(["rm", "-rf", env["RECONCILE_CACHE_DIR"]], check=True)
        subprocess.run([*cli, path], env=env, capture_output=True, check=False)

    rows = []
    for needs in (False, True):
        for n in (int(x) for x in args.sizes.split(",")):
            text = units(n, needs)
            path = os.path.join(tmp, f"u{n}{'n' if needs else ''}.yaml")
            with open(path, "w") as fh:
                fh.write(text)
            label = f"{n} units{' (a chain of needs)' if needs else ''}, {len(text) / 2**20:.2f} MiB"
            rows.append((label, "load, cold (in process)", timed(lambda p=path: load(p, use_cache=False), args.runs)))
            os.environ["RECONCILE_CACHE_DIR"] = env["RECONCILE_CACHE_DIR"]
            load(path)
            rows.append((label, "load, from the cache (in process)", timed(lambda p=path: load(p), args.runs)))
            rows.append((label, "reconcile validate, cold", timed(lambda p=path: cli_run(p, True), args.runs)))
            cli_run(path, False)
            rows.append((label, "reconcile validate, from the cache", timed(lambda p=path: cli_run(p, False),
                                                                                 args.runs)))

    def refused(text: str) -> float:
        def go():
            try:
                load("x.yaml", text=text, use_cache=False)
            except StateFileError:
                return
            raise AssertionError("accepted")
        return timed(go, args.runs)

    comment = "version: 1\n# " + "x" * 2**20 + "\nunits: {a.service: {active: false}}\n"
    rows.append(("1 MB comment line", "load, cold", timed(lambda: load("c.yaml", text=comment, use_cache=False),
                                                         args.runs)))
    rows.append(("5 MiB file", "refused (size limit)", refused("version: 1\n#" + "x" * 5 * 2**20 + "\n")))
    rows.append(("alias bomb, 9 levels of 9 (387 M nodes)", "refused (node budget)", refused(bomb())))
    rows.append(("10,000 levels of nesting", "refused (depth limit)", refused("x: " + "[" * 10000 + "]" * 10000)))
    width = max(len(r[0]) for r in rows)
    for label, what, seconds in rows:
        print(f"{label:<{width}}  {what:<38} {seconds * 1000:9.1f} ms")


if __name__ == "__main__":
    main()
