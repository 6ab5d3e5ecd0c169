"""Apply's three moves, each checked against a fresh observation first (nothing acts on what
the plan saw if the directory changed since), none deleting anything:

- quarantine: rename torn checkpoints into <dir>/.reconcile-quarantine/<UTC time>/ (same file
  system: a rename), with manifest.json (why, original path, mtime, size). No framework sees
  it there: transformers lists `checkpoint-*` at the top of output_dir only (get_last_checkpoint,
  _sorted_checkpoints: its save_total_limit rotation never reaches it); Lightning's ls of dirpath
  is not recursive and `.reconcile-quarantine` has no `.ckpt` suffix; DeepSpeed and Megatron read
  only what their pointer names; torchtitan matches `step-N` at the top; Accelerate's
  load_state and total_limit cleanup read every entry of `checkpoints/` (and crash on one without a
  number), so its quarantine is in the project_dir, beside `checkpoints/`; litgpt's resume walks
  every folder below out_dir (rglob, hidden ones too) and the Fabric example's lists every entry
  of its folder, so theirs is beside dir, in its parent (<parent>/.reconcile-quarantine/<time>/<dir name>/);
- point: DeepSpeed's `latest` or Megatron's tracker rewritten durably: a temporary file beside
  it, fsync, rename over it, fsync of the directory (the old text is kept in the quarantine);
- last: Lightning's last.ckpt made the newest whole step file: a copy (or, where the job saves
  `save_last="link"`, a relative symbolic link) made under a temporary name, then renamed over
  last.ckpt; an old last.ckpt is hard-linked into the quarantine first. A copy, not a hard link:
  Lightning's next save opens last.ckpt for writing and would overwrite the step file through it.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ...common.quarantine import QUARANTINE, new_quarantine_dir
from ...core.atomic import fsync_dir, write_json, write_text
from ...core.contract import ApplyError, utc_iso
from .added import BESIDE
from .layouts import ACC_FOLDER
from .observed import CheckpointsObserved, NotCheckable
from .survey import survey


def _inside(root: str, rel: str, layout: str = "") -> str:
    """REL if it names an entry at the top of ROOT (for accelerate: of ROOT/checkpoints/)."""
    norm = os.path.normpath(rel)
    top = norm
    if layout == "accelerate" and norm.startswith(ACC_FOLDER + os.sep):
        top = norm[len(ACC_FOLDER) + 1:]
    if not top or top in (".", "..") or os.path.isabs(norm) or norm.startswith("..") or os.sep in top \
            or top == QUARANTINE:
        raise ApplyError(f"refusing to move {rel!r}: not a checkpoint at the top of {root}")
    return norm


def _qdir(root: str) -> str:
    qdir = new_quarantine_dir(root)
    os.makedirs(qdir)
    return qdir


def _fresh(spec: dict[str, Any]) -> CheckpointsObserved:
    try:
        obs = survey(spec)
    except NotCheckable as exc:
        raise ApplyError(str(exc)) from None
    if not obs.exists:
        raise ApplyError(f"{spec['dir']} no longer exists")
    return obs


def _manifest(qdir: str, name: str, obs: CheckpointsObserved, why: str, entries: list[dict[str, Any]]) -> None:
    write_json(os.path.join(qdir, "manifest.json"), {
        "created": utc_iso(), "checkpoints": name, "dir": obs.dir, "layout": obs.layout, "why": why,
        "resume_rule": obs.resume_rule, "newest_whole": obs.newest_whole_path, "moved": entries}, indent=1)


def quarantine(spec: dict[str, Any], name: str, steps: list[dict[str, Any]]) -> str:
    root = spec["dir"]
    obs = _fresh(spec)
    moved: list[dict[str, Any]] = []
    skipped = []
    qdir = None
    try:
        for item in steps:
            rel = _inside(root, item["path"], obs.layout)
            now = obs.step_at(rel)
            if now is None or now.whole:
                skipped.append(rel)  # gone, or whole now (the job rewrote it): left alone
                continue
            src = os.path.join(root, rel)
            st = os.lstat(src)
            if obs.layout in BESIDE:  # beside dir: the framework's rule walks or lists all of dir
                qdir = qdir or _qdir(os.path.dirname(os.path.abspath(root)))
                dst = os.path.join(qdir, os.path.basename(os.path.abspath(root)), rel)
            else:
                qdir = qdir or _qdir(root)
                dst = os.path.join(qdir, rel)  # accelerate: <dir>/.reconcile-quarantine/T/checkpoints/checkpoint_N,
            os.makedirs(os.path.dirname(dst), exist_ok=True)  # beside checkpoints/, never in it (its rule)
            os.rename(src, dst)
            moved.append({"path": rel, "original": src, "moved_to": os.path.relpath(dst, root),
                          "reason": now.reason, "step": now.step, "mtime": st.st_mtime,
                          "mtime_utc": utc_iso(st.st_mtime), "size": now.size})
    finally:
        if moved and qdir:
            _manifest(qdir, name, obs, "torn checkpoints newer than the newest whole one, moved aside so that the "
                      "framework resumes from the newest whole one (nothing deleted)", moved)
    text = f"moved {len(moved)} torn checkpoint{'s' if len(moved) != 1 else ''} to {qdir or '(nothing)'}"
    if skipped:
        text += f"; {len(skipped)} whole now or gone, left alone"
    return text


def point(spec: dict[str, Any], name: str, params: dict[str, Any]) -> str:
    root = spec["dir"]
    obs = _fresh(spec)
    target = obs.step_at(params["step_path"])
    if target is None or not target.whole:
        raise ApplyError(f"{params['step_path']} is not whole now: not pointing at it")
    pointer = os.path.join(root, _inside(root, params["file"]))
    try:
        with open(pointer, encoding="utf-8", errors="replace") as fh:
            old: str | None = fh.read()
    except FileNotFoundError:
        old = None
    if old is not None and old.strip() == params["text"]:
        return f"{params['file']} already names {params['text']}"
    if old is not None:  # the old text is kept, beside a manifest saying why it changed
        qdir = _qdir(root)
        with open(os.path.join(qdir, params["file"]), "w", encoding="utf-8") as fh:
            fh.write(old)
        _manifest(qdir, name, obs, f"{params['file']} pointed at a checkpoint that is not whole; rewritten to "
                  f"name {params['text']}", [{"path": params["file"], "original": pointer, "old_text": old[:200],
                                              "new_text": params["text"], "moved_to": None}])
    write_text(pointer, params["text"])
    return f"{params['file']} now names {params['text']} (was {old.strip()[:40]!r})" if old is not None \
        else f"{params['file']} written: {params['text']}"


def last(spec: dict[str, Any], name: str, params: dict[str, Any]) -> str:
    root = spec["dir"]
    obs = _fresh(spec)
    source = _inside(root, params["source"])
    s = obs.step_at(source)
    if s is None or not s.whole:
        raise ApplyError(f"{source} is not whole now: not making last.ckpt of it")
    target = os.path.join(root, "last.ckpt")
    tmp = os.path.join(root, f".last.ckpt.reconcile-{os.getpid()}.tmp")  # not a .ckpt: never a candidate
    if os.path.lexists(tmp):
        os.unlink(tmp)  # our own leftover temp name
    if params.get("link"):
        os.symlink(source, tmp)
    else:
        shutil.copyfile(os.path.join(root, source), tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if os.path.lexists(target):
        qdir = _qdir(root)
        os.link(target, os.path.join(qdir, "last.ckpt"), follow_symlinks=False)
        st = os.lstat(target)
        old = obs.step_at("last.ckpt")
        _manifest(qdir, name, obs, "last.ckpt replaced by the newest whole step file", [{
            "path": "last.ckpt", "original": target, "moved_to": os.path.relpath(os.path.join(qdir, "last.ckpt"), root),
            "reason": old.reason if old and not old.whole else f"whole, step {old.step if old else None}: superseded",
            "mtime": st.st_mtime, "mtime_utc": utc_iso(st.st_mtime), "size": st.st_size}])
    os.replace(tmp, target)
    fsync_dir(root)
    return f"last.ckpt is now {'a link to' if params.get('link') else 'a copy of'} {source} (step {s.step})"
