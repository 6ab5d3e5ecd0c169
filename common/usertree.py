"""The one door into a user-owned tree: a directory held by fd, every access relative to fds,
never following a symbolic link, never re-resolving a path string.

STAND-IN: the subset of the agreed API (Tree.open, subdir, lstat, entries, open_regular,
read_bounded, read_json, close) that the checkpoint layouts written beside it use, so they run
before the full module lands; the full implementation replaces this file whole.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REG = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeTree(OSError):
    """A refusal: what was found and where (relative path). str() is one clear line."""


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # file, dir, symlink, other
    size: int
    mtime_ns: int


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _parts(rel: str) -> list[str]:
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts) or rel.startswith("/"):
        raise UnsafeTree(f"{rel}: outside the tree")
    return parts


class Tree:
    """A directory of a user's tree, held by fd. Context manager."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    @classmethod
    def open(cls, path: str) -> Tree:
        return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _walk(self, parts: list[str]) -> int:
        """An fd of the directory PARTS (a new one: the caller closes it)."""
        fd = os.dup(self.fd)
        try:
            for p in parts:
                try:
                    nxt = os.open(p, _DIR, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a symbolic link, or not a folder
                        raise UnsafeTree(exc.errno, f"{'/'.join(parts)}: not a directory (a symlink?)") from None
                    raise
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def subdir(self, rel: str) -> Tree:
        parts = _parts(rel)
        return Tree(self._walk(parts), os.path.join(self.path, *parts))

    def lstat(self, rel: str) -> os.stat_result:
        parts = _parts(rel)
        if not parts:
            return os.fstat(self.fd)
        fd = self._walk(parts[:-1])
        try:
            return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        finally:
            os.close(fd)

    def entries(self, rel: str = ".") -> list[Entry]:
        fd = self._walk(_parts(rel))
        try:
            out = []
            for name in os.listdir(fd):
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                out.append(Entry(name, _kind(st.st_mode), st.st_size, st.st_mtime_ns))
            return out
        finally:
            os.close(fd)

    def open_regular(self, rel: str) -> int:
        parts = _parts(rel)
        fd = self._walk(parts[:-1])
        try:
            try:
                f = os.open(parts[-1], _REG, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise UnsafeTree(exc.errno, f"{rel}: a symbolic link") from None
                raise
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(f).st_mode):
            os.close(f)
            raise UnsafeTree(f"{rel}: not a regular file")
        return f

    def read_bounded(self, rel: str, limit: int) -> bytes:
        fd = self.open_regular(rel)
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                raise UnsafeTree(f"{rel}: {size} bytes, more than {limit}")
            chunks, got = [], 0
            while got < size:
                b = os.pread(fd, size - got, got)
                if not b:
                    break
                chunks.append(b)
                got += len(b)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def read_json(self, rel: str, limit: int = 16 << 20) -> object:
        return json.loads(self.read_bounded(rel, limit))
