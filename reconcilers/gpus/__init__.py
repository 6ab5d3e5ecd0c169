"""GPUs: how many, how much memory is held and by whom, and whether they are healthy.

Observed through NVML (the `pynvml` module of nvidia-ml-py), in this process: the
gpus kind always describes the machine reconcile runs on. Without NVML it falls
back to `nvidia-smi --query-...` CSV; with neither, the resource is an error.

Memory is freed by stopping the systemd unit a holder belongs to, or by signalling
a process whose name the state allows to be killed — never by a blind
`fuser -k /dev/nvidia*`: a holder that is neither is reported and left alone.
A unit killed from outside with Restart=always comes back; a stop through systemd
does not, which is why units are stopped rather than their processes killed.
"""

from __future__ import annotations

import fnmatch
import os
import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Action, ApplyError, Context, Drift, ObserveError, Plan, Reconciler, Resource, run_action
from .host import CommandTimeout, Host
from .statefile import parse_duration, parse_size

MIB = 2**20
DEFAULT_SETTLE = 30.0
# NVML calls can block for minutes on a wedged driver or a GPU fallen off the bus; the GPUs
# are read in a child the engine abandons after this long (`observe_timeout`).
DEFAULT_OBSERVE_TIMEOUT = "60s"
DEFAULT_GRACE = 10.0
KILL_WAIT = 5.0  # after SIGKILL: a process stuck in D-state may take a moment; longer means trouble
STOP_TIMEOUT = 120.0
SMI_TIMEOUT = 30.0

# Processes that hold /dev/nvidia* by design (monitoring, persistence): never holders.
EXCLUDED_NAMES = frozenset({"nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nvidia-smi"})
# Application Xids (k8s-device-plugin's list): the process's fault, not the GPU's.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# Test/diagnostic knobs: where the GPU device files are, and a kernel log to read instead of dmesg.
DEV_GLOB_ENV = "RECONCILE_NVIDIA_DEV_GLOB"
KERNEL_LOG_ENV = "RECONCILE_KERNEL_LOG"
DEFAULT_DEV_GLOB = "/dev/nvidia*"

SMI_GPU_FIELDS = ("index,name,uuid,pci.bus_id,memory.total,memory.used,temperature.gpu,power.draw,"
                  "ecc.errors.uncorrected.volatile.total,retired_pages.pending")
SMI_REMAP_FIELDS = "uuid,remapped_rows.pending,remapped_rows.failure"
SMI_APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"

_XID_RE = re.compile(r"NVRM: Xid \((PCI:[^)]*)\): (\d+),?\s*(.*)")
_DEV_GPU_RE = re.compile(r"nvidia(\d+)$")


# --- observed state --------------------------------------------------------------------

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


# --- reading /proc -------------------------------------------------------------------------

def unit_of_cgroup(text: str) -> str | None:
    """The system service of a /proc/PID/cgroup text, or None (scopes, user managers, no unit)."""
    path = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "name=systemd":
            path = parts[2]
            break
        if parts[0] == "0" and parts[1] == "":
            path = parts[2]  # unified hierarchy; a v1 name=systemd line wins if present
    if not path:
        return None
    for comp in path.split("/"):
        if comp.endswith(".service"):
            # user@UID.service is a user's whole session manager: never "the holder's unit".
            return None if comp.startswith("user@") else comp
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _proc_info(pid: int) -> dict[str, Any] | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None  # a zombie holds nothing any more
        starttime = int(fields[19])
    except (IndexError, ValueError):
        return None
    comm = (_read(f"/proc/{pid}/comm") or "").strip()
    argv0 = (_read(f"/proc/{pid}/cmdline") or "").split("\0", 1)[0]
    return {"name": comm, "exe": os.path.basename(argv0), "starttime": starttime,
            "unit": unit_of_cgroup(_read(f"/proc/{pid}/cgroup") or "")}


