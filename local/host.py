"""The local machine, as core.host.Host: run a command with a deadline, read a file, signal a
process, fork an observer child and read it to its deadline.

Reconcilers never call subprocess/os directly for host access: they are handed a Host, so a
test double or a remote run changes one place.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import IO, Any, TypeVar

from ..core.boot import boot_id
from ..core.host import CommandResult, CommandTimeout, ProgressSink

__all__ = ["ForkedChild", "LocalHost", "collect_children", "kill_group", "split_beats"]

K = TypeVar("K")
# What a child writes for a heartbeat; a pickle (protocol >= 2) never starts with it.
HEARTBEAT = b"."
# A progress record from a child: PROGRESS + JSON [what, done, total, unit] + newline (done null:
# that work is over). It counts as a heartbeat too.
PROGRESS = b"\x01"


def split_beats(data: bytes) -> tuple[list[tuple[str, float | None, float | None, str]], bytes, bool]:
    """The heartbeats and progress records at the start of what a child wrote: (the progress
    records, the rest, whether the rest has begun: its answer). An incomplete record at the end
    is left in the rest, with False."""
    import json

    records = []
    pos = 0
    while pos < len(data):
        c = data[pos:pos + 1]
        if c == HEARTBEAT:
            pos += 1
            continue
        if c != PROGRESS:
            return records, data[pos:], True
        end = data.find(b"\n", pos)
        if end < 0:
            break
        try:
            what, done, total, unit = json.loads(data[pos + 1:end])
            records.append((str(what), done, total, str(unit)))
        except (ValueError, TypeError):
            pass
        pos = end + 1
    return records, data[pos:], False


class ForkedChild:
    """A child from Host.fork_call, with the parts of Popen's interface a poller needs."""

    def __init__(self, pid: int, stdout: IO[bytes]):
        self.pid, self.stdout = pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        if self.poll() is not None:
            return self.returncode
        # A pidfd (Linux 5.3) is readable once the child has exited: no sleeping between polls,
        # which a child that has just closed its pipe would otherwise cost (it exits a moment later).
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # an older kernel, or it is already reaped
            pass
        else:
            import select

            try:
                waiter = select.poll()
                waiter.register(fd, select.POLLIN)
                waiter.poll(None if timeout is None else max(0, int(timeout * 1000)))
            finally:
                os.close(fd)
            return self.poll()
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0005  # a child that has closed its pipe is exiting: the first polls are short
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        return self.returncode


_ABANDONED: list[ForkedChild] = []


