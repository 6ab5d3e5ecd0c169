"""The integrity check of a tree, in runs of indices, on every CPU, and what it adds up to.

Phase 1 checks every file of the indices to check, at the depth the verify mode asks (the
files the recent rule re-reads: their content). Phase 2 (`verify: at-risk`, when no check of
this boot has seen the tree) reads whole the files written within RECENT_WINDOW of the newest.
Both run as tasks on pool.map_forked's workers, or in this process when the work is small.

A task adds up its files as it goes, so a million whole files come back as a few ranges and
counts, not as a million verdicts (the observation stays small, and nothing per file crosses
between processes): the indices with a whole file, those whose .gz was only opened, those
without CRCs, how many files were checked and how many read whole, the newest modification
time. Kept one by one ("held") are the files that are not whole, and every file of an index
whose newest file is within RECENT_WINDOW of the task's newest: only those can be recent, the
newest of the whole tree being at least the task's. Every sum is a union, a count or a maximum,
so the tasks may finish in any order and on any number of workers: the result is the serial
one (tests/test_extractions_parallel.py holds them equal on a tree with damaged files).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

from ...common.filechecks.verdicts import CONTENT, GONE, STRUCTURE, UNPROVEN, UNREADABLE, Verdict
from .ranges import normalize, size, to_ranges

if TYPE_CHECKING:
    from .listing import Listing

# Files modified within this window before the newest one give the rate, and are re-read when
# the machine has booted since they were checked (see the package docstring).
RECENT_WINDOW = 300.0
# Below these, the check runs in the observer itself: forking workers costs milliseconds.
POOL_MIN_INDICES = 1000
POOL_MIN_BYTES = 64 * 2**20
CHUNK = 512  # indices per task at most (a few milliseconds of structural checks)
TICK_BATCH = 16  # indices a task checks between two calls of its tick (a few hundred µs: a heartbeat still)
CONTENT_TASK_BYTES = 16 * 2**20  # bytes read whole per task in phase 2, about
PRUNE_AT = 4096  # held files before the observer adds up those that have turned out old


REFUSED = -2  # a folder's fd in Check's table: not entered (see Check.refused)
_new = tuple.__new__  # a NamedTuple made without its Python-level __new__


class Held(NamedTuple):
    """A file kept one by one: its index, its place among the index's files, its path below
    the extraction's dir, and the verdict."""
    idx: int
    k: int
    rel: str
    v: Verdict


class Part(NamedTuple):
    """What a run of indices added up to (see the module docstring)."""
    good: list[tuple[int, int]]  # indices with a whole file, held files apart
    gz: list[tuple[int, int]]  # ... whose .gz was only opened (gz_shallow)
    no_crc: list[tuple[int, int]]  # ... whose archive has no CRCs
    checked: int
    content: int  # of `checked`, read whole
    newest: float | None  # the newest modification time of the files seen (per index, from 0.0)
    held: list[Held]


class Tally(NamedTuple):
    """The whole check: Parts merged, phase 2 done, the held files sorted as the serial check
    sees them (by index, then by the index's own order of files)."""
    good: list[tuple[int, int]]
    gz: list[tuple[int, int]]
    no_crc: list[tuple[int, int]]
    checked: int
    content: int
    newest: float | None  # of the files checked (phase 1), and `known`
    mtimes: dict[int, float]  # newest modification time of each held index, from phase 1
    held: list[Held]


