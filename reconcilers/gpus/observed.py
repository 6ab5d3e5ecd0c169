"""What the gpus kind observes: each GPU, what holds its memory, and the verdict on its health."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    bus_id: str
    memory_total: int  # bytes
    memory_used: int  # bytes (NVML v2 `used` where the driver has it: excludes the driver's reservation)
    temperature_c: int | None = None
    power_w: float | None = None
    ecc_uncorrected_volatile: int | None = None  # None: not supported / unknown
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    health: str = "unknown"  # healthy, unhealthy, unknown
    problems: tuple[str, ...] = ()
    minor: int | None = None  # /dev/nvidiaN


@dataclass(frozen=True)
class GpuUse:
    gpu: int  # NVML index
    used_bytes: int | None  # None: not reported (a device-file holder, N/A)


@dataclass(frozen=True)
class Holder:
    """A process that holds GPU memory (NVML) or a GPU device file (/proc/PID/fd)."""

    pid: int
    name: str  # /proc/PID/comm ("" when the process is not visible from here)
    exe: str = ""  # basename of argv[0]
    unit: str | None = None  # the system service it belongs to (/proc/PID/cgroup)
    starttime: int | None = None  # /proc/PID/stat field 22: guards against a reused PID
    uses: tuple[GpuUse, ...] = ()
    device_files: tuple[str, ...] = ()
    visible: bool = True  # False: NVML names a PID this /proc does not show (another PID namespace)

    def label(self) -> str:
        return f"{self.pid} ({self.name or '?'})"


@dataclass(frozen=True)
class GpusObserved:
    source: str  # "nvml" or "nvidia-smi"
    driver_version: str
    gpus: tuple[Gpu, ...]
    holders: tuple[Holder, ...] = ()
    xids: tuple[str, ...] = ()  # critical Xid errors in the kernel log since boot
    notes: tuple[str, ...] = ()


def health_of(ecc: int | None, retired: bool | None, remap_pending: bool | None,
              remap_failure: bool | None, extra: Sequence[str] = ()) -> tuple[str, tuple[str, ...]]:
    """DCGM's memory health watch: volatile uncorrected ECC, pending retirement, row remap pending/failure."""
    problems = list(extra)
    if ecc:
        problems.append(f"{ecc} volatile uncorrected ECC error{'s' if ecc != 1 else ''}")
    if retired:
        problems.append("retired pages pending (needs a reset)")
    if remap_pending:
        problems.append("row remapping pending (needs a reset)")
    if remap_failure:
        problems.append("row remapping failed")
    if problems:
        return "unhealthy", tuple(problems)
    if None in (ecc, retired) and None in (remap_pending, remap_failure):
        return "unknown", ()
    return "healthy", ()
