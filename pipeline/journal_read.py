"""Reading the journal back, newest first, across its rotated files (journal.jsonl, .1, .2, ...).

`reconcile log` wants the last two hours of a journal that may hold millions of lines: the files
are read backwards from the end in blocks, and reading stops at the first line older than the
window (less a slack: an apply and a Slurm health check may write a few lines out of order).
"""

from __future__ import annotations

import calendar
import functools
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 1 << 16
# Writers that do not share the apply lock (slurm-health without --apply) may append a line a
# little out of time order: reading goes this far past --since before it stops.
ORDER_SLACK_S = 300.0


def rotated_files(path: Path) -> list[Path]:
    """The journal and its rotated files, newest first: journal.jsonl, journal.jsonl.1, .2, ..."""
    found = {}
    pattern = re.compile(re.escape(path.name) + r"\.(\d+)$")
    try:
        names = os.listdir(path.parent)
    except OSError:
        names = []
    for name in names:
        m = pattern.match(name)
        if m:
            found[int(m.group(1))] = path.parent / name
    return [path, *(found[n] for n in sorted(found))]


def lines_backwards(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """The lines of one file from the last to the first: (offset, bytes without the newline, torn).
    `torn` marks a last line without its newline (cut short by a crash while it was written)."""
    with open(path, "rb") as fh:
        end = os.fstat(fh.fileno()).st_size
        carry = b""  # the start of the line that begins in the block before, at offset `end`
        last = True
        while end > 0:
            start = max(0, end - BLOCK)
            fh.seek(start)
            parts = (fh.read(end - start) + carry).split(b"\n")
            torn = False
            if last:
                torn = parts[-1] != b""
                if not torn:
                    parts.pop()
                last = False
            offsets, pos = [], start + len(parts[0]) + 1
            for part in parts[1:]:
                offsets.append(pos)
                pos += len(part) + 1
            for k in range(len(parts) - 1, 0, -1):
                yield offsets[k - 1], parts[k], torn and k == len(parts) - 1
            carry, end = parts[0], start
            if start == 0:
                yield 0, carry, torn and len(parts) == 1
                return


@dataclass
class Skipped:
    """Lines that were not JSON objects: where, and whether it was the torn last line of a file."""

    torn: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        out = [f"{where}: its last line is incomplete (a crash while it was written?); skipped" for where in self.torn]
        if self.bad:
            shown = ", ".join(self.bad[:5]) + (f" and {len(self.bad) - 5} more" if len(self.bad) > 5 else "")
            out.append(f"{shown}: not a journal line; skipped")
        return out


_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?Z")


@functools.lru_cache(maxsize=4096)
def _day(year: int, month: int, day: int) -> int:
    return calendar.timegm((year, month, day, 0, 0, 0, 0, 0, 0))


def parse_time(text: Any) -> float | None:
    """A journal `time` (`2026-12-01T09:45:36.666Z`, contract.utc_iso) as epoch seconds; None when
    it is not one. A million of them are read for one `reconcile log`: no strptime."""
    if not isinstance(text, str):
        return None
    m = _TIME.fullmatch(text)
    if not m:
        return None
    y, mo, d, h, mi, sec = (int(g) for g in m.groups()[:6])
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and sec < 61):
        return None
    return _day(y, mo, d) + h * 3600 + mi * 60 + sec + (float(m.group(7)) if m.group(7) else 0.0)


def read_newest_first(path: Path, since: float | None = None, skipped: Skipped | None = None
                      ) -> Iterator[dict[str, Any]]:
    """Entries newest first, across the rotated files; stops once past `since` (less the slack).
    Lines that do not parse are recorded in `skipped`, never raised."""
    skipped = skipped if skipped is not None else Skipped()
    for file in rotated_files(path):
        try:
            for offset, raw, torn in lines_backwards(file):
                if not raw.strip():
                    continue
                try:
                    entry = json.loads(raw)
                except ValueError:
                    entry = None
                if not isinstance(entry, dict):
                    (skipped.torn if torn else skipped.bad).append(f"{file} (byte {offset})")
                    continue
                if since is not None:
                    when = parse_time(entry.get("time"))
                    if when is not None and when < since - ORDER_SLACK_S:
                        return
                yield entry
        except FileNotFoundError:
            continue  # rotated away while we read: its lines are in the next file's name now
