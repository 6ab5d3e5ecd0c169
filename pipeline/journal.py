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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(entry, sort_keys=False, default=str) + "\n"
        # O_APPEND writes of one line are not interleaved with another writer's.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                return [json.loads(line) for line in fh if line.strip()]
        except FileNotFoundError:
            return []


class LockError(Exception):
    """The lock could not be taken; the message says why."""


class LockHeld(LockError):
    """Another process holds the lock."""


class Lock:
    """An exclusive fcntl lock on `<dir>/lock`; the holder writes its PID and start time into it.

    The kernel drops the lock when the holder dies, so a crashed apply never leaves a
    stale lock behind.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self, timeout: float = 0.0, poll: float = 0.1) -> None:
        """Take the lock, waiting up to `timeout`. LockHeld when another process holds it,
        LockError when the lock file cannot be used at all."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LockError(f"cannot take the lock {self.path}: {exc.strerror}") from None
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise LockError(f"cannot take the lock {self.path}: {exc.strerror}") from None
                if time.monotonic() >= deadline:
                    holder = self._holder(fd)
                    os.close(fd)
                    waited = f" after waiting {timeout:g}s" if timeout else ""
                    raise LockHeld(f"another reconcile apply holds {self.path}{waited}: {holder}") from None
                time.sleep(poll)
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "started": utc_iso()}
        os.pwrite(fd, json.dumps(info).encode() + b"\n", 0)
        self.fd = fd

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
            return f"pid {info['pid']}, started {info['started']}"
        except (ValueError, KeyError, OSError):
            return "holder unknown"

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
