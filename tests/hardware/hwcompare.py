"""The hardware suite's comparisons: reconcile's observation of the GPUs (observe.py, as JSON)
against what the driver's own tools say on the same GPUs at the same moment:

- `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` (the field names `nvidia-smi
  --help-query-gpu` documents; a field this nvidia-smi refuses is dropped and reported as such);
- `nvidia-smi -q -x` (the XML report: other element names for the same facts, units in the text);
- `/proc/driver/nvidia/gpus/<bus>/information` (the kernel module's own Device Minor and UUID);
- reconcile's nvidia-smi fallback against its NVML path (the same dataclass, field by field).

Each check is a dict {section, gpu, field, reconcile, authority, verdict, note}; the verdicts are
`agree`, `disagree`, `moved` (a value that changes by itself between two reads: temperature,
power draw, current PCIe link and clocks, memory used; reported, not counted against reconcile),
and `absent` (the authority does not report it on this GPU/driver while reconcile does, or the
other way round: listed so the fake driver can learn it).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MIB = 2**20
# nvidia-smi's words for "this GPU/driver does not have it" (nvidia-smi(1): [N/A], [Not Supported]).
NOT_THERE = {"", "n/a", "[n/a]", "not supported", "[not supported]", "requested functionality has been deprecated",
             "[requested functionality has been deprecated]"}
CLOCK_EVENT_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                    0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
                    0x100: "display_clocks"}  # nvmlClocksEventReason* (nvml.h), the names reconcile uses

# (--query-gpu field, -q -x element paths, reconcile's field, how to read it, volatile)
FIELDS: tuple[tuple[str, tuple[str, ...], str, str, bool], ...] = (
    ("uuid", ("uuid",), "uuid", "text", False),
    ("pci.bus_id", ("pci/pci_bus_id",), "bus_id", "bus", False),
    ("name", ("product_name",), "name", "text", False),
    ("memory.total", ("fb_memory_usage/total",), "memory_total", "mib", False),
    ("memory.used", ("fb_memory_usage/used",), "memory_used", "mib", True),
    ("ecc.errors.uncorrected.volatile.total", (), "ecc_uncorrected_volatile", "int", False),
    ("ecc.errors.corrected.volatile.total", (), "ecc_corrected_volatile", "int", False),
    ("retired_pages.pending", ("retired_pages/pending_retirement",), "retired_pages_pending", "yes", False),
    ("remapped_rows.pending", ("remapped_rows/remapped_row_pending",), "remapped_rows_pending", "yes", False),
    ("remapped_rows.failure", ("remapped_rows/remapped_row_failure",), "remapped_rows_failure", "yes", False),
    ("persistence_mode", ("persistence_mode",), "persistence_mode", "enabled", False),
    ("mig.mode.current", ("mig_mode/current_mig",), "mig", "enabled", False),
    ("mig.mode.pending", ("mig_mode/pending_mig",), "settings.mig_pending", "enabled", False),
    ("ecc.mode.current", ("ecc_mode/current_ecc",), "settings.ecc", "enabled", False),
    ("ecc.mode.pending", ("ecc_mode/pending_ecc",), "settings.ecc_pending", "enabled", False),
    ("vbios_version", ("vbios_version",), "vbios", "text", False),
    ("pcie.link.gen.current", ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",), "pcie_gen", "int", True),
    ("pcie.link.gen.max", ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",), "pcie_gen_max", "int", False),
    ("pcie.link.gen.gpumax", ("pci/pci_gpu_link_info/pcie_gen/max_device_link_gen",), "pcie_gen_gpu_max", "int",
     False),
    ("pcie.link.width.current", ("pci/pci_gpu_link_info/link_widths/current_link_width",), "pcie_width", "int",
     True),
    ("pcie.link.width.max", ("pci/pci_gpu_link_info/link_widths/max_link_width",), "pcie_width_max", "int", False),
    # Power limits: under gpu_power_readings from driver 535, power_readings before (nvidia-smi -q -x).
    # power.limit is the requested limit (nvmlDeviceGetPowerManagementLimit); current_power_limit is
    # the enforced one (nvmlDeviceGetEnforcedPowerLimit), which can be lower.
    ("power.limit", ("gpu_power_readings/requested_power_limit", "power_readings/requested_power_limit",
                     "power_readings/power_limit", "gpu_power_readings/current_power_limit"),
     "settings.power_limit_mw", "watts", False),
    ("power.default_limit", ("gpu_power_readings/default_power_limit", "power_readings/default_power_limit"),
     "settings.power_default_mw", "watts", False),
    ("power.min_limit", ("gpu_power_readings/min_power_limit", "power_readings/min_power_limit"),
     "settings.power_min_mw", "watts", False),
    ("power.max_limit", ("gpu_power_readings/max_power_limit", "power_readings/max_power_limit"),
     "settings.power_max_mw", "watts", False),
    ("compute_mode", ("compute_mode",), "settings.compute_mode", "compute", False),
    ("clocks.applications.memory", ("applications_clocks/mem_clock",), "settings.application_clocks.0", "int",
     False),
    ("clocks.applications.graphics", ("applications_clocks/graphics_clock",), "settings.application_clocks.1",
     "int", False),
    ("clocks.default_applications.memory", ("default_applications_clocks/mem_clock",),
     "settings.default_application_clocks.0", "int", False),
    ("clocks.default_applications.graphics", ("default_applications_clocks/graphics_clock",),
     "settings.default_application_clocks.1", "int", False),
    ("clocks.current.graphics", ("clocks/graphics_clock",), "settings.graphics_clock", "int", True),
    ("clocks_event_reasons.active", (), "clock_events", "events", True),
    ("temperature.gpu", ("temperature/gpu_temp",), "temperature_c", "int", True),
    ("power.draw", ("gpu_power_readings/power_draw", "power_readings/power_draw"), "power_w", "float", True),
)
QUERY = tuple(f[0] for f in FIELDS)
# -q -x: the volatile ECC counters, per memory kind by driver generation (summed, as nvidia-smi's CSV total is).
XML_ECC = {"ecc.errors.uncorrected.volatile.total": ("sram_uncorrectable", "sram_uncorrectable_parity",
                                                     "sram_uncorrectable_secded", "dram_uncorrectable",
                                                     "double_bit/total"),
           "ecc.errors.corrected.volatile.total": ("sram_correctable", "dram_correctable", "single_bit/total")}


def value(kind: str, text: str | None) -> Any:
    """A CSV (nounits) or XML text as a comparable value; None: not there on this GPU/driver.
    Units are dropped ("97887 MiB", "450.00 W", "16x", "33 C", "1980 MHz")."""
    if text is None:
        return None
    t = text.strip()
    if t.lower() in NOT_THERE:
        return None
    m = re.fullmatch(r"(-?[\d.]+)\s*(?:MiB|W|MHz|C)|(\d+)x", t)  # never inside a hex mask (0x...FC)
    if m:
        t = m.group(1) or m.group(2)
    try:
        if kind == "mib":
            return int(t)
        if kind == "int":
            return int(t, 0)
        if kind == "float":
            return float(t)
        if kind == "watts":
            return round(float(t) * 1000)
        if kind in ("yes", "enabled"):
            return {"yes": True, "no": False, "enabled": True, "disabled": False, "1": True, "0": False}[t.lower()]
        if kind == "compute":
            return t.lower().replace(" ", "_")
        if kind == "bus":
            return bus_key(t)
        if kind == "events":
            bits = int(t, 16)
            return sorted(name for bit, name in CLOCK_EVENT_BITS.items() if bits & bit)
    except (ValueError, KeyError):
        return f"unreadable: {text}"
    return t


def bus_key(bus: str) -> str:
    """`00000000:3B:00.0` / `0000:3b:00.0` -> `0000:3b:00.0` (the domain has 8 digits in NVML, 4 in /proc)."""
    domain, _, rest = bus.strip().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}"
    except ValueError:
        return bus.lower()


def reconcile_value(gpu: Mapping[str, Any], path: str, kind: str) -> Any:
    """GPU's field PATH (`settings.application_clocks.1`) from observe.py's JSON, in the authority's units."""
    v: Any = gpu
    for part in path.split("."):
        if v is None:
            return None
        v = v[int(part)] if isinstance(v, list | tuple) else v.get(part)
    if v is None:
        return None
    if kind == "mib":
        return v // MIB
    if kind == "bus":
        return bus_key(v)
    if kind == "events":
        return sorted(v)
    return v


