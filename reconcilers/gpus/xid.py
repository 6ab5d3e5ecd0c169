"""The NVIDIA driver's messages about GPUs in the kernel log, each judged by NVIDIA's Xid catalogue.

What is read, in every form drivers print it (tests/data/gpus/xid-lines.yaml has real lines):
- `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., text` — with or without `pid=`/`name=`,
  with MIG's `GPU-I:05 GPU-CI:01` in the parenthesis, and the oldest form without `PCI:`;
  behind any prefix (`[ 12.3]`, `dmesg -T`, ISO time, syslog, journalctl's `kernel:`).
- "fallen off the bus" without an Xid number: `NVRM: GPU 0000:18:00.0: GPU has fallen off the
  bus.`, the older `NVRM: GPU at 0000:01:00.0 has fallen off the bus.` and the probe-time message
  over three lines (`NVRM: The NVIDIA GPU 0000:b3:00.0` / `(PCI ID: …) installed in this system
  has` / `fallen off the bus and is not responding to commands.`).

Since when an Xid counts — how a reset or a driver reload is told apart from an Xid before it:
the kernel log is in order, and these lines start a GPU afresh; an event before the last of
them is history (kept in the report, not judged):
- a boot (`Linux version …`, the kernel's first line) — a file may hold several boots;
- a driver load (`NVRM: loading NVIDIA UNIX … Kernel Module …`, printed at every load), for all GPUs;
- a GPU reset, for that GPU: the driver prints nothing of its own, so reconcile takes
  nvidia-smi's own words `GPU 00000000:3B:00.0 was successfully reset.` in the kernel log,
  which `nvidia-smi -r -i 3 | tee /dev/kmsg` puts there (NVSentinel acknowledges resets the
  same way, through a log entry written by its reset tool).
"""

from __future__ import annotations

import re

from .catalogue import HARMLESS, RECOVERY_ACTIONS, STEPS, XIDS

KERNEL_LOG_ENV = "RECONCILE_KERNEL_LOG"


def pci_key(bus_id: str) -> str:
    """`00000000:3B:00.0`, `0000:3b:00`, `PCI:0000:3b:00` -> `0000:3b:00` (domain:bus:device)."""
    s = bus_id.strip().lower()
    s = s[4:] if s.startswith("pci:") else s
    parts = s.split(":")
    if len(parts) != 3:
        return s
    domain, bus, dev = parts[0], parts[1], parts[2].split(".")[0]
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}"
    except ValueError:
        return s


# Compiled when a message needs them (re's cache), not at every start-up.
_CAUSE = r"caused by previous Xid (\d+)"
_RECOVERY = r"recovery action changed from .*? to (0x[0-9a-fA-F]+|\d+)"
_FATAL = r"\b(non-?fatal|fatal)\b"


def judge_xid(xid: int | None, detail: str = "", mig: bool = False) -> tuple[bool, str, str]:
    """(keep the job off the GPU, the step's action, why) for one driver message.

    The immediate action of NVIDIA's catalogue (catalogue.XIDS), read with what the line adds:
    94/95's `RST: Yes` / `D-RST: Yes` (the driver's own verdict), 45's `caused by previous Xid N`,
    154's new recovery action, 74's and 144-150's Fatal/Nonfatal (NVLink5 decode table: Fatal rows
    are RESET_GPU, Nonfatal ones IGNORE), and 63/64 under MIG, where NVML cannot report remapped rows."""
    if xid is None:  # fallen off the bus without a number: as Xid 79
        return True, "RESTART_BM", "as Xid 79 (RESTART_BM)"
    action, _ = XIDS.get(xid, (None, ""))
    listed = f"Xid {xid}: {action}" if action else f"Xid {xid}: not in the catalogue"
    if re.search(r"\bD-RST:\s*Yes", detail):
        return True, "DRAIN_AND_RESET", f"{listed}; the driver says D-RST: Yes"
    if re.search(r"(?<!D-)\bRST:\s*Yes", detail):
        return True, "RESET_GPU", f"{listed}; the driver says RST: Yes"
    if xid == 45:
        # The cause is judged on its own line; 45 adds a verdict only for a cause that always keeps off.
        cause = re.search(_CAUSE, detail, re.I)
        cause_action = XIDS.get(int(cause.group(1)), (None, ""))[0] if cause else None
        if cause_action in STEPS:
            return True, cause_action, f"{listed}, caused by Xid {cause.group(1)}: {cause_action}"
        return False, "IGNORE", listed + (f", judged by the Xid {cause.group(1)} line" if cause else "")
    if xid == 154:
        m = re.search(_RECOVERY, detail, re.I)
        if not m:
            return True, "CONTACT_SUPPORT", f"{listed}, naming no recovery action reconcile can read"
        value = int(m.group(1), 0)
        step = RECOVERY_ACTIONS.get(value, "CONTACT_SUPPORT")
        return step is not None, step or "IGNORE", f"{listed}, recovery action {m.group(1)}"
    if xid == 74 or 144 <= xid <= 150:
        m = re.search(_FATAL, detail, re.I)
        if m and m.group(1).lower().startswith("non"):
            return False, "IGNORE", f"{listed}, Nonfatal"
        return True, "RESET_GPU", f"{listed}, " + ("Fatal" if m else "severity not stated")
    if mig and xid == 63:
        # A row remap is pending until reset, and NVML cannot report remapped rows with MIG on.
        return True, "RESET_GPU", f"{listed}; with MIG on it stands for a pending row remap"
    if action == "WORKFLOW_XID_48":
        return True, "RESET_GPU", listed
    if action in HARMLESS:
        return False, action, listed
    if action in STEPS:
        return True, action, listed
    # Not in the catalogue, or no action yet (162-172): never ok.
    return True, "CONTACT_SUPPORT", f"{listed}" + ("" if action is None and xid not in XIDS else ", no action yet")
