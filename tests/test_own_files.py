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


# --- the validation cache, the state file, saved plans, the state directory, the lock -----------

STATE = "version: 1\nmounts:\n  /proc:\n    fstype: proc\n"


def run(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    from cli_support import run_cli

    proc = run_cli(tmp, *args, timeout=120, **env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def one_line_refusal(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    return proc.stderr.rstrip("\n")


def test_a_cache_entry_a_user_planted_never_makes_roots_apply_run_their_command(shared, user, tmp_path):
    """docs/remote.md once suggested RECONCILE_CACHE_DIR=/tmp/rc: a user made it first and
    planted the entry root's next apply would look up, declaring a job whose command is theirs."""
    from reconcile_host.pipeline.statefile.schema import schema_fingerprint, sha256

    state = tmp_path / "s.yaml"
    state.write_text(STATE)
    digest = sha256(schema_fingerprint().encode() + b"\0" + state.read_bytes()).hexdigest()
    ran = tmp_path / "ran-as-root"
    (tmp_path / "hs").mkdir()
    doc = {"version": 1, "extractions": {"x": {"dir": str(tmp_path / "hs"), "total": 1,
                                               "job": {"command": ["/usr/bin/touch", str(ran)]}}}}
    import json

    entry = json.dumps({"key": digest, "doc": doc, "warnings": [], "mac": "0" * 64})
    as_user(user, f"mkdir -p rc/validated && cat > rc/validated/{digest}.json <<'EOF'\n{entry}\nEOF\n", shared)
    before = snapshot(shared)
    journal = tmp_path / "journal.jsonl"
    proc = run(tmp_path, "apply", str(state), "--journal", str(journal), RECONCILE_CACHE_DIR=str(shared / "rc"),
               RECONCILE_STATE_DIR=str(tmp_path / "state"))
    line = one_line_refusal(proc)
    assert line.startswith(f"{shared / 'rc'}: directory owned by uid {user}, not by root: refusing to trust it"), line
    assert not ran.exists() and not journal.exists()
    assert snapshot(shared) == before


def test_a_state_file_or_plan_another_user_owns_or_may_write_is_refused(shared, user, tmp_path):
    as_user(user, f"cat > theirs.yaml <<'EOF'\n{STATE}EOF\n", shared)
    theirs = shared / "theirs.yaml"
    line = one_line_refusal(run(tmp_path, "apply", str(theirs)))
    assert line == (f"{theirs}:1:1: file owned by uid {user}, not by root: refusing to trust it (another user "
                    "could write it)")
    # root's own file, writable by its group: as good as anyone's
    mine = tmp_path / "mine.yaml"
    mine.write_text(STATE)
    mine.chmod(0o664)
    line = one_line_refusal(run(tmp_path, "diff", str(mine)))
    assert line == f"{mine}:1:1: file is writable by its group (mode 0664): refusing to trust it (chmod go-w)"
    mine.chmod(0o644)
    plan = tmp_path / "plan.json"
    assert run(tmp_path, "diff", str(mine), "--out", str(plan)).returncode == 0
    # The user's copy of root's plan, byte for byte: whoever owns it could have changed it.
    as_user(user, f"cat > plan.json <<'EOF'\n{plan.read_text()}EOF\n", shared)
    journal = tmp_path / "journal.jsonl"
    line = one_line_refusal(run(tmp_path, "apply", str(shared / "plan.json"), "--journal", str(journal)))
    assert line == (f"reconcile: error: refusing the saved plan {shared / 'plan.json'}: file owned by uid {user}, "
                    "not by root: refusing to trust it (another user could write it)")
    assert not journal.exists()
    assert run(tmp_path, "apply", str(plan), "--journal", str(journal)).returncode == 0  # root's own: applied


def test_a_state_directory_another_user_made_is_refused(shared, user, tmp_path):
    as_user(user, "mkdir state", shared)
    state = tmp_path / "s.yaml"
    state.write_text(STATE)
    before = snapshot(shared)
    line = one_line_refusal(run(tmp_path, "apply", str(state), "--journal", str(tmp_path / "j.jsonl"),
                                RECONCILE_STATE_DIR=str(shared / "state")))
    assert line.startswith(f"{shared / 'state'}: directory owned by uid {user}, not by root: refusing to trust it")
    assert snapshot(shared) == before


def acting_state(tmp: Path) -> Path:
    """A state whose apply has something to write in its journal first: a job to start."""
    (tmp / "hs").mkdir()
    path = tmp / "acting.yaml"
    path.write_text(f'{{"version": 1, "extractions": {{"x": {{"dir": "{tmp / "hs"}", "total": 1, '
                    '"job": {"command": ["/bin/true"]}}}}')
    return path


def test_a_lock_or_journal_planted_as_a_symlink_is_refused_and_its_target_untouched(shared, user, tmp_path):
    target = tmp_path / "root-only"
    target.write_text("root's\n")
    target.chmod(0o600)
    state = tmp_path / "s.yaml"
    state.write_text(STATE)
    acting = acting_state(tmp_path)
    # In the user's own folder given as --journal (in a sticky /tmp-like one, the kernel's
    # protected_symlinks refuses root the link before reconcile sees it).
    as_user(user, "mkdir j", shared)
    journal = shared / "j" / "journal.jsonl"
    refused = "a symlink stands where reconcile keeps its own file: refusing to follow it"
    for planted in ("lock", "journal.jsonl"):
        as_user(user, f"rm -f j/lock j/journal.jsonl; ln -s {target} j/{planted}", shared)
        before = snapshot(shared)
        if planted == "lock":  # the apply is refused before anything: one line
            line = one_line_refusal(run(tmp_path, "apply", str(state), "--journal", str(journal)))
            assert line == f"reconcile: error: cannot take the lock: {shared / 'j' / 'lock'}: {refused}"
        else:  # nothing is done without its record: the start is not carried out, and says why
            proc = run(tmp_path, "apply", str(acting), "--journal", str(journal))
            assert proc.returncode == 1
            assert f"not carried out: the journal cannot be written ({journal}: {refused})" in proc.stdout
        assert target.read_text() == "root's\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
        # (the lock beside a planted journal is root's: taken, then released)
        assert {k: v for k, v in snapshot(shared).items() if not k.startswith("j/lock")} == \
            {k: v for k, v in before.items() if not k.startswith("j/lock")}


def test_journal_lock_and_cache_are_private(tmp_path):
    journal = tmp_path / "j" / "journal.jsonl"
    run(tmp_path, "apply", str(acting_state(tmp_path)), "--journal", str(journal),
        RECONCILE_STATE_DIR=str(tmp_path / "state"))
    made = [journal, journal.with_name("lock"), journal.with_name("lock.gate"), tmp_path / "state" / "cache.key",
            *(tmp_path / "cache" / "validated").iterdir()]
    assert len(made) == 5
    assert {str(p): stat.S_IMODE(p.stat().st_mode) for p in made} == {str(p): 0o600 for p in made}
    dirs = [journal.parent, tmp_path / "state", tmp_path / "cache", tmp_path / "cache" / "validated"]
    assert {str(p): stat.S_IMODE(p.stat().st_mode) for p in dirs} == {str(p): 0o700 for p in dirs}


def test_as_root_under_sudo_the_invoking_users_own_state_file_is_theirs_to_give(shared, user, tmp_path):
    as_user(user, f"cat > theirs.yaml <<'EOF'\n{STATE}EOF\n", shared)
    theirs = shared / "theirs.yaml"
    assert run(tmp_path, "diff", str(theirs), SUDO_UID=str(user)).returncode == 0  # sudo says who ran it
    line = one_line_refusal(run(tmp_path, "diff", str(theirs), SUDO_UID=str(user + 1)))
    assert line.startswith(f"{theirs}:1:1: file owned by uid {user}, not by root:")
