"""Reading the GPUs through NVML (the `pynvml` module of nvidia-ml-py); runs in the observer child.

NVML's own semantics, as real drivers show them (each modelled by tests/fakenvml/fakenvml.c):
- a query the GPU does not support raises NotSupported (or FunctionNotFound on an older driver):
  that value is None, never 0 — GB10/Grace report no framebuffer memory at all;
- GPU_IS_LOST / RESET_REQUIRED can come from any call, the handle lookup included: the GPU is
  then `lost`, still counted, and judged by health.py;
- any other error leaves the value None and is kept as a read error: health `unknown`;
- a process can be in both the compute and the graphics list ("C+G"), with its memory in each:
  merged by PID per GPU (and MIG instance), never added twice;
- `usedGpuMemory` NVML_VALUE_NOT_AVAILABLE comes back from pynvml as None: memory not reported;
- with MIG on, remapped rows are not reported (NotSupported); the MIG instances' memory is read
  from their own handles.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cache
from types import SimpleNamespace
from typing import Any

from ...core.contract import ObserveError
from .nvml_settings import read_settings
from .observed import Gpu, GpuUse, MigInstance

FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
FIELD_NVLINK_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of a process outside MIG
# nvmlClocksEventReason* bits (pynvml), by the names the state file uses (checks.CLOCK_EVENTS).
CLOCK_EVENT_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                    0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
                    0x100: "display_clocks"}

# nvmlInit errors (NVML_ERROR_*) -> what a person does about them.
INIT_HINTS = {
    18: "the loaded NVIDIA kernel module and libnvidia-ml differ (the driver was upgraded without a reboot?): "
        "reboot the node, or reload the nvidia kernel modules",
    4: "no permission to the GPUs: run as root, or check the permissions of /dev/nvidia*",
    9: "the NVIDIA kernel module is not loaded: load it (modprobe nvidia) or install the driver",
    12: "libnvidia-ml.so.1 was not found: is the NVIDIA driver installed?",
}


class NvmlUnavailable(Exception):
    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code

    @property
    def hint(self) -> str:
        return INIT_HINTS.get(self.code or 0, "")


@dataclass
class NvmlReading:
    """What one NVML session read: the driver, the GPUs and the processes using them."""

    driver: str
    cuda: str | None
    gpus: list[Gpu]
    uses: dict[int, list[GpuUse]]
    notes: list[str] = field(default_factory=list)


def nvml_observe(settings: Collection[str] = ()) -> NvmlReading:
    """Every GPU, and the SETTINGS (names of gpus.settings) the state declares."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"pynvml not installed ({exc})") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(str(exc), getattr(exc, "value", None)) from None
    try:
        return nvml_read(pynvml, settings)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _cuda(nv: Any) -> str | None:
    for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
        try:
            v = int(getattr(nv, name)())
        except (nv.NVMLError, AttributeError):
            continue
        return f"{v // 1000}.{v % 1000 // 10}"  # 13010 -> "13.1" (CUDA_VERSION encoding)
    return None


def nvml_read(nv: Any, settings: Collection[str] = ()) -> NvmlReading:
    try:
        driver = nv.nvmlSystemGetDriverVersion()
    except nv.NVMLError:
        driver = "?"
    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as exc:
        raise ObserveError(f"NVML cannot count GPUs: {exc}") from None
    reading = NvmlReading(str(driver), _cuda(nv), [], {})
    for i in range(count):
        reading.gpus.append(_read_gpu(nv, i, reading.uses, settings))
    return reading


