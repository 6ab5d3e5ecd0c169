"""Long-running extraction jobs (EAGLE-3 hidden states): progress, damaged files, resume.

Observe counts completed samples from file NAMES (`os.scandir`, no stat per file, no glob:
on the story's host, globs over the tree failed under write load), checks the integrity
of the files that may be damaged (see integrity.py and `verify`), and asks whether the
job that writes them runs. Plan: quarantine damaged files (moved, never deleted, with a
manifest) so the job regenerates them; start the job when it is short of `min_done` and
not running; report `converging` with progress and ETA while it runs.

What `verify: recent` already checked is kept in a small state file per extraction in
the state directory: $RECONCILE_STATE_DIR if set, else the journal's directory
(/var/lib/reconcile as root), under `extractions/`. The pid file and output log of a
resume `command` live there too.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic import write_json
from .base import Action, ApplyError, Context, Drift, ObserveError, Plan, Reconciler, Resource, utc_iso
from .host import CommandTimeout, Host

QUARANTINE = ".reconcile-quarantine"
# Files modified within this window before the newest one are re-checked every time, and
# give the rate: after a VM crash, data written shortly before it may be gone from disk
# although it was whole in the page cache when last checked.
RECENT_WINDOW = 300.0
# An incomplete file this young, while its job runs, is being written: not damaged.
WRITING_GRACE = 60.0
# Under `verify: none`, stat at most this many new files (for the rate).
STAT_LIMIT = 256
MAX_RANGES = 20  # missing ranges kept in the observation (the rest is counted)
CALL_TIMEOUT = 30.0
START_TIMEOUT = 120.0


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


def scan(root: str, pattern: str, total: int) -> tuple[dict[int, str], dict[int, list[str]], int]:
    """Sample files by index (paths relative to root), further files of an index that has
    more than one (data_7.ckpt and data_7.ckpt.gz), and the count of matching files whose
    index is >= total. Names only: directory entries' types come from readdir (d_type)."""
    regexes = compile_pattern(pattern)
    # File names are matched all at once: one regex pass over the directory's listing joined
    # by newlines, so the per-name work is done in C (most of a scan's cost on 37,312 files).
    leaf = re.compile(f"^({regexes[-1].pattern})$", re.MULTILINE)
    found: dict[int, str] = {}
    extra: dict[int, list[str]] = {}
    stray = 0

    def walk(path: str, rel: str, level: int) -> None:
        nonlocal stray
        if level == len(regexes) - 1:
            # The files: names are all we need, so plain listdir (one getdents, no DirEntry
            # objects), matched in one regex pass; this is most of the cost of a scan.
            listing = os.listdir(path)
            text = "\n".join(listing)
            if text.count("\n") == len(listing) - 1:
                hits = leaf.findall(text)  # [(name, index digits)]
            else:  # a name with a newline in it: match names one by one
                hits = [(m.group(0), m.group("index")) for n in listing if (m := regexes[-1].fullmatch(n))]
            if not hits:
                return
            names, digits = zip(*hits, strict=True)
            indices = list(map(int, digits))
            pairs = list(zip(indices, names, strict=True))
            before = len(found)
            if max(indices) < total:
                in_range = len(pairs)
                found.update(zip(indices, map(rel.__add__, names), strict=True))
            else:
                in_range = sum(1 for i in indices if i < total)
                found.update((i, rel + name) for i, name in pairs if i < total)
            stray += len(pairs) - in_range
            if len(found) - before != in_range:  # an index seen twice: redo this directory slowly
                for i, name in pairs:
                    if i < total and found[i] != rel + name:
                        extra.setdefault(i, []).append(rel + name)
            return
        rx = regexes[level]
        with os.scandir(path) as it:
            for entry in it:
                name = entry.name
                # entry.is_dir() comes from readdir's d_type: no stat.
                if name != QUARANTINE and rx.fullmatch(name) and entry.is_dir():
                    walk(entry.path, f"{rel}{name}/", level + 1)

    walk(root, "", 0)
    return found, extra, stray


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


# --- where our own small files live ------------------------------------------------------