def collect_children(children: Mapping[K, tuple[ForkedChild, float]],
                     idle: Mapping[K, float] | None = None,
                     progress: ProgressSink | None = None) -> dict[K, tuple[bytes, bool]]:
    """Read every child's pipe at once, each to EOF or to its own deadline (time.monotonic()).

    With `idle[key]`, whatever the child writes (a heartbeat) moves its deadline to at least
    that many seconds later: a long job that keeps making progress is not cut short, a stuck
    one still is. Progress records (Host.progress in the child) go to `progress` as they come.
    Returns, per key, what the child wrote and whether it finished (EOF before its deadline).
    A child past its deadline is sent SIGKILL and abandoned: never waited for, since one in
    D-state (a hung filesystem, a wedged driver) can neither die nor be reaped; so this
    returns by the latest deadline whatever state the children are in."""
    import selectors

    # Children abandoned by earlier calls that have died since: reaped now, so a long-lived
    # caller (`reconcile watch`) does not collect zombies. Only by their own pid: a wait for any
    # child would take the exit status of a subprocess.Popen child from under it.
    _ABANDONED[:] = [c for c in _ABANDONED if c.poll() is None]
    idle = idle or {}
    deadlines = {key: deadline for key, (_, deadline) in children.items()}
    chunks: dict[K, list[bytes]] = {key: [] for key in children}
    unread: dict[K, bytes | None] = {key: b"" for key in children}  # beats not yet parsed (progress only)
    done: dict[K, tuple[bytes, bool]] = {}
    sel = selectors.DefaultSelector()
    for key, (child, _) in children.items():
        os.set_blocking(child.stdout.fileno(), False)
        sel.register(child.stdout, selectors.EVENT_READ, key)
    open_ = set(children)
    while open_:
        wait = max(0.0, min(deadlines[k] for k in open_) - time.monotonic())
        # What the children wrote meanwhile is read before any of them is judged late: a caller
        # that comes to collect late (busy building the rest of the state) must not cut short a
        # child whose heartbeats or answer sit unread in its pipe.
        for sel_key, _ in sel.select(timeout=wait):
            key = sel_key.data
            data = os.read(sel_key.fileobj.fileno(), 65536)
            if data:
                chunks[key].append(data)
                if progress is not None and unread[key] is not None:
                    records, rest, answering = split_beats(unread[key] + data)
                    unread[key] = None if answering else rest
                    for record in records:
                        progress(*record)
                if key in idle:
                    deadlines[key] = max(deadlines[key], time.monotonic() + idle[key])
                continue
            # EOF: the child has written all it will and is exiting; reap it if it is gone.
            open_.discard(key)
            sel.unregister(sel_key.fileobj)
            sel_key.fileobj.close()
            children[key][0].wait(timeout=1.0)  # reaped, so a long-lived caller (watch) leaves no zombies
            done[key] = (b"".join(chunks[key]), True)
        now = time.monotonic()
        for key in [k for k in open_ if deadlines[k] <= now]:
            child = children[key][0]
            open_.discard(key)
            sel.unregister(child.stdout)
            child.stdout.close()
            try:
                child.kill()  # our own child; it dies now or when the kernel lets it
            except OSError:
                pass
            _ABANDONED.append(child)
            done[key] = (b"".join(chunks[key]), False)
    sel.close()
    return done


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a child started with start_new_session=True and its whole process group, then
    reap it for at most 2 s: a child in D-state cannot die, so abandon it rather than hang."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        pass


# The parent of a job started with a status file (Host.spawn_detached): runs the command (its
# exec errors come back as "ERRNO text", as Popen raises them), sends its pid, waits for it and
# writes how it ended, atomically. Run with -I -S: nothing of the environment's site is imported.
_REAPER = """
import json, os, subprocess, sys
w, status, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
try:
    p = subprocess.Popen(argv)
except OSError as e:
    os.write(w, f"{e.errno or 0} {e.strerror or e}".encode())
    sys.exit(127)
os.write(w, f"pid {p.pid}".encode())
os.close(w)
rc = p.wait()
with open(status + ".tmp", "w") as f:
    json.dump({"pid": p.pid, "returncode": rc}, f)
os.replace(status + ".tmp", status)
"""


