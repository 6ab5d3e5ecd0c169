"""The file name pattern and the listing of the tree, with the listing cache: names only
(`os.scandir`, no stat per file, no glob), each leaf directory's listing kept while its mtime,
ctime and inode are unchanged (see the package docstring)."""

from __future__ import annotations

import os
import re
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...common.quarantine import QUARANTINE
from .ranges import intersect, normalize, runs, valid_ranges

# The directory damaged samples are moved to (quarantine.py); never listed as samples.
MANIFEST = "manifest.json"  # written when a quarantine's moves are over (quarantine.py)
# A directory listing is trusted later only if the directory's mtime was at least this much
# older than the moment the listing started (2 s: FAT's timestamp granularity, the coarsest
# in use; Linux's own clock ticks are milliseconds).
RACY_NS = 2 * 10**9
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


def canonical_indices(names: list[str], prefix: str, suffix: str) -> list[int] | None:
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
            ints = canonical_indices(names, form.prefix, form.suffix)
            if ints is not None:
                return cls(rel, runs(ints), [], [])
            if form.gz:
                ints = canonical_indices(names, form.prefix, form.suffix + ".gz")
                if ints is not None:
                    return cls(rel, [], runs(ints), [])
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
        return cls(rel, runs(plain), runs(gz), named)

    @classmethod
    def from_entry(cls, rel: str, entry: dict[str, Any]) -> Leaf | None:
        """A cached listing from the state file; None if it is not one we wrote."""
        try:
            named = [(i, n) for i, n in entry.get("x", [])]
            if not all(type(i) is int and i >= 0 and isinstance(n, str) for i, n in named):
                return None
            return cls(rel, valid_ranges(entry.get("r", [])), valid_ranges(entry.get("z", [])), named)
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

    def files_in(self, lo: int, hi: int) -> Iterator[tuple[int, list[str]]]:
        """(idx, paths(idx)) for every idx from lo to hi, as paths() gives them, without its
        lookup per index: between two interval ends the same leaves hold every index."""
        points, covers, named, form = self._points, self._covers, self._named, self.form
        k = bisect_right(points, lo) - 1
        idx = lo
        while idx <= hi:
            end = min(hi, points[k + 1] - 1) if k + 1 < len(points) else hi
            where = covers[k] if k >= 0 else []
            if where:
                assert form is not None  # ranges exist only with a renderable form
                parts = [(self.leaves[n].rel + form.prefix, form.suffix + (".gz" if v else "")) for n, v in where]
            else:
                parts = []
            for i in range(idx, end + 1):
                if i in named:
                    yield i, self.paths(i)
                elif len(parts) == 1:
                    yield i, [f"{parts[0][0]}{i}{parts[0][1]}"]
                else:
                    yield i, [f"{a}{i}{b}" for a, b in parts]
            idx = end + 1
            k += 1

    def present(self, total: int) -> list[tuple[int, int]]:
        """Ranges of the indices < total that have at least one file."""
        runs = [(a, b) for a, b, *_ in self._intervals]
        runs += [(i, i) for i in self._named]
        return intersect(normalize(runs), [(0, total - 1)] if total > 0 else [])

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
                # entry.is_dir() comes from readdir's d_type: no stat. A link is never a folder of
                # the tree (the user's tree: a link to a folder elsewhere is not walked into).
                subdirs = [(e.path, e.name) for e in it
                           if e.name != QUARANTINE and rx.fullmatch(e.name)
                           and e.is_dir(follow_symlinks=False)]
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
            for a, b in intersect(ranges, [(0, total - 1)] if total > 0 else []):
                head, end = leaf.rel + form.prefix, form.suffix + tail
                indices = range(a, b + 1)
                paths = [f"{head}{i}{end}" for i in indices]
                if found.keys().isdisjoint(indices):
                    found.update(zip(indices, paths, strict=True))
                else:
                    add(zip(indices, paths, strict=True))
        add((i, leaf.rel + name) for i, name in leaf.named if i < total)
    return found, extra, listing.counts(total)[1]


def unfinished_quarantines(root: str) -> list[str]:
    """The quarantine directories under `root` without a manifest: moves an apply began and did
    not finish (killed), by name, oldest first. Cheap: one listing and a stat per directory."""
    qroot = os.path.join(root, QUARANTINE)
    try:
        names = sorted(e.name for e in os.scandir(qroot) if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [n for n in names if not os.path.lexists(os.path.join(qroot, n, MANIFEST))]
