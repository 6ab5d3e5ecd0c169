"""The NVIDIA GPUs on the PCI bus, as sysfs lists them: what NVML's list and the declared `count`
are held against, so that a GPU gone from the driver without a word is still named.

What is read, under ROOT (`/sys/bus/pci`, or `$RECONCILE_SYSFS_PCI`: the directory pciutils' lspci
reads as `-A linux-sysfs -O sysfs.path=ROOT`), for each `ROOT/devices/DOMAIN:BUS:DEV.FN`
(kernel Documentation/ABI/testing/sysfs-bus-pci):
- `vendor` (`0x10de`) and `class` (`0xCCSSPP`: class, subclass, programming interface);
- `driver`, the link to the driver bound to it (`…/drivers/nvidia`); none: bound to no driver;
- `physfn`, the link an SR-IOV virtual function has to its physical function.

A GPU is vendor 0x10de with class 0x0300 (VGA compatible controller) or 0x0302 (3D controller),
what pci.ids calls NVIDIA's display and 3D controllers (NVIDIA's NVSentinel counts class 0x0302
the same way). Left out: NVSwitches (class 0x0680 "Bridge", bound to nvidia-nvswitch; 0x0604 on
GB200), the GPUs' HD-audio functions (0x0403), and virtual functions (vGPU hosts: NVML lists the
physical GPU only). A GPU bound to another driver (vfio-pci: passed through to a VM) is the host's
choice, not a fault: it is reported and not counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...core.contract import Drift
from .catalogue import XIDS, step_text
from .observed import NVIDIA_DRIVER, BusGpu, Gpu, GpusObserved, PciBus
from .xid import pci_key

SYSFS_PCI_ENV = "RECONCILE_SYSFS_PCI"
DEFAULT_SYSFS_PCI = "/sys/bus/pci"
NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = {0x0300: "VGA compatible controller", 0x0302: "3D controller"}  # pci.ids class 03
UNKNOWN = "unknown"
# A GPU on the bus the driver does not list has the state Xid 79 names: fallen off the bus.
FALLEN_OFF_ACTION = XIDS[79][0] or "RESTART_BM"


def sysfs_root() -> str:
    return os.environ.get(SYSFS_PCI_ENV) or DEFAULT_SYSFS_PCI


def _read(path: str) -> str:
    """A sysfs attribute (a line of a few bytes: one read gives it all), without a text file object:
    the bus is read on every observation, two files per device."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def read_pci_bus(root: str) -> PciBus:
    """The NVIDIA GPUs under ROOT/devices. A device whose vendor or class cannot be read makes the
    whole reading unknown (it could be a GPU); so does a directory with no device at all (no
    machine has an empty PCI bus: this sysfs does not show it)."""
    devices = os.path.join(root, "devices")
    try:
        entries = sorted(os.listdir(devices))
    except OSError as exc:
        return PciBus(root, readable=False, note=f"cannot list {devices}: {exc.strerror or exc}")
    if not entries:
        return PciBus(root, readable=False, note=f"{devices} lists no PCI device: this sysfs does not show the bus")
    found = []
    for entry in entries:
        path = os.path.join(devices, entry)
        try:
            vendor = int(_read(os.path.join(path, "vendor")), 16)
            cls = _read(os.path.join(path, "class"))
            code = int(cls, 16)
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else f"not a number ({exc})"
            return PciBus(root, readable=False, note=f"cannot read {entry}'s vendor and class under {devices}: {why}")
        if vendor != NVIDIA_VENDOR or code >> 8 not in GPU_CLASSES:
            continue
        if os.path.lexists(os.path.join(path, "physfn")):
            continue  # an SR-IOV virtual function: NVML lists its physical GPU
        try:
            device = _read(os.path.join(path, "device"))
        except OSError:
            device = "?"
        try:
            driver: str | None = os.path.basename(os.readlink(os.path.join(path, "driver")))
        except OSError:
            driver = None
        found.append(BusGpu(entry.lower(), device, cls, driver))
    return PciBus(root, gpus=tuple(found))


