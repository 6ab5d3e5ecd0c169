"""Writing our own small JSON files so that a reader never sees half of one: a temporary file
beside the target, then rename(2) over it. (A half-written saved plan must never be applied,
a half-written cache or check record never trusted.)"""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = None) -> None:
    path = os.fspath(path)
    parent, name = os.path.split(path)
    os.makedirs(parent or ".", exist_ok=True)
    tmp = os.path.join(parent, f".{name}.{os.getpid()}.tmp")
    text = json.dumps(data, indent=indent, default=str)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text + "\n" if indent is not None else text)
    os.replace(tmp, path)


def write_text(path: str | os.PathLike, text: str) -> None:
    """The same for a text file another program reads (node_exporter's textfile collector): the
    temporary name starts with a dot and ends in `.tmp`, which such readers skip."""
    path = os.fspath(path)
    parent, name = os.path.split(path)
    os.makedirs(parent or ".", exist_ok=True)
    tmp = os.path.join(parent, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
