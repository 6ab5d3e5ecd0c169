"""Long-running extraction jobs (EAGLE-3 hidden states): progress, damaged files, resume.

Observe counts completed samples from file NAMES (`os.listdir`/`os.scandir`, no stat per
file, no glob: on a host under heavy write load, globs over the tree failed), checks the
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

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...machines.host import Host

from ...pipeline.atomic import write_json
from ...pipeline.contract import (
    Action,
    ApplyError,
    Context,
    Drift,
    ObserveError,
    Plan,
    Reconciler,
    Resource,
    run_action,
)
from ...pipeline.values import format_duration, parse_duration
from .integrity import check
from .job import START_TIMEOUT, JobObserved, observe_jobs, start_command
from .listing import QUARANTINE, Listing, leaf_form, list_tree
from .quarantine import quarantine
from .ranges import contains, each, format_ranges, intersect, last, normalize, size, subtract, to_ranges
from .records import STATE_FORMAT, CheckRecord, RecentFile, boot_id, load_json, state_dir

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
DEFAULT_OBSERVE_TIMEOUT = "60s"  # without progress; see ExtractionsReconciler.observe_idle


@dataclass(frozen=True)
class Damaged:
    path: str  # relative to the extraction's dir
    reason: str
    size: int
    mtime: float


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
        jobs = observe_jobs(host, resources)
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

    def _observe_files(self, r: Resource, job: JobObserved,
                       beat: Callable[[], None] | None = None) -> ExtractionObserved:
        spec = r.spec
        root, total, verify = spec["dir"], spec["total"], spec["verify"]
        state_path = state_dir() / f"{r.name}.check.json"
        key = {"dir": root, "pattern": spec["pattern"]}
        raw = load_json(state_path)
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
            to_check = normalize(subtract(present, record.verified) + to_ranges(reread))
        else:
            new = last(subtract(present, record.seen if record else []), STAT_LIMIT)
            was_recent = to_ranges(f.index for f in previous)
            to_check = normalize(new + intersect(present, was_recent))
        carried = [f for f in carried if not contains(to_check, f.index)]

        now = time.time()
        bad: list[Damaged] = []
        bad_idx: set[int] = set()
        good: set[int] = set()
        in_flight: set[int] = set()  # checked, neither whole nor damaged: being written or gone
        mtimes: dict[int, float] = {}  # index -> newest mtime of its files, for the files looked at
        seen_files: list[RecentFile] = []  # files looked at that may turn out recent
        newest_so_far = record.newest if record and record.newest else 0.0
        writing = checked = unverified = 0
        for idx in each(to_check):
            for rel in listing.paths(idx):
                if beat:
                    beat()
                reason, st = check(os.path.join(root, rel), verify)
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
        usable = subtract(present, unusable)
        done = size(usable)
        absent = subtract(everything, usable)
        allowed = normalize((i, i) for i in spec["allow_missing"])
        allowed_absent = size(intersect(absent, allowed))
        missing = subtract(absent, allowed)

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
            verified = normalize(subtract(intersect(record.verified if record else [], present),
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
            missing=size(missing), missing_ranges=tuple(missing[:MAX_RANGES]),
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
        if not contains(present, idx):
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


def _rate(mtimes: list[float]) -> float | None:
    if len(mtimes) < 3:
        return None
    mtimes.sort()
    span = mtimes[-1] - mtimes[0]
    return (len(mtimes) - 1) / span if span > 0 else None


__all__ = ["ExtractionsReconciler", "ExtractionObserved", "scan", "list_tree", "compile_pattern", "to_ranges",
           "format_ranges", "quarantine", "state_dir"]