def agrees(kind: str, field: str, mine: Any, theirs: Any) -> bool:
    if kind == "mib" and isinstance(mine, int) and isinstance(theirs, int):
        return abs(mine - theirs) <= 1  # bytes floored to MiB here, rounded by nvidia-smi
    if kind == "watts" and isinstance(mine, int) and isinstance(theirs, int):
        return abs(mine - theirs) <= 10  # nvidia-smi prints two decimals of watts
    if kind == "float" and isinstance(mine, int | float) and isinstance(theirs, int | float):
        return abs(mine - theirs) <= 0.1
    return mine == theirs


def check(section: str, gpu: Any, field: str, mine: Any, theirs: Any, kind: str = "text", volatile: bool = False,
          note: str = "") -> dict[str, Any]:
    if agrees(kind, field, mine, theirs):
        verdict = "agree"
    elif (mine is None) != (theirs is None):
        verdict = "absent"  # one side does not report it at all: not a value that moved
    else:
        verdict = "moved" if volatile else "disagree"
    return {"section": section, "gpu": gpu, "field": field, "reconcile": mine, "authority": theirs,
            "verdict": verdict, "note": note}


# --- the authorities, parsed ------------------------------------------------------------------------

def parse_query(csv: str, fields: Iterable[str]) -> list[dict[str, str]]:
    """`--format=csv,noheader,nounits` rows, keyed by the fields asked."""
    names = list(fields)
    rows = []
    for line in csv.splitlines():
        if not line.strip() or line.startswith("Unable to determine"):
            continue
        cells = [c.strip() for c in line.split(", ")]
        rows.append(dict(zip(names, cells, strict=False)))
    return rows