class Check:
    """What every task needs, inherited by the workers when they are forked."""

    def __init__(self, root: str, listing: Listing, depth: str, reread: set[int], walk: bool = True):
        self.root, self.listing, self.depth, self.reread = root, listing, depth, reread
        # walk=False (verify: at-risk): the files read whole for what a crash can have torn have
        # their CRCs checked, the pickle walked only where there are none (torchzip.check_torch_zip)
        self.walk = walk
        # Set by run() for the first check of a boot under at-risk: a file that may be recent has
        # its CRCs checked in phase 1's read (check_path's crcs_from), so phase 2 need not read it.
        self.recent_pass = False
        self.refused: dict[str, str] = {}  # folder -> why it was not entered (a link, a special file)

    @cached_property
    def check_path(self) -> Callable[..., Verdict]:
        """integrity.check_path. The file checks and the archive readers under them are imported
        with the first file to check, not with the kind (see verdicts.py)."""
        from ...common.filechecks.integrity import check_path

        return check_path

    def indices(self, span: tuple[int, int], tick: Callable[[int], None], since: float | None = None) -> Part:
        """Phase 1 for the indices span[0]..span[1] (all of them to be checked). `since`: the
        newest modification time known so far (of the files checked before): a file within
        RECENT_WINDOW of neither it nor this run's newest cannot be recent, and is added up."""
        lo, hi = span
        reread, depth, check, check_path, walk = self.reread, self.depth, self._check, self.check_path, self.walk
        old_before = None if since is None else since - RECENT_WINDOW
        # (a file older than this is added up at the end of the run, never read again: see below)
        crcs_from = None if not self.recent_pass or depth != STRUCTURE else \
            0 if old_before is None else int(old_before * 1e9)
        dirs: dict[str, int | None] = {}
        pending: list[tuple[int, list[tuple[int, str, Verdict]], float | None]] = []
        newest: float | None = None
        good: list[int] = []
        gz: list[int] = []
        no_crc: list[int] = []
        held: list[Held] = []
        checked = content = 0
        untold = 0  # indices done since the last tick(): told TICK_BATCH at a time (a call less per file)
        try:
            for idx, rels in self.listing.files_in(lo, hi):
                untold += 1
                if untold == TICK_BATCH:
                    tick(untold)
                    untold = 0
                d = CONTENT if idx in reread else depth
                if len(rels) == 1:  # (the usual: one file an index; the loop below, inline)
                    rel = rels[0]
                    head, _, name = rel.rpartition("/")
                    fd = dirs.get(head, -1)  # (inline: _check, as every file of a first check takes it)
                    v = check_path(name, d, fd, walk, crcs_from) if fd is not None and fd >= 0 \
                        else check(rel, d, dirs, crcs_from)
                    if v.state == GONE:  # vanished between the listing and the check
                        continue
                    mine = [(0, rel, v)]
                    top = None if v.st is None else v.st.st_mtime_ns / 1e9
                else:
                    mine = []
                    top = None
                    for k, rel in enumerate(rels):
                        head, _, name = rel.rpartition("/")
                        fd = dirs.get(head, -1)
                        v = check_path(name, d, fd, walk, crcs_from) if fd is not None and fd >= 0 \
                            else check(rel, d, dirs, crcs_from)
                        if v.state == GONE:
                            continue
                        mine.append((k, rel, v))
                        if v.st is not None:
                            t = v.st.st_mtime_ns / 1e9
                            top = max(0.0 if top is None else top, t)
                    if not mine:
                        continue
                if top is not None and (newest is None or top > newest):
                    newest = top
                if old_before is None or top is None or top >= old_before:
                    pending.append((idx, mine, top))  # may be recent: decided at the end of the run
                    continue
                for k, rel, v in mine:  # (inline: this is the path of nearly every file)
                    if not v.whole:
                        held.append(Held(idx, k, rel, v))
                        continue
                    checked += 1
                    content += v.depth == CONTENT
                    if not good or good[-1] != idx:
                        good.append(idx)
                    if v.gz_shallow and (not gz or gz[-1] != idx):
                        gz.append(idx)
                    if v.no_crc and (not no_crc or no_crc[-1] != idx):
                        no_crc.append(idx)
        finally:
            for fd in set(dirs.values()):
                if fd is not None and fd >= 0:
                    os.close(fd)
        if untold:
            tick(untold)
        top_known = newest if since is None or (newest is not None and newest > since) else since
        recent_from = None if top_known is None else top_known - RECENT_WINDOW
        for idx, mine, top in pending:
            keep = recent_from is not None and top is not None and top >= recent_from
            for k, rel, v in mine:
                if keep or not v.whole:
                    held.append(Held(idx, k, rel, v))
                    continue
                checked += 1
                content += v.depth == CONTENT
                good.append(idx)
                if v.gz_shallow:
                    gz.append(idx)
                if v.no_crc:
                    no_crc.append(idx)
        return Part(to_ranges(good), to_ranges(gz), to_ranges(no_crc), checked, content, newest, held)

    def _check(self, rel: str, depth: str, dirs: dict[str, int | None], crcs_from: int | None = None) -> Verdict:
        """check_path, opening the file relative to its directory, kept open for the task."""
        head, _, name = rel.rpartition("/")
        if head not in dirs:
            # The user's tree: each folder opened once, beneath the root's fd with no link followed
            # (common/usertree.py), so a folder swapped for a link after the listing is not entered.
            # Once per folder, not per file: imported here, not with the kind.
            from ...common.usertree import DIR_FLAGS, UnsafeTree, chase_safe, open_beneath

            for rel_dir in ("", head) if "" not in dirs and head else (head,):
                try:
                    base = dirs.get("")
                    if not rel_dir:
                        fd = chase_safe(self.root)
                    elif base is None or base == REFUSED:
                        fd = base
                        if base == REFUSED:
                            self.refused[rel_dir] = self.refused[""]
                    else:
                        fd = open_beneath(base, rel_dir, DIR_FLAGS)
                except FileNotFoundError:
                    fd = None  # gone since the listing
                except OSError as exc:  # a link, a special file (UnsafeTree), or not readable
                    fd, self.refused[rel_dir] = REFUSED, str(exc) if isinstance(exc, UnsafeTree) \
                        else f"{os.path.join(self.root, rel_dir)}: {exc.strerror}"
                dirs[rel_dir] = fd
        fd = dirs[head]
        if fd == REFUSED:
            return Verdict(UNREADABLE, f"unreadable: {self.refused[head]}", depth)
        if fd is None:  # gone since the listing: never a path walked again instead
            return Verdict(GONE, depth=depth)
        return self.check_path(name, depth, fd, self.walk, crcs_from)

    def content(self, items: list[tuple[int, str]], tick: Callable[[int], None],
                _since: float | None = None) -> list[tuple[int, Verdict]]:
        """Phase 2: these files read whole (n, their verdict); gone ones left out."""
        out = []
        dirs: dict[str, int | None] = {}
        try:
            for n, rel in items:
                v = self._check(rel, CONTENT, dirs)  # relative to its folder's fd, as in phase 1
                tick(1)
                if v.state != GONE:
                    out.append((n, v))
        finally:
            for fd in set(dirs.values()):
                if fd is not None and fd >= 0:
                    os.close(fd)
        return out


