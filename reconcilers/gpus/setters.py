"""Carrying out a GPU settings action: one NVML setter on one GPU in a forked child with a deadline
(a wedged driver must not hang `apply`, as it must not hang observing), read back by the child;
the record of locked clocks NVML cannot read back; nvidia-persistenced through the units kind.

Each failure (no permission, NOT_SUPPORTED, the GPU lost, a setter that never returns) is one line
for that GPU's action (`ApplyError(independent=True)`): the other GPUs' actions go on. A GPU lost
or not answering is not tried again in the same apply.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...core.atomic import write_json
from ...core.boot import boot_id as _boot_id
from ...core.contract import Action, ApplyError, Resource, utc_iso
from ...core.paths import state_dir
from ...core.values import format_duration
from .nvml_settings import RESETTERS, SETTERS, setter_child

if TYPE_CHECKING:
    from ...core.host import Host

RECORD = "gpu-locked-clocks.json"
DEFAULT_TIMEOUT = 60.0
# What a person does about the error NVML gave (pynvml's exception class names).
HINTS = {
    "NVMLError_NoPermission": "setting GPU settings needs root",
    "NVMLError_NotSupported": "this GPU or driver does not support it",
    "NVMLError_Deprecated": "this driver deprecated it",
    "NVMLError_GpuIsLost": "the GPU fell off the bus: reboot the node",
    "NVMLError_ResetRequired": "the GPU requires a reset",
    "NVMLError_InUse": "a process holds the GPU",
    "NVMLError_InvalidArgument": "the driver refused the value",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel module is not loaded",
    "NVMLError_LibraryNotFound": "libnvidia-ml.so.1 was not found",
}
GONE = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired")


def _record_path() -> str:
    return os.path.join(state_dir(), RECORD)


def read_locked(boot: str, driver_load: str) -> dict[str, dict[str, Any]]:
    """GPU UUID -> {"locked": [min, max] | "none", "at": time}: the locked clocks reconcile set in this
    boot since the driver last loaded. A record of another boot or driver load is void: locked
    clocks do not survive either."""
    try:
        with open(_record_path(), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("boot_id") != boot or data.get("driver_load") != driver_load:
        return {}
    gpus = data.get("gpus")
    return gpus if isinstance(gpus, dict) else {}


def write_locked(uuid: str, value: Any, boot: str, driver_load: str) -> None:
    gpus = read_locked(boot, driver_load)
    gpus[uuid] = {"locked": value, "at": utc_iso()}
    write_json(_record_path(), {"boot_id": boot, "driver_load": driver_load, "gpus": gpus}, indent=1)


def locked_of(entry: Mapping[str, Any] | None) -> tuple[tuple[int, int] | str | None, str]:
    """A record entry -> ((min, max) or "none", when); (None, "") when there is none."""
    if not entry:
        return None, ""
    value = entry.get("locked")
    if value == "none":
        return "none", str(entry.get("at", ""))
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (value[0], value[1]), str(entry.get("at", ""))
    return None, ""


class Setters:
    """The settings actions of one apply: remembers GPUs lost or not answering meanwhile."""

    def __init__(self) -> None:
        self.gone: dict[str, str] = {}  # GPU UUID -> what happened to it

    def set(self, host: Host, action: Action) -> str:
        p = action.params
        gpu, uuid, setting, value = p["gpu"], str(p.get("uuid", "?")), p["setting"], p["value"]
        fn = RESETTERS[setting] if value in ("default", "none") and setting in RESETTERS else SETTERS[setting]
        if uuid in self.gone:
            raise ApplyError(f"GPU {gpu}: not tried: {self.gone[uuid]} earlier in this apply", independent=True)
        timeout = float(p.get("timeout") or DEFAULT_TIMEOUT)
        try:
            import pynvml  # noqa: F401  (imported here once, so each setter child forks with it loaded)
        except ImportError:
            pass
        child = host.fork_call(setter_child, {"gpu": gpu, "uuid": uuid, "setting": setting, "value": value})
        said, finished = host.collect({"set": (child, time.monotonic() + timeout)})["set"]
        if not finished:
            self.gone[uuid] = f"{fn} did not return"
            raise ApplyError(f"GPU {gpu}: {fn} did not return within {format_duration(timeout)} (a wedged driver?); "
                             f"setter pid {child.pid} abandoned", independent=True)
        try:
            answer = json.loads(said.decode(errors="replace"))
        except ValueError:
            raise ApplyError(f"GPU {gpu}: the setter of {setting} exited {child.returncode} without an answer",
                             independent=True) from None
        if "ok" in answer:
            if setting == "locked_clocks":
                write_locked(uuid, value, str(p.get("boot_id", "")), str(p.get("driver_load", "")))
            return f"GPU {gpu}: {answer['ok']}"
        kind = answer.get("error", "")
        if kind in GONE:
            self.gone[uuid] = answer.get("message", "lost")
        hint = HINTS.get(kind, "")
        where = "" if kind == "ReadBack" else f"{fn}: "
        raise ApplyError(f"GPU {gpu}: {where}{answer.get('message', '?')}" + (f" ({hint})" if hint else ""),
                         independent=True)


def unit_action(host: Host, action: Action) -> str:
    """start/stop/enable/disable of nvidia-persistenced.service: the units kind carries it out."""
    from ..units import UnitsReconciler

    unit = action.params.get("unit") or action.target
    res = Resource(id=f"unit:{unit}", kind="unit", name=unit, spec={})
    return UnitsReconciler().apply(host, res, Action(action.action, unit)) or f"{action.action} {unit}"


def boot_id() -> str:
    """This boot's id; "" where it cannot be read (core/boot.py)."""
    return _boot_id() or ""
