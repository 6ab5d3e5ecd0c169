"""Which boot this is: the kernel's boot id (proc(5): /proc/sys/kernel/random/boot_id, a new
random UUID at every boot). Records keyed by it (the extraction and checkpoint check records,
the kernel log's read position, the GPU recovery history, the locked clocks) start afresh after
a reboot. $RECONCILE_BOOT_ID_FILE names another file: the tests' reboot."""

from __future__ import annotations

import os

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
BOOT_ID_ENV = "RECONCILE_BOOT_ID_FILE"


def boot_id() -> str | None:
    """This boot's id, or None where it cannot be read (never a made-up one)."""
    try:
        with open(os.environ.get(BOOT_ID_ENV) or BOOT_ID_FILE, encoding="ascii", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None
