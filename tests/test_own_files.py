"""What another local user can put where reconcile, as root, looks: files in a mount's root
(the write probe), entries in the validation cache, a state file, a saved plan or a state
directory of their own. An unprivileged user (a spare uid no account has, taken with setpriv,
so there is nothing to create or remove on the host) prepares the files; reconcile runs as
root; the test asserts the result is a clear verdict or a one-line refusal, that the user's
files are as they left them, and that nothing they named ran."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from reconcile_host.reconcilers.mounts.probe import PROBE_PREFIX, _write_probe

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv(1) to act as another user")


def spare_uid() -> int:
    """A uid no account has (so no home, no groups, no running process)."""
    for uid in range(61000, 62000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no spare uid in 61000-61999")


@pytest.fixture
def user():
    return spare_uid()


def as_user(uid: int, script: str, cwd: Path) -> None:
    """Run a shell script as `uid` (no groups): what that user can do, and nothing more."""
    subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", "/bin/sh", "-ec",
                    script], cwd=cwd, check=True, timeout=60, env={"PATH": "/usr/bin:/bin"})


@pytest.fixture
def shared():
    """A directory every user may write in (as a mount's root often is: /scratch 1777), under a
    folder others can reach (pytest's own temporary folders are root's, 0700)."""
    top = Path(tempfile.mkdtemp(prefix="reconcile-own-files-", dir="/tmp"))
    top.chmod(0o755)
    root = top / "mnt"
    root.mkdir()
    root.chmod(0o1777)
    try:
        yield root
    finally:
        shutil.rmtree(top)


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry below `folder`: kind, owner, mode and (for a file) content; links unfollowed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            body = p.read_bytes() if stat.S_ISREG(st.st_mode) else (os.readlink(p) if p.is_symlink() else None)
            out[str(p.relative_to(folder))] = (stat.S_IFMT(st.st_mode), st.st_uid, stat.S_IMODE(st.st_mode), body)
    return out


# --- the mount write probe --------------------------------------------------------------------

def test_names_planted_in_a_mount_root_do_not_change_the_write_probe(shared, user, tmp_path):
    secret = tmp_path / "root-only"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    pid = os.getpid()
    # The names the probe once used (its pid's), every name a user might guess, a symlink to a
    # root-only file, a FIFO: none may block the probe, be written through, or be removed.
    as_user(user, f"""
        for p in {pid} {pid + 1} {pid - 1}; do echo mine > {PROBE_PREFIX}$p; done
        echo mine > {PROBE_PREFIX}
        ln -s {secret} {PROBE_PREFIX}link
        mkfifo {PROBE_PREFIX}fifo
        mkdir {PROBE_PREFIX}dir
    """, shared)
    before = snapshot(shared)
    assert all(uid == user for _, uid, _, _ in before.values())
    for _ in range(20):
        assert _write_probe(str(shared), PROBE_PREFIX) == {"writable": True}
    assert snapshot(shared) == before  # the user's files untouched, the probe's own gone
    assert secret.read_text() == "root's\n"
