#!/usr/bin/env python3
"""The gpus kind's kernel-log read on a sick node's log, against `grep -c Xid`.

Writes kernel logs of 10,000, 100,000 and 800,000 lines as `dmesg` prints them: mostly NVRM Xid
lines (29 distinct faults over 8 GPUs: Xid 95 with the driver's RST verdict, 31 MMU faults of
which one in 25 is at an address of its own, 13 with varying ESR registers, 154 recovery
actions, 119 GSP timeouts, 43, 94), from a few processes, between other kernel lines. Each is
read through RECONCILE_KERNEL_LOG by a fresh interpreter (start-up and imports included, as in
a `diff`):

- first read: no record (a new state directory each run): the whole file;
- second read: the record of the first, nothing new (a second `diff`, a quiet `watch` pass);
- pass after 100 new lines: what a `watch` pass reads on a node that keeps logging.

The floor is `grep -c Xid FILE`, timed in the same run, interleaved with the reads (one of each
in turn), medians of --runs. Peak memory is the reader's own VmHWM (/proc/self/status).

    python bench/bench_kernel_log.py [--runs 5] [--sizes 10000/100000/800000] [--shape realistic|repeated]

Results are printed as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from common import clean_env, log, median, parse_list

READER = (
    "import json, time\n"
    "t = time.perf_counter()\n"
    "from reconcile_host.reconcilers.gpus.kernel_log import read_kernel_log\n"
    "fold, klog = read_kernel_log()\n"
    "events = fold.kernel_events()\n"
    "hwm = next(x for x in open('/proc/self/status') if x.startswith('VmHWM:')).split()[1]\n"
    "report = json.dumps([e.__dict__ for e in events])\n"
    "print(json.dumps({'hwm_kib': int(hwm), 'events': len(events), 'lines_read': klog.lines_read,\n"
    "                  'report_bytes': len(report), 'resumed': klog.resumed}))\n"
)


NAMES = ("pt_main_thread", "python3", "nvidia-smi", "dcgm-exporter", "torchrun", "vllm-worker")


def nvrm_line(i: int, shape: str = "realistic") -> str:
    """Line I of the storm. `realistic`: every line from a process of its own (a fresh pid= and
    one of a few names: monitoring polls nvidia-smi every second, workers come and go) and one MMU
    fault in 10 at an address of its own; `repeated`: the earlier shape, five pids and one MMU
    fault in 25 at an address of its own (lines byte-identical but for the time)."""
    at = f"[{2000 + i * 0.004:12.6f}]"
    k = i % 29
    pci = f"0000:{(0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb)[k % 8]:02x}:00"
    realistic = shape == "realistic"
    pid = f"pid={100000 + i}, name={NAMES[i % len(NAMES)]}" if realistic else f"pid={3100 + i % 5}, name=pt_main_thread"
    if k < 8:
        return f"{at} NVRM: Xid (PCI:{pci}): 95, {pid}, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No"
    if k < 14:
        unique = i % (10 if realistic else 25) == 0
        addr = i * 0x1000 if unique else 0x7f3a_1c00_0000 + k * 0x1000
        return (f"{at} NVRM: Xid (PCI:{pci}): 31, {pid}, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS "
                f"GPCCLIENT_T1_8 faulted @ 0x{addr >> 32:x}_{addr & 0xffffffff:08x}. Fault is of type FAULT_PDE "
                "ACCESS_TYPE_VIRT_WRITE")
    if k < 19:
        return (f"{at} NVRM: Xid (PCI:{pci}): 13, pid='<unknown>', name=<unknown>, Graphics Exception: "
                f"ESR 0x546fb0=0x{0x11f000e + i % 13:x} 0x546fb4=0x24 0x546fa8=0xf81eb60 0x546fac=0x1174")
    if k < 22:
        return (f"{at} NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from 0x0 (None) to "
                f"0x{1 + k % 2} ({'GPU Reset' if k % 2 == 0 else 'Node Reboot'} Required)")
    if k < 25:
        return (f"{at} NVRM: Xid (PCI:{pci}): 119, {pid}, Timeout after 6s of waiting for RPC response from "
                f"GPU{k % 8} GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).")
    if k < 27:
        return f"{at} NVRM: Xid (PCI:{pci}): 43, {pid}, Ch 0000{k:04x}"
    return f"{at} NVRM: Xid (PCI:{pci}): 94, {pid}, Contained: SM (0x1). RST: No, D-RST: No"


def write_log(path: str, lines: int, shape: str = "realistic") -> None:
    with open(path, "w") as fh:
        fh.write("[    0.000000] Linux version 6.8.0-1015-nvidia (buildd@lcy02) #16-Ubuntu SMP\n"
                 "[   21.402138] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01\n")
        for i in range(lines - 2):
            if i % 10 == 9:
                fh.write(f"[{2000 + i * 0.004:12.6f}] mlx5_core 0000:c1:00.0: poll_health:{i // 10}: ok\n")
            else:
                fh.write(nvrm_line(i, shape) + "\n")


def _run(argv: list[str], env: dict[str, str] | None = None, into: str | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the child (user + system, from wait4), its stdout). Into a
    pipe or the file INTO, never /dev/null: GNU grep stops at the first match when its output is
    /dev/null."""
    t0 = time.perf_counter()
    out_fh = open(into, "wb") if into else None  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, env=env, stdout=out_fh or subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if out_fh:
        out_fh.close()
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime, out.decode()


