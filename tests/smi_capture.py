"""Real nvidia-smi captures (tests/data/gpus/real/) as a stand-in `nvidia-smi` answers them.

A capture becomes, per GPU, the values `nvidia-smi --query-gpu=FIELD --format=csv` prints for
the fields reconcile asks (text with units, `[N/A]` as nvidia-smi writes it), the compute
processes, each GPU's Device Minor (for /proc/driver/nvidia/gpus/<bus>/information), the CUDA
version and the `nvlink -s` text:

- nvidia_gpu_exporter captures hold nvidia-smi's own `--query-gpu=<240 fields> --format=csv`
  and `--query-compute-apps` output: the stand-in selects the asked columns, byte for byte, and
  refuses fields that capture's `--help-query-gpu` does not list, as that nvidia-smi would;
- `-q -x` (XML) and `-q` (text) captures hold the same facts under other names: they are
  translated field by field (the tables below); a field the capture has no element for is
  refused as an older nvidia-smi refuses it (`Field "X" is not a valid field to query.`).

`expected()` gives what each GPU's reading must be, read from the same values by this file's own
small rules (so reconcile's parser is held against the capture, not against itself), and the
translation is held against features.json (written by the research tool from the raw files).
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REAL = HERE / "data" / "gpus" / "real"
NA = "[N/A]"
MIB = 2**20

# The fields the stand-in can answer for XML/-q captures, and their units in the CSV header.
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "power.draw": "W", "used_gpu_memory": "MiB"}
CLOCK_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
              "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
              "hw_power_brake_slowdown": 0x80, "display_clocks_setting": 0x100}


@dataclass
class Capture:
    name: str
    gpus: list[dict[str, str]] = field(default_factory=list)  # field -> CSV text
    apps: list[dict[str, str]] = field(default_factory=list)  # gpu_uuid, pid, process_name, used_gpu_memory
    minors: dict[str, str] = field(default_factory=dict)  # bus id -> Device Minor ("N/A" on Windows)
    cuda: str | None = None
    driver: str | None = None
    nvlink: str = ""
    valid: list[str] | None = None  # the fields this nvidia-smi knows (None: those in `gpus`)
    units: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


# --- nvidia_gpu_exporter captures -------------------------------------------------------------

def _sections(text: str) -> dict[str, str]:
    """`# <state> :: <what>` sections of an exporter capture, keyed by their `# $ command` line."""
    out: dict[str, str] = {}
    parts = re.split(r"^#{80}\n", text, flags=re.M)
    for i, part in enumerate(parts):
        m = re.search(r"^# (\w+) :: .*\n# \$ (.*)$", part, flags=re.M)
        if m and i + 1 < len(parts):
            out[f"{m.group(1)} {m.group(2).strip()}"] = parts[i + 1]
    return out


def _csv(text: str) -> tuple[list[str], dict[str, str], list[dict[str, str]]]:
    lines = [line for line in text.splitlines() if line.strip()]
    header = [h.strip() for h in lines[0].split(", ")]
    names = [h.split(" [", 1)[0] for h in header]
    units = {n: h.split(" [", 1)[1].rstrip("]") for n, h in zip(names, header, strict=True) if " [" in h}
    rows = [dict(zip(names, (c.strip() for c in line.split(", ")), strict=True)) for line in lines[1:]]
    return names, units, rows


def load_exporter(path: Path, state: str = "idle") -> Capture:
    sec = _sections(path.read_text())
    cap = Capture(path.name)
    query = next(v for k, v in sec.items() if k.startswith(f"{state} nvidia-smi --query-gpu="))
    _, cap.units, cap.gpus = _csv(query)
    apps = next(v for k, v in sec.items() if k.startswith(f"{state} nvidia-smi --query-compute-apps="))
    _, units, rows = _csv(apps)
    cap.units.update(units)
    cap.apps = [{k: r[k] for k in ("gpu_uuid", "pid", "process_name", "used_gpu_memory")} for r in rows]
    helptext = next(v for k, v in sec.items() if k.endswith("nvidia-smi --help-query-gpu"))
    cap.valid = sorted(set(re.findall(r'^"([a-z_.A-Z0-9]+)"', helptext, flags=re.M)))
    version = next((v for k, v in sec.items() if k.endswith("nvidia-smi --version")), "")
    m = re.search(r"CUDA Version\s*:\s*([\d.]+)", version)
    cap.cuda = m.group(1) if m else None
    cap.driver = cap.gpus[0].get("driver_version")
    q = next(v for k, v in sec.items() if k.startswith(f"{state} nvidia-smi -q"))
    for bus, minor in re.findall(r"^GPU ([0-9A-F:.]+)\n(?:.*\n)*?\s+Minor Number\s+: (\S+)", q, flags=re.M):
        cap.minors[bus] = minor
    cap.nvlink = next((v for k, v in sec.items() if k.endswith("nvidia-smi nvlink -s")), "")
    return cap


# --- XML (-q -x) captures --------------------------------------------------------------------

def _x(g: ET.Element, *paths: str) -> str | None:
    for p in paths:
        e = g.find(p)
        if e is not None and e.text is not None and e.text.strip():
            return e.text.strip()
    return None


def _csv_value(text: str | None, strip_unit: str = "") -> str:
    """An XML/-q value as nvidia-smi's CSV prints it: N/A -> [N/A], `16x` -> 16, `33 C` -> 33."""
    if text is None or text in ("N/A", "Unknown Error") or text.startswith("Requested functionality"):
        return NA if text is None or text == "N/A" else f"[{text}]"
    if strip_unit and text.endswith(strip_unit):
        return text[: -len(strip_unit)].strip()
    return text


