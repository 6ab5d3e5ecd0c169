"""How many bytes a command and every process it starts read: the kernel's own I/O accounting.

`/proc/PID/io` of a process counts its own reads, and the kernel adds to it those of each child
it reaps (kernel/exit.c wait_task_zombie: the child's `ioac` and its own reaped children's go to
the parent's signal struct). So a small parent that starts the command, reaps it and every
process left over, then reads its own `/proc/self/io`, has the whole tree's reads, with nothing
intercepted (no strace, no LD_PRELOAD) — the forked observer child of `reconcile diff`
included. The parent makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so a
grandchild left running by its parent is reparented to it, reaped by it, and counted too.

`rchar`: the bytes read(2)/pread(2)/preadv(2) returned, from the page cache or the disk alike
(what reconcile asked for: the measure of "read again"); `read_bytes`: what the storage layer
fetched (0 from a warm page cache). Used by tests/test_checkpoints_records.py and
bench/bench_checkpoints.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

COUNTER = r"""
import ctypes, json, os, resource, subprocess, sys, time
PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
def io():
    with open("/proc/self/io") as fh:
        return {k: int(v) for k, v in (line.split(": ") for line in fh.read().splitlines())}
before = io()
t0 = time.perf_counter()
rc = subprocess.call(sys.argv[2:])
while True:  # every process left over (reparented to us): reaped, so its reads are counted
    try:
        os.wait()
    except ChildProcessError:
        break
wall = time.perf_counter() - t0
after = io()
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as fh:
    cpu = ru.ru_utime + ru.ru_stime
    json.dump({"rc": rc, "wall_s": wall, "cpu_s": cpu, **{k: after[k] - before[k] for k in after}}, fh)
"""


@dataclass(frozen=True)
class Counted:
    returncode: int
    stdout: str
    stderr: str
    rchar: int  # bytes the tree's reads returned
    read_bytes: int  # bytes fetched from storage
    wall_s: float = 0.0  # from the start of the command to the last process reaped
    cpu_s: float = 0.0  # user + system CPU of the whole tree


def run_counted(argv: list[str], env: dict[str, str], cwd: str, result: str, timeout: float = 300) -> Counted:
    """Run argv under the counting parent; `result` is a scratch file for its figures."""
    proc = subprocess.run([sys.executable, "-c", COUNTER, result, *argv], capture_output=True, text=True,
                          errors="replace", env=env, cwd=cwd, timeout=timeout)
    with open(result) as fh:
        got = json.load(fh)
    return Counted(got["rc"], proc.stdout, proc.stderr, got["rchar"], got["read_bytes"], got["wall_s"], got["cpu_s"])
