"""Reading this boot's kernel log, whole: the Xid history that matters starts at boot.

`dmesg` first (the kernel's ring buffer). The ring buffer is small (often 1 MiB) and a long
uptime or an Xid storm rotates it, so when it does not reach back to boot (its first line is
not the kernel's `Linux version` at `[    0.000000]`) the journal's copy of this boot's kernel
messages is read instead (`journalctl -k -b 0`). When neither reaches back, or neither can be
read (`dmesg` needs root where kernel.dmesg_restrict=1), the GPUs' health is `unknown`, never
`healthy`: a critical Xid may be in the part that could not be read.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from ...core.host import CommandTimeout
from .observed import KernelLog
from .xid import KERNEL_LOG_ENV

if TYPE_CHECKING:
    from ...core.host import Host

DMESG_TIMEOUT = 5.0
JOURNAL_TIMEOUT = 15.0
JOURNAL_ARGV = ["journalctl", "-k", "-b", "0", "-o", "short-monotonic", "--no-pager", "-q"]
_STAMP_RE = re.compile(r"\[\s*(\d+)\.\d+\]")


def starts_at_boot(text: str) -> tuple[bool, str]:
    """(whether TEXT begins with this boot, the first timestamp seen)."""
    first = ""
    for line in text.splitlines()[:50]:
        if "Linux version " in line:
            return True, first
        m = _STAMP_RE.search(line)
        if m and not first:
            first = m.group(0)
            if int(m.group(1)) == 0:
                return True, first
    return False, first


def read_kernel_log(host: Host) -> tuple[str, KernelLog]:
    path = os.environ.get(KERNEL_LOG_ENV)
    if path:  # a test/diagnostic knob: the file is taken as the whole log
        try:
            return host.read_text(path), KernelLog(path)
        except OSError as exc:
            return "", KernelLog(path, readable=False, note=f"{path} unreadable: {exc.strerror}")
    problems = []
    dmesg = None
    try:
        res = host.run(["dmesg"], timeout=DMESG_TIMEOUT)
        if res.ok:
            dmesg = res.stdout
            whole, first = starts_at_boot(dmesg)
            if whole:
                return dmesg, KernelLog("dmesg")
            problems.append(f"the kernel ring buffer starts at {first or 'an unknown time'}, not at boot (rotated)")
        else:
            problems.append(f"dmesg: {res.brief()}")
    except CommandTimeout:
        problems.append("dmesg timed out")
    try:
        res = host.run(JOURNAL_ARGV, timeout=JOURNAL_TIMEOUT)
        if res.ok and res.stdout.strip():
            whole, _ = starts_at_boot(res.stdout)
            if whole or dmesg is None:
                return res.stdout, KernelLog("journalctl -k -b 0", complete=whole,
                                             note="" if whole else "; ".join(
                                                 [*problems, "the journal does not reach back to boot either"]))
            problems.append("the journal does not reach back to boot either")
        elif res.returncode == 127:
            problems.append("journalctl is not installed")
        else:
            problems.append(f"journalctl: {res.brief()}")
    except CommandTimeout:
        problems.append("journalctl -k timed out")
    if dmesg is not None:
        return dmesg, KernelLog("dmesg", complete=False, note="; ".join(problems))
    return "", KernelLog("", readable=False, note="kernel log not readable: " + "; ".join(problems))
