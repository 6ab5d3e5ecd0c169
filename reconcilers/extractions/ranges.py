"""Index ranges: sorted, disjoint, maximal inclusive (first, last) runs. Counting works on ranges
throughout, so a warm observe of 1,000,000 files builds no per-file set."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import Any


def to_ranges(indices: Iterable[int]) -> list[tuple[int, int]]:
    """Integers -> sorted inclusive (first, last) runs.

    Divide and conquer on the sorted list: a slice whose ends differ by its length is one run,
    so the Python-level work grows with the number of runs (few), not of indices (37,312)."""
    s = sorted(set(indices))
    pieces: list[tuple[int, int]] = []

    def split(i: int, j: int) -> None:  # s[i:j], not empty
        if s[j - 1] - s[i] == j - 1 - i:
            pieces.append((s[i], s[j - 1]))
        else:
            m = (i + j) // 2
            split(i, m)
            split(m, j)

    if s:
        split(0, len(s))
    out: list[tuple[int, int]] = []
    for a, b in pieces:  # halves of one run come back as touching pieces: join them
        if out and a == out[-1][1] + 1:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def format_ranges(ranges: Sequence[Sequence[int]], more: int = 0) -> str:
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
    return text + (f" (+{more} more ranges)" if more else "")


def runs(indices: list[int]) -> list[tuple[int, int]]:
    """Distinct integers -> ranges; one min/max when they are one run (the usual case)."""
    if not indices:
        return []
    lo, hi = min(indices), max(indices)
    return [(lo, hi)] if hi - lo + 1 == len(indices) else to_ranges(indices)


def valid_ranges(value: Any) -> list[tuple[int, int]]:
    """JSON [[a, b], ...] -> sorted disjoint ranges; ValueError/TypeError if it is not that."""
    out: list[tuple[int, int]] = []
    for a, b in value:
        if type(a) is not int or type(b) is not int or not 0 <= a <= b or (out and a <= out[-1][1]):
            raise ValueError(f"bad range {a!r}-{b!r}")
        out.append((a, b))
    return out


def normalize(runs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Any (first, last) runs -> sorted, disjoint, maximal ranges."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(runs):
        if out and a <= out[-1][1] + 1:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def intersect(x: Sequence[tuple[int, int]], y: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a <= b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x: Sequence[tuple[int, int]], y: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    j = 0
    for a, b in x:
        while j < len(y) and y[j][1] < a:
            j += 1
        k = j
        while k < len(y) and y[k][0] <= b:
            if y[k][0] > a:
                out.append((a, y[k][0] - 1))
            a = max(a, y[k][1] + 1)
            k += 1
        if a <= b:
            out.append((a, b))
    return out


def size(ranges: Iterable[tuple[int, int]]) -> int:
    return sum(b - a + 1 for a, b in ranges)


def each(ranges: Iterable[tuple[int, int]]) -> Iterator[int]:
    for a, b in ranges:
        yield from range(a, b + 1)


def contains(ranges: Sequence[tuple[int, int]], i: int) -> bool:
    k = bisect_right(ranges, (i, float("inf"))) - 1
    return k >= 0 and ranges[k][1] >= i


def last(ranges: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """The n highest indices."""
    out: list[tuple[int, int]] = []
    for a, b in reversed(ranges):
        if n <= 0:
            break
        take = min(n, b - a + 1)
        out.append((b - take + 1, b))
        n -= take
    return out[::-1]
