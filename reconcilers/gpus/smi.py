"""The nvidia-smi fallback: `--query-gpu` / `--query-compute-apps` CSV (and `nvlink -s`), parsed.

CSV with its header (`--format=csv`): columns are found by name, values keep nvidia-smi's units
(`97887 MiB`, `84.12 W`). The query field names are stable across drivers where the `-q` text
is not (driver 610 moved the power limits). An nvidia-smi that does not know a field refuses the
whole query (`Field "gpu_recovery_action" is not a valid field to query.`): the field is dropped
and the query repeated, so an older driver still answers what it has; that reading is then
unknown, never a default.

Values: `[N/A]`, `N/A`, `[Not Supported]` and `[Requested functionality has been deprecated]`
mean the GPU or driver does not have it; any other bracketed value (`[Unknown Error]`, `[GPU is
lost]`, `[Insufficient Permissions]`) is an error: a read error, or the GPU lost.
A GPU nvidia-smi cannot reach is a line `Unable to determine the device handle for GPU
0000:02:00.0: GPU is lost. Reboot the system to recover this GPU` in place of its row.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...core.contract import ObserveError
from ...core.host import CommandTimeout
from .catalogue import recovery_from_text
from .nvml import CLOCK_EVENT_BITS, INIT_HINTS
from .observed import MIB, Gpu, GpuSettings, GpuUse
from .procfs import DEFAULT_PROC_GPUS, PROC_GPUS_ENV, gpu_minors

if TYPE_CHECKING:
    from ...core.host import Host
    from .nvml import NvmlUnavailable

# Without these the GPUs cannot be told apart or their memory read: an nvidia-smi that refuses one is an error.
SMI_REQUIRED = ("index", "uuid", "pci.bus_id", "memory.total", "memory.used")
SMI_GPU_FIELDS = SMI_REQUIRED + (
    "name", "driver_version", "temperature.gpu", "power.draw", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.volatile.total", "retired_pages.pending", "remapped_rows.pending",
    "remapped_rows.failure", "gpu_recovery_action", "mig.mode.current", "persistence_mode", "vbios_version",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.gen.gpumax", "pcie.link.width.current",
    "pcie.link.width.max", "clocks_event_reasons.active")
# Asked only when gpus.settings is declared: the CSV names are stable where the `-q -d POWER,CLOCK,
# COMPUTE,ECC` text is not (driver 610 moved the power limits under "GPU Power Readings").
SMI_SETTINGS_FIELDS = (
    "power.limit", "power.default_limit", "power.min_limit", "power.max_limit", "compute_mode",
    "clocks.applications.memory", "clocks.applications.graphics", "clocks.default_applications.memory",
    "clocks.default_applications.graphics", "clocks.current.graphics", "mig.mode.pending", "ecc.mode.current",
    "ecc.mode.pending")
# Which of them each declared setting needs.
SMI_SETTING_COLUMNS = {
    "power_limit": ("power.limit", "power.default_limit", "power.min_limit", "power.max_limit"),
    "compute_mode": ("compute_mode",),
    "application_clocks": ("clocks.applications.memory", "clocks.applications.graphics",
                           "clocks.default_applications.memory", "clocks.default_applications.graphics"),
    "locked_clocks": ("clocks.current.graphics",),
    "mig": ("mig.mode.pending",),
    "ecc": ("ecc.mode.current", "ecc.mode.pending"),
}
# Drivers before 535 name the clock-event reasons "throttle reasons".
SMI_RENAMED = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
SMI_APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")

_INVALID_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query')
_HANDLE_RE = re.compile(r"Unable to determine the device handle for (?:GPU\s*)?([0-9A-Fa-f:.]+):\s*(.+)")
_NOT_THERE = ("n/a", "[n/a]", "not supported", "[not supported]", "[requested functionality has been deprecated]",
              "requested functionality has been deprecated", "")


def invalid_field(text: str) -> str | None:
    m = _INVALID_FIELD_RE.search(text)
    return m.group(1) if m else None


class Value:
    """One CSV cell: its text, and what it means."""

    def __init__(self, text: str | None):
        self.text = (text or "").strip()

    @property
    def missing(self) -> bool:
        return self.text.lower() in _NOT_THERE

    @property
    def error(self) -> str | None:
        return self.text.strip("[]") if self.text.startswith("[") and not self.missing else None

    def str(self) -> str | None:
        return None if self.missing or self.error else self.text

    def int(self) -> int | None:
        s = self.str()
        if s is None:
            return None
        try:
            word = s.split()[0].rstrip("x")  # "16x" link widths
            return int(word, 16) if word.lower().startswith("0x") else int(float(word))
        except (ValueError, IndexError):
            return None

    def float(self) -> float | None:
        s = self.str()
        try:
            return float(s.split()[0]) if s else None
        except (ValueError, IndexError):
            return None

    def bool(self) -> bool | None:
        s = self.str()
        return None if s is None else s.lower() in ("yes", "1", "true", "enabled", "active")

    def mib(self) -> int | None:
        n = self.int()
        return None if n is None else n * MIB


def _bits(v: Value) -> tuple[str, ...] | None:
    s = v.str()
    if s is None:
        return None
    try:
        bits = int(s, 16)
    except ValueError:
        return None
    return tuple(name for bit, name in CLOCK_EVENT_BITS.items() if bits & bit)


def _rows(csv: str) -> tuple[list[dict[str, Value]], list[tuple[str, str]]]:
    """Header-keyed rows of nvidia-smi's CSV (units stripped from the names), and the GPUs it could
    not reach: (bus id, reason)."""
    header: list[str] | None = None
    rows: list[dict[str, Value]] = []
    unreachable: list[tuple[str, str]] = []
    for line in csv.splitlines():
        m = _HANDLE_RE.search(line)
        if m:
            unreachable.append((m.group(1), m.group(2).strip()))
            continue
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if header is None:
            canonical = {old: new for new, old in SMI_RENAMED.items()}
            header = [canonical.get(n, n) for n in (c.split(" [", 1)[0] for c in cols)]
            continue
        if len(cols) != len(header):
            raise ObserveError(f"unexpected nvidia-smi output line: {line.strip()!r}")
        rows.append({h: Value(c) for h, c in zip(header, cols, strict=True)})
    return rows, unreachable


def parse_smi_gpus(csv: str, minors: Mapping[str, int] | None = None, settings: Sequence[str] = ()
                   ) -> tuple[list[Gpu], str | None]:
    """`nvidia-smi --query-gpu=<fields> --format=csv` -> the GPUs, and the driver version.

    MINORS: PCI bus id (pci_key form) -> Device Minor from /proc/driver/nvidia/gpus (procfs.py).
    SETTINGS: the declared settings, read from SMI_SETTINGS_FIELDS."""
    from .xid import pci_key

    rows, unreachable = _rows(csv)
    minors = minors or {}
    gpus: list[Gpu] = []
    driver = None
    for r in rows:
        def get(name: str, row: dict[str, Value] = r) -> Value:
            return row.get(name) or Value(None)

        if get("index").int() is None:
            raise ObserveError(f"nvidia-smi gave no index in {', '.join(v.text for v in r.values())!r}")
        driver = driver or get("driver_version").str()
        errors, lost = [], None
        for name, v in r.items():
            if v.error and name in SMI_SETTINGS_FIELDS and "lost" not in v.error.lower():
                continue  # a setting that cannot be read leaves the setting unknown, not the GPU's health
            if v.error:
                if "lost" in v.error.lower() or "reset" in v.error.lower():
                    lost = lost or v.error
                else:
                    errors.append(f"{name}: {v.error}")
        bus = get("pci.bus_id").text
        recovery = get("gpu_recovery_action")
        gpus.append(Gpu(
            index=get("index").int() or 0, name=get("name").text or "?", uuid=get("uuid").text, bus_id=bus,
            memory_total=get("memory.total").mib(), memory_used=get("memory.used").mib(),
            temperature_c=get("temperature.gpu").int(), power_w=get("power.draw").float(),
            ecc_uncorrected_volatile=get("ecc.errors.uncorrected.volatile.total").int(),
            ecc_corrected_volatile=get("ecc.errors.corrected.volatile.total").int(),
            retired_pages_pending=get("retired_pages.pending").bool(),
            remapped_rows_pending=get("remapped_rows.pending").bool(),
            remapped_rows_failure=get("remapped_rows.failure").bool(),
            recovery_action=recovery_from_text(recovery.text) if recovery.str() else None,
            mig=get("mig.mode.current").bool(), persistence_mode=get("persistence_mode").bool(),
            vbios=get("vbios_version").str(),
            pcie_gen=get("pcie.link.gen.current").int(), pcie_gen_max=get("pcie.link.gen.max").int(),
            pcie_gen_gpu_max=get("pcie.link.gen.gpumax").int(), pcie_width=get("pcie.link.width.current").int(),
            pcie_width_max=get("pcie.link.width.max").int(),
            clock_events=_bits(get("clocks_event_reasons.active")),
            minor=minors.get(pci_key(bus)), lost=lost, read_errors=tuple(errors), processes_listed=lost is None,
            settings=smi_settings(r, settings) if settings else None,
        ))
    # A GPU nvidia-smi could not reach takes the place its row would have had (index order).
    taken = {g.index for g in gpus}
    free = (i for i in range(len(gpus) + len(unreachable)) if i not in taken)
    for bus, reason in unreachable:
        lost = reason if "lost" in reason.lower() or "reset" in reason.lower() else None
        gpus.append(Gpu(next(free), "?", "?", bus, None, None, lost=lost, minor=minors.get(pci_key(bus)),
                        read_errors=() if lost else (f"its handle: {reason}",), processes_listed=False))
    return sorted(gpus, key=lambda g: g.index), driver


def _mw(v: Value) -> int | None:
    w = v.float()
    return None if w is None else round(w * 1000)


def smi_settings(row: Mapping[str, Value], settings: Sequence[str]) -> GpuSettings:
    """The declared settings from one row of SMI_SETTINGS_FIELDS: `[N/A]`/deprecated is not supported,
    another bracketed value cannot be read, a column this nvidia-smi refused was not read."""
    unsupported: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    for setting in settings:
        for col in SMI_SETTING_COLUMNS.get(setting, ()):
            v = row.get(col)
            if v is None:
                unreadable.setdefault(setting, f"this nvidia-smi does not know the field {col!r}")
            elif v.error:
                unreadable.setdefault(setting, f"{col}: {v.error}")
            elif v.missing:
                deprecated = "deprecated" in v.text.lower()
                unsupported.setdefault(setting, "deprecated by this driver (nvidia-smi: Requested functionality "
                                       "has been deprecated)" if deprecated else "not supported by this GPU or driver")

    def get(col: str) -> Value:
        return row.get(col) or Value(None)

    def pair(mem: str, gr: str) -> tuple[int, int] | None:
        m, g = get(mem).int(), get(gr).int()
        return None if m is None or g is None else (m, g)

    mode = get("compute_mode").str()
    return GpuSettings(
        power_limit_mw=_mw(get("power.limit")), power_default_mw=_mw(get("power.default_limit")),
        power_min_mw=_mw(get("power.min_limit")), power_max_mw=_mw(get("power.max_limit")),
        compute_mode=mode.lower() if mode else None,
        application_clocks=pair("clocks.applications.memory", "clocks.applications.graphics"),
        default_application_clocks=pair("clocks.default_applications.memory", "clocks.default_applications.graphics"),
        graphics_clock=get("clocks.current.graphics").int(),
        mig_pending=get("mig.mode.pending").bool(), ecc=get("ecc.mode.current").bool(),
        ecc_pending=get("ecc.mode.pending").bool(),
        unsupported=tuple(sorted(unsupported.items())), unreadable=tuple(sorted(unreadable.items())))


def parse_smi_apps(csv: str, index_of_uuid: Mapping[str, int]) -> dict[int, list[GpuUse]]:
    """`--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory --format=csv` -> PID -> uses.

    nvidia-smi lists a process that is compute and graphics ("C+G") here once per GPU."""
    uses: dict[int, list[GpuUse]] = {}
    header = True
    for line in csv.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if header and cols and cols[0].startswith("gpu_uuid"):
            header = False
            continue
        if len(cols) < 4 or not cols[1].isdigit():
            continue
        gpu = index_of_uuid.get(cols[0])
        if gpu is None:
            continue
        uses.setdefault(int(cols[1]), []).append(GpuUse(gpu, Value(cols[-1]).mib()))
    return uses


_NVLINK_GPU_RE = re.compile(r"^GPU (\d+):")
_NVLINK_LINK_RE = re.compile(r"^\s*Link (\d+):\s*(.*)$")


def parse_nvlink_status(text: str) -> dict[int, tuple[int, tuple[int, ...]]]:
    """`nvidia-smi nvlink -s` -> GPU index -> (links, the links that are down).

    A link is listed with its speed (`Link 0: 25 GB/s`) or as `<inactive>`."""
    out: dict[int, list] = {}
    gpu = None
    for line in text.splitlines():
        m = _NVLINK_GPU_RE.match(line)
        if m:
            gpu = int(m.group(1))
            out[gpu] = [0, []]
            continue
        m = _NVLINK_LINK_RE.match(line)
        if m and gpu is not None:
            out[gpu][0] += 1
            if "inactive" in m.group(2).lower() or "down" in m.group(2).lower():
                out[gpu][1].append(int(m.group(1)))
    return {g: (n, tuple(down)) for g, (n, down) in out.items()}


def parse_cuda_version(text: str) -> str | None:
    """`nvidia-smi --version` (`CUDA Version : 13.1`) or the table's header (`CUDA Version: 13.1`)."""
    m = re.search(r"CUDA Version\s*:\s*([0-9][0-9.]*)", text)
    return m.group(1) if m else None