def run_reader(env: dict[str, str]) -> tuple[float, float, dict]:
    wall, cpu, out = _run([sys.executable, "-c", READER], env)
    return wall, cpu, json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", type=parse_list, default=[10_000, 100_000, 800_000])
    ap.add_argument("--shape", choices=("realistic", "repeated"), default="realistic")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            path = os.path.join(tmp, f"kern-{n}.log")
            write_log(path, n, args.shape)
            size = os.path.getsize(path)
            log(f"{n:,} lines, {size / 2**20:.1f} MiB")
            base = {**clean_env(), "RECONCILE_KERNEL_LOG": path}
            grep, first, second, extra, hwm, info, tail = [], [], [], [], [], {}, {}
            grep_cpu, first_cpu = [], []
            runs = args.runs
            for r in range(runs):
                state = os.path.join(tmp, f"state-{n}-{r}")
                wall, cpu, _ = _run(["grep", "-c", "Xid", path], into=os.path.join(tmp, "grep.out"))
                grep.append(wall)
                grep_cpu.append(cpu)
                t, cpu, info = run_reader({**base, "RECONCILE_STATE_DIR": state})
                first.append(t)
                first_cpu.append(cpu)
                hwm.append(info["hwm_kib"])
                t, _, again = run_reader({**base, "RECONCILE_STATE_DIR": state})
                assert again["resumed"] and again["lines_read"] == 0, again
                second.append(t)
                with open(path, "a") as fh:  # the node goes on logging; restored below
                    fh.writelines(nvrm_line(n + i, args.shape) + "\n" for i in range(100))
                t, _, tail = run_reader({**base, "RECONCILE_STATE_DIR": state})
                extra.append(t)
                with open(path, "r+") as fh:
                    fh.truncate(size)
            floor = median(grep)
            rows.append((n, size, floor, median(first), median(second), median(extra), max(hwm), info, tail,
                         median(grep_cpu), median(first_cpu)))
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f} at the end; {args.shape} storm; medians of {args.runs}\n")
    print("| lines | file | `grep -c Xid` | first read | ratio | CPU: grep, read, ratio | second read "
          "| pass after 100 new lines | peak RSS | events | report |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, size, floor, f, s, e, hwm, info, tail, gcpu, fcpu in rows:
        print(f"| {n:,} | {size / 2**20:.1f} MiB | {floor * 1000:.0f} ms | {f * 1000:.0f} ms | {f / floor:.1f}x "
              f"| {gcpu * 1000:.0f} ms, {fcpu * 1000:.0f} ms, {fcpu / max(gcpu, 1e-3):.1f}x "
              f"| {s * 1000:.0f} ms | {e * 1000:.0f} ms ({tail['lines_read']} lines) | {hwm / 1024:.1f} MiB "
              f"| {info['events']} | {info['report_bytes'] / 1024:.1f} KiB |")


if __name__ == "__main__":
    main()
