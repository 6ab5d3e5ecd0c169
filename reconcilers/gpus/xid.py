"""Xid errors from the kernel log (`NVRM: Xid (PCI:...): NN, ...`): what the driver reported about
each GPU since boot."""

from __future__ import annotations

import re

# Application Xids (k8s-device-plugin's list): the process's fault, not the GPU's.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
KERNEL_LOG_ENV = "RECONCILE_KERNEL_LOG"
_XID_RE = re.compile(r"NVRM: Xid \((PCI:[^)]*)\): (\d+),?\s*(.*)")


def parse_xids(text: str) -> tuple[str, ...]:
    """Critical Xid lines of a kernel log (application Xids left out), one entry per distinct error."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        m = _XID_RE.search(line)
        if not m or int(m.group(2)) in APPLICATION_XIDS:
            continue
        detail = m.group(3).strip()
        detail = re.sub(r"^pid=[^,]*,\s*(name=[^,]*,\s*)?", "", detail)
        seen[f"Xid {m.group(2)} on {m.group(1)}" + (f": {detail}" if detail else "")] = None
    return tuple(seen)[:20]
