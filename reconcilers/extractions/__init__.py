"""Long-running extraction jobs (EAGLE-3 hidden states): progress, damaged files, resume.

Observe counts completed samples from file NAMES (`os.listdir`/`os.scandir`, no stat per
file, no glob: on the story's host, globs over the tree failed under write load), checks the
integrity of the files that may be damaged (see integrity.py and `verify`), and asks whether
the job that writes them runs. Plan: quarantine damaged files (moved, never deleted, with a
manifest) so the job regenerates them; start the job when it is short of `min_done` and
not running; report `converging` with progress and ETA while it runs.

What observe learnt is kept in a small state file per extraction (`NAME.check.json`) in
the state directory: $RECONCILE_STATE_DIR if set, else the journal's directory
(/var/lib/reconcile as root), under `extractions/`. It holds
- the listing of each leaf directory (`rows_*`), keyed by the directory's mtime, ctime and
  inode: creating, removing or renaming an entry changes the mtime, so an unchanged
  directory is not listed again (git's untracked cache does the same). A listing is kept
  only when the directory's mtime is more than RACY_NS older than the moment the listing
  started: an entry added within the same timestamp tick would not change the mtime.
  Indices are kept as ranges: names that are the pattern's rendering of their index
  (`data_7.ckpt`, `data_7.ckpt.gz`) as ranges, other matching names (`data_007.ckpt`)
  one by one;
- the indices verified whole, and the indices seen, as ranges;
- the recent files (within RECENT_WINDOW of the newest) with their stat and the boot id
  they were checked under (see RECENT_WINDOW).
Counting works on ranges throughout, so a warm observe of 1,000,000 files builds no
per-file set. The file is rewritten only when something in it changed. The pid file and
output log of a resume `command` live in the same directory.

Test seam: $RECONCILE_BOOT_ID_FILE, read on each observe, names the file the boot id is read
from instead of /proc/sys/kernel/random/boot_id (tests change it to stand for a reboot).
"""

from __future__ import annotations

import json
import os
import re
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from pathlib import Path

from .atomic import write_json
from .base import Action, ApplyError, Context, Drift, ObserveError, Plan, Reconciler, Resource, run_action, utc_iso
from .host import CommandTimeout, Host
from .statefile import format_duration, parse_duration

QUARANTINE = ".reconcile-quarantine"
# Files modified within this window before the newest one give the rate, and are re-read
# when the machine has booted since they were checked, or their stat changed: after a VM
# crash, data written shortly before it may be gone from disk although it was whole in the
# page cache when last checked. Within one boot a re-read would be served from that same
# page cache, so it could not find anything the last check did not.
RECENT_WINDOW = 300.0
# An incomplete file this young, while its job runs, is being written: not damaged.
WRITING_GRACE = 60.0
# Under `verify: none`, stat at most this many new files (for the rate).
STAT_LIMIT = 256
MAX_RANGES = 20  # missing ranges kept in the observation (the rest is counted)
CALL_TIMEOUT = 30.0
DEFAULT_OBSERVE_TIMEOUT = "60s"  # without progress; see ExtractionsReconciler.observe_idle
START_TIMEOUT = 120.0
# A directory listing is trusted later only if the directory's mtime was at least this much
# older than the moment the listing started (2 s: FAT's timestamp granularity, the coarsest
# in use; Linux's own clock ticks are milliseconds).
RACY_NS = 2 * 10**9
STATE_FORMAT = 2  # format 1 (no `format` key): verified/seen ranges, recent {index: mtime}
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


# --- the file name pattern ---------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{(index|group)\}")


def compile_pattern(pattern: str) -> list[re.Pattern[str]]:
    """'rows_{group}/data_{index}.ckpt' -> one regex per path component. {index} (the sample
    index, digits) is in the last one; {group} matches any text within a component
    (SpecForge names groups `rows_0-2000`). The file may also end in `.gz`."""
    parts = pattern.strip("/").split("/")
    out = []
    for i, part in enumerate(parts):
        rx = ""
        pos = 0
        for m in _PLACEHOLDER.finditer(part):
            rx += re.escape(part[pos:m.start()])
            rx += r"(?P<index>\d+)" if m.group(1) == "index" else r".+?"
            pos = m.end()
        rx += re.escape(part[pos:])
        if i == len(parts) - 1 and not part.endswith(".gz"):
            rx += r"(?:\.gz)?"
        out.append(re.compile(rx))
    return out


class LeafForm(NamedTuple):
    """How the last component renders index i: prefix + str(i) + suffix, and with `.gz`
    appended too when `gz` (the pattern itself does not end in .gz)."""
    prefix: str
    suffix: str
    gz: bool


