"""A fake PCI bus for the gpus kind's bus check (reconcilers/gpus/pcibus.py): a directory laid out
as sysfs lays out /sys (tests/data/gpus/pci/this-build-host__sysfs.txt is this machine's), built
from a real `lspci` listing (tests/data/gpus/pci/, with provenance), and checked by the real
`lspci -A linux-sysfs -O sysfs.path=…`, which reads the same files the kind reads.

The layout, per device: `sys/devices/pciDDDD:BB/SLOT/{vendor,device,class,revision,config}` (the
kernel nests devices under their bridges; one level is enough for what is read here), the link
`sys/bus/pci/devices/SLOT -> ../../../devices/pciDDDD:BB/SLOT`, and `driver ->
../../../bus/pci/drivers/NAME` as on this machine. `config` holds the standard header's first 64
bytes (vendor, device, revision, programming interface, class), which lspci reads besides the files.

Imported by name (tests/ is on sys.path under pytest's default import mode).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "gpus" / "pci"
DEFAULT_HOST = "gpud__azure-8x-a100__lspci-nn.txt"  # small, numeric, no pci.ids needed
# nvidia-smi captures (tests/data/gpus/real/) -> the lspci capture of a host with the same GPU bus ids.
SAME_HOST = {"gpud__8x-h100-80gb-hbm3__535.161.08.q.txt": "gpud__dell-8x-h100__lspci-vvv.devices.txt"}
PCI_IDS = (Path("/usr/share/misc/pci.ids"), Path("/usr/share/hwdata/pci.ids"))  # pciutils' database


@dataclass(frozen=True)
class PciDevice:
    slot: str  # "0000:3b:00.0"
    pci_class: int  # 0x030200: class, subclass, programming interface
    vendor: int
    device: int
    revision: int = 0
    driver: str | None = None
    physfn: str | None = None  # an SR-IOV virtual function: its physical function's slot


# --- reading lspci listings -------------------------------------------------------------------------

class PciIds:
    """pci.ids (the database lspci names devices with): vendor, device and subclass names -> numbers.
    lspci prints a subclass's name, or its class's name with the number when pci.ids lacks it."""

    def __init__(self, text: str):
        self.vendors: dict[str, int] = {}
        self.devices: dict[int, dict[str, int]] = {}
        self.classes: dict[str, list[int]] = {}
        vendor = klass = None
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            if line.startswith("C "):
                code, _, name = line[2:].partition("  ")
                klass, vendor = int(code, 16), None  # a class name alone comes with its number ("[0807]")
            elif not line.startswith("\t"):
                code, _, name = line.partition("  ")
                vendor, klass = int(code, 16), None
                self.vendors.setdefault(name.strip(), vendor)
            elif not line.startswith("\t\t") and klass is not None:
                code, _, name = line[1:].partition("  ")
                self.classes.setdefault(name.strip(), []).append((klass << 8) | int(code, 16))
            elif not line.startswith("\t\t") and vendor is not None:
                code, _, name = line[1:].partition("  ")
                self.devices.setdefault(vendor, {}).setdefault(name.strip(), int(code, 16))

    @classmethod
    def load(cls) -> PciIds:
        for path in PCI_IDS:
            if path.exists():
                return cls(path.read_text(encoding="utf-8", errors="replace"))
        raise FileNotFoundError("pci.ids not found (the pciutils package): " + ", ".join(map(str, PCI_IDS)))


_NN_RE = re.compile(r"^(?P<slot>[0-9a-f]{2,4}:[0-9a-f]{2}(?::[0-9a-f]{2})?\.[0-7]) (?P<cname>.*?) "
                    r"\[(?P<class>[0-9a-f]{4})\]: .*\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\]"
                    r"(?: \(rev (?P<rev>[0-9a-f]{2})\))?(?: \(prog-if (?P<progif>[0-9a-f]{2})[^)]*\))?$")
_PLAIN_RE = re.compile(r"^(?P<slot>[0-9a-f]{2,4}:[0-9a-f]{2}(?::[0-9a-f]{2})?\.[0-7]) (?P<cname>[^:]+?)"
                       r"(?: \[(?P<class>[0-9a-f]{4})\])?: (?P<rest>.*?)(?: \(rev (?P<rev>[0-9a-f]{2})\))?"
                       r"(?: \(prog-if (?P<progif>[0-9a-f]{2})[^)]*\))?$")


def _full_slot(slot: str) -> str:
    return slot if slot.count(":") == 2 else f"0000:{slot}"


def parse_lspci(text: str, ids: PciIds | None = None) -> list[PciDevice]:
    """Devices of an `lspci -nn` listing (numbers as printed), or of a plain `lspci`/`lspci -vvv`
    one (names, resolved through IDS, pci.ids; each `Kernel driver in use:` line binds its device).
    A name pci.ids does not resolve is an error, never a guess."""
    out: list[PciDevice] = []
    for line in text.splitlines():
        if line.startswith("\t"):
            m = re.match(r"\tKernel driver in use: (\S+)", line)
            if m and out:
                out[-1] = replace(out[-1], driver=m.group(1))
            continue
        if not line.strip():
            continue
        m = _NN_RE.match(line)
        if m:
            klass = (int(m.group("class"), 16) << 8) | int(m.group("progif") or "0", 16)
            out.append(PciDevice(_full_slot(m.group("slot")), klass, int(m.group("vendor"), 16),
                                 int(m.group("device"), 16), int(m.group("rev") or "0", 16)))
            continue
        m = _PLAIN_RE.match(line)
        if m is None:
            raise ValueError(f"not an lspci line: {line!r}")
        ids = ids or PciIds.load()
        if m.group("class"):
            klass = int(m.group("class"), 16)
        else:
            codes = ids.classes.get(m.group("cname"), [])
            if len(codes) != 1:
                raise ValueError(f"class {m.group('cname')!r}: pci.ids gives {codes}")
            klass = codes[0]
        rest = m.group("rest")
        vendor_name = max((v for v in ids.vendors if rest.startswith(v + " ")), key=len, default=None)
        if vendor_name is None:
            raise ValueError(f"no pci.ids vendor starts {rest!r}")
        vendor, device_name = ids.vendors[vendor_name], rest[len(vendor_name) + 1:]
        dm = re.fullmatch(r"Device ([0-9a-f]{4})", device_name)
        device = int(dm.group(1), 16) if dm else ids.devices.get(vendor, {}).get(device_name)
        if device is None:
            raise ValueError(f"pci.ids has no device {device_name!r} of {vendor_name}")
        out.append(PciDevice(_full_slot(m.group("slot")), (klass << 8) | int(m.group("progif") or "0", 16),
                             vendor, device, int(m.group("rev") or "0", 16)))
    return out


def capture(name: str, ids: PciIds | None = None) -> list[PciDevice]:
    return parse_lspci((DATA / name).read_text(), ids)


def is_gpu(d: PciDevice) -> bool:
    """An NVIDIA display or 3D controller (class 03xx), as the captures' GPUs are picked out."""
    return d.vendor == 0x10DE and d.pci_class >> 16 == 0x03