def scan_device_holders(pattern: str) -> dict[int, tuple[str, ...]]:
    """PID -> the device files matching PATTERN it has open, from /proc/PID/fd links (what fuser does;
    psutil's open_files() leaves device nodes out)."""
    found: dict[int, tuple[str, ...]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        files = set()
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if fnmatch.fnmatchcase(target, pattern):
                files.add(target)
        if files:
            found[int(entry)] = tuple(sorted(files))
    return found


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


# --- nvidia-smi ------------------------------------------------------------------------------

def _smi_value(v: str) -> str | None:
    v = v.strip()
    return None if not v or v.startswith("[") or v in ("N/A", "Not Supported") else v


def _smi_int(v: str) -> int | None:
    s = _smi_value(v)
    try:
        return int(float(s)) if s is not None else None
    except ValueError:
        return None


def _smi_bool(v: str) -> bool | None:
    s = _smi_value(v)
    if s is None:
        return None
    return s.lower() in ("yes", "1", "true", "enabled")


def parse_smi_gpus(csv: str, remap_csv: str = "") -> list[Gpu]:
    """`nvidia-smi --query-gpu=SMI_GPU_FIELDS --format=csv,noheader,nounits` (MiB, W, C)."""
    remap: dict[str, tuple[bool | None, bool | None]] = {}
    for line in remap_csv.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) == 3:
            remap[cols[0]] = (_smi_bool(cols[1]), _smi_bool(cols[2]))
    gpus = []
    for line in csv.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 10:
            raise ObserveError(f"unexpected nvidia-smi output line: {line.strip()!r}")
        idx, name, uuid, bus, total, used, temp, power, ecc, retired = cols
        power_v = _smi_value(power)
        ecc_v, retired_v = _smi_int(ecc), _smi_bool(retired)
        pend, fail = remap.get(uuid, (None, None))
        health, problems = health_of(ecc_v, retired_v, pend, fail)
        gpus.append(Gpu(
            index=int(idx), name=name, uuid=uuid, bus_id=bus,
            memory_total=(_smi_int(total) or 0) * MIB, memory_used=(_smi_int(used) or 0) * MIB,
            temperature_c=_smi_int(temp), power_w=float(power_v) if power_v else None,
            ecc_uncorrected_volatile=ecc_v, retired_pages_pending=retired_v,
            remapped_rows_pending=pend, remapped_rows_failure=fail, health=health, problems=problems,
            minor=int(idx),
        ))
    return gpus


def parse_smi_apps(csv: str, index_of_uuid: Mapping[str, int]) -> dict[int, list[GpuUse]]:
    """`--query-compute-apps=gpu_uuid,pid,process_name,used_memory` -> PID -> uses."""
    uses: dict[int, list[GpuUse]] = {}
    for line in csv.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 4 or not cols[1].isdigit():
            continue
        gpu = index_of_uuid.get(cols[0])
        if gpu is None:
            continue
        mib = _smi_int(cols[-1])
        uses.setdefault(int(cols[1]), []).append(GpuUse(gpu, mib * MIB if mib is not None else None))
    return uses


# --- NVML ------------------------------------------------------------------------------------

class _NvmlUnavailable(Exception):
    pass


def _nvml_observe() -> tuple[str, list[Gpu], dict[int, list[GpuUse]], list[str]]:
    try:
        import pynvml
    except ImportError as exc:
        raise _NvmlUnavailable(f"pynvml not installed ({exc})") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise _NvmlUnavailable(str(exc)) from None
    try:
        return _nvml_read(pynvml)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _nvml_read(nv: Any) -> tuple[str, list[Gpu], dict[int, list[GpuUse]], list[str]]:
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


# --- plan helpers (pure) ------------------------------------------------------------------------

