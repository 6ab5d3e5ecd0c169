"""Reading the GPUs through NVML (the `pynvml` module of nvidia-ml-py); runs in the observer child."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...pipeline.contract import ObserveError
from .observed import Gpu, GpuUse, health_of


class NvmlUnavailable(Exception):
    pass


def nvml_observe() -> tuple[str, list[Gpu], dict[int, list[GpuUse]], list[str]]:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"pynvml not installed ({exc})") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(str(exc)) from None
    try:
        return nvml_read(pynvml)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def nvml_read(nv: Any) -> tuple[str, list[Gpu], dict[int, list[GpuUse]], list[str]]:
    fatal: list[str] = []  # of the GPU being read: lost or needing a reset

    def q(fn: Callable, *args: Any) -> tuple[Any, str | None]:
        """(value, None), or (None, None) when not supported, or (None, the error)."""
        try:
            return fn(*args), None
        except nv.NVMLError_NotSupported:
            return None, None
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired) as exc:
            fatal.append(f"NVML: {exc}")
            return None, str(exc)
        except nv.NVMLError as exc:
            return None, str(exc)

    driver, _ = q(nv.nvmlSystemGetDriverVersion)
    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as exc:
        raise ObserveError(f"NVML cannot count GPUs: {exc}") from None
    gpus: list[Gpu] = []
    uses: dict[int, list[GpuUse]] = {}
    notes: list[str] = []
    for i in range(count):
        fatal.clear()
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as exc:
            # A GPU that fell off the bus still counts as present and is reported unhealthy.
            gpus.append(Gpu(i, "?", "?", "?", 0, 0, health="unhealthy", problems=(f"NVML: {exc}",)))
            continue
        errors: list[str] = []
        name, _ = q(nv.nvmlDeviceGetName, h)
        uuid, _ = q(nv.nvmlDeviceGetUUID, h)
        pci, _ = q(nv.nvmlDeviceGetPciInfo, h)
        minor, _ = q(nv.nvmlDeviceGetMinorNumber, h)
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        except (nv.NVMLError_FunctionNotFound, nv.NVMLError_NotSupported, nv.NVMLError_ArgumentVersionMismatch):
            mem, err = q(nv.nvmlDeviceGetMemoryInfo, h)  # drivers < 515: v1 counts the reservation as used
            if err:
                errors.append(f"memory info: {err}")
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired) as exc:
            mem = None
            fatal.append(f"NVML: {exc}")
        except nv.NVMLError as exc:
            mem = None
            errors.append(f"memory info: {exc}")
        temp, _ = q(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        power, _ = q(nv.nvmlDeviceGetPowerUsage, h)
        ecc, _ = q(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        retired, _ = q(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        remap, _ = q(nv.nvmlDeviceGetRemappedRows, h)
        pend, fail = (bool(remap[2]), bool(remap[3])) if remap else (None, None)
        for kind in ("Compute", "Graphics"):
            procs, err = None, None
            for suffix in ("_v3", "_v2"):  # _v3 from driver 510.39 on
                fn = getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses{suffix}")
                try:
                    procs = fn(h)
                    break
                except nv.NVMLError_FunctionNotFound:
                    continue
                except nv.NVMLError_NotSupported:
                    break
                except nv.NVMLError as exc:
                    err = str(exc)
                    break
            if err:
                errors.append(f"{kind.lower()} processes: {err}")
            for p in procs or ():
                uses.setdefault(int(p.pid), []).append(GpuUse(i, p.usedGpuMemory))
        health, problems = health_of(ecc, None if retired is None else bool(retired), pend, fail, tuple(fatal))
        gpus.append(Gpu(
            index=i, name=name or "?", uuid=uuid or "?",
            bus_id=(pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)) if pci else "?",
            memory_total=int(mem.total) if mem else 0, memory_used=int(mem.used) if mem else 0,
            temperature_c=temp, power_w=round(power / 1000, 1) if power is not None else None,
            ecc_uncorrected_volatile=ecc, retired_pages_pending=None if retired is None else bool(retired),
            remapped_rows_pending=pend, remapped_rows_failure=fail, health=health, problems=problems,
            minor=minor,
        ))
        # Queries that failed (not merely unsupported) are notes, never a crash.
        notes.extend(f"GPU {i}: could not read {e}" for e in errors)
    return driver or "?", gpus, uses, notes
