"""The journal lines of GPU recovery that are not an action's: the completion of a reboot reconcile
requested (its intent was journaled in boot A; the first apply of the next boot writes what came of
it), and a person's acknowledgement that a fault was serviced (`reconcile ack`), which starts the
caps and latched faults of a GPU or of the node again (reconcilers/gpus/recovery.py reads both).

Called by the one run path (pipeline/runs.py apply), under the apply lock.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from typing import Any

from ..core.contract import utc_iso
from .journal import Journal
from .journal_read import read_newest_first

# How far back an uncompleted reboot intent is looked for: a node may stay down for days.
COMPLETION_HORIZON_S = 30 * 86400.0
GPU_ID_RE = re.compile(r"^(GPU-[0-9a-fA-F-]{8,}|([0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(\.[0-7])?)$")


def complete_reboots(journal: Journal, machine: Mapping[str, Any], report: Any = None) -> list[dict[str, Any]]:
    """Write a `rebooted` line for each reboot whose intent was journaled in another boot and that no
    line completes yet: intent in boot A, result observed in this boot. Returns the lines written."""
    boot = machine.get("boot_id")
    if not boot:
        return []  # which boot this is cannot be told: nothing is claimed
    entries = list(read_newest_first(journal.path, time.time() - COMPLETION_HORIZON_S))
    completed = {e.get("intent_run") for e in entries if e.get("event") == "rebooted"}
    pending = [e for e in reversed(entries) if e.get("event") == "intent" and e.get("action") == "reboot"
               and e.get("boot") and e.get("boot") != boot and e.get("run") not in completed]
    now = _outcome(report, str(pending[0].get("resource", "gpus"))) if pending else ""
    written = []
    for e in pending:
        line = {"event": "rebooted", "time": utc_iso(millis=True), "resource": e.get("resource"), "action": "reboot",
                "target": e.get("target"), "intent_run": e.get("run"), "requested": e.get("time"),
                "from_boot": e.get("boot"), "boot": boot, "description": e.get("description", ""),
                "message": f"up again in boot {boot}" + (f": {now}" if now else "")}
        journal(line)
        written.append(line)
    return written


def _outcome(report: Any, resource: str) -> str:
    for r in getattr(report, "resources", ()) or ():
        if r.resource.id == resource:
            first = (r.message or "").strip().splitlines()
            return f"{resource} {r.status.value}" + (f": {first[0]}" if first else "")
    return ""


def ack(journal: Journal, reason: str, by: str, gpu: str | None, machine: Mapping[str, Any]) -> dict[str, Any]:
    """Journal that a person serviced a fault of GPU (a UUID or a bus id; None: the node)."""
    line = {"event": "ack", "time": utc_iso(millis=True), "by": by, "reason": reason, "gpu": gpu,
            "node": machine.get("hostname"), "boot": machine.get("boot_id")}
    journal(line)
    return line


def default_by() -> str:
    """Who acknowledges: the user behind sudo, else the user."""
    who = os.environ.get("SUDO_USER") or os.environ.get("USER") or os.environ.get("LOGNAME")
    if who:
        return who
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        return f"uid {os.getuid()}"