def query_fields(refused: Sequence[str], settings: Sequence[str] = ()) -> str:
    """The --query-gpu fields: SMI_GPU_FIELDS, and those of the declared SETTINGS, less what this
    nvidia-smi refused."""
    fields = []
    extra = tuple(dict.fromkeys(c for s in settings for c in SMI_SETTING_COLUMNS.get(s, ())))
    for f in SMI_GPU_FIELDS + tuple(c for c in extra if c not in SMI_GPU_FIELDS):
        if f in refused:
            alt = SMI_RENAMED.get(f)
            if alt and alt not in refused:
                fields.append(alt)
            continue
        fields.append(f)
    return ",".join(fields)


SMI_TIMEOUT = 30.0
# nvidia-smi's words when NVML cannot start -> the NVML error code whose hint applies.
SMI_INIT_FAILURES = {"version mismatch": 18, "insufficient permissions": 4,
                     "couldn't communicate with the nvidia driver": 9, "driver not loaded": 9}


def smi_observe(host: Host, nvml_error: NvmlUnavailable, checks: Mapping[str, Any],
                settings: frozenset[str] = frozenset()) -> tuple[str, str | None, list[Gpu], dict[int, list[GpuUse]]]:
    """The GPUs through `nvidia-smi --query-...` CSV, when NVML cannot start (NVML_ERROR): (driver, CUDA
    version, GPUs, their processes by PID)."""
    def smi(*args: str):
        try:
            return host.run(["nvidia-smi", *args], timeout=SMI_TIMEOUT)
        except CommandTimeout as exc:
            raise ObserveError(str(exc)) from None

    def failed(res) -> ObserveError:
        said = (res.stdout + res.stderr).lower()
        code = next((c for words, c in SMI_INIT_FAILURES.items() if words in said), nvml_error.code)
        hint = INIT_HINTS.get(code or 0, "")
        return ObserveError(f"cannot read GPUs: NVML is unavailable ({nvml_error}) and {res.brief()}"
                            + (f": {hint}" if hint else ""))

    refused: list[str] = []
    while True:
        res = smi(f"--query-gpu={query_fields(refused, sorted(settings))}", "--format=csv")
        if res.returncode == 127:
            raise ObserveError(f"cannot read GPUs: NVML is unavailable ({nvml_error}) and nvidia-smi is not "
                               "installed: " + (nvml_error.hint or "no NVIDIA driver on this host?"))
        bad = invalid_field(res.stdout + res.stderr)
        if bad is None or bad in refused:
            break
        if bad in SMI_REQUIRED:
            raise ObserveError(f"cannot read GPUs: this nvidia-smi does not know the field {bad!r}")
        refused.append(bad)  # an older driver: that reading stays unknown
    said = res.stdout + "".join(f"\n{line}" for line in res.stderr.splitlines() if "device handle" in line)
    if "No devices were found" in res.stdout + res.stderr:
        return "?", None, [], {}
    if not res.ok and "device handle" not in said:
        raise failed(res)
    minors = gpu_minors(os.environ.get(PROC_GPUS_ENV) or DEFAULT_PROC_GPUS)
    gpus, driver = parse_smi_gpus(said, minors, sorted(settings))
    apps = smi(f"--query-compute-apps={','.join(SMI_APP_FIELDS)}", "--format=csv")
    if not apps.ok and "device handle" not in apps.stdout + apps.stderr:  # a lost GPU fails the exit code only
        raise ObserveError(f"cannot list GPU processes: {apps.brief()}")
    uses = parse_smi_apps(apps.stdout, {g.uuid: g.index for g in gpus})
    if checks.get("max_nvlink_down") is not None:
        links = smi("nvlink", "-s")
        status = parse_nvlink_status(links.stdout) if links.ok else {}
        gpus = [replace(g, nvlink_links=status[g.index][0], nvlink_down=status[g.index][1])
                if g.index in status else g for g in gpus]
    cuda = None
    if checks.get("cuda"):
        ver = smi("--version")
        cuda = parse_cuda_version(ver.stdout) if ver.ok else None
        if cuda is None:
            table = smi()
            cuda = parse_cuda_version(table.stdout) if table.ok else None
    return driver or "?", cuda, gpus, uses

