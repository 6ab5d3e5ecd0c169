"""The apply journal (one JSON line per action) and the lock that keeps two applies apart.

Both live in one directory: /var/lib/reconcile as root, the XDG state directory
otherwise. The journal is the recovery timeline a post-mortem reads.

They are reconcile's own files: made 0600 (the journal records what was observed: unit, file
and process names, messages), opened without following a symlink, and refused (UnsafeOwnFile,
one line) when another user owns them or may write them. Their directory is made 0700 when
missing, and the default one (the state directory) must be reconcile's own (core/paths.py
own_dir); a directory given with --journal is the caller's choice.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.contract import utc_iso
from ..core.paths import UnsafeOwnFile, check_own, default_journal_path, own_dir

FILE_MODE = 0o600


def open_own(path: str | os.PathLike, flags: int) -> int:
    """One of reconcile's own files in its directory: created 0600, never through a symlink,
    refused (UnsafeOwnFile) when another user owns it or may write it; an older reconcile's
    0644 file is made 0600."""
    path = os.fspath(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeOwnFile(path, "a symlink stands where reconcile keeps its own file: refusing to follow it") \
                from None
        raise
    try:
        st = check_own(fd, path)
        if st.st_mode & 0o077:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def own_parent(path: str | os.PathLike) -> None:
    """The directory of the journal or the lock: made 0700 when missing; the default one (the
    state directory) checked as reconcile's own whether or not it was just made."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(parent) and parent != os.path.dirname(default_journal_path()):
        return  # --journal's directory, which exists: the caller's choice
    os.close(own_dir(parent))

# Bounded growth: a journal is rotated when it reaches MAX_BYTES or its first line is MAX_AGE_S old,
# keeping KEEP rotated files (logrotate's `size`, `maxage`, `rotate`); $RECONCILE_JOURNAL_MAX_BYTES,
# $RECONCILE_JOURNAL_MAX_AGE (a duration, 0 = never by age) and $RECONCILE_JOURNAL_KEEP override them.
MAX_BYTES, MAX_AGE_S, KEEP = 32 << 20, 90 * 86400.0, 8
# An observation's lists beyond this many items (an extraction's missing ranges, thousands of files)
# are summarised in the journal: the first items and how many more.
MAX_LIST_ITEMS = 32


@dataclass(frozen=True)
class Rotation:
    """When the journal is rotated and how many old files are kept."""

    max_bytes: int = MAX_BYTES
    max_age_s: float = MAX_AGE_S
    keep: int = KEEP

    @classmethod
    def from_env(cls) -> Rotation:
        from ..core.values import parse_duration

        env = os.environ
        try:
            return cls(int(env.get("RECONCILE_JOURNAL_MAX_BYTES", MAX_BYTES)),
                       parse_duration(env["RECONCILE_JOURNAL_MAX_AGE"]) if env.get("RECONCILE_JOURNAL_MAX_AGE")
                       else MAX_AGE_S, int(env.get("RECONCILE_JOURNAL_KEEP", KEEP)))
        except (ValueError, TypeError):
            return cls()  # a bad override never stops the journal: the defaults hold

    def due(self, fd: int) -> bool:
        size = os.fstat(fd).st_size
        if size == 0:
            return False
        if self.max_bytes and size >= self.max_bytes:
            return True
        if not self.max_age_s:
            return False
        from .journal_read import parse_time

        head = os.pread(fd, 4096, 0).split(b"\n", 1)[0]
        try:
            first = parse_time(json.loads(head).get("time"))
        except (ValueError, AttributeError):
            return False
        return first is not None and time.time() - first >= self.max_age_s


def compact(value: Any, depth: int = 0) -> Any:
    """VALUE with every list longer than MAX_LIST_ITEMS cut to its first items and a note of how
    many more: the journal records what was seen, not every one of 18,913 missing indices."""
    if isinstance(value, dict):
        return {k: compact(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [compact(v, depth + 1) for v in value[:MAX_LIST_ITEMS]]
        if len(value) > MAX_LIST_ITEMS:
            items.append(f"... {len(value) - MAX_LIST_ITEMS} more ({len(value)} in all)")
        return items
    return value


class Journal:
    def __init__(self, path: Path, rotation: Rotation | None = None):
        self.path = Path(path)
        self._opened = False
        self.skipped: list[int] = []
        self.rotation = rotation or Rotation.from_env()

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
        refuses to act without a record. The file is rotated first when it is over its size or age
        (`Rotation`): the line goes into the new file, whole."""
        line = (json.dumps(compact(entry), sort_keys=False, default=str) + "\n").encode()
        if not self._opened:
            own_parent(self.path)
        fd = self._open_locked()
        try:
            if self.rotation.due(fd):
                fd = self._rotate(fd)
            if not self._opened:
                line = self._after_torn_line(fd) + line
            # O_APPEND writes of one line are not interleaved with another writer's.
            written = os.write(fd, line)
            if written != len(line):  # a short write: the disk filled up under us
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
            self._opened = True
        finally:
            os.close(fd)

    def _open_locked(self) -> int:
        """The journal open for appending, under an exclusive flock held until it is closed, and
        still the file at `path` (another writer may have rotated it while we waited)."""
        while True:
            fd = open_own(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)  # read: the torn-line check
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def _rotate(self, fd: int) -> int:
        """journal.jsonl.N-1 -> .N, ..., journal.jsonl -> .1 (the oldest beyond `keep` removed),
        under the flock of the current file: a writer waiting for it finds the name moved and
        opens the new file. Returns the new file, open and locked."""
        keep = max(1, self.rotation.keep)  # the file just closed is always kept
        names = [self.path.with_name(f"{self.path.name}.{n}") for n in range(1, keep + 1)]
        try:
            os.unlink(names[-1])
        except FileNotFoundError:
            pass
        for older, newer in zip(reversed(names[1:]), reversed(names[:-1]), strict=True):
            try:
                os.rename(newer, older)
            except FileNotFoundError:
                pass
        os.rename(self.path, names[0])
        os.close(fd)
        self._opened = True  # the old file's last line was checked (or is old news); the new one is empty
        return self._open_locked()

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
        """Every complete line, oldest first, across the rotated files (journal.jsonl.N ... .1, then
        journal.jsonl). A line that does not parse (the torn last line of a crash) is skipped with a
        warning on stderr, and listed in `self.skipped` (1-based line numbers in the current file)."""
        from .journal_read import rotated_files

        entries: list[dict[str, Any]] = []
        for path in reversed(rotated_files(self.path)):
            entries.extend(self._read_one(path))
        return entries

    def _read_one(self, path: Path) -> list[dict[str, Any]]:
        skipped = []
        try:
            with open(path, "rb") as fh:
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
                skipped.append(number)
                continue
            entries.append(entry)
        if path == self.path:
            self.skipped = skipped
        if skipped:
            import sys

            last = data.count(b"\n") + (not data.endswith(b"\n"))
            what = "its last line is torn" if skipped == [last] else f"line(s) {skipped} do not parse"
            print(f"reconcile: warning: {path}: {what}; skipped", file=sys.stderr)
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
            own_parent(path)
            return open_own(path, os.O_RDWR | os.O_CREAT)
        except UnsafeOwnFile as exc:
            raise LockError(f"cannot take the lock: {exc}") from None
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
                info = {"pid": os.getpid(), "started": utc_iso()}
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, json.dumps(info).encode() + b"\n", 0)
                except OSError:
                    pass  # who holds it only words a message; the flock is the lock (on a full disk the
                    # journal's own first write refuses every action, with its reason)
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
            gate = open_own(self.gate_path, os.O_RDWR | os.O_CREAT)
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
