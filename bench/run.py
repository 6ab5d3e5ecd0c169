"""Benchmark `reconcile diff` against Ansible, pyinfra, testinfra and the plain shell (run by hand, as root).

It boots a real systemd as PID 1 of a namespace (tests/nsystemd.py) and builds the seed
host in it: `vllm-kimi-k25-int4.service` enabled and running (Restart=always), 8 fake
GPUs held by it at 72,289 MiB each (when the fake libnvidia-ml can be built), `/data` a
tmpfs mounted inside the namespace only, and an EAGLE-3 extraction in SpecForge layout
with 37,312 sample files. Then it times the same audit with each tool, inside the
namespace, N times each after a warm-up run, and reports medians of wall time and peak
RSS; then how reconcile's cost grows with files (37,312 -> 1,000,000) and declared units
(1 -> 500), and the time of `reconcile apply` on the incident scenario. Last, the fleet
(bench/fleet.py): `reconcile diff --inventory` over SSH to 10 and 100 hosts on this
machine against Ansible and pyinfra, with controller CPU and memory from cgroups.

    sudo python3 bench/run.py                  # everything (about 25 min on 2 cores)
    sudo python3 bench/run.py --quick          # 3 runs, no 1,000,000-file step, 1 fleet run
    sudo python3 bench/run.py --only fleet     # the fleet alone: bench/results/fleet.md
    sudo python3 bench/run.py --only netfleet  # per host at 0.2/5/50 ms RTT, projected: netfleet.md
    sudo python3 bench/run.py --only check     # the cold integrity check alone (bench/bench_check.py)
    sudo python3 bench/run.py --only firstcheck  # 37,312 torch.save samples (bench/bench_firstcheck.py)

The peers are installed into bench/.peers (a separate virtual environment) when missing.
Every tool runs without PYTHONDONTWRITEBYTECODE, so byte-code caches are used as on a
normal install. Results: bench/results/latest.md and latest.json (git-ignored)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from fleet_measure import Fleet
from harness import inner
from install import ensure_peers, install_reconcile
from measure import Bench

from common import RESULTS, SEED_TOTAL, log, parse_list


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Time the seed host's audit with reconcile, Ansible, pyinfra, testinfra and plain shell "
                    "(needs root; boots a namespaced systemd; about 10 minutes).",
        epilog="Writes bench/results/latest.md and latest.json.")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per tool after one warm-up (default 7)")
    ap.add_argument("--ansible-runs", type=int, help="timed runs of each Ansible variant (default: --runs)")
    ap.add_argument("--done", type=int, default=SEED_TOTAL,
                    help=f"sample files in the seed extraction (default {SEED_TOTAL:,}; the seed host had 18,400 "
                         f"of {SEED_TOTAL:,})")
    ap.add_argument("--files", type=parse_list, default=[SEED_TOTAL, 1_000_000],
                    help="file counts for the growth table, separated by / (default 37312/1000000)")
    ap.add_argument("--units", type=parse_list, default=[1, 100, 500],
                    help="declared-unit counts for the growth table (default 1/100/500)")
    ap.add_argument("--quick", action="store_true", help="3 runs, files only up to 37,312")
    ap.add_argument("--no-peers", action="store_true", help="skip Ansible, pyinfra and testinfra")
    ap.add_argument("--no-gpus", action="store_true", help="leave the fake GPUs out")
    ap.add_argument("--skip", default="",
                    help="comma list of parts to skip: breakdown,units,files,apply,importtime,check,fleet")
    ap.add_argument("--only", choices=["fleet", "check", "firstcheck", "netfleet"],
                    help="run only this part (fleet: writes bench/results/fleet.md; check: check.md; "
                         "firstcheck: firstcheck.md)")
    ap.add_argument("--fleet-hosts", type=parse_list, default=[10, 100],
                    help="inventory sizes for the fleet, separated by / (default 10/100)")
    ap.add_argument("--fleet-parallel", type=int, default=10,
                    help="reconcile's --parallel, Ansible's forks and pyinfra's --parallel (default 10)")
    ap.add_argument("--fleet-namespaces", type=int, default=5, help="namespaced systemds the hosts share (default 5)")
    ap.add_argument("--fleet-files", type=int, default=2000, help="sample files in each fleet host's /data (2000)")
    ap.add_argument("--fleet-runs", type=int, help="timed runs per tool and host count (default 3; --quick 1)")
    ap.add_argument("--netfleet-skip", default="",
                    help="--only netfleet: tools left out of the many-host run (comma list: ansible,pyinfra)")
    ap.add_argument("--netfleet-big-rt", action="store_true",
                    help="--only netfleet: the many-host run at real-time priority too (it takes the machine)")
    ap.add_argument("--fleet-compare", metavar="RECONCILE",
                    help="also time this reconcile console script (e.g. main's, installed in a venv of its own), "
                         "on the controller and on the targets alike: a before/after in one run")
    ap.add_argument("--compare", metavar="RECONCILE",
                    help="also time this reconcile console script (e.g. main's, in a venv of its own) in the seed "
                         "audit and the per-kind table: a before/after in one run")
    ap.add_argument("--installed", action="store_true",
                    help="time the `reconcile` installed next to this interpreter instead of a fresh "
                         "`pip install .` of this tree in bench/.reconcile")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, state files, playbooks)")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        inner(a.inner)
        return
    if a.quick:
        a.runs = 3
        a.files = [n for n in a.files if n <= SEED_TOTAL] or [SEED_TOTAL]
    a.ansible_runs = a.ansible_runs or a.runs
    a.fleet_runs = a.fleet_runs or (1 if a.quick else 3)
    if a.compare:
        a.compare = os.path.abspath(a.compare)
        if not os.access(a.compare, os.X_OK):
            sys.exit(f"bench: --compare {a.compare}: not an executable reconcile")
    if a.fleet_compare:
        a.fleet_compare = os.path.abspath(a.fleet_compare)
        if not os.access(a.fleet_compare, os.X_OK):
            sys.exit(f"bench: --fleet-compare {a.fleet_compare}: not an executable reconcile")
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it boots systemd in a namespace, mounts tmpfs there): sudo python3 bench/run.py")

    t_start = time.perf_counter()
    load_start = os.getloadavg()
    if load_start[0] > 1.0:
        log(f"WARNING: load average {load_start[0]:.1f} on {os.cpu_count()} CPUs: other work will skew "
            "the times (the tools run round-robin, so the ratios suffer less than the absolute times)")
    if a.only == "check":  # in-process, from this interpreter's reconcile: no install, no peers
        text, targets, results = run_check(a)
        write(Results({"argv": sys.argv[1:], "load_start": load_start, "load_end": os.getloadavg(),
                       "seconds": time.perf_counter() - t_start, "cpus": os.cpu_count()}, results), "check",
              text, targets)
        return
    if a.only == "firstcheck":  # in-process and `python -m reconcile_host` from this interpreter
        import bench_firstcheck

        text, targets, results = bench_firstcheck.run(a.quick)
        write(Results({"argv": sys.argv[1:], "load_start": load_start, "load_end": os.getloadavg(),
                       "seconds": time.perf_counter() - t_start, "cpus": os.cpu_count()}, results), "firstcheck",
              text, targets)
        return
    if not a.installed:
        install_reconcile()
    peers = {} if a.no_peers else ensure_peers()
    if a.only == "netfleet":  # bench/fleet_net.py: per-host latency at real RTTs, and the projection
        import fleet_model
        from fleet_net import main_netfleet

        res = main_netfleet(a)
        meta = {"argv": sys.argv[1:], "peers": peers, "load_start": load_start, "load_end": os.getloadavg(),
                "seconds": time.perf_counter() - t_start, "cpus": os.cpu_count()}
        write(Results(meta, res), "netfleet", fleet_model.report(meta, res), [])
        return
    if a.only == "fleet":
        fleet = run_fleet(a)
        fleet.meta.update({"argv": sys.argv[1:], "peers": peers, "load_start": load_start, "load_end": os.getloadavg(),
                           "seconds": time.perf_counter() - t_start, "cpus": os.cpu_count()})
        write(fleet, "fleet", fleet.fleet_header() + "\n".join(fleet.fleet_report()) + "\n", fleet.fleet_targets())
        return
    b = Bench(a)
    b.meta.update({"argv": sys.argv[1:], "peers": peers, "load_start": load_start})
    try:
        b.start()
        b.seed_audit()
        if "breakdown" not in skip:
            b.breakdown()
        if "apply" not in skip:
            b.apply_seed()
        if "units" not in skip:
            b.growth_units()
        if "importtime" not in skip:
            b.importtime()
        if "files" not in skip:
            b.growth_files()
    finally:
        b.stop()
    targets = b.targets()
    text = b.report()
    if "check" not in skip:
        check_text, check_targets, b.results["check"] = run_check(a)
        targets += check_targets
        text += "\n" + check_text + "\n### Check targets\n\n" + "".join(
            f"- {'PASS' if ok else 'FAIL'}: {t}\n" for ok, t in check_targets)
    if "fleet" not in skip:
        fleet = run_fleet(a)
        b.results.update(fleet.results)
        fleet_targets = fleet.fleet_targets()
        targets += fleet_targets
        # The fleet's section and its own targets close the report.
        text += "\n".join(fleet.fleet_report()) + "\n\n### Fleet targets\n\n" + "".join(
            f"- {'PASS' if ok else 'FAIL'}: {t}\n" for ok, t in fleet_targets)
        write(fleet, "fleet", fleet.fleet_header() + "\n".join(fleet.fleet_report()) + "\n", fleet_targets)
    b.meta["seconds"] = time.perf_counter() - t_start
    b.meta["load_end"] = os.getloadavg()
    b.meta.update({"gpus": b.gpus, "gpus_left_out_because": b.gpus_why, "kinds": sorted(b.kinds),
                   "reconcile": b.rec_label, "cpus": os.cpu_count()})
    write(b, "latest", text, targets)


class Results:
    """What write() needs of a part run on its own."""

    def __init__(self, meta: dict, results: dict):
        self.meta, self.results = meta, results


def run_check(a):
    """bench/bench_check.py: structure per file beside the pread floor, content MB/s beside cat,
    the speedup on every CPU, and (not --quick) a million files with their peak RSS."""
    import bench_check

    return bench_check.run(a.quick, runs=3 if a.quick else 5)


def run_fleet(a) -> Fleet:
    fleet = Fleet(a)
    try:
        fleet.start()
        fleet.breakdown_fleet()
        fleet.run_fleet()
    finally:
        fleet.stop()
    return fleet


def write(b, stem: str, text: str, targets) -> None:
    """bench/results/STEM.md (the tables) and STEM.json (every raw figure)."""
    RESULTS.mkdir(exist_ok=True)
    if stem in ("fleet", "check", "firstcheck"):
        text += "\n## Targets\n\n" + "".join(f"- {'PASS' if ok else 'FAIL'}: {t}\n" for ok, t in targets)
    (RESULTS / f"{stem}.md").write_text(text)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": b.meta, "results": b.results,
                                                     "targets": [{"pass": ok, "text": t} for ok, t in targets]},
                                                    indent=1, default=str))
    print(text)
    log(f"wrote {RESULTS / (stem + '.md')} and {stem}.json")


if __name__ == "__main__":
    main()