def _sum(values: list[str | None]) -> str:
    nums = [int(v) for v in values if v is not None and v.isdigit()]
    return str(sum(nums)) if nums else NA


def _clock_mask(states: dict[str, str | None]) -> str:
    """`Active` / `Not Active` per reason -> nvidia-smi's `clocks_event_reasons.active` bitmask."""
    if not states or all(v is None or v == "N/A" for v in states.values()):
        return NA
    bits = sum(CLOCK_BITS[k] for k, v in states.items() if k in CLOCK_BITS and v == "Active")
    return f"0x{bits:016X}"


def load_xml(path: Path) -> Capture:
    root = ET.parse(path).getroot()
    cap = Capture(path.name, cuda=_x(root, "cuda_version"), driver=_x(root, "driver_version"))
    for i, g in enumerate(root.findall("gpu")):
        ecc = "ecc_errors/volatile/"
        uncorr = [_x(g, ecc + t) for t in ("sram_uncorrectable", "sram_uncorrectable_parity",
                                           "sram_uncorrectable_secded", "dram_uncorrectable", "double_bit/total")]
        corr = [_x(g, ecc + t) for t in ("sram_correctable", "dram_correctable", "single_bit/total")]
        reasons = {}
        for group in ("clocks_event_reasons", "clocks_throttle_reasons"):
            for e in g.findall(group + "/*"):
                reasons[re.sub(r"^clocks_(event|throttle)_reason_", "", e.tag)] = (e.text or "").strip()
        row = {
            "index": str(i), "name": _x(g, "product_name") or NA, "uuid": _x(g, "uuid") or NA,
            "pci.bus_id": _x(g, "pci/pci_bus_id") or g.get("id", NA), "driver_version": cap.driver or NA,
            "memory.total": _csv_value(_x(g, "fb_memory_usage/total")),
            "memory.used": _csv_value(_x(g, "fb_memory_usage/used")),
            "temperature.gpu": _csv_value(_x(g, "temperature/gpu_temp"), " C"),
            "power.draw": _csv_value(_x(g, "gpu_power_readings/power_draw", "power_readings/power_draw")),
            "ecc.errors.uncorrected.volatile.total": _sum(uncorr),
            "ecc.errors.corrected.volatile.total": _sum(corr),
            "retired_pages.pending": _csv_value(_x(g, "retired_pages/pending_retirement")),
            "mig.mode.current": _csv_value(_x(g, "mig_mode/current_mig")),
            "persistence_mode": _csv_value(_x(g, "persistence_mode")),
            "vbios_version": _csv_value(_x(g, "vbios_version")),
            "pcie.link.gen.current": _csv_value(_x(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
            "pcie.link.gen.max": _csv_value(_x(g, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            "pcie.link.width.current": _csv_value(_x(g, "pci/pci_gpu_link_info/link_widths/current_link_width"), "x"),
            "pcie.link.width.max": _csv_value(_x(g, "pci/pci_gpu_link_info/link_widths/max_link_width"), "x"),
            "clocks_event_reasons.active": _clock_mask(reasons),
        }
        row.update(_xml_settings(g))
        # Fields an older nvidia-smi does not have: only where the capture has the element.
        if g.find("pci/pci_gpu_link_info/pcie_gen/max_device_link_gen") is not None:
            row["pcie.link.gen.gpumax"] = _csv_value(_x(g, "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen"))
        if g.find("remapped_rows") is not None:
            row["remapped_rows.pending"] = _csv_value(_x(g, "remapped_rows/remapped_row_pending"))
            row["remapped_rows.failure"] = _csv_value(_x(g, "remapped_rows/remapped_row_failure"))
        if g.find("gpu_recovery_action") is not None:
            row["gpu_recovery_action"] = _csv_value(_x(g, "gpu_recovery_action"))
        cap.gpus.append(row)
        cap.minors[row["pci.bus_id"]] = _x(g, "minor_number") or "N/A"
        for p in g.findall("processes/process_info"):
            if (_x(p, "type") or "C") in ("C", "C+G"):  # --query-compute-apps lists compute processes
                cap.apps.append({"gpu_uuid": row["uuid"], "pid": _x(p, "pid") or "",
                                 "process_name": _x(p, "process_name") or "",
                                 "used_gpu_memory": _csv_value(_x(p, "used_memory"))})
    cap.units = dict(UNITS)
    return cap


def _xml_settings(g: ET.Element) -> dict[str, str]:
    """The settings' --query-gpu fields from a `-q -x` GPU element (power limits under
    gpu_power_readings from driver 535 on, power_readings before)."""
    power = "gpu_power_readings/" if g.find("gpu_power_readings") is not None else "power_readings/"
    row = {
        "power.limit": _csv_value(_x(g, power + "requested_power_limit", power + "power_limit")),
        "power.default_limit": _csv_value(_x(g, power + "default_power_limit")),
        "power.min_limit": _csv_value(_x(g, power + "min_power_limit")),
        "power.max_limit": _csv_value(_x(g, power + "max_power_limit")),
        "compute_mode": _csv_value(_x(g, "compute_mode")),
        "clocks.applications.memory": _csv_value(_x(g, "applications_clocks/mem_clock")),
        "clocks.applications.graphics": _csv_value(_x(g, "applications_clocks/graphics_clock")),
        "clocks.default_applications.memory": _csv_value(_x(g, "default_applications_clocks/mem_clock")),
        "clocks.default_applications.graphics": _csv_value(_x(g, "default_applications_clocks/graphics_clock")),
        "clocks.current.graphics": _csv_value(_x(g, "clocks/graphics_clock")),
        "ecc.mode.current": _csv_value(_x(g, "ecc_mode/current_ecc")),
        "ecc.mode.pending": _csv_value(_x(g, "ecc_mode/pending_ecc")),
    }
    if g.find("mig_mode") is not None:
        row["mig.mode.pending"] = _csv_value(_x(g, "mig_mode/pending_mig"))
    return row


# --- `nvidia-smi -q` text captures -----------------------------------------------------------------

def _tree(block: list[str]) -> dict[str, str]:
    """Indented `Key : Value` lines -> `A/B/C` paths (the first occurrence of each)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in block:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        key = key.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([k for _, k in stack] + [key])
        if value.strip():
            out.setdefault(path, value.strip())
        else:
            stack.append((indent, key))
    return out


def load_q(path: Path) -> Capture:
    text = path.read_text()
    head = _tree(text.split("\nGPU ", 1)[0].splitlines())
    cap = Capture(path.name, cuda=head.get("CUDA Version"), driver=head.get("Driver Version"))
    blocks = re.split(r"^GPU ([0-9A-Fa-f]{8}:[0-9A-Fa-f:.]+)\n", text, flags=re.M)
    for i, (bus, body) in enumerate(zip(blocks[1::2], blocks[2::2], strict=True)):
        t = _tree(body.splitlines())

        def v(*keys: str, unit: str = "", tree: dict[str, str] = t) -> str:
            return _csv_value(next((tree[k] for k in keys if k in tree), None), unit)

        reasons = {}
        for k, val in t.items():
            m = re.match(r"Clocks (?:Event|Throttle) Reasons/(?:HW Slowdown/)?(.+)", k)
            if m:
                name = m.group(1).lower().replace(" ", "_").replace("idle", "gpu_idle").replace("clock_", "clocks_")
                reasons[name] = val
        row = {
            "index": str(i), "name": v("Product Name"), "uuid": v("GPU UUID"), "pci.bus_id": bus,
            "driver_version": cap.driver or NA,
            "memory.total": v("FB Memory Usage/Total"), "memory.used": v("FB Memory Usage/Used"),
            "temperature.gpu": v("Temperature/GPU Current Temp", unit=" C"),
            "power.draw": v("GPU Power Readings/Power Draw", "Power Readings/Power Draw"),
            "ecc.errors.uncorrected.volatile.total": _sum([t.get("ECC Errors/Volatile/SRAM Uncorrectable"),
                                                            t.get("ECC Errors/Volatile/DRAM Uncorrectable")]),
            "ecc.errors.corrected.volatile.total": _sum([t.get("ECC Errors/Volatile/SRAM Correctable"),
                                                          t.get("ECC Errors/Volatile/DRAM Correctable")]),
            "retired_pages.pending": v("Retired Pages/Pending Page Blacklist", "Retired Pages/Pending"),
            "remapped_rows.pending": v("Remapped Rows/Pending"),
            "remapped_rows.failure": v("Remapped Rows/Remapping Failure Occurred"),
            "mig.mode.current": v("MIG Mode/Current"), "persistence_mode": v("Persistence Mode"),
            "vbios_version": v("VBIOS Version"),
            "pcie.link.gen.current": v("PCI/GPU Link Info/PCIe Generation/Current"),
            "pcie.link.gen.max": v("PCI/GPU Link Info/PCIe Generation/Max"),
            "pcie.link.gen.gpumax": v("PCI/GPU Link Info/PCIe Generation/Device Max"),
            "pcie.link.width.current": v("PCI/GPU Link Info/Link Width/Current", unit="x"),
            "pcie.link.width.max": v("PCI/GPU Link Info/Link Width/Max", unit="x"),
            "clocks_event_reasons.active": _clock_mask(reasons),
        }
        if "GPU Recovery Action" in t:
            row["gpu_recovery_action"] = v("GPU Recovery Action")
        power = "GPU Power Readings/" if any(k.startswith("GPU Power Readings/") for k in t) else "Power Readings/"
        row.update({
            "power.limit": v(power + "Requested Power Limit", power + "Power Limit"),
            "power.default_limit": v(power + "Default Power Limit"),
            "power.min_limit": v(power + "Min Power Limit"), "power.max_limit": v(power + "Max Power Limit"),
            "compute_mode": v("Compute Mode"),
            "clocks.applications.memory": v("Applications Clocks/Memory"),
            "clocks.applications.graphics": v("Applications Clocks/Graphics"),
            "clocks.default_applications.memory": v("Default Applications Clocks/Memory"),
            "clocks.default_applications.graphics": v("Default Applications Clocks/Graphics"),
            "clocks.current.graphics": v("Clocks/Graphics"),
            "mig.mode.pending": v("MIG Mode/Pending"),
            "ecc.mode.current": v("ECC Mode/Current", "Ecc Mode/Current"),
            "ecc.mode.pending": v("ECC Mode/Pending", "Ecc Mode/Pending"),
        })
        cap.gpus.append(row)
        cap.minors[bus] = t.get("Minor Number", "N/A")
        procs = body.split("\n    Processes", 1)[1] if "\n    Processes" in body else ""
        for m in re.finditer(r"Process ID\s+: (\d+)\n\s+Type\s+: (\S+)\n\s+Name\s+: (.*)\n\s+Used GPU Memory\s+: (.*)",
                             procs):
            if m.group(2) in ("C", "C+G"):
                cap.apps.append({"gpu_uuid": row["uuid"], "pid": m.group(1), "process_name": m.group(3).strip(),
                                 "used_gpu_memory": _csv_value(m.group(4).strip())})
    cap.units = dict(UNITS)
    return cap


def load(path: Path) -> Capture:
    if path.name.endswith(".capture.txt"):
        return load_exporter(path)
    if path.suffix == ".xml":
        return load_xml(path)
    return load_q(path)


# --- the stand-in -------------------------------------------------------------------------------

STAND_IN = textwrap.dedent('''\
    """A stand-in nvidia-smi answering reconcile's queries from one real capture (tests/smi_capture.py)."""
    import json, sys
    cap = json.load(open(sys.argv[1]))
    args = sys.argv[2:]
    def out(text, rc=0):
        sys.stdout.write(text)
        sys.exit(rc)
    if cap.get("fail"):
        out(cap["fail"] + "\\n", cap.get("rc", 9))
    def query(kind, rows):
        fields = args[0].split("=", 1)[1].split(",")
        valid = cap["valid"] if kind == "gpu" and cap.get("valid") else (rows[0].keys() if rows else fields)
        for f in fields:
            if f not in valid or (rows and f not in rows[0]):
                out('Field "%s" is not a valid field to query.\\n\\n' % f, 2)
        units = cap.get("units", {})
        lines = [", ".join(f + (" [%s]" % units[f] if f in units else "") for f in fields)]
        lines += [", ".join(r[f] for f in fields) for r in rows]
        lost = cap.get("unreachable", [])
        text = "".join("Unable to determine the device handle for GPU %s: %s\\n" % tuple(u) for u in lost)
        out(text + "\\n".join(lines) + "\\n", 15 if lost else 0)
    if args and args[0].startswith("--query-gpu="):
        query("gpu", cap["gpus"])
    if args and args[0].startswith("--query-compute-apps="):
        query("apps", cap["apps"])
    if args[:2] == ["nvlink", "-s"]:
        out(cap.get("nvlink", ""))
    if args == ["--version"]:
        out("NVIDIA-SMI version  : stand-in\\nDRIVER version      : %s\\nCUDA Version        : %s\\n"
            % (cap.get("driver"), cap.get("cuda") or "N/A"))
    out("stand-in nvidia-smi: unexpected arguments: %s\\n" % " ".join(args), 2)
''')


def install(cap: Capture, where: Path, **extra) -> dict[str, str]:
    """Write the stand-in nvidia-smi for CAP and the /proc/driver/nvidia/gpus it implies under WHERE;
    return the environment that points reconcile at them (PATH, RECONCILE_NVIDIA_PROC_DIR)."""
    bindir, proc = where / "bin", where / "proc-driver-nvidia-gpus"
    bindir.mkdir(parents=True, exist_ok=True)
    data = where / "capture.json"
    data.write_text(json.dumps({**cap.__dict__, **extra}))
    (where / "nvidia_smi.py").write_text(STAND_IN)
    script = bindir / "nvidia-smi"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{where / "nvidia_smi.py"}" "{data}" "$@"\n')
    script.chmod(0o755)
    for bus, minor in cap.minors.items():
        if minor.isdigit():  # Windows captures: N/A, no /proc/driver/nvidia
            d = proc / bus_dir(bus)
            d.mkdir(parents=True, exist_ok=True)
            (d / "information").write_text(f"Model: \t\t NVIDIA\nBus Location: \t {bus_dir(bus)}\n"
                                           f"Device Minor: \t {minor}\n")
    proc.mkdir(parents=True, exist_ok=True)
    # The PCI bus: a GPU at each captured bus id (pci_support.bus_with_gpus), on the bus of the same
    # host where tests/data/gpus/pci/ has its lspci (gpud's 8x H100), else on the default host's.
    import pci_support

    buses = [g["pci.bus_id"] for g in cap.gpus] + [bus for bus, _ in extra.get("unreachable", ())]  # lost: on the bus
    slots = [bus_dir(b) for b in buses if re.fullmatch(r"[0-9A-F]+:[0-9A-F:.]+", b, re.I)]
    same = pci_support.SAME_HOST.get(cap.name)
    devices = (pci_support.capture(same) if same else
               pci_support.bus_with_gpus(pci_support.DEFAULT_HOST, [(s, "nvidia") for s in slots]))
    sysfs = pci_support.write_tree(where / "sys", devices)
    path = os.pathsep.join([str(bindir), *(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                           if d and not os.path.exists(os.path.join(d, "nvidia-smi")))])
    return {"PATH": path, "RECONCILE_NVIDIA_PROC_DIR": str(proc), "RECONCILE_SYSFS_PCI": str(sysfs)}


def bus_dir(bus: str) -> str:
    """`00000000:3B:00.0` -> `0000:3b:00.0`, the name the driver gives its /proc/driver/nvidia/gpus entry."""
    domain, rest = bus.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


# --- what each GPU's reading must be --------------------------------------------------------------

def _num(text: str) -> int | None:
    m = re.match(r"^(\d+)(?: \w+)?$", text.strip())
    return int(m.group(1)) if m else None


def _yes(text: str) -> bool | None:
    return {"Yes": True, "No": False, "Enabled": True, "Disabled": False}.get(text.strip())


def expected(cap: Capture) -> list[dict]:
    """Per GPU, the capture's own values as reconcile must read them, and the verdict they imply."""
    out = []
    for row in cap.gpus:
        def f(name: str, row: dict[str, str] = row) -> str:
            return row.get(name, NA) if cap.valid is None or name in cap.valid else NA

        mem_total, mem_used = _num(f("memory.total")), _num(f("memory.used"))
        unc = _num(f("ecc.errors.uncorrected.volatile.total"))
        problems = []
        if unc:
            problems.append("ecc")
        for name in ("retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure"):
            if _yes(f(name)):
                problems.append(name)
        rec = f("gpu_recovery_action")
        if rec not in (NA, "None"):
            problems.append("recovery")
        minor = cap.minors.get(row["pci.bus_id"], "N/A")
        out.append({
            "index": int(row["index"]), "uuid": row["uuid"], "bus_id": row["pci.bus_id"],
            "memory_total": None if mem_total is None else mem_total * MIB,
            "memory_used": None if mem_used is None else mem_used * MIB,
            "minor": int(minor) if minor.isdigit() else None,
            "temperature_c": _num(f("temperature.gpu")),
            "remapped_rows_pending": _yes(f("remapped_rows.pending")),
            "persistence_mode": _yes(f("persistence_mode")),
            "mig": _yes(f("mig.mode.current")),
            "pcie_width": _num(f("pcie.link.width.current")), "pcie_width_max": _num(f("pcie.link.width.max")),
            "health": "unhealthy" if problems else "healthy",
            "step": "reset the GPU" if problems else "",
        })
    return out


# --- the settings, as the capture says -------------------------------------------------------------

SETTING_COLUMNS = {
    "power_limit": ("power.limit", "power.default_limit", "power.min_limit", "power.max_limit"),
    "compute_mode": ("compute_mode",),
    "application_clocks": ("clocks.applications.memory", "clocks.applications.graphics",
                           "clocks.default_applications.memory", "clocks.default_applications.graphics"),
    "locked_clocks": ("clocks.current.graphics",),
    "mig": ("mig.mode.pending",),
    "ecc": ("ecc.mode.current", "ecc.mode.pending"),
}


def _mw(text: str) -> int | None:
    m = re.match(r"^(\d+(?:\.\d+)?) W$", text.strip())
    return round(float(m.group(1)) * 1000) if m else None


def expected_settings(cap: Capture) -> list[dict]:
    """Per GPU, the settings as reconcile must read them from the capture's values, by this file's own
    rules: watts to milliwatts, `N MHz` to N, Enabled/Disabled; [N/A] and deprecated: not supported."""
    out = []
    for row in cap.gpus:
        def f(name: str, row: dict[str, str] = row) -> str | None:
            if cap.valid is not None and name not in cap.valid:
                return None  # this nvidia-smi refuses the field
            return row.get(name)

        def pair(mem: str, gr: str) -> list[int] | None:
            m, g = _num(f(mem) or ""), _num(f(gr) or "")
            return None if m is None or g is None else [m, g]

        unsupported, unreadable = [], []
        for setting, cols in SETTING_COLUMNS.items():
            values = [f(c) for c in cols]
            if any(v is None for v in values):
                unreadable.append(setting)
            elif any(v == NA or "deprecated" in v for v in values):
                unsupported.append(setting)
        mode = f("compute_mode")
        out.append({
            "power_limit_mw": _mw(f("power.limit") or ""), "power_default_mw": _mw(f("power.default_limit") or ""),
            "power_min_mw": _mw(f("power.min_limit") or ""), "power_max_mw": _mw(f("power.max_limit") or ""),
            "compute_mode": mode.lower() if mode and mode != NA else None,
            "application_clocks": pair("clocks.applications.memory", "clocks.applications.graphics"),
            "default_application_clocks": pair("clocks.default_applications.memory",
                                               "clocks.default_applications.graphics"),
            "graphics_clock": _num(f("clocks.current.graphics") or ""),
            "mig_pending": _yes(f("mig.mode.pending") or ""), "ecc": _yes(f("ecc.mode.current") or ""),
            "ecc_pending": _yes(f("ecc.mode.pending") or ""),
            "unsupported": sorted(unsupported), "unreadable": sorted(unreadable),
        })
    return out
