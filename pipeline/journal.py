"""The apply journal (one JSON line per action) and the lock that keeps two applies apart.

Both live in one directory: /var/lib/reconcile as root, the XDG state directory
otherwise. The journal is the recovery timeline a post-mortem reads.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from .contract import utc_iso
from .paths import default_journal_path


class Journal:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._opened = False
        self.skipped: list[int] = []

    @classmethod
    def at(cls, path: str | os.PathLike | None) -> Journal:
        """The journal at PATH (`--journal`), else the default one."""
        return cls(Path(path or default_journal_path()))

    @property
    def lock_path(self) -> Path:
        """The apply lock sits beside the journal: one per journal directory."""
        return self.path.parent / "lock"

    def lock(self) -> Lock:
        return Lock(self.lock_path)

    def __call__(self, entry: dict[str, Any]) -> None:
        """Append one line and fsync it before returning: a line the caller was told is written
        survives a crash. OSError (ENOSPC, EROFS, EACCES, ...) is the caller's to handle: the engine
        refuses to act without a record."""
        line = (json.dumps(entry, sort_keys=False, default=str) + "\n").encode()
        if not self._opened:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND writes of one line are not interleaved with another writer's.
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)  # read: the torn-line check
        try:
            if not self._opened:
                line = self._after_torn_line(fd) + line
            written = os.write(fd, line)
            if written != len(line):  # a short write: the disk filled up under us
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
            self._opened = True
        finally:
            os.close(fd)

    def _after_torn_line(self, fd: int) -> bytes:
        """A journal whose last line has no newline was cut short by a crash while writing it: the
        new line must not be glued onto it. Returns the newline that ends it (and warns once)."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return b""
        import sys

        print(f"reconcile: warning: {self.path}: its last line is incomplete (a crash while it was written?); "
              "it is kept and skipped by readers", file=sys.stderr)
        return b"\n"

    def read(self) -> list[dict[str, Any]]:
        """Every complete line, in order. A line that does not parse (the torn last line of a crash)
        is skipped with a warning on stderr, and listed in `self.skipped` (1-based line numbers)."""
        self.skipped = []
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return []
        entries = []
        for number, raw in enumerate(data.split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
            except ValueError:
                entry = None
            if not isinstance(entry, dict):
                self.skipped.append(number)
                continue
            entries.append(entry)
        if self.skipped:
            import sys

            last = data.count(b"\n") + (not data.endswith(b"\n"))
            what = "its last line is torn" if self.skipped == [last] else f"line(s) {self.skipped} do not parse"
            print(f"reconcile: warning: {self.path}: {what}; skipped", file=sys.stderr)
        return entries


class LockError(Exception):
    """The lock could not be taken; the message says why."""


class LockHeld(LockError):
    """Another process holds the lock."""


class Lock:
    """An exclusive fcntl lock on `<dir>/lock`; the holder writes its PID and start time into it.

    The kernel drops the lock when the holder dies, so a crashed apply never leaves a stale lock
    behind. A second, short-lived lock on `<dir>/lock.gate` is held while the lock is tried and
    its holder's name written (or erased on release): whoever finds the lock taken reads the name
    under the gate too, so it never reads the file between the holder's flock and its write
    ("holder unknown").
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.gate_path = self.path.with_name(self.path.name + ".gate")
        self.fd: int | None = None

    def _open(self, path: Path) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LockError(f"cannot take the lock {path}: {exc.strerror}") from None

    def acquire(self, timeout: float = 0.0, poll: float = 0.1) -> None:
        """Take the lock, waiting up to `timeout`. LockHeld when another process holds it,
        LockError when the lock file cannot be used at all."""
        fd = self._open(self.path)
        try:
            gate = self._open(self.gate_path)
        except LockError:
            os.close(fd)
            raise
        deadline = time.monotonic() + timeout
        try:
            while True:
                fcntl.flock(gate, fcntl.LOCK_EX)  # held for microseconds by whoever has it
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise LockError(f"cannot take the lock {self.path}: {exc.strerror}") from None
                    holder = self._holder(fd)  # written under the gate: complete
                    fcntl.flock(gate, fcntl.LOCK_UN)
                    if time.monotonic() >= deadline:
                        waited = f" after waiting {timeout:g}s" if timeout else ""
                        raise LockHeld(f"another reconcile apply holds {self.path}{waited}: {holder}") from None
                    time.sleep(poll)
                    continue
                os.ftruncate(fd, 0)
                info = {"pid": os.getpid(), "started": utc_iso()}
                os.pwrite(fd, json.dumps(info).encode() + b"\n", 0)
                fcntl.flock(gate, fcntl.LOCK_UN)
                self.fd, fd = fd, -1
                return
        finally:
            if fd >= 0:
                os.close(fd)
            os.close(gate)

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
            return f"pid {info['pid']}, started {info['started']}"
        except (ValueError, KeyError, TypeError, OSError):
            return "holder unknown"

    def release(self) -> None:
        if self.fd is None:
            return
        gate = None
        try:
            gate = os.open(self.gate_path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(gate, fcntl.LOCK_EX)
        except OSError:
            pass  # without the gate, a reader may find the name erased: it says "holder unknown"
        try:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None
            if gate is not None:
                os.close(gate)

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
