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
- point: DeepSpeed's `latest` or Megatron's tracker rewritten durably: a file of a random name
  made O_EXCL beside it, fsync, renameat over it, fsync of the directory (the old text is kept in
  the quarantine); the new file keeps the directory owner's ownership (the job reads it back);
- last: Lightning's last.ckpt made the newest whole step file: a copy (or, where the job saves
  `save_last="link"`, a relative symbolic link) made under a temporary name, then renamed over
  last.ckpt; an old last.ckpt is hard-linked into the quarantine first. A copy, not a hard link:
  Lightning's next save opens last.ckpt for writing and would overwrite the step file through it.
"""

from __future__ import annotations

import os
from typing import Any

from ...common.quarantine import QUARANTINE, makedirs_in, open_new
from ...common.usertree import POINTER_LIMIT, Tree, UnsafeTree, rename_between
from ...core.contract import ApplyError, utc_iso
from .added import BESIDE
from .layouts import ACC_FOLDER
from .observed import CheckpointsObserved, NotCheckable
from .survey import survey

# Every move and write below happens in the run directory, which the training job's user owns:
# through common/usertree.py only (held directory fds, no link followed, random O_EXCL names).


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


def _open_root(root: str) -> Tree:
    try:
        return Tree.open(root)
    except OSError as exc:
        raise ApplyError(f"{root}: {exc.strerror or exc}") from None


def _fresh(spec: dict[str, Any]) -> CheckpointsObserved:
    try:
        obs = survey(spec)
    except NotCheckable as exc:
        raise ApplyError(str(exc)) from None
    if not obs.exists:
        raise ApplyError(f"{spec['dir']} no longer exists")
    return obs


def _manifest(q: Tree, name: str, obs: CheckpointsObserved, why: str, entries: list[dict[str, Any]]) -> None:
    import json

    q.write_atomic("manifest.json", (json.dumps({
        "created": utc_iso(), "checkpoints": name, "dir": obs.dir, "layout": obs.layout, "why": why,
        "resume_rule": obs.resume_rule, "newest_whole": obs.newest_whole_path, "moved": entries},
        indent=1, default=str) + "\n").encode(), mode=0o600)


def quarantine(spec: dict[str, Any], name: str, steps: list[dict[str, Any]]) -> str:
    root = spec["dir"]
    obs = _fresh(spec)
    moved: list[dict[str, Any]] = []
    skipped = []
    q: Tree | None = None
    try:
        with _open_root(root) as tree:
            try:
                for item in steps:
                    rel = _inside(root, item["path"], obs.layout)
                    now = obs.step_at(rel)
                    if now is None or now.whole:
                        skipped.append(rel)  # gone, or whole now (the job rewrote it): left alone
                        continue
                    parent, _, base = rel.rpartition("/")
                    st = tree.lstat(rel)
                    inner = parent
                    if obs.layout in BESIDE:  # beside dir: the framework's rule walks or lists all of dir
                        inner = "/".join(p for p in (os.path.basename(os.path.abspath(root)), parent) if p)
                        if q is None:
                            with _open_root(os.path.dirname(os.path.abspath(root))) as above:
                                q = open_new(above)
                    q = q or open_new(tree)
                    # accelerate: <dir>/.reconcile-quarantine/T/checkpoints/checkpoint_N, beside
                    # checkpoints/, never in it (its rule); litgpt, fabric: <parent>/.reconcile-quarantine/T/<dir>/
                    with tree.subdir(parent) if parent else Tree(os.dup(tree.fd), root) as src, \
                            makedirs_in(q, inner) if inner else Tree(os.dup(q.fd), q.path) as dst:
                        rename_between(src, base, dst, base)
                    moved.append({"path": rel, "original": os.path.join(root, rel),
                                  "moved_to": os.path.relpath(os.path.join(q.path, inner, base), root),
                                  "reason": now.reason, "step": now.step, "mtime": st.st_mtime,
                                  "mtime_utc": utc_iso(st.st_mtime), "size": now.size})
            finally:
                if moved and q is not None:
                    _manifest(q, name, obs, "torn checkpoints newer than the newest whole one, moved aside so that "
                              "the framework resumes from the newest whole one (nothing deleted)", moved)
    except UnsafeTree as exc:
        raise ApplyError(str(exc)) from None
    finally:
        if q is not None:
            q.close()
    text = f"moved {len(moved)} torn checkpoint{'s' if len(moved) != 1 else ''} to {q.path if q else '(nothing)'}"
    if skipped:
        text += f"; {len(skipped)} whole now or gone, left alone"
    return text


def point(spec: dict[str, Any], name: str, params: dict[str, Any]) -> str:
    root = spec["dir"]
    obs = _fresh(spec)
    target = obs.step_at(params["step_path"])
    if target is None or not target.whole:
        raise ApplyError(f"{params['step_path']} is not whole now: not pointing at it")
    rel = _inside(root, params["file"])
    try:
        with _open_root(root) as tree:
            try:
                old: str | None = tree.read_pointer(rel, POINTER_LIMIT)
            except FileNotFoundError:
                old = None
            if old is not None and old.strip() == params["text"]:
                return f"{params['file']} already names {params['text']}"
            if old is not None:  # the old text is kept, beside a manifest saying why it changed
                with open_new(tree) as q:
                    q.write_atomic(os.path.basename(rel), old.encode("utf-8", "surrogateescape"), mode=0o600)
                    entry = {"path": params["file"], "original": os.path.join(root, rel), "old_text": old[:200],
                             "new_text": params["text"], "moved_to": None}
                    _manifest(q, name, obs, f"{params['file']} pointed at a checkpoint that is not whole; rewritten "
                              f"to name {params['text']}", [entry])
            tree.write_atomic(rel, params["text"].encode("utf-8", "surrogateescape"), mode=0o644,
                              owner=tree.owner())
    except UnsafeTree as exc:
        raise ApplyError(str(exc)) from None
    return f"{params['file']} now names {params['text']} (was {old.strip()[:40]!r})" if old is not None \
        else f"{params['file']} written: {params['text']}"


def last(spec: dict[str, Any], name: str, params: dict[str, Any]) -> str:
    root = spec["dir"]
    obs = _fresh(spec)
    source = _inside(root, params["source"])
    s = obs.step_at(source)
    if s is None or not s.whole:
        raise ApplyError(f"{source} is not whole now: not making last.ckpt of it")
    try:
        with _open_root(root) as tree:
            try:
                old_st: os.stat_result | None = tree.lstat("last.ckpt")
            except FileNotFoundError:
                old_st = None
            if old_st is not None:  # the old last.ckpt is kept: hard-linked into the quarantine first
                with open_new(tree) as q:
                    os.link("last.ckpt", "last.ckpt", src_dir_fd=tree.fd, dst_dir_fd=q.fd, follow_symlinks=False)
                    old = obs.step_at("last.ckpt")
                    _manifest(q, name, obs, "last.ckpt replaced by the newest whole step file", [{
                        "path": "last.ckpt", "original": os.path.join(root, "last.ckpt"),
                        "moved_to": os.path.relpath(os.path.join(q.path, "last.ckpt"), root),
                        "reason": old.reason if old and not old.whole
                        else f"whole, step {old.step if old else None}: superseded",
                        "mtime": old_st.st_mtime, "mtime_utc": utc_iso(old_st.st_mtime), "size": old_st.st_size}])
            if params.get("link"):
                tree.symlink_atomic(source, "last.ckpt", owner=tree.owner())
            else:  # a copy made through held fds: the step file itself, never what a link names
                tree.copy_atomic(source, "last.ckpt", owner=tree.owner())
    except UnsafeTree as exc:
        raise ApplyError(str(exc)) from None
    return f"last.ckpt is now {'a link to' if params.get('link') else 'a copy of'} {source} (step {s.step})"