def parse_xml(text: str) -> tuple[int | None, list[dict[str, str | None]]]:
    """(attached_gpus, per GPU the --query-gpu field -> its XML text) from `nvidia-smi -q -x`."""
    root = ET.fromstring(text)
    attached = root.findtext("attached_gpus")
    gpus = []
    for g in root.findall("gpu"):
        row: dict[str, str | None] = {"minor": _find(g, "minor_number"), "id": g.get("id")}
        for field, paths, _, _, _ in FIELDS:
            if paths:
                row[field] = _find(g, *paths)
        for field, kinds in XML_ECC.items():
            nums = [int(t) for t in (_find(g, f"ecc_errors/volatile/{k}") for k in kinds) if t and t.isdigit()]
            row[field] = str(sum(nums)) if nums else None
        if row.get("pci.bus_id") is None:
            row["pci.bus_id"] = g.get("id")
        gpus.append(row)
    return (int(attached) if attached and attached.strip().isdigit() else None), gpus


def _find(g: ET.Element, *paths: str) -> str | None:
    for p in paths:
        e = g.find(p)
        if e is not None and e.text is not None and e.text.strip():
            return e.text.strip()
    return None


def parse_proc(directory: Path) -> dict[str, dict[str, str]]:
    """bus key -> the kernel module's `information` fields (Device Minor, GPU UUID, Bus Location)."""
    out = {}
    for info in sorted(directory.glob("*/information")):
        fields = {}
        for line in info.read_text(errors="replace").splitlines():
            k, sep, v = line.partition(":")
            if sep:
                fields[k.strip()] = v.strip()
        out[bus_key(fields.get("Bus Location") or info.parent.name)] = fields
    return out


# --- the comparisons --------------------------------------------------------------------------------

def by_uuid(gpus: Iterable[Mapping[str, Any]], key: str = "uuid") -> dict[str, Mapping[str, Any]]:
    return {str(g.get(key)): g for g in gpus}