def allowed(holder: Holder, allow: Sequence[str]) -> bool:
    for entry in allow:
        if entry.startswith("unit:"):
            if holder.unit and fnmatch.fnmatchcase(holder.unit, entry[5:]):
                return True
        elif holder.visible and any(n and fnmatch.fnmatchcase(n, entry) for n in (holder.name, holder.exe)):
            return True
    return False


def counted_used(gpu: Gpu, holders: Sequence[Holder], allow: Sequence[str]) -> int:
    """The GPU's used memory minus what allowed holders are known to hold on it."""
    expected = sum(u.used_bytes or 0 for h in holders if allowed(h, allow) for u in h.uses if u.gpu == gpu.index)
    return max(0, gpu.memory_used - expected)


def mib(n: int) -> str:
    return f"{n // MIB}MiB"


def _gpu_list(idx: Sequence[int]) -> str:
    idx = sorted(set(idx))
    if len(idx) > 2 and idx == list(range(idx[0], idx[-1] + 1)):
        return f"GPUs {idx[0]}-{idx[-1]}"
    return ("GPU " if len(idx) == 1 else "GPUs ") + ",".join(str(i) for i in idx)


def _holding(h: Holder, gpus: Sequence[int]) -> str:
    uses = [u for u in h.uses if u.gpu in gpus]
    known = [u.used_bytes for u in uses if u.used_bytes is not None]
    if not known:
        files = ", ".join(h.device_files) or "a GPU device file"
        return f"holding {files} on {_gpu_list([u.gpu for u in uses])} (memory not reported by NVML)"
    each = {b for b in known}
    amount = mib(known[0]) + (" each" if len(known) > 1 else "") if len(each) == 1 else f"{mib(sum(known))} in all"
    return f"holding {amount} on {_gpu_list([u.gpu for u in uses])}"


# --- the reconciler ------------------------------------------------------------------------------

