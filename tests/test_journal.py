"""The journal and the apply lock, as the CLI uses them."""

from __future__ import annotations

import errno
import json
import os

from cli_support import run_cli
from reconcile_host.pipeline.journal import Journal, LockError, LockHeld


def test_unusable_lock_location_is_a_one_line_error(tmp_path):
    not_a_dir = tmp_path / "file"  # the journal's directory is a regular file
    not_a_dir.write_text("")
    state = tmp_path / "s.yaml"
    state.write_text("version: 1\nmounts:\n  /proc:\n    fstype: proc\n")
    proc = run_cli(tmp_path, "apply", str(state), "--journal", str(not_a_dir / "journal.jsonl"))
    assert proc.returncode == 1
    assert proc.stderr == f"reconcile: error: cannot take the lock {not_a_dir / 'lock'}: {os.strerror(errno.ENOTDIR)}\n"


def test_lock_beside_the_journal_held_then_free(tmp_path):
    journal = Journal.at(tmp_path / "j" / "journal.jsonl")
    assert journal.lock_path == tmp_path / "j" / "lock"
    first, second = journal.lock(), journal.lock()
    first.acquire()
    try:
        try:
            second.acquire()
        except LockHeld as exc:
            assert isinstance(exc, LockError)
            holder = json.loads((tmp_path / "j" / "lock").read_text())
            assert f"pid {holder['pid']}" in str(exc)
        else:
            raise AssertionError("a second lock was granted while the first was held")
    finally:
        first.release()
    second.acquire()
    second.release()
