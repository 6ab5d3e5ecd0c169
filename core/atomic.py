"""The one way reconcile writes a file of its own whole: a file under a name nobody can predict,
made `O_CREAT | O_EXCL | O_NOFOLLOW` in the target's directory held by fd (mkstemp(3)'s rule: a
link or a file planted at a guessed name is never written through), written and fsync'd, renamed
over the target with renameat(2), then the directory fsync'd. A reader never sees half a file,
and after a crash the target is the old file or the new one, never an empty one (ext4 and XFS may
otherwise commit the rename before the data). A half-written saved plan must never be applied, a
half-written cache or check record never trusted, a `latest` pointer never left empty.

Mode 0600 unless the caller says otherwise (only what another program must read: the Prometheus
textfile, 0644); directories reconcile makes for itself are 0700. Files in a tree another user
owns are written through common/usertree.py instead.

The temporary name starts with a dot and ends in `.tmp`: node_exporter's textfile collector
(only `*.prom`) and the checkpoint layouts (checkpoints/layouts.py TEMP_NAME) skip it."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in this directory durable."""
    fd = os.open(os.fspath(path) or ".", _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: str, mode: int = 0o700) -> None:
    """reconcile's own directories: made 0700 (os.makedirs applies MODE to each one it creates)."""
    os.makedirs(path, mode=mode, exist_ok=True)


def make_unique(name: str, make: Callable[[str], T]) -> tuple[str, T]:
    """MAKE(tmp) under a temporary name for NAME that nobody can predict (mkstemp(3)'s rule: random,
    and MAKE creates it exclusively), tried again on the rare clash. The one naming rule of every
    temporary file or link reconcile makes, here and in a user's tree (common/usertree.py)."""
    for _ in range(16):
        tmp = f".{name}.reconcile-{os.urandom(8).hex()}.tmp"  # secrets.token_hex's bytes, without its imports
        try:
            return tmp, make(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name for {name}")


def write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o600) -> None:
    """Replace PATH with DATA, atomically and durably (see the module's docstring)."""
    path = os.fspath(path)
    parent, name = os.path.split(path)
    make_dirs(parent or ".", 0o700 if not mode & 0o044 else 0o755)  # a textfile's folder stays readable
    dfd = os.open(parent or ".", _DIR_FLAGS)
    try:
        tmp, fd = make_unique(name, lambda t: os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                                      | os.O_CLOEXEC, mode, dir_fd=dfd))
        try:
            os.fchmod(fd, mode)  # the umask does not decide who may read it
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_text(path: str | os.PathLike, text: str, *, mode: int = 0o600) -> None:
    write_bytes(path, text.encode("utf-8", "surrogateescape"), mode=mode)


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = None, mode: int = 0o600) -> None:
    text = json.dumps(data, indent=indent, default=str)
    write_text(path, text + "\n" if indent is not None else text, mode=mode)