def leaf_form(pattern: str) -> LeafForm | None:
    """None when the last component cannot be rendered from the index alone ({group} in it)."""
    leaf = pattern.strip("/").split("/")[-1]
    if leaf.count("{index}") != 1 or "{group}" in leaf or "\n" in leaf:
        return None
    prefix, suffix = leaf.split("{index}")
    return LeafForm(prefix, suffix, not leaf.endswith(".gz"))


def _canonical_indices(names: list[str], prefix: str, suffix: str) -> list[int] | None:
    """The indices if EVERY name is prefix + str(index) + suffix, else None.

    Done with a few passes of C string methods over the names joined by newlines instead
    of a regex match per name: on 1,000,000 names the per-name work costs more than the
    listing itself. A newline occurs only between names (checked), so "\\n" + prefix can
    only match at a name's start and suffix + "\\n" only at its end; each replacement
    shortens the text by the same length, so the lengths count the matches."""
    if not names:
        return []
    text = "\n" + "\n".join(names) + "\n"
    n = len(names)
    if text.count("\n") != n + 1:  # a name with a newline in it
        return None
    for old in ("\n" + prefix, suffix + "\n"):
        if len(old) > 1:
            stripped = text.replace(old, "\n")
            if len(text) - len(stripped) != n * (len(old) - 1):
                return None
            text = stripped
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        return None
    # ASCII digits, none empty, no leading zero: exactly what str(int) renders.
    if raw.translate(None, b"\n0123456789") or b"\n\n" in raw or raw.count(b"\n0") != raw.count(b"\n0\n"):
        return None
    return list(map(int, raw[1:-1].split(b"\n")))


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Distinct integers -> ranges; one min/max when they are one run (the usual case)."""
    if not indices:
        return []
    lo, hi = min(indices), max(indices)
    return [(lo, hi)] if hi - lo + 1 == len(indices) else to_ranges(indices)


def _valid_ranges(value: Any) -> list[tuple[int, int]]:
    """JSON [[a, b], ...] -> sorted disjoint ranges; ValueError/TypeError if it is not that."""
    out: list[tuple[int, int]] = []
    for a, b in value:
        if type(a) is not int or type(b) is not int or not 0 <= a <= b or (out and a <= out[-1][1]):
            raise ValueError(f"bad range {a!r}-{b!r}")
        out.append((a, b))
    return out


@dataclass
class Leaf:
    """What one leaf directory holds that matches the pattern."""
    rel: str  # relative to the extraction's dir, with a trailing "/" ("" for the dir itself)
    plain: list[tuple[int, int]]  # ranges of indices whose file is named prefix + str(i) + suffix
    gz: list[tuple[int, int]]  # ... that name + ".gz"
    named: list[tuple[int, str]]  # (index, name) of any other matching name

    @classmethod
    def parse(cls, rel: str, names: list[str], rx: re.Pattern[str], form: LeafForm | None) -> Leaf:
        if form is not None:
            ints = _canonical_indices(names, form.prefix, form.suffix)
            if ints is not None:
                return cls(rel, _runs(ints), [], [])
            if form.gz:
                ints = _canonical_indices(names, form.prefix, form.suffix + ".gz")
                if ints is not None:
                    return cls(rel, [], _runs(ints), [])
        # Mixed or odd names: one by one.
        plain: list[int] = []
        gz: list[int] = []
        named: list[tuple[int, str]] = []
        for name in names:
            m = rx.fullmatch(name)
            if not m:
                continue
            idx = int(m.group("index"))
            if form is not None:
                canonical = f"{form.prefix}{idx}{form.suffix}"
                if name == canonical:
                    plain.append(idx)
                    continue
                if form.gz and name == canonical + ".gz":
                    gz.append(idx)
                    continue
            named.append((idx, name))
        return cls(rel, _runs(plain), _runs(gz), named)

    @classmethod
    def from_entry(cls, rel: str, entry: dict[str, Any]) -> Leaf | None:
        """A cached listing from the state file; None if it is not one we wrote."""
        try:
            named = [(i, n) for i, n in entry.get("x", [])]
            if not all(type(i) is int and i >= 0 and isinstance(n, str) for i, n in named):
                return None
            return cls(rel, _valid_ranges(entry.get("r", [])), _valid_ranges(entry.get("z", [])), named)
        except (TypeError, ValueError):
            return None

    def entry(self, stat: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"stat": stat}
        if self.plain:
            out["r"] = [list(r) for r in self.plain]
        if self.gz:
            out["z"] = [list(r) for r in self.gz]
        if self.named:
            out["x"] = [list(x) for x in self.named]
        return out


class Listing:
    """The matching files of a tree, by leaf directory, with lookups by index.

    Files of one index come in a fixed order: by leaf directory (in listing order), then
    the plain name, the `.gz` name, other names."""

    def __init__(self, leaves: list[Leaf], form: LeafForm | None, cache: dict[str, Any] | None = None,
                 listed: int = 0, reused: int = 0):
        self.leaves = leaves
        self.form = form
        self.cache = cache or {}  # rel -> entry: the listings safe to trust next time
        self.listed = listed  # leaf directories read with listdir
        self.reused = reused  # leaf directories whose cached listing was trusted
        intervals = [(a, b, n, v) for n, leaf in enumerate(leaves)
                     for v, ranges in ((0, leaf.plain), (1, leaf.gz)) for a, b in ranges]
        # Elementary segments between all interval ends, each with the (leaf, variant) pairs
        # covering it: one bisect finds an index's files (ranges of different directories
        # may overlap when an index has a file in two of them).
        self._points = sorted({a for a, *_ in intervals} | {b + 1 for _, b, *_ in intervals})
        self._covers: list[list[tuple[int, int]]] = [[] for _ in self._points]
        for a, b, n, v in intervals:
            for k in range(bisect_left(self._points, a), bisect_left(self._points, b + 1)):
                self._covers[k].append((n, v))
        self._named: dict[int, list[tuple[int, int, str]]] = {}
        for n, leaf in enumerate(leaves):
            for k, (i, name) in enumerate(leaf.named):
                self._named.setdefault(i, []).append((n, 2 + k, leaf.rel + name))
        self._intervals = intervals

    def paths(self, idx: int) -> list[str]:
        """The files of one index, relative to the extraction's dir."""
        out: list[tuple[int, int, str]] = []
        k = bisect_right(self._points, idx) - 1
        if k >= 0 and self._covers[k]:
            form = self.form
            assert form is not None  # ranges exist only with a renderable form
            name = f"{form.prefix}{idx}{form.suffix}"
            out = [(n, v, self.leaves[n].rel + name + (".gz" if v else "")) for n, v in self._covers[k]]
        if idx in self._named:
            out = sorted(out + self._named[idx])
        return [p for *_, p in out]

    def present(self, total: int) -> list[tuple[int, int]]:
        """Ranges of the indices < total that have at least one file."""
        runs = [(a, b) for a, b, *_ in self._intervals]
        runs += [(i, i) for i in self._named]
        return _intersect(_normalize(runs), [(0, total - 1)] if total > 0 else [])

    def counts(self, total: int) -> tuple[int, int]:
        """(files whose index is < total, files whose index is >= total)."""
        inside = outside = 0
        for a, b, *_ in self._intervals:
            n = max(0, min(b, total - 1) - a + 1)
            inside += n
            outside += b - a + 1 - n
        for i, files in self._named.items():
            if i < total:
                inside += len(files)
            else:
                outside += len(files)
        return inside, outside


