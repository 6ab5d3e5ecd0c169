"""Where the kinds that move damaged files aside put them: one folder name and one naming rule
for every quarantine, so a person finds them the same way whichever kind moved them (nothing
reconcile moves is ever deleted).

The quarantine lives in a tree another user controls, so it is made and entered only through
held directory fds (common/usertree.py): the folder is made with mkdirat(2), never created "if
missing" through a path; one that already exists must be a real directory owned by reconcile's
own user and writable by no one else (a folder, or a link, the user planted is refused, as
systemd-tmpfiles refuses an unsafe path transition); each quarantine is a fresh stamped folder in
it (mode 0700) held by fd before the first move, so swapping names afterwards moves nothing
anywhere else."""

from __future__ import annotations

import errno
import os
import stat
import time

from .usertree import Tree, UnsafeTree

QUARANTINE = ".reconcile-quarantine"


def _ours(where: str, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeTree(where, "not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeTree(where, f"owned by uid {st.st_uid}, not by reconcile's uid {os.geteuid()}: "
                                "a quarantine folder reconcile did not make")
    if st.st_mode & 0o022:
        raise UnsafeTree(where, f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


def refuse_planted(root: str, folder: str = QUARANTINE) -> None:
    """UnsafeTree when ROOT (reached as usertree.chase_safe allows) holds a FOLDER that reconcile did
    not make: a link, a file, a folder of another owner or writable by others. Observed, so the
    resource is an error naming it before any apply would try to move something into it."""
    with Tree.open(root) as t:
        try:
            st = os.stat(folder, dir_fd=t.fd, follow_symlinks=False)
        except FileNotFoundError:
            return
    where = os.path.join(root, folder)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeTree(where, "a symbolic link: a quarantine folder reconcile did not make")
    _ours(where, st)


def open_folder(tree: Tree, folder: str = QUARANTINE) -> Tree:
    """TREE's quarantine folder, made with mkdirat if missing, checked if present, held by fd."""
    try:
        os.mkdir(folder, 0o700, dir_fd=tree.fd)
    except FileExistsError:
        pass
    q = tree.subdir(folder)  # a link planted at the name: refused here (no link is followed)
    try:
        _ours(q.path, os.fstat(q.fd))
    except BaseException:
        q.close()
        raise
    return q


def open_new(tree: Tree, folder: str = QUARANTINE, name: str | None = None, create: bool = True) -> Tree:
    """A fresh quarantine TREE/FOLDER/<UTC time>[-N] (or NAME when given: a quarantine being
    finished; with create=False it must exist), made with mkdirat (0700) and held by fd."""
    with open_folder(tree, folder) as q:
        stamp = name or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        cand, n = stamp, 1
        while create:
            try:
                os.mkdir(cand, 0o700, dir_fd=q.fd)
                break
            except FileExistsError:
                if name is not None:
                    break  # finishing a quarantine already begun: its folder is reused (checked below)
                n += 1
                cand = f"{stamp}-{n}"
        d = q.subdir(cand)
        try:
            _ours(d.path, os.fstat(d.fd))
        except BaseException:
            d.close()
            raise
        return d


def makedirs_in(tree: Tree, rel: str) -> Tree:
    """REL's directories made inside a held quarantine (mkdirat each, 0700), the last one held."""
    cur = Tree(os.dup(tree.fd), tree.path)
    for part in [p for p in rel.split("/") if p not in ("", ".")]:
        if part == "..":
            cur.close()
            raise UnsafeTree(rel, "`..` in a quarantine name")
        try:
            os.mkdir(part, 0o700, dir_fd=cur.fd)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                cur.close()
                raise
        try:
            nxt = cur.subdir(part)
        finally:
            cur.close()
        cur = nxt
    return cur