def bus_with_gpus(host: str, gpus: Iterable[tuple[str, str | None]]) -> list[PciDevice]:
    """The devices of the capture HOST with its GPUs replaced by GPUS, (slot, driver) each, as the
    capture's first GPU (class, vendor, device, revision)."""
    devices = capture(host)
    template = next(d for d in devices if is_gpu(d))
    return [d for d in devices if not is_gpu(d)] + [replace(template, slot=s, driver=drv) for s, drv in gpus]


# --- writing the tree -------------------------------------------------------------------------------

def _config(d: PciDevice) -> bytes:
    """The standard configuration header's first 64 bytes (PCI Local Bus spec, type 0 header)."""
    head = bytearray(64)
    struct.pack_into("<HH", head, 0, d.vendor, d.device)
    head[8], head[9], head[10], head[11] = d.revision, d.pci_class & 0xFF, (d.pci_class >> 8) & 0xFF, d.pci_class >> 16
    return bytes(head)


def write_tree(sys_root: Path, devices: Iterable[PciDevice]) -> Path:
    """SYS_ROOT laid out as /sys for DEVICES; returns SYS_ROOT/bus/pci (RECONCILE_SYSFS_PCI, and
    lspci's sysfs.path). An existing tree there is replaced."""
    if sys_root.exists():
        shutil.rmtree(sys_root)
    bus = sys_root / "bus" / "pci"
    (bus / "devices").mkdir(parents=True)
    (bus / "drivers").mkdir()
    for d in devices:
        domain, number = d.slot.split(":")[:2]
        where = sys_root / "devices" / f"pci{domain}:{number}" / d.slot
        where.mkdir(parents=True)
        (where / "vendor").write_text(f"0x{d.vendor:04x}\n")
        (where / "device").write_text(f"0x{d.device:04x}\n")
        (where / "class").write_text(f"0x{d.pci_class:06x}\n")
        (where / "revision").write_text(f"0x{d.revision:02x}\n")
        (where / "config").write_bytes(_config(d))
        (bus / "devices" / d.slot).symlink_to(f"../../../devices/pci{domain}:{number}/{d.slot}")
        if d.driver:
            (bus / "drivers" / d.driver).mkdir(exist_ok=True)
            (where / "driver").symlink_to(f"../../../bus/pci/drivers/{d.driver}")
        if d.physfn:
            pdom, pnum = d.physfn.split(":")[:2]
            (where / "physfn").symlink_to(f"../../pci{pdom}:{pnum}/{d.physfn}")
    return bus


