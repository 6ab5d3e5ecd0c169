"""`reconcile log --host ADDRESS | --via PREFIX | --inventory FILE`: the target's journal, read
there (`reconcile log --format json` on the target, through the same SSH door as diff and
apply: doors/remote.py), rendered here. Nothing is changed on a target, so no handshake:
the far side's JSON says its own `format_version`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import remote

LOG_TIMEOUT = 300.0


def fetch(target: remote.Target, args: Sequence[str], journal: str | None = None,
          timeout: float = LOG_TIMEOUT) -> tuple[dict[str, Any], list[str]]:
    """The target's `reconcile log --format json ARGS` document and the warnings it printed.
    RemoteError (one line) when it cannot be had."""
    words = ["log", "--format", "json", *args, *(["--journal", journal] if journal else [])]
    try:
        out = remote._run(target.argv(words), None, target.connect_timeout + timeout)
    except remote.Deadline:
        raise remote.RemoteError(f"{target.name}: `reconcile log` gave no answer within "
                                 f"{target.connect_timeout + timeout:g}s") from None
    doc = remote._json_object(out.stdout) if out.returncode == 0 else None
    if doc is None or "events" not in doc:
        raise remote._first_contact_error(target, out, "log") or remote.RemoteError(
            f"{target.name}: `{shlex.join(target.remote_command)} log` failed (exit {out.returncode}): "
            f"{remote._last_line(out.stderr) or remote._last_line(out.stdout) or 'no output'}")
    if str(doc.get("format_version", "")).split(".")[0] != "1":
        raise remote.RemoteError(f"{target.name}: its `reconcile log` speaks format {doc.get('format_version')!r}; "
                                 "this reconcile reads format 1")
    why = _unreadable_events(doc.get("events"))
    if why:
        raise remote.RemoteError(f"{target.name}: its `reconcile log` answer cannot be read ({why}); "
                                 "is the same reconcile installed there?")
    warnings = [line for line in out.stderr.splitlines() if line.startswith("reconcile: warning:")]
    return doc, warnings


def _unreadable_events(events: Any) -> str | None:
    """Why the far side's events are not what views/log.py renders (None: they are): a broken
    or hostile target is one error line for that host, not a crash of the timeline here."""
    if not isinstance(events, list):
        return "events is not a list"
    for i, e in enumerate(events):
        if not isinstance(e, dict) or not isinstance(e.get("event"), str):
            return f"events[{i}] is not an event"
        if e["event"] == "run":
            actions, observed = e.get("actions"), e.get("observed")
            if not isinstance(actions, list) or not all(isinstance(a, dict) and "resource" in a and
                                                        isinstance(a.get("outcome"), str) for a in actions):
                return f"events[{i}].actions"
            if not isinstance(observed, list) or not all(isinstance(o, dict) and "resource" in o for o in observed):
                return f"events[{i}].observed"
            if "run" not in e:
                return f"events[{i}].run"
        elif e["event"] == "watch-pass" and not isinstance(e.get("resources") or {}, dict):
            return f"events[{i}].resources"
    return None


def fetch_inventory(path: str, limit: str | None, opts: remote.RemoteOptions, args: Sequence[str],
                    parallel: int = 10) -> list[tuple[str, dict[str, Any] | None, list[str], str]]:
    """(host name, its log document or None, warnings, error) for each host, in inventory order:
    an unreachable host is an entry with its error, not a missing one."""
    from .inventory import load_inventory

    inv = load_inventory(path)
    hosts = inv.select(limit)

    def one(h) -> tuple[str, dict[str, Any] | None, list[str], str]:
        try:
            timeout = remote.duration_option(opts.connect_timeout, "--connect-timeout", 0.0) or \
                h.connect_timeout or remote.DEFAULT_CONNECT_TIMEOUT
            rcmd = opts.remote_command or h.remote_command
            try:
                target = (remote.ssh_target(h.address, (*opts.ssh_options, *h.ssh_options), timeout, rcmd)
                          if h.address else remote.via_target(h.via or "", timeout, rcmd))
            except ValueError as exc:
                raise remote.RemoteError(str(exc)) from None
            doc, warnings = fetch(target, args, journal=h.journal)
            return h.name, doc, warnings, ""
        except remote.RemoteError as exc:
            return h.name, None, [], str(exc)

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts) or 1))) as pool:
        return list(pool.map(one, hosts))
