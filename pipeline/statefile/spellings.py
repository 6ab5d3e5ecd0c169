"""Old spellings: a state file written before a field or a value was renamed keeps working.

Each kind's schema fragment lists its deprecated spellings (`x-old-spellings`, read by
schema.old_spellings): a renamed field (`{key, now}`: extractions' `resume` is `job`) or a
renamed value (`{key, value, now}`: `verify: recent` is `verify: at-risk`). Before the file is
validated, each old spelling is read as its new one, with one warning at the old spelling's
position; a resource that gives a field in both spellings is an error at the old key. The
vocabulary itself is docs/state-file.md ("Vocabulary").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.values import dotted
from ...reconcilers import KINDS
from .schema import old_spellings

if TYPE_CHECKING:
    from .positions import Positions

SEE = "docs/state-file.md#vocabulary"
Found = tuple[int, int, str]  # line, column, message (without the file's label)


def _resources(data: dict[str, Any]) -> list[tuple[str, tuple, dict[str, Any]]]:
    """(kind key, path, mapping) of every resource whose fields may hold an old spelling."""
    out = []
    for key in KINDS:
        section = data.get(key)
        if not isinstance(section, dict):
            continue
        if KINDS[key].singleton:
            out.append((key, (key,), section))
            continue
        out.extend((key, (key, name), spec) for name, spec in section.items() if isinstance(spec, dict))
    return out


def _move_positions(pos: Positions, old: tuple, new: tuple) -> None:
    """Positions recorded under the old key's path, found under the new one too: a problem in the
    renamed field's value is reported where the user wrote it."""
    n = len(old)
    for table in (pos.values, pos.keys):
        for path in [p for p in table if p[:n] == old]:
            table[new + path[n:]] = table[path]


def modernize(data: dict[str, Any], pos: Positions) -> tuple[list[Found], list[Found]]:
    """Read every old spelling in `data` as its new one, in place. Returns (warnings, problems):
    one warning per old spelling written (one per position: a spelling merged into several
    resources from one anchor is one line), one problem per field given in both spellings."""
    table = old_spellings()
    warnings: dict[tuple[int, int], str] = {}
    problems: list[Found] = []
    for key, path, spec in _resources(data):
        entries = table.get(key, ())
        for entry in (e for e in entries if "value" not in e):  # renamed fields first
            old, now = entry["key"], entry["now"]
            if old not in spec:
                continue
            line, col = pos.of_key((*path, old))
            if now in spec:
                other = pos.of_key((*path, now))
                problems.append((line, col, f"{dotted((*path, old))}: {old!r} is the old spelling of {now!r}, "
                                            f"which is given too (line {other[0]}): keep {now!r} only"))
                del spec[old]
                continue
            spec[now] = spec.pop(old)
            _move_positions(pos, (*path, old), (*path, now))
            warnings.setdefault((line, col), f"warning: {dotted((*path, old))}: deprecated spelling: write {now!r} "
                                             f"(same meaning; {SEE})")
        for entry in (e for e in entries if "value" in e):
            field, old, now = entry["key"], entry["value"], entry["now"]
            if not isinstance(spec.get(field), str) or spec[field] != old:
                continue
            spec[field] = now
            line, col = pos.of_value((*path, field))
            warnings.setdefault((line, col), f"warning: {dotted((*path, field))}: {old!r} is a deprecated spelling: "
                                             f"write {now!r} (same meaning; {SEE})")
    return [(line, col, msg) for (line, col), msg in sorted(warnings.items())], problems