class LocalHost:
    """The machine reconcile runs on: core.host.Host, implemented."""

    def __init__(self) -> None:
        # Set by the engine in a child that observes with a deadline (see heartbeat).
        self.heartbeat_to: IO[bytes] | None = None
        self._last_beat = 0.0
        # Set by the command line when it shows progress (views/progress.py): what Host.progress
        # says in this process, and what observer children say, goes there.
        self.on_progress: ProgressSink | None = None
        self._last_progress = 0.0

    def heartbeat(self) -> None:
        """Say "still making progress" from a long observation (one directory listed, one file
        checked): in a child observing with a deadline it moves the deadline on; elsewhere it
        does nothing. At most 20 writes a second, however often it is called."""
        if self.heartbeat_to is None:
            return
        now = time.monotonic()
        if now - self._last_beat >= 0.05:
            self._last_beat = now
            self.heartbeat_to.write(HEARTBEAT)

    def progress(self, what: str, done: float, total: float | None = None, unit: str = "") -> None:
        """Say how far a long piece of work has come (`unit` "s": seconds waited, of `total`).
        In a child observing with a deadline it goes to the parent, at most 10 times a second,
        and counts as a heartbeat; in the reconcile process, to the progress line when one is
        shown; elsewhere nowhere."""
        if self.heartbeat_to is not None:
            now = time.monotonic()
            if now - self._last_progress >= 0.1:
                self._last_progress = self._last_beat = now
                self._send_progress(what, done, total, unit)
        elif self.on_progress is not None:
            self.on_progress(what, done, total, unit)

    def _send_progress(self, what: str, done: float | None, total: float | None, unit: str) -> None:
        import json

        assert self.heartbeat_to is not None
        self.heartbeat_to.write(PROGRESS + json.dumps([what, done, total, unit]).encode() + b"\n")

    def run(self, argv: list[str] | tuple[str, ...], timeout: float = 30.0, env: dict | None = None,
            input: str | None = None) -> CommandResult:
        """Run a command to completion or kill it at the deadline.

        The child gets its own session so the kill reaches its whole process group.
        A child stuck in D-state cannot die; we wait a bounded 2 s after the kill
        and abandon it rather than hang with it.
        """
        full = tuple(argv)
        try:
            proc = subprocess.Popen(full, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=env, start_new_session=True)
        except FileNotFoundError as exc:
            return CommandResult(tuple(full), 127, "", f"{full[0]}: command not found ({exc.strerror})")
        started = time.monotonic()
        step = timeout if self.on_progress is None else min(timeout, 0.5)
        shown = ""
        try:
            while True:
                try:
                    out, err = proc.communicate(input=input, timeout=step)
                    break
                except subprocess.TimeoutExpired:
                    waited = time.monotonic() - started
                    if waited >= timeout or self.on_progress is None:
                        kill_group(proc)
                        raise CommandTimeout(f"`{' '.join(full)}` did not finish within {timeout:g}s") from None
                    # A long command (a unit's stop: its ExecStop, its TimeoutStopSec) on the progress line.
                    shown = f"waiting for `{' '.join(argv)}`"
                    self.on_progress(shown, waited, timeout, "s")
                    step = min(0.5, max(0.01, timeout - waited))
        finally:
            if shown and self.on_progress is not None:
                self.on_progress(shown, None, None, "")
        return CommandResult(tuple(full), proc.returncode, out, err)

    def fork_call(self, fn: Callable[..., None], *args: Any) -> ForkedChild:
        """Run `fn(*args, out)` in a forked child and return at once, for a caller that reads
        `out` (a pipe) to its own deadline and may abandon the child: one in D-state on a hung
        filesystem can neither be killed nor waited for. A fork costs about a millisecond where
        starting an interpreter costs a hundred. The child's stdin/stdout/stderr are /dev/null
        and it keeps no other descriptor of ours, so an abandoned child holds none of our
        streams (a caller reading our output would otherwise never see EOF)."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            # The objects shared with the parent are left to the parent: the child's collector never
            # scans them (no copy-on-write of every page they sit on), and collects its own cycles,
            # whatever the parent chose (commands.run_diff turns its collector off).
            gc.freeze()
            gc.enable()
            try:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                for name in os.listdir("/proc/self/fd"):
                    if int(name) > 2 and int(name) != write_fd:
                        try:
                            os.close(int(name))
                        except OSError:
                            pass
                with os.fdopen(write_fd, "wb", buffering=0) as out:
                    fn(*args, out)
            finally:
                os._exit(0)
        os.close(write_fd)
        return ForkedChild(pid, os.fdopen(read_fd, "rb", buffering=0))

    def collect(self, children: Mapping[K, tuple[ForkedChild, float]],
                idle: Mapping[K, float] | None = None) -> dict[K, tuple[bytes, bool]]:
        """Read what forked children (fork_call) wrote, each to its own deadline: collect_children."""
        return collect_children(children, idle)

    def spawn_detached(self, argv: list[str] | tuple[str, ...], log_path: str, cwd: str | None = None,
                       status_path: str | None = None) -> int:
        """Start a long-running command detached from us and return its pid, not waiting for it:
        its own session (no terminal signals reach it, it outlives us), stdin from /dev/null,
        stdout and stderr appended to `log_path`.

        With `status_path`, a small reaper (this Python, `_REAPER`) is the command's parent: it
        waits for the command and writes `{"pid", "returncode"}` there when it ends (negative: the
        signal that killed it), so a later observation can say how a job ended, which only a
        parent can learn (waitpid). The pid returned is still the command's own."""
        full = tuple(argv)
        if status_path is None:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        cwd=cwd, start_new_session=True, close_fds=True)
            return proc.pid
        import sys

        r, w = os.pipe()
        try:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER, str(w), status_path, *full],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                        start_new_session=True, close_fds=True, pass_fds=(w,))
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        answer = self._reaper_answer(r, proc)
        if answer.startswith("pid "):
            return int(answer[4:])
        proc.wait()
        code, _, why = answer.partition(" ")
        raise OSError(int(code) if code.isdigit() else 0, why or f"the job's reaper exited {proc.returncode}")

    @staticmethod
    def _reaper_answer(r: int, proc: subprocess.Popen, timeout: float = 60.0) -> str:
        """What the reaper writes once the command has exec'd (its pid) or failed to (the error),
        read to end of file within `timeout`: a reaper that never answers is killed, not waited for."""
        import select

        deadline = time.monotonic() + timeout
        data = b""
        with os.fdopen(r, "rb", buffering=0) as said:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([said], [], [], left)[0]:
                    proc.kill()
                    proc.wait()
                    raise OSError(0, f"the job's reaper did not answer within {timeout:g}s")
                chunk = said.read(4096)
                if not chunk:
                    return data.decode(errors="replace")
                data += chunk

    def which(self, name: str) -> str | None:
        from shutil import which

        return which(name)

    def read_text(self, path: str) -> str:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read()

    def hostname(self) -> str:
        return os.uname().nodename  # gethostname(2) without importing socket (~6 ms)

    def machine(self) -> dict[str, str | None]:
        """Which machine this is: its hostname, systemd's /etc/machine-id (machine-id(5): written
        once at install, so a recreated VM has a new one) and the kernel's boot id
        (proc(5): /proc/sys/kernel/random/boot_id, new at every boot). What cannot be read is
        None, never a made-up value. $RECONCILE_MACHINE_ID_FILE and $RECONCILE_BOOT_ID_FILE name other
        files (tests; core/boot.py, which every record keyed by the boot reads)."""
        return {"hostname": self.hostname(),
                "machine_id": _first_line(os.environ.get("RECONCILE_MACHINE_ID_FILE") or "/etc/machine-id"),
                "boot_id": boot_id()}

    def signal(self, pid: int, sig: int, starttime: int | None = None) -> None:
        """Signal PID; with STARTTIME (/proc/PID/stat field 22), only the process that started then:
        ProcessLookupError when PID is gone or now names another process.

        Through a pidfd (pidfd_open(2), Linux 5.3; pidfd_send_signal(2), 5.1): the fd pins the
        process, so the start time read after opening it is that process's, and the signal cannot
        reach a stranger that took the PID in between (kill(2) by number can). Where the kernel or
        Python lacks them, kill(2) right after the same check: the window is the two calls'."""
        # The last line of defence for "never PID 1, never ourselves", whatever a plan says.
        if pid <= 1 or pid == os.getpid() or pid == os.getppid():
            raise PermissionError(f"refusing to signal pid {pid}")
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError) as exc:
            if isinstance(exc, ProcessLookupError):
                raise
            fd = -1  # no pidfd here (ENOSYS, an old Python): kill(2) below
        try:
            if starttime is not None and _starttime(pid) != starttime:
                raise ProcessLookupError(f"pid {pid} is no longer the process that started at {starttime}")
            if fd >= 0 and hasattr(signal, "pidfd_send_signal"):
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)
        finally:
            if fd >= 0:
                os.close(fd)

    def pid_alive(self, pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie still answers kill(0); it holds nothing any more.
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, IndexError):
            return False

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _starttime(pid: int) -> int | None:
    """/proc/PID/stat's starttime (field 22: clock ticks after boot), None when PID is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (IndexError, ValueError):
        return None


def _first_line(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.readline().strip() or None
    except OSError:
        return None