def list_tree(root: str, pattern: str, cache: dict[str, Any] | None = None,
              beat: Callable[[], None] | None = None) -> Listing:
    """List the tree's leaf directories, reusing a cached listing (see Listing.cache) of each
    directory whose mtime, ctime and inode are unchanged. Directories above the leaves are
    listed every time (a few hundred names); entry types come from readdir (d_type)."""
    regexes = compile_pattern(pattern)
    form = leaf_form(pattern)
    cache = cache if isinstance(cache, dict) else {}
    # Racy-clean rule: a listing made while the directory's mtime was within RACY_NS of now
    # may miss an entry added later in the same timestamp tick, which leaves the mtime as it
    # was; such a listing is used now but not kept. (The stat is taken before the listing, so
    # an entry added in between makes the kept stat stale: listed again next time.)
    safe_before = time.time_ns() - RACY_NS
    leaves: list[Leaf] = []
    keep: dict[str, Any] = {}
    listed = reused = 0
    last = len(regexes) - 1

    def leaf_dir(path: str, rel: str) -> None:
        nonlocal listed, reused
        if beat:
            beat()
        st = os.stat(path)
        stat = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        entry = cache.get(rel)
        leaf = Leaf.from_entry(rel, entry) if isinstance(entry, dict) and entry.get("stat") == stat else None
        if leaf is None:
            leaf = Leaf.parse(rel, os.listdir(path), regexes[-1], form)
            entry = leaf.entry(stat)
            listed += 1
        else:
            reused += 1
        if st.st_mtime_ns < safe_before:
            keep[rel] = entry
        leaves.append(leaf)

    def walk(path: str, rel: str, level: int) -> None:
        try:
            if level == last:
                leaf_dir(path, rel)
                return
            rx = regexes[level]
            with os.scandir(path) as it:
                # entry.is_dir() comes from readdir's d_type: no stat.
                subdirs = [(e.path, e.name) for e in it
                           if e.name != QUARANTINE and rx.fullmatch(e.name) and e.is_dir()]
        except FileNotFoundError:
            if level == 0:
                raise
            return  # removed since its parent was listed: as if listed a moment later
        for sub, name in subdirs:
            walk(sub, f"{rel}{name}/", level + 1)

    walk(root, "", 0)
    return Listing(leaves, form, keep, listed, reused)


