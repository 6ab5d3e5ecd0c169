"""A stand-in `nvidia-smi` for the hardware suite's self-test: like the real one, an NVML client.

It reads the (fake) driver through the real pynvml, so what it prints is derived from the same
state reconcile reads, and prints it as nvidia-smi does: `--query-gpu=F,... --format=csv[,noheader]
[,nounits]` (`[N/A]` where NVML says NOT_SUPPORTED, `[Unknown Error]` for other errors),
`--query-compute-apps=...`, `-q -x` (the elements hwcompare.py reads, units in the text) and
`--version`. Knobs for the self-test: FAKE_SMI_SKEW="field=text,..." prints TEXT for that field
(a disagreement the report must show); FAKE_SMI_REFUSE="field,..." refuses those fields as an
older nvidia-smi does (`Field "X" is not a valid field to query.`, exit 2).
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET

import pynvml as n

NA = "[N/A]"
COMPUTE = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "power.draw": "W", "power.limit": "W",
         "power.default_limit": "W", "power.min_limit": "W", "power.max_limit": "W",
         "clocks.applications.memory": "MHz", "clocks.applications.graphics": "MHz",
         "clocks.default_applications.memory": "MHz", "clocks.default_applications.graphics": "MHz",
         "clocks.current.graphics": "MHz", "used_memory": "MiB", "used_gpu_memory": "MiB"}


def _s(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def _en(v):
    return "Enabled" if v else "Disabled"


def _yn(v):
    return "Yes" if v else "No"


def _w(mw):
    return f"{mw / 1000:.2f}"


def _mib(b):
    return str(int(b) // 2**20)


def getters(h):
    """field -> a function giving its text (no unit)."""
    mem = lambda: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)  # noqa: E731
    cons = lambda: n.nvmlDeviceGetPowerManagementLimitConstraints(h)  # noqa: E731
    remap = lambda: n.nvmlDeviceGetRemappedRows(h)  # noqa: E731
    ecc = lambda t: str(n.nvmlDeviceGetTotalEccErrors(h, t, n.NVML_VOLATILE_ECC))  # noqa: E731
    return {
        "name": lambda: _s(n.nvmlDeviceGetName(h)),
        "uuid": lambda: _s(n.nvmlDeviceGetUUID(h)),
        "pci.bus_id": lambda: _s(n.nvmlDeviceGetPciInfo(h).busId),
        "driver_version": lambda: _s(n.nvmlSystemGetDriverVersion()),
        "memory.total": lambda: _mib(mem().total),
        "memory.used": lambda: _mib(mem().used),
        "temperature.gpu": lambda: str(n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU)),
        "power.draw": lambda: _w(n.nvmlDeviceGetPowerUsage(h)),
        "ecc.errors.uncorrected.volatile.total": lambda: ecc(n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        "ecc.errors.corrected.volatile.total": lambda: ecc(n.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        "retired_pages.pending": lambda: _yn(n.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        "remapped_rows.pending": lambda: _yn(remap()[2]),
        "remapped_rows.failure": lambda: _yn(remap()[3]),
        "gpu_recovery_action": lambda: "None",
        "mig.mode.current": lambda: _en(n.nvmlDeviceGetMigMode(h)[0]),
        "mig.mode.pending": lambda: _en(n.nvmlDeviceGetMigMode(h)[1]),
        "ecc.mode.current": lambda: _en(n.nvmlDeviceGetEccMode(h)[0]),
        "ecc.mode.pending": lambda: _en(n.nvmlDeviceGetEccMode(h)[1]),
        "persistence_mode": lambda: _en(n.nvmlDeviceGetPersistenceMode(h)),
        "vbios_version": lambda: _s(n.nvmlDeviceGetVbiosVersion(h)),
        "pcie.link.gen.current": lambda: str(n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        "pcie.link.gen.max": lambda: str(n.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        "pcie.link.gen.gpumax": lambda: str(n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)),
        "pcie.link.width.current": lambda: str(n.nvmlDeviceGetCurrPcieLinkWidth(h)),
        "pcie.link.width.max": lambda: str(n.nvmlDeviceGetMaxPcieLinkWidth(h)),
        "clocks_event_reasons.active": lambda: f"0x{n.nvmlDeviceGetCurrentClocksEventReasons(h):016X}",
        "power.limit": lambda: _w(n.nvmlDeviceGetPowerManagementLimit(h)),
        "power.default_limit": lambda: _w(n.nvmlDeviceGetPowerManagementDefaultLimit(h)),
        "power.min_limit": lambda: _w(cons()[0]),
        "power.max_limit": lambda: _w(cons()[1]),
        "compute_mode": lambda: COMPUTE.get(n.nvmlDeviceGetComputeMode(h), "Unknown"),
        "clocks.applications.memory": lambda: str(n.nvmlDeviceGetApplicationsClock(h, n.NVML_CLOCK_MEM)),
        "clocks.applications.graphics": lambda: str(n.nvmlDeviceGetApplicationsClock(h, n.NVML_CLOCK_GRAPHICS)),
        "clocks.default_applications.memory": lambda: str(n.nvmlDeviceGetDefaultApplicationsClock(h,
                                                                                                   n.NVML_CLOCK_MEM)),
        "clocks.default_applications.graphics": lambda: str(n.nvmlDeviceGetDefaultApplicationsClock(
            h, n.NVML_CLOCK_GRAPHICS)),
        "clocks.current.graphics": lambda: str(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_GRAPHICS)),
    }


def text_of(get, field: str) -> str:
    skew = dict(kv.split("=", 1) for kv in os.environ.get("FAKE_SMI_SKEW", "").split(",") if "=" in kv)
    if field in skew:
        return skew[field]
    try:
        return get[field]()
    except (n.NVMLError_NotSupported, n.NVMLError_FunctionNotFound):
        return NA
    except n.NVMLError as exc:
        return f"[{exc}]"


def query_gpu(fields: list[str], fmt: set[str], only: int | None) -> int:
    refused = set(filter(None, os.environ.get("FAKE_SMI_REFUSE", "").split(",")))
    for f in fields:
        if f in refused or (f != "index" and f not in getters(None)):
            print(f'Field "{f}" is not a valid field to query.\n')
            return 2
    units = "nounits" not in fmt
    if "noheader" not in fmt:
        print(", ".join(f"{f} [{UNITS[f]}]" if units and f in UNITS else f for f in fields))
    for i in range(n.nvmlDeviceGetCount()):
        if only is not None and i != only:
            continue
        get = getters(n.nvmlDeviceGetHandleByIndex(i))
        cells = []
        for f in fields:
            t = str(i) if f == "index" else text_of(get, f)
            cells.append(f"{t} {UNITS[f]}" if units and f in UNITS and not t.startswith("[") else t)
        print(", ".join(cells))
    return 0


def query_apps(fields: list[str], fmt: set[str]) -> int:
    units = "nounits" not in fmt
    if "noheader" not in fmt:
        print(", ".join(f"{f} [{UNITS[f]}]" if units and f in UNITS else f for f in fields))
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        for p in n.nvmlDeviceGetComputeRunningProcesses(h):
            try:
                name = os.readlink(f"/proc/{p.pid}/exe")
            except OSError:
                name = "[Not Found]"
            mem = NA if p.usedGpuMemory is None else _mib(p.usedGpuMemory)
            row = {"gpu_uuid": _s(n.nvmlDeviceGetUUID(h)), "pid": str(p.pid), "process_name": name,
                   "used_memory": mem, "used_gpu_memory": mem}
            print(", ".join(row.get(f, NA) + (f" {UNITS[f]}" if units and f in UNITS and row.get(f, NA) != NA
                                               else "") for f in fields))
    return 0


# The -q -x elements the suite reads: element path -> (field, unit suffix as -q -x prints it).
XML = {"product_name": ("name", ""), "uuid": ("uuid", ""), "pci/pci_bus_id": ("pci.bus_id", ""),
       "fb_memory_usage/total": ("memory.total", " MiB"), "fb_memory_usage/used": ("memory.used", " MiB"),
       "ecc_errors/volatile/dram_uncorrectable": ("ecc.errors.uncorrected.volatile.total", ""),
       "ecc_errors/volatile/dram_correctable": ("ecc.errors.corrected.volatile.total", ""),
       "retired_pages/pending_retirement": ("retired_pages.pending", ""),
       "remapped_rows/remapped_row_pending": ("remapped_rows.pending", ""),
       "remapped_rows/remapped_row_failure": ("remapped_rows.failure", ""),
       "persistence_mode": ("persistence_mode", ""), "mig_mode/current_mig": ("mig.mode.current", ""),
       "mig_mode/pending_mig": ("mig.mode.pending", ""), "ecc_mode/current_ecc": ("ecc.mode.current", ""),
       "ecc_mode/pending_ecc": ("ecc.mode.pending", ""), "vbios_version": ("vbios_version", ""),
       "pci/pci_gpu_link_info/pcie_gen/current_link_gen": ("pcie.link.gen.current", ""),
       "pci/pci_gpu_link_info/pcie_gen/max_link_gen": ("pcie.link.gen.max", ""),
       "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen": ("pcie.link.gen.gpumax", ""),
       "pci/pci_gpu_link_info/link_widths/current_link_width": ("pcie.link.width.current", "x"),
       "pci/pci_gpu_link_info/link_widths/max_link_width": ("pcie.link.width.max", "x"),
       "gpu_power_readings/requested_power_limit": ("power.limit", " W"),
       "gpu_power_readings/default_power_limit": ("power.default_limit", " W"),
       "gpu_power_readings/min_power_limit": ("power.min_limit", " W"),
       "gpu_power_readings/max_power_limit": ("power.max_limit", " W"),
       "gpu_power_readings/power_draw": ("power.draw", " W"), "compute_mode": ("compute_mode", ""),
       "applications_clocks/mem_clock": ("clocks.applications.memory", " MHz"),
       "applications_clocks/graphics_clock": ("clocks.applications.graphics", " MHz"),
       "default_applications_clocks/mem_clock": ("clocks.default_applications.memory", " MHz"),
       "default_applications_clocks/graphics_clock": ("clocks.default_applications.graphics", " MHz"),
       "clocks/graphics_clock": ("clocks.current.graphics", " MHz"), "temperature/gpu_temp": ("temperature.gpu", " C")}


def query_xml() -> int:
    root = ET.Element("nvidia_smi_log")
    ET.SubElement(root, "driver_version").text = _s(n.nvmlSystemGetDriverVersion())
    count = n.nvmlDeviceGetCount()
    ET.SubElement(root, "attached_gpus").text = str(count)
    for i in range(count):
        h = n.nvmlDeviceGetHandleByIndex(i)
        get = getters(h)
        g = ET.SubElement(root, "gpu", id=_s(n.nvmlDeviceGetPciInfo(h).busId))
        ET.SubElement(g, "minor_number").text = str(n.nvmlDeviceGetMinorNumber(h))
        for path, (field, unit) in XML.items():
            t = text_of(get, field)
            t = "N/A" if t == NA else t if t.startswith("[") else t + unit
            parent = g
            for part in path.split("/")[:-1]:
                parent = parent.find(part) if parent.find(part) is not None else ET.SubElement(parent, part)
            ET.SubElement(parent, path.split("/")[-1]).text = t
    sys.stdout.write('<?xml version="1.0" ?>\n' + ET.tostring(root, encoding="unicode") + "\n")
    return 0


def main(argv: list[str]) -> int:
    n.nvmlInit()
    try:
        fmt, only, action = set(), None, None
        for i, a in enumerate(argv):
            if a.startswith("--format="):
                fmt = set(a.split("=", 1)[1].split(","))
            elif a == "-i":
                only = int(argv[i + 1])
        for a in argv:
            if a.startswith("--query-gpu="):
                action = ("gpu", a.split("=", 1)[1].split(","))
            elif a.startswith("--query-compute-apps="):
                action = ("apps", a.split("=", 1)[1].split(","))
        if action and action[0] == "gpu":
            return query_gpu(action[1], fmt, only)
        if action:
            return query_apps(action[1], fmt)
        if "-q" in argv and "-x" in argv:
            return query_xml()
        if "--version" in argv:
            print(f"NVIDIA-SMI version  : {_s(n.nvmlSystemGetDriverVersion())}\nDRIVER version      : "
                  f"{_s(n.nvmlSystemGetDriverVersion())}")
            return 0
        print("stand-in nvidia-smi: unexpected arguments: " + " ".join(argv), file=sys.stderr)
        return 2
    finally:
        n.nvmlShutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
