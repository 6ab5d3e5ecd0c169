"""Checking files on every CPU: a small pool of forked workers, and how many to start.

A first check of a million samples is CPU work (about 20 µs a file for the structure of a
torch.save sample, docs/extractions.md#measured; the page cache's read speed for the content), so
it is split into tasks (runs of indices) that workers forked from the observer take one at a time.
The workers inherit everything the task needs (the listing, the rules) from the fork: a task
travels as its number, and its result comes back pickled. Why not multiprocessing or
concurrent.futures: their import costs more than this module, and the observer must keep its
heartbeat honest. A worker reports each file it finishes (at most 20 times a second); the observer
passes that on as its own heartbeat, so the engine's deadline still fires when the files stop
coming (a hung network mount), not when the work is merely long.

How many workers: the CPUs this process may run on (`os.sched_getaffinity`), fewer under a
cgroup CPU quota (`cpu.max`), at most NETWORK_WORKERS on a network or FUSE filesystem (decided
by statfs's f_type: each worker stuck on a server that stopped answering is a process in
D-state nobody can kill, and a file server shared by a cluster is not ours to saturate), and
$RECONCILE_CHECK_WORKERS when set (1: check in the observer itself).
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

NETWORK_WORKERS = 4
# statfs(2) f_type of filesystems whose files live elsewhere (linux/magic.h; the FUSE magic covers
# GlusterFS, virtiofs, s3fs, sshfs and every other FUSE filesystem).
NETWORK_FS = {
    0x6969: "nfs", 0xFF534D42: "cifs", 0xFE534D42: "smb2", 0x517B: "smb", 0x65735546: "fuse",
    0x00C36400: "ceph", 0x01021997: "9p", 0x5346414F: "afs", 0x6B414653: "afs", 0x73757245: "coda",
    0x564C: "ncp", 0x0BD00BD0: "lustre", 0x47504653: "gpfs", 0x20030528: "orangefs", 0x19830326: "beegfs",
    0x01161970: "gfs2", 0x7461636F: "ocfs2",
}
TICK_EVERY = 0.05  # a worker reports finished files at most this often
_TICK, _RESULT, _ERROR = b"T", b"R", b"E"
_HEAD = struct.Struct("<cII")  # kind, task number or count, payload length


def statfs_type(path: str) -> int | None:
    """statfs(2)'s f_type for the filesystem `path` is on; None when it cannot be asked."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)  # struct statfs: 120 bytes on 64-bit Linux
        if libc.statfs(os.fsencode(path), buf) != 0:
            return None
        # f_type is the first member, a __fsword_t: a C long on Linux but s390x (an unsigned int).
        return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
    except (ImportError, OSError, AttributeError):
        return None


def network_fs(path: str) -> str | None:
    """The name of the network (or FUSE) filesystem `path` is on, None for a local one; "unknown"
    when statfs cannot say (then treated as remote: the cautious side)."""
    f_type = statfs_type(path)
    if f_type is None:
        return "unknown"
    return NETWORK_FS.get(f_type)


