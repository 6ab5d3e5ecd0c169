"""common/usertree.py, the one door into a tree another user owns, and core/atomic.py, reconcile's
own files: each refusal tried on the thing it refuses (a link, a FIFO, a device behind a link, a
large file, a `..`, a user's link into root's tree), and what must still work (a regular pointer,
a framework's own relative link, a root-owned link on the declared path)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from reconcile_host.common.quarantine import QUARANTINE, open_folder, open_new
from reconcile_host.common.usertree import POINTER_LIMIT, Tree, UnsafeTree, chase_safe
from reconcile_host.core.atomic import write_bytes

NOBODY = 65534  # a uid that owns nothing here (chown needs root: those tests skip without it)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "run").mkdir()
    with Tree.open(str(tmp_path / "run")) as t:
        yield t


def run_of(t: Tree) -> Path:
    return Path(t.path)


def test_a_regular_pointer_is_read(tree):
    (run_of(tree) / "latest").write_text("global_step8\n")
    assert tree.read_pointer("latest") == "global_step8\n"


@pytest.mark.parametrize("make", ["symlink", "fifo", "zero", "big", "dir_link"])
def test_a_pointer_that_is_not_a_small_regular_file_is_refused(tree, tmp_path, make):
    secret = tmp_path / "secret"
    secret.write_text("root's secret text")
    run = run_of(tree)
    if make == "symlink":
        os.symlink(secret, run / "latest")
    elif make == "fifo":
        os.mkfifo(run / "latest")  # O_NONBLOCK: opened without a writer, never waited on
    elif make == "zero":
        os.symlink("/dev/zero", run / "latest")
    elif make == "big":
        (run / "latest").write_bytes(b"x" * (POINTER_LIMIT + 1))
    else:
        os.symlink(tmp_path, run / "step")
        (run / "latest").write_text("ok")
    rel = "step/secret" if make == "dir_link" else "latest"
    done: list[BaseException | str] = []

    def read() -> None:
        try:
            done.append(tree.read_pointer(rel))
        except BaseException as exc:  # noqa: BLE001 - the refusal is the result
            done.append(exc)

    th = threading.Thread(target=read, daemon=True)
    th.start()
    th.join(60)
    assert done, "the read hung"
    (exc,) = done
    assert isinstance(exc, UnsafeTree), exc
    assert "secret text" not in str(exc) and "\n" not in str(exc)


def test_names_that_leave_the_root_are_refused(tree):
    for rel in ("../x", "/etc/passwd", "a/../../x"):
        with pytest.raises(UnsafeTree):
            tree.read_pointer(rel)


def test_a_frameworks_relative_link_is_resolved_inside_the_root_only(tree):
    run = run_of(tree)
    (run / "epoch=1-step=8.ckpt").write_bytes(b"x")
    os.symlink("epoch=1-step=8.ckpt", run / "last.ckpt")
    os.symlink("sub/../epoch=1-step=8.ckpt", run / "ok2.ckpt")
    assert tree.readlink_inside("last.ckpt") == "epoch=1-step=8.ckpt"
    assert tree.readlink_inside("ok2.ckpt") == "epoch=1-step=8.ckpt"
    os.symlink("/etc/shadow", run / "abs.ckpt")
    os.symlink("../../etc/shadow", run / "up.ckpt")
    for rel in ("abs.ckpt", "up.ckpt"):
        with pytest.raises(UnsafeTree):
            tree.readlink_inside(rel)


def test_write_atomic_replaces_a_link_never_writes_through_it(tree, tmp_path):
    target = tmp_path / "target"
    target.write_text("untouched")
    os.symlink(target, run_of(tree) / "latest")
    tree.write_atomic("latest", b"global_step4")
    p = run_of(tree) / "latest"
    assert not p.is_symlink() and p.read_text() == "global_step4" and target.read_text() == "untouched"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        tree.write_atomic("latest", b"again", replace=False)
    assert [n for n in os.listdir(run_of(tree)) if n.endswith(".tmp")] == []


def test_copy_atomic_copies_the_file_never_what_a_link_names(tree, tmp_path):
    run = run_of(tree)
    (tmp_path / "other-users-model").write_bytes(b"private weights")
    os.symlink(tmp_path / "other-users-model", run / "step=8.ckpt")
    with pytest.raises(UnsafeTree):
        tree.copy_atomic("step=8.ckpt", "last.ckpt")
    assert not (run / "last.ckpt").exists()
    (run / "step=4.ckpt").write_bytes(b"weights")
    tree.copy_atomic("step=4.ckpt", "last.ckpt")
    assert (run / "last.ckpt").read_bytes() == b"weights"


@needs_root
def test_a_users_link_on_the_declared_path_into_roots_tree_is_refused(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    os.symlink("/etc", home / "run")
    os.chown(home / "run", NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(UnsafeTree, match="unsafe path transition"):
        Tree.open(str(home / "run"))
    os.symlink("../../..", home / "up")  # relative, then `..` out of the user's folder into root's
    os.chown(home / "up", NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(UnsafeTree, match="unsafe path transition"):
        Tree.open(str(home / "up"))
    (home / "real").mkdir()
    os.chown(home / "real", NOBODY, NOBODY)
    os.symlink("real", home / "mine")  # the user's link to the user's own folder: followed
    os.chown(home / "mine", NOBODY, NOBODY, follow_symlinks=False)
    with Tree.open(str(home / "mine")) as t:
        assert os.path.samestat(os.fstat(t.fd), os.stat(home / "real"))


@needs_root
def test_a_users_link_in_a_sticky_world_writable_folder_is_not_followed(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    os.chmod(tmpdir, 0o1777)
    (tmpdir / "real").mkdir()
    os.symlink("real", tmpdir / "run")
    os.chown(tmpdir / "run", NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(UnsafeTree, match="unsafe path transition"):
        Tree.open(str(tmpdir / "run"))


def test_roots_links_on_the_declared_path_are_followed(tmp_path):
    (tmp_path / "mnt").mkdir()
    os.symlink(tmp_path / "mnt", tmp_path / "data")  # /data -> /mnt/nvme, the administrator's
    with Tree.open(str(tmp_path / "data")) as t:
        assert os.path.samestat(os.fstat(t.fd), os.stat(tmp_path / "mnt"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        chase_safe(str(tmp_path / "file"))
    with pytest.raises(FileNotFoundError):
        chase_safe(str(tmp_path / "missing"))


def test_a_planted_quarantine_link_is_refused(tree, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, run_of(tree) / QUARANTINE)
    with pytest.raises(UnsafeTree):
        open_folder(tree)
    assert list(elsewhere.iterdir()) == []


@needs_root
def test_a_planted_quarantine_folder_is_refused(tree):
    q = run_of(tree) / QUARANTINE
    q.mkdir()
    os.chown(q, NOBODY, NOBODY)
    with pytest.raises(UnsafeTree, match="owned by uid"):
        open_folder(tree)
    os.chown(q, 0, 0)
    os.chmod(q, 0o777)
    with pytest.raises(UnsafeTree, match="writable by group or others"):
        open_folder(tree)


def test_a_new_quarantine_is_0700_and_its_manifest_0600(tree):
    with open_new(tree) as q:
        q.write_atomic("manifest.json", b"{}", replace=False)
        assert stat.S_IMODE(os.fstat(q.fd).st_mode) == 0o700
        assert stat.S_IMODE(os.stat("manifest.json", dir_fd=q.fd).st_mode) == 0o600
    assert stat.S_IMODE((run_of(tree) / QUARANTINE).stat().st_mode) == 0o700


def test_own_files_are_0600_under_a_random_name_and_replace_a_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("untouched")
    os.symlink(target, tmp_path / "plan.json")
    write_bytes(tmp_path / "plan.json", b"{}")
    assert target.read_text() == "untouched" and not (tmp_path / "plan.json").is_symlink()
    assert stat.S_IMODE((tmp_path / "plan.json").stat().st_mode) == 0o600
    write_bytes(tmp_path / "reconcile.prom", b"x 1\n", mode=0o644)
    assert stat.S_IMODE((tmp_path / "reconcile.prom").stat().st_mode) == 0o644