class GpusReconciler(Reconciler):
    key = "gpus"
    kind = "gpus"
    rank = 20
    # Memory in use moves by itself: a saved plan keeps these fields' want, not their have.
    volatile_drift = ("gpu*.memory_used",)

    def resources(self, section: Mapping[str, Any]) -> list[Resource]:
        free = section.get("free_with") or {}
        spec = {
            "count": section.get("count"),
            "max_memory_used": parse_size(section["max_memory_used"]) if "max_memory_used" in section else None,
            "allow": tuple(section.get("allow", ())),
            "healthy": section.get("healthy", True),
            "free_with": {
                "stop_units": bool(free.get("stop_units", False)),
                "kill": tuple(free.get("kill", ())),
                "grace": parse_duration(free.get("grace", DEFAULT_GRACE)),
            },
            "observe_timeout": parse_duration(section.get("observe_timeout", DEFAULT_OBSERVE_TIMEOUT)),
        }
        settle = parse_duration(section.get("settle", DEFAULT_SETTLE))
        return [Resource(id="gpus", kind=self.kind, name="gpus", spec=spec,
                         needs=tuple(section.get("needs", ())), settle=settle)]

    # --- observe ---

    def observe_deadline(self, resources: Sequence[Resource]) -> float | None:
        return max(float(r.spec["observe_timeout"]) for r in resources)

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        if not resources:
            return {}
        obs = self._observe(host)
        return {r.id: obs for r in resources}

    def _observe(self, host: Host) -> GpusObserved:
        notes: list[str] = []
        try:
            driver, gpus, uses, nvml_notes = _nvml_observe()
            source = "nvml"
            notes.extend(nvml_notes)
        except _NvmlUnavailable as nvml_error:
            source = "nvidia-smi"
            driver, gpus, uses = self._smi_observe(host, str(nvml_error))
            notes.append(f"NVML unavailable ({nvml_error}): read through nvidia-smi")
        holders = self._holders(uses, gpus)
        xids, xid_note = self._xids(host) if gpus else ((), "")
        if xid_note:
            notes.append(xid_note)
        return GpusObserved(source, driver, tuple(gpus), tuple(holders), xids, tuple(notes))

    def _smi_observe(self, host: Host, nvml_error: str) -> tuple[str, list[Gpu], dict[int, list[GpuUse]]]:
        def smi(query: str, fields: str):
            try:
                return host.run(["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
                                timeout=SMI_TIMEOUT)
            except CommandTimeout as exc:
                raise ObserveError(str(exc)) from None

        res = smi("gpu", SMI_GPU_FIELDS)
        if res.returncode == 127:
            raise ObserveError(f"cannot read GPUs: NVML is unavailable ({nvml_error}) and nvidia-smi is not "
                               "installed: no NVIDIA driver on this host?")
        if not res.ok:
            raise ObserveError(f"cannot read GPUs: NVML is unavailable ({nvml_error}) and {res.brief()}")
        remap = smi("gpu", SMI_REMAP_FIELDS)  # older nvidia-smi lacks these fields: then unknown
        gpus = parse_smi_gpus(res.stdout, remap.stdout if remap.ok else "")
        apps = smi("compute-apps", SMI_APP_FIELDS)
        if not apps.ok:
            raise ObserveError(f"cannot list GPU processes: {apps.brief()}")
        uses = parse_smi_apps(apps.stdout, {g.uuid: g.index for g in gpus})
        drv = host.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=SMI_TIMEOUT)
        driver = drv.stdout.splitlines()[0].strip() if drv.ok and drv.stdout.strip() else "?"
        return driver, gpus, uses

    def _holders(self, uses: Mapping[int, list[GpuUse]], gpus: Sequence[Gpu]) -> list[Holder]:
        by_minor = {g.minor if g.minor is not None else g.index: g.index for g in gpus}
        devices = scan_device_holders(os.environ.get(DEV_GLOB_ENV) or DEFAULT_DEV_GLOB)
        me = os.getpid()
        holders = []
        for pid in sorted(set(uses) | set(devices)):
            if pid == me:
                continue
            info = _proc_info(pid)
            if info is not None and info["name"] in EXCLUDED_NAMES:
                continue
            if info is None and pid not in uses:
                continue  # gone since the scan
            pid_uses = list(uses.get(pid, ()))
            nvml_gpus = {u.gpu for u in pid_uses}
            for path in devices.get(pid, ()):
                m = _DEV_GPU_RE.search(path)
                gpu = by_minor.get(int(m.group(1))) if m else None
                if gpu is not None and gpu not in nvml_gpus:
                    pid_uses.append(GpuUse(gpu, None))
                    nvml_gpus.add(gpu)
            holders.append(Holder(
                pid=pid, name=info["name"] if info else "", exe=info["exe"] if info else "",
                unit=info["unit"] if info else None, starttime=info["starttime"] if info else None,
                uses=tuple(sorted(pid_uses, key=lambda u: u.gpu)), device_files=devices.get(pid, ()),
                visible=info is not None,
            ))
        return holders

    def _xids(self, host: Host) -> tuple[tuple[str, ...], str]:
        path = os.environ.get(KERNEL_LOG_ENV)
        if path:
            try:
                return parse_xids(host.read_text(path)), ""
            except OSError as exc:
                return (), f"kernel log {path} unreadable: {exc.strerror}"
        try:
            res = host.run(["dmesg"], timeout=5)
        except CommandTimeout:
            return (), "kernel log not read (dmesg timed out): Xid errors unknown"
        if not res.ok:
            return (), f"kernel log not readable ({res.brief()}): Xid errors unknown"
        return parse_xids(res.stdout), ""

    # --- diff / plan ---

    def diff(self, resource: Resource, observed: GpusObserved) -> list[Drift]:
        spec = resource.spec
        drift = []
        if spec.get("count") is not None and len(observed.gpus) != spec["count"]:
            drift.append(Drift("count", spec["count"], len(observed.gpus)))
        if spec.get("healthy"):
            for g in observed.gpus:
                if g.health == "unhealthy":
                    drift.append(Drift(f"gpu{g.index}.healthy", True, False))
        limit = spec.get("max_memory_used")
        if limit is not None:
            for g in observed.gpus:
                used = counted_used(g, observed.holders, spec.get("allow", ()))
                if used > limit:
                    drift.append(Drift(f"gpu{g.index}.memory_used", f"<= {mib(limit)}", mib(used)))
        return drift

    def plan(self, resource: Resource, observed: GpusObserved, drift: Sequence[Drift], ctx: Context) -> Plan:
        spec = resource.spec
        allow = spec.get("allow", ())
        free = spec.get("free_with") or {}
        fields = {d.field for d in drift}
        blocked: list[str] = []
        notes: list[str] = []
        actions: list[Action] = []

        if "count" in fields:
            blocked.append(f"expected {spec['count']} GPUs, found {len(observed.gpus)}: a person must check the "
                           "hardware and driver (nvidia-smi -L, the kernel log)")
        for g in observed.gpus:
            if f"gpu{g.index}.healthy" in fields:
                blocked.append(f"GPU {g.index} ({g.bus_id}) is unhealthy: {'; '.join(g.problems)}: "
                               "a person must reset or replace it")

        over = [g for g in observed.gpus if f"gpu{g.index}.memory_used" in fields]
        if over:
            limit = spec["max_memory_used"]
            over_idx = {g.index for g in over}
            others = [h for h in observed.holders if not allowed(h, allow)]
            # Memory no listed process accounts for: device-file holders are then suspects too.
            unexplained = {}
            for g in over:
                known = sum(u.used_bytes or 0 for h in others for u in h.uses if u.gpu == g.index)
                unexplained[g.index] = counted_used(g, observed.holders, allow) - known
            suspects = []
            for h in others:
                hit = [u.gpu for u in h.uses if u.gpu in over_idx
                       and ((u.used_bytes or 0) > 0 or (u.used_bytes is None and unexplained[u.gpu] > limit))]
                if hit:
                    suspects.append((h, hit))
            seen_units: set[str] = set()
            for h, hit in suspects:
                what = f"{h.label()} {_holding(h, hit)}"
                if not h.visible:
                    blocked.append(f"pid {h.pid} {_holding(h, hit)} is not visible from here (another PID "
                                   "namespace or container?): free it where it runs")
                elif h.pid <= 1 or h.pid == os.getpid():
                    blocked.append(f"{what}: PID 1 and reconcile itself are never signalled")
                elif h.unit and free.get("stop_units"):
                    if h.unit in seen_units:
                        continue
                    seen_units.add(h.unit)
                    declared = ctx.resources.get(f"unit:{h.unit}")
                    if declared is not None and declared.spec.get("active") is False:
                        notes.append(f"{what}: freed by unit:{h.unit} (declared active: false, acted on first)")
                    elif declared is not None:
                        blocked.append(f"{what} belongs to {h.unit}, which the state declares active: add "
                                       f"unit:{h.unit} to gpus.allow or declare it active: false")
                    else:
                        actions.append(Action("stop", h.unit, f"stop unit {h.unit} ({what})",
                                              {"unit": h.unit}))
                elif self._killable(h, free.get("kill", ())):
                    verb = f"terminate {h.pid} ({h.name}) {_holding(h, hit)}"
                    if h.unit:
                        verb += f" [in {h.unit}: with Restart= it may come back; stop_units is off]"
                    actions.append(Action("terminate", f"pid {h.pid}", verb, {
                        "pid": h.pid, "name": h.name, "starttime": h.starttime,
                        "grace": free.get("grace", DEFAULT_GRACE)}))
                else:
                    where = f" in {h.unit}" if h.unit else ""
                    blocked.append(f"{what}{where} is not in gpus.allow"
                                   + (" and stop_units is off" if h.unit else "")
                                   + " nor matched by free_with.kill: nothing was signalled")
            for g in over:
                # Still over the limit with every listed holder gone, and no device-file holder to blame.
                if unexplained[g.index] > limit and not any(
                        u.used_bytes is None and u.gpu == g.index for h, _ in suspects for u in h.uses):
                    blocked.append(f"GPU {g.index}: {mib(unexplained[g.index])} held by no process visible here "
                                   "(NVML lists none and no process has its device file open)")
        message = "\n".join([*notes, *self._gpu_lines(observed, spec), *self._xid_lines(observed)]) if drift else ""
        if blocked and message:
            message = "\n" + message  # the report joins blocked and message on one line otherwise
        return Plan(actions=tuple(actions), blocked="\n".join(blocked) or None, message=message)

    @staticmethod
    def _killable(h: Holder, globs: Sequence[str]) -> bool:
        return any(n and fnmatch.fnmatchcase(n, g) for g in globs for n in (h.name, h.exe))

    @staticmethod
    def _gpu_lines(observed: GpusObserved, spec: Mapping[str, Any]) -> list[str]:
        lines = []
        for g in observed.gpus:
            counted = counted_used(g, observed.holders, spec.get("allow", ()))
            extra = f" ({mib(counted)} counted)" if counted != g.memory_used else ""
            lines.append(f"GPU {g.index}: {mib(g.memory_used)} / {mib(g.memory_total)}{extra}, {g.health}")
        return lines

    @staticmethod
    def _xid_lines(observed: GpusObserved) -> list[str]:
        return [f"kernel log: {x}" for x in observed.xids]

    # --- apply ---

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        if action.action == "stop":
            unit = action.params.get("unit") or action.target
            run_action(host, ["systemctl", "stop", "--", unit], STOP_TIMEOUT)
            return f"stopped {unit}"
        if action.action == "terminate":
            return self._terminate(host, action.params)
        raise ApplyError(f"unknown gpus action {action.action!r}")

    @staticmethod
    def _terminate(host: Host, params: Mapping[str, Any]) -> str:
        pid = int(params["pid"])
        grace = float(params.get("grace", DEFAULT_GRACE))

        def same_process() -> bool:
            info = _proc_info(pid)
            return info is not None and (params.get("starttime") is None or info["starttime"] == params["starttime"])

        def gone_within(seconds: float) -> float | None:
            """Seconds it took the process to go, or None if it is still there after `seconds`."""
            t0 = time.monotonic()
            while True:
                if not host.pid_alive(pid) or not same_process():
                    return time.monotonic() - t0
                if time.monotonic() - t0 >= seconds:
                    return None
                host.sleep(0.05)

        if not same_process():
            return f"{pid} had already exited"
        host.signal(pid, signal.SIGTERM)
        took = gone_within(grace)
        if took is not None:
            return f"exited {took:.1f}s after SIGTERM"
        if not same_process():  # the PID was reused in between: never SIGKILL a stranger
            return f"exited {grace:g}s after SIGTERM"
        host.signal(pid, signal.SIGKILL)
        if gone_within(KILL_WAIT) is not None:
            return f"still running {grace:g}s after SIGTERM; killed with SIGKILL"
        raise ApplyError(f"{pid} survived SIGKILL for {KILL_WAIT:g}s (uninterruptible sleep?)")

    def summary(self, resource: Resource, observed: GpusObserved) -> str:
        per = ", ".join(f"GPU{g.index} {mib(g.memory_used)} / {mib(g.memory_total)}" for g in observed.gpus)
        health = {g.health for g in observed.gpus}
        word = "unhealthy" if "unhealthy" in health else ("health unknown" if "unknown" in health else "healthy")
        via = "NVML" if observed.source == "nvml" else "nvidia-smi"
        return f"{len(observed.gpus)} GPUs via {via} (driver {observed.driver_version}), {word}: {per}"