def cpus_allowed() -> int:
    """CPUs this process may use: its affinity mask, fewer under a cgroup v2 quota on the way up."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            rel = next((line.split(":", 2)[2].strip() for line in fh if line.startswith("0::")), None)
    except OSError:
        rel = None
    while rel is not None:
        try:
            with open(f"/sys/fs/cgroup{rel.rstrip('/')}/cpu.max", encoding="ascii") as fh:
                quota, period = fh.read().split()
            if quota != "max":
                n = min(n, max(1, -(-int(quota) // int(period))))
        except (OSError, ValueError):
            pass
        if rel in ("/", ""):
            break
        rel = os.path.dirname(rel.rstrip("/")) or "/"
    return max(1, n)


def worker_count(path: str, tasks: int) -> int:
    """How many workers to check the files under `path` with, for `tasks` tasks."""
    env = os.environ.get("RECONCILE_CHECK_WORKERS", "").strip()
    if env.isdigit() and int(env) > 0:
        n = int(env)
    else:
        n = cpus_allowed()
        if n > NETWORK_WORKERS and network_fs(path):
            n = NETWORK_WORKERS
    return max(1, min(n, tasks))


class _Ticks:
    """A worker's count of finished files, sent at most every TICK_EVERY seconds."""

    def __init__(self, fd: int):
        self.fd, self.n, self.last = fd, 0, time.monotonic()

    def __call__(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= TICK_EVERY:
            self.flush(now)

    def flush(self, now: float) -> None:
        if self.n:
            _send(self.fd, _TICK, self.n)
            self.n = 0
        self.last = now


def _send(fd: int, kind: bytes, number: int, payload: bytes = b"") -> None:
    data = memoryview(_HEAD.pack(kind, number, len(payload)) + payload)
    while data:
        data = data[os.write(fd, data):]


_TASK = struct.Struct("<Id")  # task number, the hint (NaN: None)


def _serve(fn: Callable[[Any, Callable[[int], None], Any], Any], tasks: Sequence[Any], task_r: int,
           res_w: int) -> None:
    """A worker: run the tasks whose numbers arrive until the pipe closes."""
    ticks = _Ticks(res_w)
    with os.fdopen(task_r, "rb", buffering=0) as inbox:
        while True:
            raw = inbox.read(_TASK.size)
            if len(raw) < _TASK.size:
                return  # the observer is done with us, or gone
            n, hint = _TASK.unpack(raw)
            try:
                result = pickle.dumps(fn(tasks[n], ticks, None if hint != hint else hint),
                                      protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # the observer runs this task itself, where the error shows as it would serially
                ticks.flush(time.monotonic())
                _send(res_w, _ERROR, n)
                continue
            ticks.flush(time.monotonic())
            _send(res_w, _RESULT, n, result)


class _Worker:
    def __init__(self, pid: int, task_w: int, res_r: int):
        self.pid, self.task_w, self.res_r = pid, task_w, res_r
        self.buf = bytearray()
        self.outstanding: list[int] = []


def map_forked(fn: Callable[[T, Callable[[int], None], float | None], R], tasks: Sequence[T], workers: int,
               on_tick: Callable[[int], None], hint: Callable[[], float | None] = lambda: None,
               on_result: Callable[[R], None] = lambda r: None) -> list[R]:
    """[fn(task, tick, hint()) for task in tasks], on `workers` forked processes (in this process
    when 1), the results in the order of the tasks. The tasks start in their order; hint() is
    asked as each one starts (what the results so far have taught: the newest file seen), and
    on_result(r) gets each result as it comes. fn calls tick(n) as it finishes n files; on_tick(n)
    gets those counts here. A task whose worker failed or died is run here, so the result (or the
    exception) is the serial one. Call it from a process without threads (the observer child):
    fork copies only the calling thread."""
    if workers <= 1 or len(tasks) <= 1:
        out = []
        for t in tasks:
            out.append(fn(t, on_tick, hint()))
            on_result(out[-1])
        return out
    results: dict[int, R] = {}
    redo: list[int] = []
    pool: list[_Worker] = []
    sel = selectors.DefaultSelector()
    try:
        for _ in range(workers):
            pool.append(_fork(fn, tasks, pool))
        queue = list(range(len(tasks) - 1, -1, -1))  # popped from the end: task 0 first
        for w in pool:
            sel.register(w.res_r, selectors.EVENT_READ, w)
            for _ in range(2):  # one running, one waiting: no idle gap between tasks
                _give(w, queue, hint())
            _close_task_pipe(w)  # none for it (fewer tasks than workers): it exits
        live = len(pool)
        while live:
            for key, _ in sel.select():
                w = key.data
                data = os.read(w.res_r, 1 << 20)
                if not data:  # the worker exited or died: its tasks are run here
                    sel.unregister(w.res_r)
                    redo += w.outstanding
                    w.outstanding = []
                    live -= 1
                    continue
                w.buf += data
                for kind, number, payload in _frames(w):
                    if kind == _TICK:
                        on_tick(number)
                        continue
                    w.outstanding.remove(number)
                    if kind == _RESULT:
                        results[number] = pickle.loads(payload)
                        on_result(results[number])
                    else:
                        redo.append(number)
                    if not _give(w, queue, hint()):
                        _close_task_pipe(w)
        for n in sorted(redo + queue):  # what no worker finished (queue: all workers died)
            results[n] = fn(tasks[n], on_tick, hint())
            on_result(results[n])
    finally:
        sel.close()
        _stop(pool)
    return [results[n] for n in range(len(tasks))]


def _fork(fn, tasks, pool: list[_Worker]) -> _Worker:
    task_r, task_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the caller's code
        code = 1
        try:
            keep = {0, 1, 2, task_r, res_w}
            for name in os.listdir("/proc/self/fd"):  # not the observer's pipe to reconcile, nor siblings'
                if int(name) not in keep:
                    try:
                        os.close(int(name))
                    except OSError:
                        pass
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            _serve(fn, tasks, task_r, res_w)
            code = 0
        finally:
            os._exit(code)
    os.close(task_r)
    os.close(res_w)
    return _Worker(pid, task_w, res_r)


def _give(w: _Worker, queue: list[int], hint: float | None) -> bool:
    if not queue or w.task_w < 0:
        return False
    n = queue.pop()
    try:
        os.write(w.task_w, _TASK.pack(n, float("nan") if hint is None else hint))
    except OSError:  # it died: the EOF on its results pipe will tell
        queue.append(n)
        return False
    w.outstanding.append(n)
    return True


def _close_task_pipe(w: _Worker) -> None:
    if w.task_w >= 0 and not w.outstanding:
        os.close(w.task_w)  # it exits once it has read to the end
        w.task_w = -1


def _frames(w: _Worker):
    buf = w.buf
    while len(buf) >= _HEAD.size:
        kind, number, n = _HEAD.unpack_from(buf)
        if len(buf) < _HEAD.size + n:
            break
        payload = bytes(buf[_HEAD.size:_HEAD.size + n])
        del buf[:_HEAD.size + n]
        yield kind, number, payload


def _stop(pool: list[_Worker]) -> None:
    """Close every pipe and reap the workers: at most a second's wait, then SIGKILL, and one
    stuck in D-state (a hung filesystem) is left behind rather than waited for."""
    for w in pool:
        for fd in (w.task_w, w.res_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        w.task_w = w.res_r = -1
    deadline = time.monotonic() + 1.0
    waiting = {w.pid for w in pool}
    while waiting:
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                waiting.discard(pid)
        if not waiting:
            break
        if time.monotonic() >= deadline:
            for pid in waiting:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
            for pid in list(waiting):
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            break
        time.sleep(0.002)


__all__ = ["map_forked", "worker_count", "network_fs", "cpus_allowed", "statfs_type", "NETWORK_WORKERS"]