def run(check: Check, to_check: list[tuple[int, int]], recent_pass: bool, known: float | None,
        on_tick: Callable[[str, int, int], None]) -> Tally:
    """Check the indices of `to_check` (phase 1), then, with `recent_pass`, read whole the files
    within RECENT_WINDOW of the newest, which is at least `known` (phase 2). on_tick(stage, done,
    total) as files are done.

    The runs of indices are checked from the highest down: a job writes in index order, so the
    newest files come first and teach every later task what cannot be recent (the `since` of
    Check.indices), which keeps the files held one by one to about a window's worth."""
    total = size(to_check)
    if not total:  # every file as last seen (the steady state): nothing to import or fork
        return Tally([], [], [], 0, 0, known, {}, [])
    from .pool import TICK_EVERY, map_forked, worker_count  # (with the first file to check, as check_path)

    check.check_path  # noqa: B018  (imported here, once, before any worker is forked)
    check.recent_pass = recent_pass
    spans = _spans(to_check, max(64, min(CHUNK, total // 64)))[::-1]  # >= 64 tasks where there are enough
    done = [0, 0.0]  # files done, when on_tick was last called

    def tick1(n: int) -> None:
        done[0] += n
        now = time.monotonic()
        if now - done[1] >= TICK_EVERY or done[0] == total:
            done[1] = now
            on_tick("checking", done[0], total)

    acc = _Sum(known)
    workers = worker_count(check.root, len(spans)) if total >= POOL_MIN_INDICES else 1
    map_forked(check.indices, spans, workers, tick1, hint=lambda: acc.newest, on_result=acc.add)
    held = acc.prune()
    held.sort(key=lambda h: (h.idx, h.k))
    mtimes: dict[int, float] = {}
    for h in held:
        if h.v.st is not None:
            mtimes[h.idx] = max(mtimes.get(h.idx, 0.0), h.v.st.st_mtime_ns / 1e9)
    newest = acc.newest
    if recent_pass and newest is not None:
        held = _recent_pass(check, held, newest - RECENT_WINDOW, on_tick)
    return Tally(normalize(acc.good), normalize(acc.gz), normalize(acc.no_crc), acc.checked, acc.content, newest,
                 mtimes, held)


class _Sum:
    """The Parts added up as they come; the held files that turn out too old to be recent (the
    newest seen has moved on) added up too, now and then, so that they stay few."""

    def __init__(self, known: float | None):
        self.newest = known
        self.good: list[tuple[int, int]] = []
        self.gz: list[tuple[int, int]] = []
        self.no_crc: list[tuple[int, int]] = []
        self.held: list[Held] = []
        self.checked = self.content = 0
        self._pruned_at = PRUNE_AT

    def add(self, p: Part) -> None:
        self.good += p.good
        self.gz += p.gz
        self.no_crc += p.no_crc
        self.held += p.held
        self.checked += p.checked
        self.content += p.content
        if p.newest is not None and (self.newest is None or p.newest > self.newest):
            self.newest = p.newest
        if len(self.held) > self._pruned_at:
            self.prune()
            self._pruned_at = max(PRUNE_AT, 2 * len(self.held))
        if len(self.good) > 4096:
            self.good, self.gz, self.no_crc = normalize(self.good), normalize(self.gz), normalize(self.no_crc)

    def prune(self) -> list[Held]:
        """Add up the whole held files of indices whose newest file is older than the window
        before the newest seen; the held files that are left."""
        if self.newest is None:
            return self.held
        since = self.newest - RECENT_WINDOW
        tops: dict[int, float] = {}
        for h in self.held:
            if h.v.st is not None:
                tops[h.idx] = max(tops.get(h.idx, 0.0), h.v.st.st_mtime_ns / 1e9)
        kept: list[Held] = []
        good: list[int] = []
        gz: list[int] = []
        no_crc: list[int] = []
        for h in self.held:
            v = h.v
            if not v.whole or (h.idx in tops and tops[h.idx] >= since):
                kept.append(h)
                continue
            self.checked += 1
            self.content += v.depth == CONTENT
            good.append(h.idx)
            if v.gz_shallow:
                gz.append(h.idx)
            if v.no_crc:
                no_crc.append(h.idx)
        self.good += to_ranges(good)
        self.gz += to_ranges(gz)
        self.no_crc += to_ranges(no_crc)
        self.held = kept
        return kept


def _recent_pass(check: Check, held: list[Held], since: float,
                 on_tick: Callable[[str, int, int], None]) -> list[Held]:
    """Phase 2: the whole files checked for their structure only, modified at `since` or later,
    read whole; a verdict replaces the structural one unless the file is gone by then."""
    todo = [n for n, h in enumerate(held)
            if (h.v.whole or h.v.state == UNPROVEN) and h.v.depth == STRUCTURE and h.v.st.st_mtime_ns / 1e9 >= since]
    out = list(held)
    read = []
    for n in todo:  # proven by their CRCs in phase 1's read: what reading them again would say
        h = held[n]
        if h.v.crcs_proven:  # (made directly: _replace costs µs, and a first check has thousands)
            out[n] = Held(h.idx, h.k, h.rel, _new(Verdict, (*h.v[:2], CONTENT, *h.v[3:7], False)))
        else:
            read.append(n)
    todo = read
    if not todo:
        return out
    tasks: list[list[tuple[int, str]]] = [[]]
    load = 0
    per_task = max(1, min(CHUNK, len(todo) // 64))  # >= 64 tasks where there are enough files
    for n in todo:
        if tasks[-1] and (load >= CONTENT_TASK_BYTES or len(tasks[-1]) >= per_task):
            tasks.append([])
            load = 0
        tasks[-1].append((n, held[n].rel))
        load += held[n].v.st.st_size
    nbytes = sum(held[n].v.st.st_size for n in todo)
    done = [0]

    def tick2(k: int) -> None:
        done[0] += k
        on_tick("reading whole", done[0], len(todo))

    from .pool import map_forked, worker_count

    big = nbytes >= POOL_MIN_BYTES or len(todo) >= POOL_MIN_INDICES
    workers = worker_count(check.root, len(tasks)) if big else 1
    for result in map_forked(check.content, tasks, workers, tick2):
        for n, v in result:
            out[n] = out[n]._replace(v=v)
    return out


def _spans(ranges: Sequence[tuple[int, int]], chunk: int) -> list[tuple[int, int]]:
    """The ranges cut into runs of at most `chunk` indices."""
    out = []
    for a, b in ranges:
        for lo in range(a, b + 1, chunk):
            out.append((lo, min(b, lo + chunk - 1)))
    return out


__all__ = ["Check", "Held", "Tally", "run", "RECENT_WINDOW"]
