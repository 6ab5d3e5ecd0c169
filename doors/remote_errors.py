"""What goes wrong reaching another machine, as the remote doors say it: the one-line errors, the
refusal reason each becomes in an error report, and stderr as the user reads it (doors/remote.py,
doors/inventory.py and doors/__init__.py raise and print these)."""

from __future__ import annotations

import sys
from typing import Any


class RemoteError(Exception):
    """One line for the user: the target could not be reached or cannot run this request."""


def refusal_reason(message: str) -> str:
    """The error report's `reason` for a RemoteError's message: `unreachable` when no connection
    was made or it was lost (ssh's own words, and ours for a silent target), else `remote-error`
    (reconcile missing or too old there, a bad option, a deadline)."""
    unreachable = ("cannot reach ", "connection lost ", ": no answer within ")
    return "unreachable" if any(w in message for w in unreachable) else "remote-error"


def echo_err(text: str) -> None:
    """Text to stderr as click.echo(err=True) writes it, without click (doors/ is below the
    command line): flushed, its control characters escaped but for line breaks (the far side's
    words: core/escape.py), and what the stream cannot encode replaced rather than raised (a
    path from the far side)."""
    from ..core.escape import escape_controls

    text = escape_controls(text, newlines=True)
    stream = sys.stderr
    try:
        stream.write(text)
    except UnicodeEncodeError:
        enc = stream.encoding or "utf-8"
        stream.write(text.encode(enc, "replace").decode(enc))
    stream.flush()


class RemoteFailed(Exception):
    """The far side's reconcile refused the request (bad state file, lock held, wrong host):
    its stderr, passed through as it is."""

    def __init__(self, stderr: str, report: dict[str, Any] | None = None):
        super().__init__(stderr)
        self.stderr = stderr
        self.report = report  # the far side's error report (a bad state file), for --format json/junit
