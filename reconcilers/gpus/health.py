"""The verdict on each GPU: every signal that means "a job must not run here", and the step a
person must take first.

Signals (each with its source):
- NVML's `GPU_IS_LOST` / `RESET_REQUIRED` from any call, nvidia-smi's "GPU is lost": reboot the
  node / reset the GPU (NVIDIA: a lost GPU is Xid 79's state, RESTART_BM).
- The driver's recovery action (NVML field 230, nvidia-smi `gpu_recovery_action`): its own step.
- Memory health, as DCGM's memory health watch reads it: volatile uncorrected ECC errors, retired
  pages pending (retirement takes effect at the next reset: NVIDIA "Dynamic Page Retirement"),
  row remapping pending or failed (NVIDIA "A100/H100 GPU Memory Error Management": a reset
  activates a pending remap; a failure is Xid 64, RESET_GPU, and needs service if it recurs).
- Driver messages in the kernel log since the GPU was last initialised (xid.py), as NVIDIA's
  Xid catalogue judges them.

A signal the GPU does not support (GeForce boards have no ECC; MIG hides remapped rows) is not a
signal; one that could not be read (an NVML error, an unreadable kernel log) makes the verdict
`unknown`, never `healthy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .catalogue import RECOVERY_ACTIONS, RECOVERY_NAMES, step_rank, step_text
from .observed import Gpu, KernelEvent, KernelLog, Signal
from .xid import pci_key

CATALOGUE = "NVIDIA Xid catalogue"


def _signal(what: str, action: str, source: str, step: str = "") -> Signal:
    return Signal(what, action, step or step_text(action), source)


def gpu_signals(gpu: Gpu, events: Sequence[KernelEvent]) -> list[Signal]:
    out: list[Signal] = []
    if gpu.lost:
        lost = "lost" in gpu.lost.lower() or "fallen off" in gpu.lost.lower()
        out.append(_signal(gpu.lost, "RESTART_BM" if lost else "RESET_GPU",
                           "NVML (GPU_IS_LOST: as Xid 79)" if lost else "NVML (RESET_REQUIRED)"))
    if gpu.recovery_action not in (None, 0):
        value = gpu.recovery_action
        action = RECOVERY_ACTIONS.get(value) or "CONTACT_SUPPORT"
        name = RECOVERY_NAMES.get(value, "a value reconcile does not know")
        out.append(_signal(f"the driver's recovery action is {name}", action,
                           "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"))
    if gpu.ecc_uncorrected_volatile:
        n = gpu.ecc_uncorrected_volatile
        out.append(_signal(f"{n} volatile uncorrected ECC error{'s' if n != 1 else ''}", "RESET_GPU",
                           "DCGM memory health watch"))
    if gpu.retired_pages_pending:
        out.append(_signal("retired pages pending", "RESET_GPU", "NVIDIA Dynamic Page Retirement"))
    if gpu.remapped_rows_pending:
        out.append(_signal("row remapping pending", "RESET_GPU", "NVIDIA GPU Memory Error Management"))
    if gpu.remapped_rows_failure:
        out.append(_signal("row remapping failed", "RESET_GPU", "NVIDIA GPU Memory Error Management (Xid 64)",
                           "reset the GPU; if the remap fails again, the GPU needs service (contact NVIDIA support)"))
    mine = [e for e in events if e.pci == pci_key(gpu.bus_id) and e.current and e.keep_off]
    has_79 = any(e.xid == 79 for e in mine)
    for ev in mine:
        if ev.xid is None and has_79:
            continue  # the companion line of an Xid 79: the same event, not a second one
        out.append(_signal(ev.describe(), ev.action, f"{CATALOGUE}: {ev.why}"))
    return out


def judge(gpu: Gpu, events: Sequence[KernelEvent], log: KernelLog | None) -> Gpu:
    """GPU with its verdict: health, problems, signals and the first step."""
    signals = gpu_signals(gpu, events)
    if signals:
        top = max(signals, key=lambda s: step_rank(s.action))
        several = len({s.step for s in signals}) > 1
        return replace(gpu, health="unhealthy", signals=tuple(signals), step=top.step,
                       problems=tuple(f"{s.what} [{s.source}" + (f": {s.step}]" if several else "]") for s in signals))
    unknown = [f"could not read {e}" for e in gpu.read_errors]
    if log is not None and not log.readable:
        unknown.append(f"Xid errors unknown: {log.note}")
    elif log is not None and not log.complete:
        unknown.append(f"Xid errors unknown before the kernel log starts: {log.note}")
    if log is not None and log.readable and log.lost:
        unknown.append(f"Xid errors unknown in lines lost before they were read: {log.lost}")
    if unknown:
        return replace(gpu, health="unknown", problems=tuple(unknown), signals=(), step="")
    return replace(gpu, health="healthy", problems=(), signals=(), step="")


def unlisted_events(gpus: Sequence[Gpu], events: Sequence[KernelEvent]) -> list[KernelEvent]:
    """Current keep-off events for a PCI address no listed GPU has: a GPU gone from NVML."""
    known = {pci_key(g.bus_id) for g in gpus}
    return [e for e in events if e.current and e.keep_off and e.pci not in known]