def address_key(bus_id: str) -> tuple[int, int, int, int] | None:
    """`00000000:3B:00.0` (NVML), `0000:3b:00.0` (sysfs) -> (domain, bus, device, function)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3 or "." not in parts[2]:
        return None
    dev, _, fn = parts[2].partition(".")
    try:
        return int(parts[0], 16), int(parts[1], 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None


def with_visibility(bus: PciBus, proc_buses: Iterable[str]) -> PciBus:
    """BUS with the GPUs bound to nvidia that the driver's /proc/driver/nvidia/gpus does not list
    set apart, when it lists any: in a container given some of the GPUs, the NVIDIA container
    toolkit shows only those there (libnvidia-container src/nvc_mount.c: mount_procfs puts a tmpfs
    over /proc/driver/nvidia, mount_procfs_gpu binds each given GPU's gpus/BUSID into it), while
    sysfs shows every GPU of the host."""
    shown = {pci_key(b) for b in proc_buses}
    if not bus.readable or not shown:
        return bus
    hidden = [g for g in bus.gpus if g.driver == NVIDIA_DRIVER and pci_key(g.address) not in shown]
    if not hidden:
        return bus
    keep = tuple(g for g in bus.gpus if g not in hidden)
    return PciBus(bus.root, bus.readable, bus.note, keep, tuple(g.address for g in hidden))


def not_on_bus(gpus: Sequence[Gpu], bus: PciBus) -> list[Gpu]:
    """GPUs the driver lists that the bus does not show (empty when the bus is not readable). A GPU
    whose bus id the driver could not give (lost before its PCI info was read) is not among them."""
    if not bus.readable:
        return []
    on_bus = {address_key(g.address) for g in bus.gpus} | {address_key(a) for a in bus.not_visible}
    return [g for g in gpus if address_key(g.bus_id) is not None and address_key(g.bus_id) not in on_bus]


def disagreement(gpus: Sequence[Gpu], bus: PciBus) -> str | None:
    """The error when the driver lists a GPU the bus does not show: the two readings cannot both be
    this machine's (a sysfs of another namespace or machine), so neither is judged."""
    missing = not_on_bus(gpus, bus)
    if not missing:
        return None
    named = ", ".join(g.label for g in missing)
    return (f"the driver lists {named}, which {os.path.join(bus.root, 'devices')} does not show"
            f" ({len(bus.gpus)} NVIDIA GPU{'s' if len(bus.gpus) != 1 else ''} there): this sysfs is not the "
            f"GPUs' machine, or the bus changed while it was read; check `lspci -D -d 10de:` against `nvidia-smi -L`")


def counted(bus: PciBus) -> list[BusGpu]:
    """The bus's GPUs the declared count is held against: those meant for the NVIDIA driver."""
    return [g for g in bus.gpus if g.for_this_host]


def unlisted(gpus: Sequence[Gpu], bus: PciBus) -> list[BusGpu]:
    """GPUs on the bus, meant for the NVIDIA driver, that it does not list: fallen off the bus.
    While the driver lists as many GPUs without a bus id (lost before their PCI info was read: their
    own verdict names them) as the bus has unlisted, those are taken to be the same GPUs."""
    listed = {address_key(g.bus_id) for g in gpus}
    out = [b for b in counted(bus) if address_key(b.address) not in listed]
    return [] if len(out) <= sum(1 for g in gpus if address_key(g.bus_id) is None) else out


def field_of(b: BusGpu) -> str:
    """The drift field of a GPU known only by its bus address, as health.unlisted_events' are."""
    return f"gpu@{pci_key(b.address)}.healthy"


def bus_drift(spec: Mapping[str, Any], observed: GpusObserved) -> list[Drift]:
    bus = observed.pci_bus
    if bus is None:
        return []
    out = []
    if spec.get("count") is not None:
        have: Any = len(counted(bus)) if bus.readable else UNKNOWN
        if have != spec["count"]:
            out.append(Drift("pci_count", spec["count"], have))
    if spec.get("healthy"):
        out.extend(Drift(field_of(b), True, False) for b in unlisted(observed.gpus, bus))
    return out


def _driver_words(b: BusGpu) -> str:
    return "bound to the nvidia driver" if b.driver else "bound to no driver (the NVIDIA driver did not take it)"


def bus_blocked(spec: Mapping[str, Any], observed: GpusObserved, fields: Iterable[str], named: Iterable[str]
                ) -> list[str]:
    """One line per bus drift; NAMED: drift fields another line already names (a kernel-log event
    for the same address, which says the same with its Xid)."""
    bus = observed.pci_bus
    fields, named = set(fields), set(named)
    if bus is None:
        return []
    out = []
    if "pci_count" in fields:
        if not bus.readable:
            out.append(f"expected {spec['count']} GPUs; the PCI bus could not be read, so how many are on it is "
                       f"unknown: {bus.note}")
        else:
            mine = counted(bus)
            out.append(f"expected {spec['count']} GPUs, the PCI bus shows {len(mine)} NVIDIA GPU"
                       f"{'s' if len(mine) != 1 else ''} ({', '.join(b.address for b in mine) or 'none'}): "
                       "a person must check the hardware (lspci -D -d 10de:, the BMC's inventory)")
    step = step_text(FALLEN_OFF_ACTION)
    for b in unlisted(observed.gpus, bus):
        if field_of(b) in fields and field_of(b) not in named:
            out.append(f"the GPU at PCI {b.address} (device {b.device}), {_driver_words(b)}, is on the PCI bus but "
                       f"the driver does not list it: it has fallen off the bus (no Xid needed) and must not run "
                       f"jobs: {step}. [as Xid 79 in the NVIDIA Xid catalogue: {FALLEN_OFF_ACTION}]")
    return out


def bus_caveats(observed: GpusObserved) -> tuple[str, ...]:
    """What the bus reading could not prove, whatever the status (Plan.caveats)."""
    bus = observed.pci_bus
    if bus is None or bus.readable:
        return ()
    return (f"PCI bus not read ({bus.note}): a GPU gone from the driver without an Xid would not be seen",)


def bus_notes(observed: GpusObserved) -> list[str]:
    """GPUs on the bus set apart from the count, and why."""
    bus = observed.pci_bus
    if bus is None or not bus.readable:
        return []
    lines = [f"PCI bus: the GPU at {b.address} is bound to {b.driver}, not to the NVIDIA driver: not counted "
             "(passed through to a VM?)" for b in bus.gpus if not b.for_this_host]
    if bus.not_visible:
        n = len(bus.not_visible)
        lines.append(f"PCI bus: {n} GPU{'s' if n != 1 else ''} of this machine not given to this container "
                     f"({', '.join(bus.not_visible)}): not counted")
    return lines