def scan(root: str, pattern: str, total: int) -> tuple[dict[int, str], dict[int, list[str]], int]:
    """Sample files by index (paths relative to root), further files of an index that has
    more than one (data_7.ckpt and data_7.ckpt.gz), and the count of matching files whose
    index is >= total. Names only, no cache: list_tree's result as plain dicts."""
    listing = list_tree(root, pattern)
    found: dict[int, str] = {}
    extra: dict[int, list[str]] = {}

    def add(pairs: Iterable[tuple[int, str]]) -> None:
        for i, path in pairs:
            if i in found:
                extra.setdefault(i, []).append(path)
            else:
                found[i] = path

    form = listing.form
    for leaf in listing.leaves:
        for ranges, tail in ((leaf.plain, ""), (leaf.gz, ".gz")):
            assert form is not None or not ranges
            for a, b in _intersect(ranges, [(0, total - 1)] if total > 0 else []):
                head, end = leaf.rel + form.prefix, form.suffix + tail
                indices = range(a, b + 1)
                paths = [f"{head}{i}{end}" for i in indices]
                if found.keys().isdisjoint(indices):
                    found.update(zip(indices, paths, strict=True))
                else:
                    add(zip(indices, paths, strict=True))
        add((i, leaf.rel + name) for i, name in leaf.named if i < total)
    return found, extra, listing.counts(total)[1]


# --- index ranges: sorted, disjoint, maximal inclusive (first, last) runs ------------------

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


def from_ranges(ranges: Iterable[Sequence[int]]) -> set[int]:
    out: set[int] = set()
    for a, b in ranges:
        out.update(range(a, b + 1))
    return out


def format_ranges(ranges: Sequence[Sequence[int]], more: int = 0) -> str:
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
    return text + (f" (+{more} more ranges)" if more else "")


