"""The check record of each extraction (`NAME.check.json` in the state directory): what the
last observation learnt, read back (see the package docstring)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from .ranges import valid_ranges

# Format 4 adds `unproven` (safetensors files whose zero tail cannot be judged); format 3 added
# `gz_shallow` and `no_crc`. Formats 3 and 2 (the same without them) and format 1 (no `format`
# key; recent files as {index: mtime}) were written by earlier rules (before torch.save archives
# were read as torch.load reads them; before safetensors zero tails were judged): their
# `verified` is dropped, so every file is checked once more by the current rules (the listing
# cache and the recent files are kept).
STATE_FORMAT = 4




def state_dir() -> str:
    # A string, as core/paths.py's: pathlib (with urllib.parse and ipaddress) is ~3 ms of the
    # observer child's start-up, the one module of that weight it alone would import.
    from ...core import paths

    return os.path.join(paths.state_dir(), "extractions")


def load_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RecentFile(NamedTuple):
    """A recent file as last seen: its stat, and whether it was whole when last read."""
    rel: str
    index: int
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    whole: bool

    @classmethod
    def of(cls, rel: str, index: int, st: os.stat_result, whole: bool) -> RecentFile:
        return cls(rel, index, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, whole)

    def same_stat(self, st: os.stat_result) -> bool:
        return (self.size, self.mtime_ns, self.ctime_ns, self.ino) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                                                       st.st_ino)


@dataclass
class CheckRecord:
    """The state file's content, read back."""
    verified: list[tuple[int, int]]
    seen: list[tuple[int, int]]
    recent: list[RecentFile]
    newest: float | None
    boot_id: str | None
    dirs: dict[str, Any]
    gz_shallow: list[tuple[int, int]]  # indices whose .gz was never decompressed
    no_crc: list[tuple[int, int]]  # indices whose archive has no CRCs
    unproven: list[tuple[int, int]]  # indices whose file cannot be proven whole

    @classmethod
    def parse(cls, data: dict[str, Any] | None, key: dict[str, Any]) -> CheckRecord | None:
        """None when there is no usable record (missing, another dir or pattern, malformed)."""
        if not data or {k: data.get(k) for k in key} != key:
            return None
        try:
            verified = valid_ranges(data.get("verified", []))
            seen = valid_ranges(data.get("seen", []))
            newest = data.get("newest")
            newest = float(newest) if newest is not None else None
            if data.get("format") in (2, 3, STATE_FORMAT):
                recent = [RecentFile(str(r), int(i), int(s), int(m), int(c), int(n), bool(w))
                          for r, i, s, m, c, n, w in data.get("recent", [])]
                boot = data.get("boot_id")
                dirs = data.get("dirs")
                current = data.get("format") == STATE_FORMAT
                return cls(verified if current else [], seen, recent, newest,
                           boot if isinstance(boot, str) else None, dirs if isinstance(dirs, dict) else {},
                           valid_ranges(data.get("gz_shallow", [])) if current else [],
                           valid_ranges(data.get("no_crc", [])) if current else [],
                           valid_ranges(data.get("unproven", [])) if current else [])
            # Format 1 kept recent files as {index: mtime}, without a stat to compare: not kept.
            return cls([], seen, [], newest, None, {}, [], [], [])
        except (TypeError, ValueError, AttributeError):
            return None