def compare_count(nvml: Mapping[str, Any], csv_rows: list[dict], xml: tuple[int | None, list], proc: Mapping,
                  proc_readable: bool) -> list[dict]:
    n = len(nvml["gpus"])
    out = [check("count", None, "count (nvidia-smi --query-gpu rows)", n, len(csv_rows), "int"),
           check("count", None, "count (nvidia-smi -q -x attached_gpus)", n, xml[0], "int")]
    if proc_readable:
        out.append(check("count", None, "count (/proc/driver/nvidia/gpus)", n, len(proc), "int"))
    mine = sorted(g["uuid"] for g in nvml["gpus"])
    out.append(check("count", None, "UUIDs (nvidia-smi --query-gpu)", mine, sorted(r.get("uuid") for r in csv_rows)))
    return out


def parse_lspci_vmm(text: str) -> list[dict[str, str]]:
    """`lspci -D -vmmnk`: one dict per device (Slot, Class, Vendor, Device, ProgIf, Driver)."""
    blocks = (dict(line.split(":\t", 1) for line in b.splitlines() if ":\t" in line) for b in text.split("\n\n"))
    return [b for b in blocks if b]


def compare_pci_bus(nvml: Mapping[str, Any], lspci: list[dict[str, str]] | None) -> list[dict]:
    """Reconcile's PCI bus reading (pcibus.py) against lspci's, and the driver's count against the
    bus's: read-only, as the section is (nothing is reset, unbound or rescanned). LSPCI None: lspci
    could not be run (each check then `absent`)."""
    bus = nvml.get("pci_bus") or {}
    mine = [g["address"] for g in bus.get("gpus", ())] if bus.get("readable") else None
    gpus = None if lspci is None else [d for d in lspci if d.get("Vendor") == "10de" and d.get("Class") in
                                       ("0300", "0302")]
    theirs = None if gpus is None else sorted(d["Slot"] for d in gpus)
    out = [check("pci-bus", None, "NVIDIA GPUs on the bus (lspci -d 10de::0300/0302)", mine, theirs)]
    drivers = {g["address"]: g.get("driver") for g in bus.get("gpus", ())}
    for d in gpus or ():
        out.append(check("pci-bus", d["Slot"], "bound driver (lspci -k)", drivers.get(d["Slot"]), d.get("Driver")))
    listed = sorted(bus_key(g["bus_id"]) for g in nvml["gpus"])
    on_bus = None if mine is None else sorted(g["address"] for g in bus.get("gpus", ())
                                              if g.get("driver") in (None, "nvidia"))
    out.append(check("pci-bus", None, "the driver's GPUs are the bus's (NVML bus ids vs the bus)", listed, on_bus,
                     note="a GPU on the bus the driver does not list has fallen off it"))
    return out


def compare_fields(section: str, nvml: Mapping[str, Any], rows: list[dict], refused: Iterable[str] = ()
                   ) -> list[dict]:
    """Reconcile's NVML reading against one nvidia-smi report (CSV rows or XML GPUs), GPU by UUID."""
    out = []
    theirs = by_uuid(rows)
    refused = set(refused)
    for g in nvml["gpus"]:
        row = theirs.get(g["uuid"])
        if row is None:
            out.append(check(section, g["index"], "present", True, False, note="nvidia-smi does not list this UUID"))
            continue
        for field, _paths, path, kind, volatile in FIELDS:
            if field in refused or field not in row:
                out.append({"section": section, "gpu": g["index"], "field": field, "reconcile":
                            reconcile_value(g, path, kind), "authority": None, "verdict": "not asked",
                            "note": "this nvidia-smi does not have the field" if field in refused else
                            "no element for it in this report"})
                continue
            out.append(check(section, g["index"], field, reconcile_value(g, path, kind), value(kind, row[field]),
                             kind, volatile))
    return out


