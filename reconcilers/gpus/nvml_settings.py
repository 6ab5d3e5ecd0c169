"""GPU settings through NVML: read in the observer child, set in a setter child (setters.py).

NVML's facts this follows (nvml.h, pynvml of nvidia-ml-py 13.615):
- power limits are milliwatts (nvmlDeviceGetPowerManagementLimit / DefaultLimit /
  LimitConstraints; nvmlDeviceSetPowerManagementLimit takes milliwatts, INVALID_ARGUMENT outside
  the constraints);
- nvmlDeviceSetApplicationsClocks takes the memory clock first, then the graphics clock; the
  application-clock calls are deprecated (pynvml: "will be removed in CUDA 14.0") and drivers
  590 and later answer NVML_ERROR_DEPRECATED ("Requested functionality has been deprecated", as
  nvidia-smi prints it on H100, H200, L40S and GeForce captures): not supported, never a value;
- NVML has no getter for locked clocks (nvmlDeviceSetGpuLockedClocks): what can be read is the
  clock the GPU runs at (nvmlDeviceGetClockInfo), and what reconcile recorded setting
  (setters.py); a clock above the locked maximum shows the lock is gone;
- MIG and ECC modes have a current and a pending value (nvmlDeviceGetMigMode,
  nvmlDeviceGetEccMode): a change is pending until the GPU is reset (MIG) or the host reboots (ECC);
- setters need root: NO_PERMISSION otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import IO, Any

from .observed import GpuSettings

# NVML_COMPUTEMODE_*; 1 (exclusive thread) was removed from the drivers.
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
COMPUTE_CODES = {name: code for code, name in COMPUTE_MODES.items()}
CLOCK_GRAPHICS, CLOCK_MEM = 0, 2  # NVML_CLOCK_GRAPHICS, NVML_CLOCK_MEM
DEPRECATED = "deprecated by this driver (NVML: Requested functionality has been deprecated)"
NOT_SUPPORTED = "not supported by this GPU or driver"
# NVML's functions, by setting: what the report names when one refuses.
SETTERS = {
    "persistence_mode": "nvmlDeviceSetPersistenceMode",
    "power_limit": "nvmlDeviceSetPowerManagementLimit",
    "compute_mode": "nvmlDeviceSetComputeMode",
    "application_clocks": "nvmlDeviceSetApplicationsClocks",
    "locked_clocks": "nvmlDeviceSetGpuLockedClocks",
    "mig": "nvmlDeviceSetMigMode",
    "ecc": "nvmlDeviceSetEccMode",
}
RESETTERS = {"application_clocks": "nvmlDeviceResetApplicationsClocks",
             "locked_clocks": "nvmlDeviceResetGpuLockedClocks"}


def read_settings(nv: Any, h: Any, wanted: Collection[str], lost: list[str]) -> GpuSettings:
    """The declared settings of the GPU whose handle is H; a GPU_IS_LOST/RESET_REQUIRED from any call
    goes to LOST (the GPU is then lost, as for every other reading)."""
    unsupported: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    fatal = (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired)
    deprecated = getattr(nv, "NVMLError_Deprecated", ())

    def q(setting: str, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
            unsupported.setdefault(setting, NOT_SUPPORTED)
        except deprecated:
            unsupported.setdefault(setting, DEPRECATED)
        except fatal as exc:
            lost.append(str(exc))
        except nv.NVMLError as exc:
            unreadable.setdefault(setting, str(exc))
        return None

    out: dict[str, Any] = {}
    if "power_limit" in wanted:
        out["power_limit_mw"] = q("power_limit", nv.nvmlDeviceGetPowerManagementLimit, h)
        out["power_default_mw"] = q("power_limit", nv.nvmlDeviceGetPowerManagementDefaultLimit, h)
        limits = q("power_limit", nv.nvmlDeviceGetPowerManagementLimitConstraints, h)
        if limits is not None:
            out["power_min_mw"], out["power_max_mw"] = int(limits[0]), int(limits[1])
    if "compute_mode" in wanted:
        mode = q("compute_mode", nv.nvmlDeviceGetComputeMode, h)
        out["compute_mode"] = None if mode is None else COMPUTE_MODES.get(int(mode), f"mode {mode}")
    if "application_clocks" in wanted:
        pair = [q("application_clocks", nv.nvmlDeviceGetApplicationsClock, h, c) for c in (CLOCK_MEM, CLOCK_GRAPHICS)]
        dflt = [q("application_clocks", nv.nvmlDeviceGetDefaultApplicationsClock, h, c)
                for c in (CLOCK_MEM, CLOCK_GRAPHICS)]
        out["application_clocks"] = tuple(int(c) for c in pair) if None not in pair else None
        out["default_application_clocks"] = tuple(int(c) for c in dflt) if None not in dflt else None
    if {"application_clocks", "locked_clocks"} & set(wanted):
        which = "application_clocks" if "application_clocks" in wanted else "locked_clocks"
        mems = q(which, nv.nvmlDeviceGetSupportedMemoryClocks, h)
        if mems is not None:
            table = []
            for m in mems:
                graphics = q(which, nv.nvmlDeviceGetSupportedGraphicsClocks, h, m)
                if graphics is None:
                    break
                table.append((int(m), tuple(sorted(int(c) for c in graphics))))
            else:
                out["supported_clocks"] = tuple(sorted(table, reverse=True))
    if "locked_clocks" in wanted:
        out["graphics_clock"] = q("locked_clocks", nv.nvmlDeviceGetClockInfo, h, CLOCK_GRAPHICS)
    if "mig" in wanted:
        mig = q("mig", nv.nvmlDeviceGetMigMode, h)
        out["mig_pending"] = None if mig is None else bool(mig[1])
    if "ecc" in wanted:
        ecc = q("ecc", nv.nvmlDeviceGetEccMode, h)
        if ecc is not None:
            out["ecc"], out["ecc_pending"] = bool(ecc[0]), bool(ecc[1])
    return GpuSettings(**out, unsupported=tuple(sorted(unsupported.items())),
                       unreadable=tuple(sorted(unreadable.items())))


# --- the setter child ------------------------------------------------------------------------------

def _mhz(pair: Any) -> str:
    return f"memory {pair[0]} MHz, graphics {pair[1]} MHz"


def _set(nv: Any, h: Any, setting: str, value: Any) -> str:
    """Call the setter, read back what NVML can, and say what it reads. Raises NVMLError, or
    ValueError when the value reads back different."""
    if setting == "persistence_mode":
        nv.nvmlDeviceSetPersistenceMode(h, 1 if value else 0)
        back = bool(nv.nvmlDeviceGetPersistenceMode(h))
        word = "enabled" if back else "disabled"
        if back != bool(value):
            raise ValueError(f"persistence mode set, but reads back {word}")
        return f"persistence mode {word} (reads back {word})"
    if setting == "power_limit":
        nv.nvmlDeviceSetPowerManagementLimit(h, int(value))
        back = int(nv.nvmlDeviceGetPowerManagementLimit(h))
        if back != int(value):
            raise ValueError(f"power limit set to {int(value) / 1000:g} W, but reads back {back / 1000:g} W")
        return f"power limit {back / 1000:g} W (reads back {back / 1000:g} W)"
    if setting == "compute_mode":
        nv.nvmlDeviceSetComputeMode(h, COMPUTE_CODES[value])
        back = COMPUTE_MODES.get(int(nv.nvmlDeviceGetComputeMode(h)), "?")
        if back != value:
            raise ValueError(f"compute mode set to {value}, but reads back {back}")
        return f"compute mode {back} (reads back {back})"
    if setting == "application_clocks":
        if value == "default":
            nv.nvmlDeviceResetApplicationsClocks(h)
        else:
            nv.nvmlDeviceSetApplicationsClocks(h, int(value[0]), int(value[1]))  # memory first
        back = (int(nv.nvmlDeviceGetApplicationsClock(h, CLOCK_MEM)),
                int(nv.nvmlDeviceGetApplicationsClock(h, CLOCK_GRAPHICS)))
        if value != "default" and back != tuple(value):
            raise ValueError(f"application clocks set to {_mhz(value)}, but read back {_mhz(back)}")
        return f"application clocks {'reset: ' if value == 'default' else ''}{_mhz(back)} (read back)"
    if setting == "locked_clocks":
        if value == "none":
            nv.nvmlDeviceResetGpuLockedClocks(h)
        else:
            nv.nvmlDeviceSetGpuLockedClocks(h, int(value[0]), int(value[1]))
        now = int(nv.nvmlDeviceGetClockInfo(h, CLOCK_GRAPHICS))
        if value != "none" and now > int(value[1]):
            raise ValueError(f"graphics clocks locked to {value[0]}-{value[1]} MHz, but the GPU runs at {now} MHz")
        what = "reset (none locked)" if value == "none" else f"locked to {value[0]}-{value[1]} MHz"
        return f"graphics clocks {what}; graphics clock now {now} MHz (NVML cannot read locked clocks back)"
    if setting in ("mig", "ecc"):
        if setting == "mig":
            nv.nvmlDeviceSetMigMode(h, 1 if value else 0)
            current, pending = (bool(v) for v in nv.nvmlDeviceGetMigMode(h))
            later = "the GPU is reset"
        else:
            nv.nvmlDeviceSetEccMode(h, 1 if value else 0)
            current, pending = (bool(v) for v in nv.nvmlDeviceGetEccMode(h))
            later = "the host reboots"
        name = "MIG" if setting == "mig" else "ECC"
        want = "enabled" if value else "disabled"
        if pending != bool(value):
            raise ValueError(f"{name} mode set {want}, but its pending mode reads back "
                             f"{'enabled' if pending else 'disabled'}")
        if current == bool(value):
            return f"{name} mode {want} (reads back {want})"
        return f"{name} mode {want} pending: it takes effect when {later} (reads back pending {want})"
    raise ValueError(f"unknown setting {setting!r}")


def setter_child(request: dict[str, Any], out: IO[bytes]) -> None:
    """In a forked child (Host.fork_call): one setter on one GPU, read back; writes one JSON answer:
    {"ok": message} or {"error": NVML error class, "code": n, "message": ...}."""
    answer: dict[str, Any]
    try:
        import pynvml as nv

        nv.nvmlInit()
        try:
            try:
                h = nv.nvmlDeviceGetHandleByUUID(request["uuid"])
            except (nv.NVMLError_NotFound, nv.NVMLError_FunctionNotFound, nv.NVMLError_InvalidArgument):
                h = nv.nvmlDeviceGetHandleByIndex(int(request["gpu"]))  # a GPU whose UUID could not be read
            answer = {"ok": _set(nv, h, request["setting"], request["value"])}
        finally:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
    except ValueError as exc:
        answer = {"error": "ReadBack", "code": None, "message": str(exc)}
    except Exception as exc:  # NVMLError and its subclasses, pynvml missing, a bug: all reported, never raised
        answer = {"error": type(exc).__name__, "code": getattr(exc, "value", None), "message": str(exc)}
    out.write(json.dumps(answer).encode())
