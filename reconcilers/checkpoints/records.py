"""Check records of the checkpoints kind: a step checked once is not read again while its files
are unchanged (docs/checkpoints.md, "Check records").

One record file per run directory, `checkpoints/<dir, as a name>-<hash>.check.json` in the state
directory (the extraction kind's: $RECONCILE_STATE_DIR, else the journal's directory), written
with core/atomic.py's write (after a crash: the old record or the new one, never half of one).
Per step name it holds
- the key: for the step's entry and every file and folder below it (the whole file set, names
  included) the device, inode, size, mode, mtime and ctime in nanoseconds, followed through
  symbolic links (a link's own entry too: Lightning's last.ckpt); plus what else decides the
  verdict: the layout, `model_only`, DeepSpeed's ZeRO rank count, the record format and
  reconcile's version;
- the verdict per depth (structure, content): the StepObserved the check made.

A verdict is reused only when the whole key is identical, whole or torn alike (a torn verdict
is no cheaper to believe than a whole one, and its files, unchanged, hold the same bytes); a
file that could not be read (EIO, EACCES) is never recorded. The record is dropped whole when
the machine booted since it was made (the boot id, as the extraction kind keeps it: data a
crash lost may have been read from the page cache), and ignored when $RECONCILE_RECHECK is set
(`reconcile diff --recheck`). Bounded: only the names present now are kept, at most
MAX_STEPS of them (the highest steps), a step of more than MAX_FILES files is not recorded.

Racy-clean rule (git's, and the extraction kind's listing cache): a step whose newest mtime or
ctime is within RACY_NS of the moment its check began is not recorded (a write in the same
timestamp tick after the check would leave its times as recorded), nor one whose key changed
while it was checked (written meanwhile).

Bump RECORD_FORMAT when what a verdict depends on changes (a new rule of "whole").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from stat import S_ISDIR, S_ISLNK
from typing import Any

from ... import __version__
from ...core import paths
from ...core.atomic import write_json
from ...core.boot import boot_id
from . import layouts as L
from .observed import StepObserved

RECORD_FORMAT = 1
RACY_NS = 2 * 10**9  # as reconcilers/extractions/listing.py: filesystems with 1 s or 2 s times (FAT, NFSv3 servers)
MAX_STEPS = 512
MAX_FILES = 4096  # below one step (DCP: one .distcp per rank)
MAX_LEVELS = 4  # folders below a step walked (Megatron: iter_N/mp_rank_XX/)
RECHECK_ENV = "RECONCILE_RECHECK"

# Names that may be a step of each layout: a superset of what layouts.py accepts (it decides),
# so that no other folder of the run directory (the Trainer's `runs/`, a wandb folder) is walked.
CANDIDATE: dict[str, Callable[[str], bool]] = {
    "hf-trainer": lambda n: bool(L.HF_DIR.match(n)),
    "lightning": lambda n: n.endswith(".ckpt"),
    "deepspeed": lambda n: n not in ("latest", "latest_universal") and not n.endswith((".py", ".json")),
    "dcp": lambda n: bool(L.DCP_DIR.search(n)),
    "megatron": lambda n: bool(L.MEGATRON_DIR.match(n)),
    "accelerate": lambda n: n.startswith("checkpoints/"),  # accelerate.names: checkpoints/<folder>
}

Check = Callable[[list[str], str], list[StepObserved]]  # (names, depth) -> the steps among them


def plain(value: Any) -> Any:
    """A verdict's parameter as JSON holds it (Accelerate's roles per checkpoint: sorted lists)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return value


def record_path(root: str) -> str:
    digest = hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", root.strip("/"))[-60:] or "root"
    return os.path.join(paths.state_dir(), "checkpoints", f"{label}-{digest}.check.json")


def _stat(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns]


def fingerprint(root: str, name: str) -> list[list[Any]] | None:
    """The key's file part for one step: [relative path, stat...] of the step and everything
    below it, in name order; None when it cannot be taken (gone, too many files)."""
    top = os.path.join(root, name)
    try:
        lst = os.lstat(top)
        st = os.stat(top) if S_ISLNK(lst.st_mode) else lst
    except OSError:
        return None
    out: list[list[Any]] = [[".", *_stat(lst)]]
    if S_ISLNK(lst.st_mode):
        out.append(["->", *_stat(st)])
    if S_ISDIR(st.st_mode) and not _walk(top, "", 0, out):
        return None
    return out