def _normalize(runs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Any (first, last) runs -> sorted, disjoint, maximal ranges."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(runs):
        if out and a <= out[-1][1] + 1:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _intersect(x: Sequence[tuple[int, int]], y: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
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


def _subtract(x: Sequence[tuple[int, int]], y: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
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


def _size(ranges: Iterable[tuple[int, int]]) -> int:
    return sum(b - a + 1 for a, b in ranges)


def _each(ranges: Iterable[tuple[int, int]]) -> Iterator[int]:
    for a, b in ranges:
        yield from range(a, b + 1)


def _contains(ranges: Sequence[tuple[int, int]], i: int) -> bool:
    k = bisect_right(ranges, (i, float("inf"))) - 1
    return k >= 0 and ranges[k][1] >= i


def _last(ranges: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """The n highest indices."""
    out: list[tuple[int, int]] = []
    for a, b in reversed(ranges):
        if n <= 0:
            break
        take = min(n, b - a + 1)
        out.append((b - take + 1, b))
        n -= take
    return out[::-1]


# --- where our own small files live ------------------------------------------------------

def state_dir() -> Path:
    from pathlib import Path  # not at the top: pathlib is ~10 ms of the parent's start-up

    explicit = os.environ.get("RECONCILE_STATE_DIR")
    if explicit:
        return Path(explicit) / "extractions"
    from .journal import default_journal_path

    return default_journal_path().parent / "extractions"


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def boot_id() -> str | None:
    """This boot's id, or None where the system has none (then recent files are always re-read)."""
    path = os.environ.get("RECONCILE_BOOT_ID_FILE") or BOOT_ID_FILE  # the test seam, see the docstring
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


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

    @classmethod
    def parse(cls, data: dict[str, Any] | None, key: dict[str, Any]) -> CheckRecord | None:
        """None when there is no usable record (missing, another dir or pattern, malformed)."""
        if not data or {k: data.get(k) for k in key} != key:
            return None
        try:
            verified = _valid_ranges(data.get("verified", []))
            seen = _valid_ranges(data.get("seen", []))
            newest = data.get("newest")
            newest = float(newest) if newest is not None else None
            if data.get("format") == STATE_FORMAT:
                recent = [RecentFile(str(r), int(i), int(s), int(m), int(c), int(n), bool(w))
                          for r, i, s, m, c, n, w in data.get("recent", [])]
                boot = data.get("boot_id")
                dirs = data.get("dirs")
                return cls(verified, seen, recent, newest, boot if isinstance(boot, str) else None,
                           dirs if isinstance(dirs, dict) else {})
            # Format 1 kept recent files as {index: mtime}, without a stat to compare: those
            # indices count as not verified, so they are read once more and recorded anew.
            old_recent = to_ranges(int(i) for i in data.get("recent", {}))
            return cls(_subtract(verified, old_recent), seen, [], newest, None, {})
        except (TypeError, ValueError, AttributeError):
            return None


# --- observations ------------------------------------------------------------------------

@dataclass(frozen=True)
class Damaged:
    path: str  # relative to the extraction's dir
    reason: str
    size: int
    mtime: float


@dataclass(frozen=True)
class JobObserved:
    how: str  # "unit", "command" or "none" (no resume declared)
    target: str  # unit name or command line
    running: bool
    state: str  # "active/running", "pid 4242 running", "not running", "not found"
    pid: int = 0
    exists: bool = True  # False: the resume unit is not known to systemd


@dataclass(frozen=True)
class ExtractionObserved:
    dir: str
    exists: bool
    total: int
    done: int  # indices with a file not found damaged
    counted: int  # done + allowed-missing indices without a file: what min_done is compared with
    files: int
    missing: int  # indices without a usable file, allow_missing excluded
    missing_ranges: tuple[tuple[int, int], ...]
    missing_ranges_more: int
    damaged: tuple[Damaged, ...]
    writing: int  # incomplete files being written by the running job
    verify: str
    checked: int  # files whose integrity was checked by this observation
    unverified_gz: int  # .gz files only checked for their magic (verify: recent)
    out_of_range: int
    rate: float | None  # samples/s from recent modification times
    newest: float | None  # mtime of the newest file seen
    eta_s: float | None
    job: JobObserved


def _progress(total: int, counted: int, rate: float | None, eta: float | None) -> str:
    pct = 100.0 * counted / total if total else 100.0
    text = f"{counted:,} of {total:,} samples ({pct:.1f}%)"
    if rate:
        text += f", {rate:.2f} samples/s"
    if eta is not None:
        text += f", ETA {format_duration(eta)}"
    return text


class ExtractionsReconciler(Reconciler):
    key = "extractions"
    kind = "extraction"
    rank = 40
    volatile_drift = ("done",)  # a running job moves it
    # Listing a directory on a hung network mount blocks for good: observed in a child that is
    # abandoned after `observe_timeout` without progress (a first check of 1,000,000 files
    # takes minutes, but makes progress all along).
    observe_idle = True

    def observe_deadline(self, resources: Sequence[Resource]) -> float | None:
        return max(float(r.spec["observe_timeout"]) for r in resources)

    def resources(self, section: dict[str, Any]) -> list[Resource]:
        out = []
        for name, spec in section.items():
            norm = {
                "dir": spec["dir"].rstrip("/") or "/",
                "pattern": spec.get("pattern", "rows_{group}/data_{index}.ckpt"),
                "total": int(spec["total"]),
                "min_done": int(spec.get("min_done", spec["total"])),
                "allow_missing": tuple(sorted(set(spec.get("allow_missing", ())))),
                "verify": spec.get("verify", "recent"),
                "resume": dict(spec.get("resume") or {}),
                "observe_timeout": parse_duration(spec.get("observe_timeout", DEFAULT_OBSERVE_TIMEOUT)),
            }
            out.append(Resource(id=f"extraction:{name}", kind=self.kind, name=name, spec=norm,
                                needs=tuple(spec.get("needs", ()))))
        return out

    # --- observe ---------------------------------------------------------------------

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        jobs = self._observe_jobs(host, resources)
        out: dict[str, Any] = {}
        for r in resources:
            job = jobs[r.id]
            if isinstance(job, ObserveError):
                out[r.id] = job
                continue
            host.heartbeat()
            try:
                out[r.id] = self._observe_files(r, job, host.heartbeat)
            except ObserveError as exc:
                out[r.id] = exc
            except OSError as exc:
                out[r.id] = ObserveError(f"cannot read {exc.filename or r.spec['dir']}: {exc.strerror}")
        return out

    def _observe_jobs(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        from .units import PROPERTIES, RUNNING, parse_show

        jobs: dict[str, Any] = {}
        units = [r for r in resources if r.spec["resume"].get("unit")]
        if units:
            names = [r.spec["resume"]["unit"] for r in units]
            try:
                res = host.run(["systemctl", "show", "--no-pager", "-p", ",".join(PROPERTIES), "--", *names],
                               timeout=CALL_TIMEOUT)
                if not res.ok:
                    raise ObserveError(f"cannot read the resume unit's state from systemd: {res.brief()}")
                shown = parse_show(res.stdout, names)
            except (ObserveError, CommandTimeout) as exc:
                shown = ObserveError(str(exc))
            for r, name in zip(units, names, strict=True):
                if isinstance(shown, ObserveError):
                    jobs[r.id] = shown
                    continue
                u = shown[name]
                jobs[r.id] = JobObserved("unit", name, u.active_state in RUNNING,
                                         f"{u.active_state}/{u.sub_state}" if u.exists else "not found",
                                         u.main_pid, u.exists)
        for r in resources:
            if r.id in jobs:
                continue
            argv = r.spec["resume"].get("command")
            if not argv:
                jobs[r.id] = JobObserved("none", "", False, "no resume declared")
                continue
            pid = _command_pid(host, r.name)
            jobs[r.id] = JobObserved("command", " ".join(argv), bool(pid),
                                     f"pid {pid} running" if pid else "not running", pid or 0)
        return jobs

    def _observe_files(self, r: Resource, job: JobObserved,
                       beat: Callable[[], None] | None = None) -> ExtractionObserved:
        spec = r.spec
        root, total, verify = spec["dir"], spec["total"], spec["verify"]
        state_path = state_dir() / f"{r.name}.check.json"
        key = {"dir": root, "pattern": spec["pattern"]}
        raw = _load_json(state_path)
        record = CheckRecord.parse(raw, key)
        try:
            listing = list_tree(root, spec["pattern"], record.dirs if record else None, beat)
            exists = True
        except FileNotFoundError as exc:
            if exc.filename != root:
                raise
            listing, exists = Listing([], leaf_form(spec["pattern"])), False
        everything = [(0, total - 1)] if total > 0 else []
        present = listing.present(total)
        files, stray = listing.counts(total)
        boot = boot_id()
        previous = record.recent if record else []

        carried: list[RecentFile] = []  # recent files not read again, as recorded
        reread: set[int] = set()
        if verify == "recent" and record:
            carried, reread = _unchanged_recent(root, listing, present, record, boot)

        if verify == "all" or (verify == "recent" and not record):
            to_check = present  # no earlier check to build on: check everything once
        elif verify == "recent":
            assert record is not None
            to_check = _normalize(_subtract(present, record.verified) + to_ranges(reread))
        else:
            new = _last(_subtract(present, record.seen if record else []), STAT_LIMIT)
            was_recent = to_ranges(f.index for f in previous)
            to_check = _normalize(new + _intersect(present, was_recent))
        carried = [f for f in carried if not _contains(to_check, f.index)]

        now = time.time()
        bad: list[Damaged] = []
        bad_idx: set[int] = set()
        good: set[int] = set()
        in_flight: set[int] = set()  # checked, neither whole nor damaged: being written or gone
        mtimes: dict[int, float] = {}  # index -> newest mtime of its files, for the files looked at
        seen_files: list[RecentFile] = []  # files looked at that may turn out recent
        newest_so_far = record.newest if record and record.newest else 0.0
        writing = checked = unverified = 0
        for idx in _each(to_check):
            for rel in listing.paths(idx):
                if beat:
                    beat()
                reason, st = _check(os.path.join(root, rel), verify)
                if st is None:  # vanished between the listing and the check
                    continue
                t = st.st_mtime_ns / 1e9
                mtimes[idx] = max(mtimes.get(idx, 0.0), t)
                newest_so_far = max(newest_so_far, t)
                if t >= newest_so_far - RECENT_WINDOW:  # an older one cannot be recent: the newest only grows
                    seen_files.append(RecentFile.of(rel, idx, st, verify != "none" and reason is None))
                if verify == "none":
                    continue
                checked += 1
                if reason is None:
                    if rel.endswith(".gz") and verify != "all":
                        unverified += 1
                    good.add(idx)
                elif (job.running or job.how == "none") and now - st.st_mtime < WRITING_GRACE:
                    writing += 1
                else:
                    bad.append(Damaged(rel, reason, st.st_size, st.st_mtime))
                    bad_idx.add(idx)
            if verify != "none" and idx not in good and idx not in bad_idx:
                in_flight.add(idx)
        for f in carried:
            mtimes[f.index] = max(mtimes.get(f.index, 0.0), f.mtime_ns / 1e9)
        # An index with one good and one damaged file (x.ckpt and x.ckpt.gz) is done, but the
        # damaged one still goes to quarantine.
        unusable = to_ranges((bad_idx | in_flight) - good)
        usable = _subtract(present, unusable)
        done = _size(usable)
        absent = _subtract(everything, usable)
        allowed = _normalize((i, i) for i in spec["allow_missing"])
        allowed_absent = _size(_intersect(absent, allowed))
        missing = _subtract(absent, allowed)

        newest = max(mtimes.values(), default=None)
        if record and record.newest and (newest is None or record.newest > newest):
            newest = record.newest
        window = {i: t for i, t in mtimes.items() if newest is not None and t >= newest - RECENT_WINDOW}
        rate = _rate(list(window.values()))
        counted = done + allowed_absent
        eta = None
        if rate and job.running and counted < spec["min_done"]:
            eta = (spec["min_done"] - counted) / rate

        if verify == "none":
            verified = record.verified if record else []
        else:
            verified = _normalize(_subtract(_intersect(record.verified if record else [], present),
                                            to_ranges(bad_idx)) + to_ranges(good))
        recent = sorted((f for f in seen_files + carried if f.index in window), key=lambda f: (f.index, f.rel))
        new_state = {
            "format": STATE_FORMAT, **key,
            "verified": [list(x) for x in verified],
            "seen": [list(x) for x in present],
            "recent": [list(f) for f in recent],
            "newest": newest,
            "boot_id": boot,
            "dirs": listing.cache,
        }
        # An unchanged tree leaves the file as it is: no write per diff.
        if raw is None or {k: v for k, v in raw.items() if k != "checked_at"} != new_state:
            try:
                write_json(state_path, {**new_state, "checked_at": now})
            except OSError:
                pass  # best effort: without it the next `recent` check is a full one
        return ExtractionObserved(
            dir=root, exists=exists, total=total, done=done, counted=counted, files=files,
            missing=_size(missing), missing_ranges=tuple(missing[:MAX_RANGES]),
            missing_ranges_more=max(0, len(missing) - MAX_RANGES), damaged=tuple(bad), writing=writing,
            verify=verify, checked=checked, unverified_gz=unverified, out_of_range=stray, rate=rate,
            newest=newest, eta_s=eta, job=job,
        )

    # --- diff and plan ---------------------------------------------------------------

    def diff(self, resource: Resource, observed: ExtractionObserved) -> list[Drift]:
        drift = []
        if observed.damaged:
            drift.append(Drift("damaged", 0, len(observed.damaged)))
        min_done = resource.spec["min_done"]
        if observed.counted < min_done:
            drift.append(Drift("done", f">= {min_done}", observed.counted))
        return drift

    def plan(self, resource: Resource, observed: ExtractionObserved, drift: Sequence[Drift], ctx: Context) -> Plan:
        spec = resource.spec
        progress = _progress(spec["total"], observed.counted, observed.rate, observed.eta_s)
        notes = []
        if observed.missing_ranges:
            notes.append("missing " + format_ranges(observed.missing_ranges, observed.missing_ranges_more))
        if not observed.exists:
            notes.append(f"{observed.dir} does not exist yet")
        message = "; ".join(notes)
        if not drift:
            return Plan(message=message)
        actions: list[Action] = []
        if observed.damaged:
            n = len(observed.damaged)
            actions.append(Action(
                "quarantine", observed.dir,
                f"move {n} damaged file{'s' if n != 1 else ''} to {observed.dir}/{QUARANTINE}/ "
                f"({observed.damaged[0].path}: {observed.damaged[0].reason}"
                + (f", +{n - 1} more" if n > 1 else "") + ")",
                {"files": [{"path": d.path, "reason": d.reason} for d in observed.damaged]}))
        if observed.counted >= spec["min_done"]:
            return Plan(actions=tuple(actions), message=message)
        job = observed.job
        if job.running:
            return Plan(actions=tuple(actions), converging=f"{job.how} {job.target} running ({job.state}): {progress}",
                        message=message)
        if job.how == "none":
            return Plan(actions=tuple(actions), blocked=f"{progress}; no resume declared to continue the job",
                        message=message)
        if job.how == "unit" and not job.exists:
            return Plan(actions=tuple(actions), blocked=f"{progress}; resume unit {job.target} not found",
                        message=message)
        actions.append(Action("start", job.target, f"start {job.how} {job.target} to resume at {progress}",
                              {"how": job.how}))
        return Plan(actions=tuple(actions), message=message)

    # --- apply -----------------------------------------------------------------------

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        if action.action == "quarantine":
            return quarantine(resource, action.params.get("files", ()))
        if action.action == "start":
            resume = resource.spec["resume"]
            if resume.get("unit"):
                run_action(host, ["systemctl", "start", "--", resume["unit"]], START_TIMEOUT)
                return f"started {resume['unit']}"
            if resume.get("command"):
                return start_command(host, resource)
            raise ApplyError("no resume declared")
        raise ApplyError(f"unknown extraction action {action.action!r}")

    def summary(self, resource: Resource, observed: ExtractionObserved) -> str:
        spec = resource.spec
        parts = [_progress(spec["total"], observed.counted, observed.rate, observed.eta_s)]
        if observed.missing:
            parts.append(f"{observed.missing:,} missing")
        if observed.damaged:
            parts.append(f"{len(observed.damaged)} damaged")
        if observed.writing:
            parts.append(f"{observed.writing} being written")
        if observed.job.how != "none":
            parts.append(f"job {observed.job.state}")
        return ", ".join(parts)


def _unchanged_recent(root: str, listing: Listing, present: list[tuple[int, int]], record: CheckRecord,
                      boot: str | None) -> tuple[list[RecentFile], set[int]]:
    """Split the recorded recent files: those that need no re-read (all files of their index
    whole when last read, same boot, same files, same stat: size, mtime, ctime, inode), and
    the indices to read again."""
    same_boot = boot is not None and boot == record.boot_id
    by_index: dict[int, list[RecentFile]] = {}
    for f in record.recent:
        by_index.setdefault(f.index, []).append(f)
    unchanged: list[RecentFile] = []
    reread: set[int] = set()
    for idx, known in by_index.items():
        if not _contains(present, idx):
            continue
        if not same_boot or not all(f.whole for f in known) \
                or sorted(listing.paths(idx)) != sorted(f.rel for f in known):
            reread.add(idx)
            continue
        for f in known:
            try:
                st = os.stat(os.path.join(root, f.rel))
            except OSError:
                reread.add(idx)
                break
            if not f.same_stat(st):
                reread.add(idx)
                break
        else:
            unchanged += known
    return unchanged, reread


def _check(path: str, verify: str):
    """(reason or None, stat or None when the file vanished)."""
    from .integrity import check_file

    if verify == "none":
        try:
            return None, os.stat(path)
        except FileNotFoundError:
            return None, None
    try:
        return check_file(path, deep=verify == "all")
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        try:
            st = os.stat(path)
        except OSError:
            return None, None
        return f"unreadable: {exc.strerror}", st


def _rate(mtimes: list[float]) -> float | None:
    if len(mtimes) < 3:
        return None
    mtimes.sort()
    span = mtimes[-1] - mtimes[0]
    return (len(mtimes) - 1) / span if span > 0 else None


# --- acting ------------------------------------------------------------------------------

def _inside(root: str, rel: str) -> str:
    norm = os.path.normpath(rel)
    if os.path.isabs(norm) or norm.startswith("..") or norm.split(os.sep)[0] == QUARANTINE:
        raise ApplyError(f"refusing to move {rel!r}: not a file inside {root}")
    return norm


def quarantine(resource: Resource, files: Iterable[dict[str, Any]]) -> str:
    """Move damaged files into <dir>/.reconcile-quarantine/<UTC time>/ (same file system, so a
    rename: nothing is copied or deleted) and write a manifest of what was moved and why.
    Each file is checked again first: one found whole now is left where it is."""
    root = resource.spec["dir"]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    qdir = os.path.join(root, QUARANTINE, stamp)
    n = 1
    while os.path.exists(qdir):
        n += 1
        qdir = os.path.join(root, QUARANTINE, f"{stamp}-{n}")
    moved: list[dict[str, Any]] = []
    skipped: list[str] = []
    rx = compile_pattern(resource.spec["pattern"])
    try:
        for f in files:
            rel = _inside(root, f["path"])
            parts = rel.split(os.sep)
            if len(parts) != len(rx) or not all(r.fullmatch(p) for r, p in zip(rx, parts, strict=True)):
                raise ApplyError(f"refusing to move {rel!r}: it does not match the pattern")
            src = os.path.join(root, rel)
            reason, st = _check(src, "all" if resource.spec["verify"] == "all" else "recent")
            if st is None or reason is None:
                skipped.append(rel)
                continue
            dst = os.path.join(qdir, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.lexists(dst):
                raise ApplyError(f"{dst} exists already")
            os.rename(src, dst)
            moved.append({"path": rel, "moved_to": os.path.join(QUARANTINE, os.path.basename(qdir), rel),
                          "reason": reason, "size": st.st_size, "mtime": st.st_mtime})
    finally:
        if moved:
            write_json(os.path.join(qdir, "manifest.json"), {
                "created": utc_iso(),
                "extraction": resource.name, "dir": root,
                "why": "damaged sample files moved aside so that the job regenerates them",
                "files": moved,
            })
    text = f"moved {len(moved)} file{'s' if len(moved) != 1 else ''} to {qdir}"
    if skipped:
        text += f"; {len(skipped)} no longer damaged or gone, left alone"
    return text


def _proc_starttime(host: Host, pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot): with the pid it
    names one process, so a reused pid is not taken for our job. None if gone or a zombie."""
    try:
        stat = host.read_text(f"/proc/{pid}/stat")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return fields[19]


def _command_pid(host: Host, name: str) -> int | None:
    info = _load_json(state_dir() / f"{name}.pid")
    if not info or not isinstance(info.get("pid"), int) or info["pid"] <= 1:
        return None
    start = _proc_starttime(host, info["pid"])
    return info["pid"] if start is not None and start == info.get("starttime") else None


def start_command(host: Host, resource: Resource) -> str:
    resume = resource.spec["resume"]
    argv = list(resume["command"])
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    log = d / f"{resource.name}.log"
    try:
        pid = host.spawn_detached(argv, str(log), cwd=resume.get("cwd"))
    except OSError as exc:
        raise ApplyError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    write_json(d / f"{resource.name}.pid", {
        "pid": pid, "starttime": _proc_starttime(host, pid), "argv": argv, "log": str(log),
        "started": utc_iso(),
    })
    return f"started pid {pid}: {' '.join(argv)} (output in {log})"


__all__ = ["ExtractionsReconciler", "ExtractionObserved", "scan", "list_tree", "compile_pattern", "to_ranges",
           "format_ranges", "quarantine", "state_dir"]
