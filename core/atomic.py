"""The one way reconcile writes a file of its own whole: a temporary file beside the target,
written and fsync'd, renamed over the target (rename(2)), then the directory fsync'd. A reader
never sees half a file, and after a crash the target is the old file or the new one, never an
empty one (ext4 and XFS may otherwise commit the rename before the data). A half-written saved
plan must never be applied, a half-written cache or check record never trusted, a `latest`
pointer never left empty.

The temporary name starts with a dot and ends in `.tmp`: node_exporter's textfile collector
(only `*.prom`) and the checkpoint layouts (checkpoints/layouts.py TEMP_NAME) skip it."""

from __future__ import annotations

import json
import os
from typing import Any


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in this directory durable."""
    fd = os.open(os.fspath(path) or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace PATH with DATA, atomically and durably (see the module's docstring)."""
    path = os.fspath(path)
    parent, name = os.path.split(path)
    os.makedirs(parent or ".", exist_ok=True)
    tmp = os.path.join(parent, f".{name}.reconcile-{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(parent or ".")


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8", "surrogateescape"))


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = None) -> None:
    text = json.dumps(data, indent=indent, default=str)
    write_text(path, text + "\n" if indent is not None else text)