def state_dir() -> Path:
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
    from .statefile import format_duration

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
            try:
                out[r.id] = self._observe_files(r, job)
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

    def _observe_files(self, r: Resource, job: JobObserved) -> ExtractionObserved:
        spec = r.spec
        root, total, verify = spec["dir"], spec["total"], spec["verify"]
        try:
            found, extra, stray = scan(root, spec["pattern"], total)
            exists = True
        except FileNotFoundError as exc:
            if exc.filename != root:
                raise
            found, extra, stray, exists = {}, {}, 0, False

        state_path = state_dir() / f"{r.name}.check.json"
        key = {"dir": root, "pattern": spec["pattern"]}
        state = _load_json(state_path) or {}
        if {k: state.get(k) for k in key} != key:
            state = {}
        verified = from_ranges(state.get("verified", ()))
        seen = from_ranges(state.get("seen", ()))
        recent = {int(k) for k in state.get("recent", {})}
        present = set(found)

        if verify == "all" or (verify == "recent" and not state):
            to_check = present  # no earlier check to build on: check everything once
        elif verify == "recent":
            to_check = (present - verified) | (present & recent)
        else:
            new = sorted(present - seen)[-STAT_LIMIT:]
            to_check = set(new) | (present & recent)

        now = time.time()
        bad: list[Damaged] = []
        bad_idx: set[int] = set()
        good: set[int] = set()
        mtimes: dict[int, float] = {}
        writing = checked = unverified = 0
        for idx in sorted(to_check):
            for rel in (found[idx], *extra.get(idx, ())):
                path = os.path.join(root, rel)
                reason, st = _check(path, verify)
                if st is None:  # vanished between the scan and the check
                    continue
                mtimes[idx] = max(mtimes.get(idx, 0.0), st.st_mtime)
                if verify == "none":
                    continue
                checked += 1
                if reason is None:
                    if rel.endswith(".gz") and verify != "all":
                        unverified += 1
                    good.add(idx)
                elif job.running or job.how == "none":
                    if now - st.st_mtime < WRITING_GRACE:
                        writing += 1
                        continue
                    bad.append(Damaged(rel, reason, st.st_size, st.st_mtime))
                    bad_idx.add(idx)
                else:
                    bad.append(Damaged(rel, reason, st.st_size, st.st_mtime))
                    bad_idx.add(idx)
        # An index with one good and one damaged file (x.ckpt and x.ckpt.gz) is done, but the
        # damaged one still goes to quarantine.
        damaged_files = tuple(bad)
        in_flight = {i for i in to_check if i not in good and i not in bad_idx} if verify != "none" else set()
        usable = present - bad_idx - in_flight if verify != "none" else present
        usable |= good
        done = len(usable)
        allowed = set(spec["allow_missing"])
        absent = set(range(total)) - usable if len(usable) < total else set()
        allowed_absent = len(absent & allowed)
        missing_set = absent - allowed
        ranges = to_ranges(missing_set)

        newest = max(mtimes.values(), default=None)
        if state.get("newest") and (newest is None or state["newest"] > newest):
            newest = state["newest"]
        window = {i: t for i, t in mtimes.items() if newest is not None and t >= newest - RECENT_WINDOW}
        rate = _rate(list(window.values()))
        counted = done + allowed_absent
        eta = None
        if rate and job.running and counted < spec["min_done"]:
            eta = (spec["min_done"] - counted) / rate

        new_state = {
            **key,
            "verified": to_ranges((verified & present) - bad_idx | good) if verify != "none"
            else state.get("verified", []),
            "seen": to_ranges(present),
            "recent": {str(i): t for i, t in window.items()},
            "newest": newest,
            "checked_at": now,
        }
        try:
            write_json(state_path, new_state)
        except OSError:
            pass  # best effort: without it the next `recent` check is a full one
        return ExtractionObserved(
            dir=root, exists=exists, total=total, done=done, counted=counted,
            files=len(found) + sum(map(len, extra.values())),
            missing=len(missing_set), missing_ranges=tuple(ranges[:MAX_RANGES]),
            missing_ranges_more=max(0, len(ranges) - MAX_RANGES), damaged=damaged_files, writing=writing,
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
                try:
                    res = host.run(["systemctl", "start", "--", resume["unit"]], timeout=START_TIMEOUT)
                except CommandTimeout as exc:
                    raise ApplyError(str(exc)) from None
                if not res.ok:
                    raise ApplyError(res.brief())
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
            write_json(Path(qdir) / "manifest.json", {
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


__all__ = ["ExtractionsReconciler", "ExtractionObserved", "scan", "compile_pattern", "to_ranges",
           "format_ranges", "quarantine", "state_dir"]
