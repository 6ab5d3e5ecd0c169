"""Where reconcile keeps its own files on a host: the journal and lock, the state directory of
the kinds (extraction check records, job pid files), the validation cache."""

from __future__ import annotations

import os


def default_journal_path() -> str:
    """/var/lib/reconcile/journal.jsonl as root, the XDG state directory otherwise."""
    if os.geteuid() == 0:
        return "/var/lib/reconcile/journal.jsonl"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "reconcile", "journal.jsonl")


def state_dir() -> str:
    """$RECONCILE_STATE_DIR if set, else the default journal's directory."""
    return os.environ.get("RECONCILE_STATE_DIR") or os.path.dirname(default_journal_path())