# --- the authority: lspci reading the tree -----------------------------------------------------------

def lspci_argv(sysfs_pci: str | os.PathLike | None, *args: str) -> list[str]:
    """lspci reading SYSFS_PCI (a /sys/bus/pci) as it reads the real one; None: the real one."""
    lspci = shutil.which("lspci") or "/usr/bin/lspci"
    where = ["-A", "linux-sysfs", "-O", f"sysfs.path={sysfs_pci}"] if sysfs_pci is not None else []
    return [lspci, *where, *args]


def lspci_machine(sysfs_pci: str | os.PathLike | None) -> list[dict[str, str]]:
    """`lspci -D -vmmnk`: one dict per device (Slot, Class, Vendor, Device, Rev, ProgIf, Driver)."""
    proc = subprocess.run(lspci_argv(sysfs_pci, "-D", "-vmmnk"), capture_output=True, text=True, timeout=60,
                          check=True)
    out = []
    for block in proc.stdout.strip().split("\n\n"):
        rec = dict(line.split(":\t", 1) for line in block.splitlines() if ":\t" in line)
        if rec:
            out.append(rec)
    return out


def lspci_devices(sysfs_pci: str | os.PathLike | None) -> list[PciDevice]:
    """Every device as lspci reads it (`-vmmnk`: numbers, and the bound driver)."""
    return [PciDevice(r["Slot"], (int(r["Class"], 16) << 8) | int(r.get("ProgIf", "0"), 16), int(r["Vendor"], 16),
                      int(r["Device"], 16), int(r.get("Rev", "0"), 16), r.get("Driver"))
            for r in lspci_machine(sysfs_pci)]


def lspci_nvidia_gpus(sysfs_pci: str | os.PathLike | None) -> list[str]:
    """The slots lspci lists for NVIDIA's display and 3D controllers (`-d 10de::0300`, `-d 10de::0302`)."""
    slots = []
    for klass in ("0300", "0302"):
        proc = subprocess.run(lspci_argv(sysfs_pci, "-D", "-n", "-d", f"10de::{klass}"), capture_output=True,
                              text=True, timeout=60, check=True)
        slots += [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return sorted(slots)
