"""Long-running extraction jobs (EAGLE-3 hidden states): progress, damaged files, their job.

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
output log of a job's `command` live in the same directory.

Test seam: $RECONCILE_BOOT_ID_FILE, read on each observe, names the file the boot id is read
from instead of /proc/sys/kernel/random/boot_id (tests change it to stand for a reboot).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...core.host import Host

from ...common import systemd
from ...common.filechecks.verdicts import CONTENT, STAT, STRUCTURE, UNPROVEN, UNREADABLE
from ...common.quarantine import refuse_planted
from ...common.usertree import UnsafeTree
from ...core.atomic import write_json
from ...core.boot import boot_id
from ...core.contract import (
    Action,
    ApplyError,
    Context,
    Drift,
    Metric,
    ObserveError,
    Plan,
    Reconciler,
    Resource,
)
from ...core.values import dotted, format_duration, never_answers, parse_duration
from . import tally
from .job import START_TIMEOUT, JobObserved, observe_jobs, start_command
from .listing import QUARANTINE, Listing, leaf_form, list_tree, unfinished_quarantines
from .ranges import contains, format_ranges, intersect, last, normalize, size, subtract, to_ranges
from .records import STATE_FORMAT, CheckRecord, RecentFile, load_json, state_dir

# Files modified within RECENT_WINDOW before the newest one give the rate, and are re-read
# when the machine has booted since they were checked, or their stat changed: after a VM
# crash, data written shortly before it may be gone from disk although it was whole in the
# page cache when last checked. Within one boot a re-read would be served from that same
# page cache, so it could not find anything the last check did not.
RECENT_WINDOW = tally.RECENT_WINDOW
# An incomplete file this young, while its job runs, is being written: not damaged.
WRITING_GRACE = 60.0
# Under `verify: none`, stat at most this many new files (for the rate).
STAT_LIMIT = 256
MAX_RANGES = 20  # missing ranges kept in the observation (the rest is counted)
DEFAULT_OBSERVE_TIMEOUT = "60s"  # without progress; see ExtractionsReconciler.observe_idle


@dataclass(frozen=True)
class Damaged:
    """A sample file found damaged or unreadable, and why."""

    path: str  # relative to the extraction's dir
    reason: str
    size: int
    mtime: float


@dataclass(frozen=True)
class ExtractionObserved:
    """An extraction's progress, its damaged and missing files, and its job."""

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
    unverified_gz: int  # indices whose .gz was never decompressed, only its header read (verify: at-risk)
    out_of_range: int
    rate: float | None  # samples/s from recent modification times
    newest: float | None  # mtime of the newest file seen
    eta_s: float | None
    job: JobObserved
    unreadable: tuple[Damaged, ...] = ()  # files that could not be read (EIO, EACCES): not done, not moved
    content_checked: int = 0  # files of `checked` whose every byte was read (CRCs, decompression)
    no_crc: int = 0  # indices whose torch.save archive has no CRCs: tensor bytes unproven
    # quarantine directories without a manifest: an apply was killed while it moved files
    unfinished_quarantine: tuple[str, ...] = ()
    unproven: int = 0  # indices whose file cannot be proven whole (counted done, not moved)
    unproven_first: tuple[Damaged, ...] = ()  # the first few of them this observation read, with why


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

    def problems(self, section: Any) -> list[tuple[tuple, str]]:
        out = never_answers((((name,), spec) for name, spec in section.items()), "observe_timeout")
        for name, spec in section.items():
            total, min_done = spec.get("total"), spec.get("min_done")
            if isinstance(total, int) and isinstance(min_done, int) and min_done > total:
                out.append(((name, "min_done"), f"{dotted((name, 'min_done'))}: {min_done} can never be done: "
                                                 f"there are only {total} samples (total)"))
        return sorted(out)

    def metrics(self, resource: Mapping[str, Any], report: Mapping[str, Any]) -> list[Metric]:
        from .metrics import extraction_metrics

        return extraction_metrics(resource, report)

    def resources(self, section: dict[str, Any]) -> list[Resource]:
        out = []
        for name, spec in section.items():
            norm = {
                "dir": spec["dir"].rstrip("/") or "/",
                "pattern": spec.get("pattern", "rows_{group}/data_{index}.ckpt"),
                "total": int(spec["total"]),
                "min_done": int(spec.get("min_done", spec["total"])),
                "allow_missing": tuple(sorted(set(spec.get("allow_missing", ())))),
                "verify": spec.get("verify", "at-risk"),
                "job": dict(spec.get("job") or {}),
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
                out[r.id] = self._observe_files(r, job, host.heartbeat, getattr(host, "progress", None))
            except ObserveError as exc:
                out[r.id] = exc
            except UnsafeTree as exc:  # a link or a planted quarantine where reconcile would act
                out[r.id] = ObserveError(str(exc))
            except OSError as exc:
                out[r.id] = ObserveError(f"cannot read {exc.filename or r.spec['dir']}: {exc.strerror}")
        return out

    def _observe_files(self, r: Resource, job: JobObserved,
                       beat: Callable[[], None] | None = None,
                       progress: Callable[[str, int, int, str], None] | None = None) -> ExtractionObserved:
        spec = r.spec
        root, total, verify = spec["dir"], spec["total"], spec["verify"]
        state_path = os.path.join(state_dir(), f"{r.name}.check.json")
        key = {"dir": root, "pattern": spec["pattern"]}
        raw = load_json(state_path)
        record = CheckRecord.parse(raw, key)
        try:
            refuse_planted(root)  # the declared root reached safely, its quarantine folder reconcile's own
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
        if verify == "at-risk" and record:
            carried, reread = _unchanged_recent(root, listing, present, record, boot)

        if verify == "content" or (verify == "at-risk" and not record):
            to_check = present  # no earlier check to build on: check everything once
        elif verify == "at-risk":
            assert record is not None
            to_check = normalize(subtract(present, record.verified) + to_ranges(reread))
        else:
            new = last(subtract(present, record.seen if record else []), STAT_LIMIT)
            was_recent = to_ranges(f.index for f in previous)
            to_check = normalize(new + intersect(present, was_recent))
        carried = [f for f in carried if not contains(to_check, f.index)]

        # The check (tally.py): every file to check at the depth its verify mode asks (at-risk: the
        # structure, except for the files the recent rule re-reads, whose content is read); then,
        # under at-risk, the files written within RECENT_WINDOW of the newest, when no check of this
        # boot has seen them (a first check, or the first since a reboot): they may hold pages a
        # crash lost, so their content is read too.
        depth = {"content": CONTENT, "at-risk": STRUCTURE, "none": STAT}[verify]
        mtimes: dict[int, float] = {}  # index -> newest mtime of its files, for the files looked at
        for f in carried:
            mtimes[f.index] = max(mtimes.get(f.index, 0.0), f.mtime_ns / 1e9)
        known = max(mtimes.values(), default=None)
        if record and record.newest and (known is None or record.newest > known):
            known = record.newest
        first_of_boot = record is None or boot is None or boot != record.boot_id
        label = f"extraction {r.name}"

        def ticked(stage: str, n: int, of: int) -> None:
            if beat:
                beat()
            if progress:
                progress(f"{label}: {stage}", n, of, "samples" if stage == "checking" else "files")

        result = tally.run(tally.Check(root, listing, depth, reread, walk=verify == "content"), to_check,
                           verify == "at-risk" and first_of_boot, known, ticked)
        newest = result.newest
        mtimes.update(result.mtimes)

        now = time.time()
        bad: list[Damaged] = []
        unreadable: list[Damaged] = []
        bad_idx: set[int] = set()
        good: list[int] = []
        shallow_gz: list[int] = []
        no_crc: list[int] = []
        unproven: list[Damaged] = []
        unproven_idx: list[int] = []
        seen_files: list[RecentFile] = []  # files looked at (those kept one by one), for the recent list
        writing = 0
        checked, content_checked = (result.checked, result.content) if verify != "none" else (0, 0)
        for idx, rel, v in ((h.idx, h.rel, h.v) for h in result.held):
            st = v.st
            if st is not None:
                seen_files.append(RecentFile.of(rel, idx, st, v.whole or v.state == UNPROVEN))
            if verify == "none":
                continue
            checked += 1
            content_checked += v.depth == CONTENT
            if v.state == UNPROVEN:  # neither whole nor shown damaged: done, never moved, said
                good.append(idx)
                unproven_idx.append(idx)
                unproven.append(Damaged(rel, v.reason, st.st_size if st else 0, st.st_mtime if st else 0.0))
            elif v.whole:
                good.append(idx)
                if v.gz_shallow:
                    shallow_gz.append(idx)
                if v.no_crc:
                    no_crc.append(idx)
            elif v.state == UNREADABLE:
                unreadable.append(Damaged(rel, v.reason, st.st_size if st else 0, st.st_mtime if st else 0.0))
            elif (job.running or job.how == "none") and st is not None and now - st.st_mtime < WRITING_GRACE:
                writing += 1
            else:
                bad.append(Damaged(rel, v.reason, st.st_size if st else 0, st.st_mtime if st else 0.0))
                bad_idx.add(idx)
        good_ranges = normalize(result.good + to_ranges(good)) if verify != "none" else []
        gz_ranges = normalize(result.gz + to_ranges(shallow_gz))
        no_crc_now = normalize(result.no_crc + to_ranges(no_crc))
        # Checked, neither whole nor damaged: being written or unreadable.
        in_flight = subtract(to_check, normalize(good_ranges + to_ranges(bad_idx))) if verify != "none" else []
        # An index with one good and one damaged file (x.ckpt and x.ckpt.gz) is done, but the
        # damaged one still goes to quarantine.
        unusable = subtract(normalize(to_ranges(bad_idx) + in_flight), good_ranges)
        usable = subtract(present, unusable)
        done = size(usable)
        absent = subtract(everything, usable)
        allowed = normalize((i, i) for i in spec["allow_missing"])
        allowed_absent = size(intersect(absent, allowed))
        missing = subtract(absent, allowed)

        window = {i: t for i, t in mtimes.items() if newest is not None and t >= newest - RECENT_WINDOW}
        rate = _rate(list(window.values()))
        counted = done + allowed_absent
        eta = None
        if rate and job.running and counted < spec["min_done"]:
            eta = (spec["min_done"] - counted) / rate

        looked = to_check if verify != "none" else []

        def carry_over(old: list[tuple[int, int]], now_ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
            """Indices still so from earlier checks (present, not checked now), and now."""
            return normalize(subtract(intersect(old, present), looked) + now_ranges)

        if verify == "none":
            verified = record.verified if record else []
        else:
            verified = normalize(subtract(intersect(record.verified if record else [], present),
                                            to_ranges(bad_idx)) + good_ranges)
        gz_shallow = carry_over(record.gz_shallow if record else [], gz_ranges)
        no_crc_ranges = carry_over(record.no_crc if record else [], no_crc_now)
        unproven_ranges = carry_over(record.unproven if record else [], to_ranges(unproven_idx))
        recent = sorted((f for f in seen_files + carried if f.index in window), key=lambda f: (f.index, f.rel))
        new_state = {
            "format": STATE_FORMAT, **key,
            "verified": [list(x) for x in verified],
            "seen": [list(x) for x in present],
            "recent": [list(f) for f in recent],
            "newest": newest,
            "boot_id": boot,
            "gz_shallow": [list(x) for x in gz_shallow],
            "no_crc": [list(x) for x in no_crc_ranges],
            "unproven": [list(x) for x in unproven_ranges],
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
            verify=verify, checked=checked, unverified_gz=size(gz_shallow), out_of_range=stray, rate=rate,
            newest=newest, eta_s=eta, job=job, unreadable=tuple(unreadable), content_checked=content_checked,
            no_crc=size(no_crc_ranges), unproven=size(unproven_ranges), unproven_first=tuple(unproven[:3]),
            unfinished_quarantine=tuple(unfinished_quarantines(root)) if exists else (),
        )

    # --- diff and plan ---------------------------------------------------------------

    def diff(self, resource: Resource, observed: ExtractionObserved) -> list[Drift]:
        drift = []
        if observed.unfinished_quarantine:
            drift.append(Drift("unfinished_quarantine", 0, len(observed.unfinished_quarantine)))
        if observed.damaged:
            drift.append(Drift("damaged", 0, len(observed.damaged)))
        if observed.unreadable:
            drift.append(Drift("unreadable", 0, len(observed.unreadable)))
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
        caveats = _caveats(observed)
        if not drift:
            return Plan(message=message, caveats=caveats)
        actions: list[Action] = []
        if observed.unfinished_quarantine:  # first: its records say what the moves before the kill were
            names = observed.unfinished_quarantine
            actions.append(Action(
                "finish-quarantine", f"{observed.dir}/{QUARANTINE}",
                f"write the manifest of {len(names)} quarantine{'s' if len(names) != 1 else ''} an apply was stopped "
                f"in ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): from its move records and files",
                {"dirs": list(names)}))
        if observed.damaged:
            n = len(observed.damaged)
            actions.append(Action(
                "quarantine", observed.dir,
                f"move {n} damaged file{'s' if n != 1 else ''} to {observed.dir}/{QUARANTINE}/ "
                f"({observed.damaged[0].path}: {observed.damaged[0].reason}"
                + (f", +{n - 1} more" if n > 1 else "") + ")",
                {"files": [{"path": d.path, "reason": d.reason} for d in observed.damaged]}))
        # A file that cannot be read is neither done nor moved: a disk error or a permission is
        # for a person to look at (the job would skip the index, its file being there).
        unreadable = None
        if observed.unreadable:
            n, first = len(observed.unreadable), observed.unreadable[0]
            unreadable = (f"{n} file{'s' if n != 1 else ''} cannot be read ({first.path}: {first.reason}"
                          + (f", +{n - 1} more" if n > 1 else "") + "): not counted done and not moved; "
                          "repair or move by hand")
        job = observed.job
        if observed.counted >= spec["min_done"]:
            return Plan(actions=tuple(actions), blocked=unreadable, message=message, caveats=caveats)
        if job.running:
            return Plan(actions=tuple(actions), converging=f"{job.how} {job.target} running ({job.state}): {progress}",
                        blocked=unreadable, message=message, caveats=caveats)
        why = None
        if job.how == "none":
            why = f"{progress}; no job declared to continue"
        elif job.how == "unit" and not job.exists:
            why = f"{progress}; the job's unit {job.target} not found"
        if why:
            return Plan(actions=tuple(actions), blocked="; ".join(x for x in (unreadable, why) if x),
                        message=message, caveats=caveats)
        actions.append(Action("start", job.target, f"start {job.how} {job.target} to resume at {progress}",
                              {"how": job.how}, once=True))
        ended = job.ended()  # the job started last ended: say how, whether or not it is started again
        return Plan(actions=tuple(actions), blocked=unreadable, message="; ".join(x for x in (ended, message) if x),
                    caveats=caveats)

    # --- apply -----------------------------------------------------------------------

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        if action.action == "quarantine":
            from .quarantine import quarantine  # (it imports the file checks: only to act)

            return quarantine(resource, action.params.get("files", ()))
        if action.action == "finish-quarantine":
            from .quarantine import finish

            return "; ".join(finish(resource, name) for name in action.params.get("dirs", ()))
        if action.action == "start":
            job = resource.spec["job"]
            if job.get("unit"):
                systemd.act(host, "start", job["unit"], START_TIMEOUT)
                return f"started {job['unit']}"
            if job.get("command"):
                return start_command(host, resource)
            raise ApplyError("no job declared")
        raise ApplyError(f"unknown extraction action {action.action!r}")

    def summary(self, resource: Resource, observed: ExtractionObserved) -> str:
        spec = resource.spec
        parts = [_progress(spec["total"], observed.counted, observed.rate, observed.eta_s)]
        if observed.missing:
            parts.append(f"{observed.missing:,} missing")
        if observed.damaged:
            parts.append(f"{len(observed.damaged)} damaged")
        if observed.unfinished_quarantine:
            parts.append(f"{len(observed.unfinished_quarantine)} unfinished quarantine")
        if observed.unreadable:
            parts.append(f"{len(observed.unreadable)} unreadable")
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
                st = os.stat(os.path.join(root, f.rel), follow_symlinks=False)  # a link swapped in: changed
            except OSError:
                reread.add(idx)
                break
            if not f.same_stat(st):
                reread.add(idx)
                break
        else:
            unchanged += known
    return unchanged, reread


def _caveats(observed: ExtractionObserved) -> tuple[str, ...]:
    """What this observation could not prove whole, said every time (docs/extractions.md)."""
    out = []
    if observed.unverified_gz:
        n = observed.unverified_gz
        out.append(f"{n:,} .gz sample{'s' if n != 1 else ''} not decompressed (verify: at-risk reads the gzip "
                   "header only): not proven whole; `verify: content` decompresses them")
    if observed.no_crc:
        n = observed.no_crc
        out.append(f"{n:,} sample{'s' if n != 1 else ''} written without CRC-32s (torch.serialization."
                   "set_crc32_options(False)): tensor bytes cannot be verified, only searched for zeroed pages")
    if observed.unproven:
        n = observed.unproven
        first = observed.unproven_first[0] if observed.unproven_first else None
        out.append(f"{n:,} sample{'s' if n != 1 else ''} cannot be proven whole (safetensors ending in zeros where "
                   "zeros may be data: counted done, not moved)" + (f": {first.path}: {first.reason}" if first else "")
                   + "; move such a file aside by hand to have it regenerated")
    return tuple(out)


def _rate(mtimes: list[float]) -> float | None:
    if len(mtimes) < 3:
        return None
    mtimes.sort()
    span = mtimes[-1] - mtimes[0]
    return (len(mtimes) - 1) / span if span > 0 else None


__all__ = ["Damaged", "ExtractionsReconciler", "ExtractionObserved", "RECENT_WINDOW", "format_ranges", "list_tree",
           "state_dir", "to_ranges"]
