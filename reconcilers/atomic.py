"""Writing our own small JSON files so that a reader never sees half of one: a temporary file
beside the target, then rename(2) over it. (A half-written saved plan must never be applied,
a half-written cache or check record never trusted.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(data, indent=indent, default=str)
    tmp.write_text(text + "\n" if indent is not None else text)
    os.replace(tmp, path)