def compare_minors(nvml: Mapping[str, Any], xml_gpus: list[dict], proc: Mapping[str, Mapping[str, str]],
                   proc_readable: bool) -> list[dict]:
    out = []
    xml = {bus_key(r.get("pci.bus_id") or ""): r for r in xml_gpus}
    for g in nvml["gpus"]:
        bus = bus_key(g["bus_id"])
        if proc_readable:
            info = proc.get(bus)
            out.append(check("minors", g["index"], "minor (/proc/driver/nvidia/gpus/*/information)", g.get("minor"),
                             value("int", info.get("Device Minor")) if info else None, "int"))
            if info and info.get("GPU UUID"):
                out.append(check("minors", g["index"], "uuid (/proc/driver/nvidia/gpus/*/information)", g["uuid"],
                                 info["GPU UUID"]))
        if bus in xml:
            out.append(check("minors", g["index"], "minor (nvidia-smi -q -x minor_number)", g.get("minor"),
                             value("int", xml[bus].get("minor")), "int"))
    return out


# Reconcile's Gpu fields that move by themselves between two reads, and those the nvidia-smi
# fallback reads at MiB resolution only.
VOLATILE = {"temperature_c", "power_w", "pcie_gen", "pcie_width", "clock_events", "memory_used",
            "settings.graphics_clock"}
SKIP = {"read_errors", "problems", "signals", "step"}  # compared as the verdict, below


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def compare_paths(nvml: Mapping[str, Any], smi: Mapping[str, Any]) -> list[dict]:
    """Reconcile's nvidia-smi fallback against its NVML path: every field of every GPU, and the verdict."""
    out = [check("smi-path", None, "source", "nvml/nvidia-smi", f"{nvml['source']}/{smi['source']}"),
           check("smi-path", None, "driver_version", nvml["driver_version"], smi["driver_version"]),
           check("smi-path", None, "count", len(nvml["gpus"]), len(smi["gpus"]), "int")]
    other = by_uuid(smi["gpus"])
    for g in nvml["gpus"]:
        s = other.get(g["uuid"])
        if s is None:
            out.append(check("smi-path", g["index"], "present", True, False))
            continue
        a, b = _flat(g), _flat(s)
        for k in sorted(set(a) | set(b)):
            if k in SKIP or k.startswith(("settings.unsupported", "settings.unreadable", "settings.supported_clocks")):
                continue
            mine, theirs = a.get(k), b.get(k)
            kind = "mib" if k in ("memory_used", "memory_total") else "float" if k == "power_w" else "text"
            if kind == "mib":
                mine, theirs = (None if v is None else v // MIB for v in (mine, theirs))
            out.append(check("smi-path", g["index"], k, mine, theirs, kind, k in VOLATILE))
        out.append(check("health", g["index"], "health (NVML path / nvidia-smi path)", g["health"], s["health"]))
        out.append(check("health", g["index"], "problems (NVML path / nvidia-smi path)", list(g["problems"]),
                         list(s["problems"])))
    return out


XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\): (\d+)")


def compare_xids(nvml: Mapping[str, Any], kernel_log: str) -> list[dict]:
    """Reconcile's Xid events against the `NVRM: Xid` lines of the kernel log it was given to read."""
    theirs: dict[tuple[str, int], int] = {}
    for m in XID_RE.finditer(kernel_log):
        key = (m.group(1).lower(), int(m.group(2)))
        theirs[key] = theirs.get(key, 0) + 1
    mine: dict[tuple[str, int], int] = {}
    for e in nvml.get("xids") or ():
        if e.get("xid") is not None:
            key = (str(e["pci"]).lower(), int(e["xid"]))
            mine[key] = mine.get(key, 0) + int(e.get("count") or 1)
    out = [check("xid", None, "Xid lines in the kernel log", sum(mine.values()), sum(theirs.values()), "int")]
    for key in sorted(set(mine) | set(theirs)):
        out.append(check("xid", key[0], f"Xid {key[1]} count", mine.get(key, 0), theirs.get(key, 0), "int"))
    log = nvml.get("kernel_log") or {}
    out.append({"section": "xid", "gpu": None, "field": "kernel log read", "reconcile": log.get("source"),
                "authority": None, "verdict": "agree" if log.get("readable") else "disagree",
                "note": log.get("note") or ("whole boot" if log.get("complete") else "")})
    return out
