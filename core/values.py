"""The values a state file declares and a report prints: sizes, durations, systemd unit names,
want/have values. Plain functions with no state, imported by every layer above."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

_SIZE_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
}
# Patterns, compiled on first use (re's own cache keeps them): a start-up compiles only those its
# state file needs.
_SIZE = r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?B|B)?\s*$"  # with re.IGNORECASE
_PERCENT = r"^\s*(\d+(?:\.\d+)?)\s*%\s*$"
_DURATION = r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$"
_DURATION_PART = r"(\d+(?:\.\d+)?)(ms|s|m|h|d)"
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# The largest values a state file may declare: past these a float overflows, a deadline is
# never reached, or time.sleep/select refuse the number (OverflowError).
MAX_SIZE = 2**63 - 1                  # bytes (8 EiB)
MAX_DURATION = 3650 * 86400.0         # ten years, in seconds


# systemd's own rules (unit-name.c:unit_name_is_valid): a name, an optional @instance (which may
# hold more @), a known suffix.
_UNIT = (
    r"^[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\@-]*)?"
    r"\.(service|socket|target|timer|mount|automount|swap|path|slice|scope|device)$"
)


def parse_size(value: int | str) -> int:
    """'4TiB' -> bytes. Integers are bytes. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, float):
        raise ValueError(value)  # bytes are whole: 1.5 bytes is a mistake, '1.5GiB' is not
    if isinstance(value, int):
        if value < 0 or value > MAX_SIZE:
            raise ValueError(value)
        return value
    m = re.match(_SIZE, str(value), re.IGNORECASE)
    if not m:
        raise ValueError(value)
    n = float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").upper()]
    if not n <= MAX_SIZE:  # also inf (a number of thousands of digits)
        raise ValueError(value)
    return int(n)


def parse_size_or_percent(value: int | str) -> tuple[str, float]:
    """('bytes', n) or ('percent', p)."""
    if isinstance(value, str):
        m = re.match(_PERCENT, value)
        if m:
            pct = float(m.group(1))
            if pct > 100:
                raise ValueError(value)
            return ("percent", pct)
    return ("bytes", parse_size(value))


def parse_duration(value: int | float | str) -> float:
    """'1h30m' -> 5400.0 seconds; a bare number is seconds. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        if not 0 <= value <= MAX_DURATION:  # also nan and inf
            raise ValueError(value)
        return float(value)
    text = str(value).strip()
    if not re.match(_DURATION, text):
        raise ValueError(value)
    seconds = sum(float(n) * _DURATION_SECONDS[u] for n, u in re.findall(_DURATION_PART, text))
    if not seconds <= MAX_DURATION:
        raise ValueError(value)
    return seconds


def is_unit_name(name: str) -> bool:
    return len(name) <= 255 and bool(re.fullmatch(_UNIT, name))  # fullmatch: `$` admits a trailing newline


def format_bytes(n: float) -> str:
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{int(n)}B"


def format_duration(seconds: float) -> str:
    if 0 < seconds < 1:
        return f"{round(seconds * 1000)}ms"  # a sub-second deadline is not "0s"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def format_value(v: Any) -> str:
    """A want/have value as the reports print it: true/false/null like the state file."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    return str(v)


def dotted(path: Iterable) -> str:
    """A path in the document as messages print it: `mounts."/data".options[0]`."""
    parts = []
    for p in path:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif re.fullmatch(r"[A-Za-z0-9_-]+", p):
            parts.append(("." if parts else "") + p)
        else:
            parts.append(("." if parts else "") + json.dumps(p))
    return "".join(parts)


def never_answers(specs: Iterable[tuple[tuple, Any]], field: str) -> list[tuple[tuple, str]]:
    """(path, message) for each (path, spec) whose `field` is a duration of zero: a deadline that
    passes before anything can answer never holds (the resource would be reported stuck on every
    run). For a kind's `problems`; `path` is the spec's place in its section (() for a singleton)."""
    out = []
    for path, spec in specs:
        if isinstance(spec, dict) and field in spec:
            try:
                zero = parse_duration(spec[field]) == 0
            except ValueError:
                continue  # the schema says what is wrong with it
            if zero:
                where = (*path, field)
                out.append((where, f"{dotted(where)}: {spec[field]} leaves no time to answer, so every "
                                   f"observation would be reported stuck; give a positive duration"))
    return out