def _walk(path: str, rel: str, level: int, out: list[list[Any]]) -> bool:
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return False
    for e in entries:
        sub = f"{rel}{e.name}"
        try:
            st = e.stat()  # followed: the loader reads what a link names
        except OSError:  # a dangling link: its own entry (the check says what is missing)
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                return False
        out.append([sub, *_stat(st)])
        if len(out) > MAX_FILES:
            return False
        if S_ISDIR(st.st_mode) and (level >= MAX_LEVELS or not _walk(e.path, sub + "/", level + 1, out)):
            return False
    return True


def _racy(fp: list[list[Any]], began_ns: int) -> bool:
    return any(max(row[5], row[6]) > began_ns - RACY_NS for row in fp)


def _to_json(s: StepObserved) -> dict[str, Any]:
    return dataclasses.asdict(s)


def _from_json(d: Any) -> StepObserved | None:
    if not isinstance(d, dict):
        return None
    known = {f.name for f in dataclasses.fields(StepObserved)}
    try:
        return StepObserved(**{k: v for k, v in d.items() if k in known})
    except TypeError:
        return None


class Book:
    """The run directory's check records for one observation: `steps` checks what is not
    recorded and reuses what is; `save` writes the record back when it changed."""

    def __init__(self, root: str, layout: str, params: dict[str, Any], use: bool):
        self.root, self.layout = root, layout
        self.key = {"format": RECORD_FORMAT, "version": __version__, "dir": root, "layout": layout, **params}
        self.boot = boot_id() if use else None
        self.enabled = use and self.boot is not None and layout in CANDIDATE
        self.path = record_path(root) if self.enabled else ""
        self.raw: dict[str, Any] | None = None
        self.old: dict[str, Any] = {}
        self.new: dict[str, Any] = {}  # name -> {"key": fingerprint, "verdicts": {depth: [step...]}}
        self.reused: set[str] = set()  # steps whose verdict came from the record this observation
        if not self.enabled:
            return
        try:
            with open(self.path, encoding="utf-8") as fh:
                raw = json.load(fh)
        except (OSError, ValueError):
            raw = None
        self.raw = raw if isinstance(raw, dict) else None
        recheck = os.environ.get(RECHECK_ENV, "") not in ("", "0")
        if (self.raw and not recheck and self.raw.get("boot_id") == self.boot
                and {k: self.raw.get(k) for k in self.key} == self.key and isinstance(self.raw.get("steps"), dict)):
            self.old = self.raw["steps"]

    def steps(self, names: list[str], depth: str, check: Check) -> list[StepObserved]:
        """The steps among `names`, each checked at `depth` or taken from its record."""
        if not self.enabled:
            return check(names, depth)
        out: list[StepObserved] = []
        wanted = CANDIDATE[self.layout]
        for n in names:
            if wanted(n):
                out += self._one(n, depth, check)
        return out

    def _one(self, name: str, depth: str, check: Check) -> list[StepObserved]:
        began = time.time_ns()
        fp = fingerprint(self.root, name)
        entry = self.new.get(name) or self.old.get(name)
        if fp is not None and isinstance(entry, dict) and entry.get("key") == fp \
                and isinstance(entry.get("verdicts"), dict):
            kept = self.new.setdefault(name, {"key": fp, "verdicts": {}})
            kept["verdicts"].update(entry["verdicts"])
            got = kept["verdicts"].get(depth)
            if isinstance(got, list):
                steps = [_from_json(d) for d in got]
                if all(s is not None for s in steps):
                    self.reused.update(s.path for s in steps)  # type: ignore[union-attr]
                    return steps  # type: ignore[return-value]
        steps = check([name], depth)
        if fp is None or any(s.unreadable for s in steps) or _racy(fp, began) \
                or fingerprint(self.root, name) != fp:
            self.new.pop(name, None)
            return steps
        kept = self.new.setdefault(name, {"key": fp, "verdicts": {}})
        if kept["key"] != fp:
            kept.update(key=fp, verdicts={})
        kept["verdicts"][depth] = [_to_json(s) for s in steps]
        return steps

    def save(self) -> None:
        """Write the record when it changed: the names checked or reused now, at most MAX_STEPS."""
        if not self.enabled:
            return
        entries = self.new
        if len(entries) > MAX_STEPS:
            def top(item: tuple[str, Any]) -> int:
                steps = [s for v in item[1]["verdicts"].values() for s in v]
                return max((s.get("step") or -1 for s in steps), default=-1)
            entries = dict(sorted(entries.items(), key=top, reverse=True)[:MAX_STEPS])
        doc = {**self.key, "boot_id": self.boot, "steps": entries}
        if self.raw is not None and {k: v for k, v in self.raw.items() if k != "checked_at"} == doc:
            return  # an unchanged run directory leaves the file as it is: no write per pass
        try:
            write_json(self.path, {**doc, "checked_at": time.time()})
        except OSError:
            pass  # best effort: without it the next observation reads the steps again