def _read_gpu(nv: Any, i: int, uses: dict[int, list[GpuUse]], settings: Collection[str] = ()) -> Gpu:
    lost: list[str] = []
    errors: list[str] = []
    fatal = (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired)

    def q(what: str, fn: Callable, *args: Any) -> Any:
        """The value; None when not supported (or not in this driver); errors are kept."""
        try:
            return fn(*args)
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
            return None
        except fatal as exc:
            lost.append(str(exc))
            return None
        except nv.NVMLError as exc:
            errors.append(f"{what}: {exc}")
            return None

    try:
        h = nv.nvmlDeviceGetHandleByIndex(i)
    except fatal as exc:
        return Gpu(i, "?", "?", "?", None, None, lost=str(exc), processes_listed=False)
    except nv.NVMLError as exc:
        return Gpu(i, "?", "?", "?", None, None, read_errors=(f"its handle: {exc}",), processes_listed=False)
    name = q("name", nv.nvmlDeviceGetName, h)
    uuid = q("UUID", nv.nvmlDeviceGetUUID, h)
    pci = q("PCI info", nv.nvmlDeviceGetPciInfo, h)
    minor = q("minor number", nv.nvmlDeviceGetMinorNumber, h)
    mem = _memory(nv, h, q)
    mig_mode = q("MIG mode", nv.nvmlDeviceGetMigMode, h)
    mig = bool(mig_mode[0]) if mig_mode is not None else None
    remap = q("remapped rows", nv.nvmlDeviceGetRemappedRows, h)
    retired = q("retired pages", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    recovery, nlinks = _fields(nv, h, q)
    down = None
    if nlinks:
        states = [q(f"NVLink {link} state", nv.nvmlDeviceGetNvLinkState, h, link) for link in range(nlinks)]
        down = tuple(link for link, s in enumerate(states) if s is not None and not s)
    reasons = _clock_events(nv, h, q)
    power = q("power", nv.nvmlDeviceGetPowerUsage, h)
    temp = _temperature(nv, h, q)
    ecc_unc = q("uncorrected ECC errors", nv.nvmlDeviceGetTotalEccErrors, h,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
    ecc_cor = q("corrected ECC errors", nv.nvmlDeviceGetTotalEccErrors, h,
                nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
    vbios = _text(q("VBIOS version", nv.nvmlDeviceGetVbiosVersion, h))
    pcie = [q(what, fn, h) for what, fn in (
        ("PCIe generation", nv.nvmlDeviceGetCurrPcieLinkGeneration),
        ("PCIe max generation", nv.nvmlDeviceGetMaxPcieLinkGeneration),
        ("PCIe GPU max generation", nv.nvmlDeviceGetGpuMaxPcieLinkGeneration),
        ("PCIe width", nv.nvmlDeviceGetCurrPcieLinkWidth),
        ("PCIe max width", nv.nvmlDeviceGetMaxPcieLinkWidth))]
    persistence = q("persistence mode", nv.nvmlDeviceGetPersistenceMode, h)
    listed = _processes(nv, h, i, q, uses)
    migs = _mig_instances(nv, h, q) if mig else ()
    # Settings that cannot be read make the settings unknown, not the GPU's health.
    declared = read_settings(nv, h, settings, lost) if settings else None
    return Gpu(
        index=i, name=name or "?", uuid=uuid or "?",
        bus_id=(pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)) if pci else "?",
        memory_total=int(mem.total) if mem else None, memory_used=int(mem.used) if mem else None,
        temperature_c=temp, power_w=round(power / 1000, 1) if power is not None else None,
        ecc_uncorrected_volatile=ecc_unc, ecc_corrected_volatile=ecc_cor,
        retired_pages_pending=None if retired is None else bool(retired),
        remapped_rows_pending=bool(remap[2]) if remap else None,
        remapped_rows_failure=bool(remap[3]) if remap else None,
        recovery_action=recovery, minor=minor, mig=mig, mig_instances=migs,
        vbios=vbios, persistence_mode=None if persistence is None else bool(persistence),
        pcie_gen=pcie[0], pcie_gen_max=pcie[1], pcie_gen_gpu_max=pcie[2], pcie_width=pcie[3], pcie_width_max=pcie[4],
        clock_events=reasons, nvlink_links=nlinks, nvlink_down=down, settings=declared,
        lost=lost[0] if lost else None, read_errors=tuple(errors), processes_listed=listed and not lost,
    )


def _text(v: Any) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


def _memory(nv: Any, h: Any, q: Callable) -> Any:
    try:
        return nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    except (nv.NVMLError_FunctionNotFound, nv.NVMLError_ArgumentVersionMismatch):
        return q("memory", nv.nvmlDeviceGetMemoryInfo, h)  # drivers < 515: v1 counts the reservation as used
    except nv.NVMLError_NotSupported:
        return None  # unified memory (GB10, Grace): v1 says the same
    except nv.NVMLError:
        return q("memory", nv.nvmlDeviceGetMemoryInfo, h)  # the error, or v1's answer


def _temperature(nv: Any, h: Any, q: Callable) -> int | None:
    """The GPU's temperature (C) through nvmlDeviceGetTemperatureV (nvml.h's versioned
    nvmlTemperature_v1_t; pynvml marks nvmlDeviceGetTemperature "DEPRECATED ... will be removed
    in CUDA 14.0"); the old call only where the driver lacks the new one (FunctionNotFound) or
    this pynvml does (nvidia-ml-py before the wrapper existed)."""
    fn = getattr(nv, "nvmlDeviceGetTemperatureV", None)
    if fn is not None:
        try:
            return fn(h, nv.NVML_TEMPERATURE_GPU)
        except (nv.NVMLError_FunctionNotFound, nv.NVMLError_ArgumentVersionMismatch):
            pass  # a driver without the call (or without its v1 struct): the old call answers
        except nv.NVMLError:
            return q("temperature", fn, h, nv.NVML_TEMPERATURE_GPU)  # the error (or lost), kept as q keeps it
    return q("temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)


def _fields(nv: Any, h: Any, q: Callable) -> tuple[int | None, int | None]:
    """(recovery action, NVLink link count) from one nvmlDeviceGetFieldValues call; each None when
    the driver does not have it (the field's own nvmlReturn)."""
    values = q("field values", nv.nvmlDeviceGetFieldValues, h, [FIELD_RECOVERY_ACTION, FIELD_NVLINK_LINK_COUNT])
    if values is None:
        return None, None
    out: list[int | None] = []
    for v in values:
        out.append(int(v.value.uiVal) if v.nvmlReturn == nv.NVML_SUCCESS else None)
    return out[0], out[1]


def _clock_events(nv: Any, h: Any, q: Callable) -> tuple[str, ...] | None:
    bits = None
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is None:
            continue
        try:
            bits = fn(h)
            break
        except nv.NVMLError_FunctionNotFound:
            continue  # drivers before 535 have only the "throttle" name
        except nv.NVMLError:
            bits = q("clock event reasons", fn, h)
            break
    if bits is None:
        return None
    return tuple(name for bit, name in CLOCK_EVENT_BITS.items() if bits & bit)


# Room for this many processes in a list's first call: more than nearly any GPU has, so NVML is
# asked once per list (nvml.h: a call with room returns the entries), rather than twice as pynvml's
# wrappers do (the count with no buffer, then the entries). Each entry is 24 bytes.
FIRST_ROOM = 64
# INSUFFICIENT_SIZE this many times in a row (processes starting faster than the lists grow): the
# list is not read, an error, never empty.
LIST_TRIES = 4


@cache
def _process_info() -> Any:
    """nvml.h's nvmlProcessInfo_v2_t (= nvmlProcessInfo_t), the entry of the _v2 and _v3 process lists
    (ctypes imported only here: the observer child needs it, a warm `diff` does not)."""
    import ctypes

    class ProcessInfo(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

    return ProcessInfo


def _process_list(nv: Any, h: Any, symbol: str, room: int = FIRST_ROOM) -> list[Any]:
    """The process list of SYMBOL (nvmlDevice{Compute,Graphics}RunningProcesses_v3/_v2) in one call with
    ROOM entries, again with room for the count NVML said it needs (and as many again, plus 5, as pynvml
    gives) while it answers NVML_ERROR_INSUFFICIENT_SIZE (nvml.h: "infoCount will contain minimal amount of
    space necessary"). Read with nvml.h's own entry, not pynvml's: nvidia-ml-py 12.535.77's
    c_nvmlProcessInfo_t has a fifth field (usedGpuCcProtectedMemory: 32 bytes, in no nvml.h), so its _v3
    lists read the driver's 24-byte entries at a 32-byte stride (tests/test_fakenvml_abi.py). The entries
    as pynvml's wrappers give them (NVML_VALUE_NOT_AVAILABLE memory as None); errors as pynvml's
    NVMLError subclasses (FunctionNotFound on a driver without SYMBOL)."""
    import ctypes

    fn = nv._nvmlGetFunctionPointer(symbol)
    ret = nv.NVML_ERROR_INSUFFICIENT_SIZE
    for _ in range(LIST_TRIES):
        entries = (_process_info() * room)()
        count = ctypes.c_uint(room)
        ret = fn(h, ctypes.byref(count), entries)
        if ret == nv.NVML_SUCCESS:
            return [SimpleNamespace(pid=e.pid,
                                    usedGpuMemory=None if e.usedGpuMemory == 2**64 - 1 else e.usedGpuMemory,
                                    gpuInstanceId=e.gpuInstanceId, computeInstanceId=e.computeInstanceId)
                    for e in entries[:min(count.value, room)]]
        if ret != nv.NVML_ERROR_INSUFFICIENT_SIZE:
            break
        room = max(count.value, room) * 2 + 5  # room for processes started before the next call
    raise nv.NVMLError(ret)


def _processes(nv: Any, h: Any, i: int, q: Callable, uses: dict[int, list[GpuUse]]) -> bool:
    """Compute and graphics processes of GPU i into USES, merged by PID (and MIG instance); False
    when a list could not be read."""
    seen: dict[tuple[int, int | None], int | None] = {}
    listed = True
    for kind in ("Compute", "Graphics"):
        procs = None
        for suffix in ("_v3", "_v2"):  # _v3 from driver 510.39 on
            symbol = f"nvmlDeviceGet{kind}RunningProcesses{suffix}"
            try:
                procs = _process_list(nv, h, symbol)
                break
            except nv.NVMLError_FunctionNotFound:
                continue
            except nv.NVMLError_NotSupported:
                break
            except nv.NVMLError as exc:
                q(f"{kind.lower()} processes", _raise, exc)  # kept as q keeps any error: lost, or a read error
                listed = False
                break
        for p in procs or ():
            gi = getattr(p, "gpuInstanceId", NO_INSTANCE)
            key = (int(p.pid), None if gi in (None, NO_INSTANCE) else int(gi))
            mem = p.usedGpuMemory  # None: NVML_VALUE_NOT_AVAILABLE
            if key in seen:  # listed as compute and as graphics (C+G): one process, its memory once
                old = seen[key]
                seen[key] = mem if old is None else old if mem is None else max(old, mem)
            else:
                seen[key] = mem
    for (pid, gi), mem in seen.items():
        uses.setdefault(pid, []).append(GpuUse(i, None if mem is None else int(mem), gi))
    return listed


def _raise(exc: BaseException) -> None:
    raise exc


def _mig_instances(nv: Any, h: Any, q: Callable) -> tuple[MigInstance, ...]:
    out = []
    top = q("MIG device count", nv.nvmlDeviceGetMaxMigDeviceCount, h) or 0
    for n in range(top):
        try:
            m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, n)
        except nv.NVMLError_NotFound:
            continue  # slots without an instance
        except nv.NVMLError:
            q(f"MIG device {n}", nv.nvmlDeviceGetMigDeviceHandleByIndex, h, n)
            continue
        gi = q("MIG GPU instance id", nv.nvmlDeviceGetGpuInstanceId, m)
        ci = q("MIG compute instance id", nv.nvmlDeviceGetComputeInstanceId, m)
        mem = _memory(nv, m, q)
        out.append(MigInstance(int(gi) if gi is not None else n, ci,
                               int(mem.total) if mem else None, int(mem.used) if mem else None))
    return tuple(out)
