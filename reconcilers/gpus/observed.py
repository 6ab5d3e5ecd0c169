"""What the gpus kind observes: each GPU, what holds its memory, what the kernel log says about
it, and the verdict on its health."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # An annotation only: importing it runs the containers kind's package (its engines, cgroups);
    # an observation that names a container brings it in when it is unpickled.
    from ..containers.observed import ContainerRef

MIB = 2**20
NVIDIA_DRIVER = "nvidia"  # the kernel module's PCI driver name (nvidia.ko registers "nvidia")


@dataclass(frozen=True)
class Signal:
    """One reason a job must not run on a GPU, and the step a person must take for it."""

    what: str  # "Xid 79 at [ 4254.197860]: GPU has fallen off the bus"
    action: str  # a catalogue.STEPS key: RESTART_BM, RESET_GPU, CONTACT_SUPPORT, ...
    step: str  # catalogue.step_text(action): "reboot the node"
    source: str = ""  # where it comes from: "NVIDIA Xid catalogue: RESTART_BM", "NVML recovery action"


@dataclass(frozen=True)
class MigInstance:
    """One MIG instance of a GPU, with its own memory."""

    gpu_instance: int
    compute_instance: int | None
    memory_total: int | None  # bytes
    memory_used: int | None


@dataclass(frozen=True)
class GpuSettings:
    """A GPU's settings as the driver reports them; only those the state declares are read.

    None: not read, not supported, or not readable: `unsupported` and `unreadable` say which
    setting and why. Persistence mode and the current MIG mode are Gpu's own fields."""

    power_limit_mw: int | None = None  # nvmlDeviceGetPowerManagementLimit, milliwatts
    power_default_mw: int | None = None
    power_min_mw: int | None = None  # nvmlDeviceGetPowerManagementLimitConstraints
    power_max_mw: int | None = None
    compute_mode: str | None = None  # default, exclusive_process, prohibited (exclusive_thread: removed)
    application_clocks: tuple[int, int] | None = None  # (memory, graphics) MHz
    default_application_clocks: tuple[int, int] | None = None
    # What the GPU supports: (memory clock, its graphics clocks), MHz.
    supported_clocks: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    graphics_clock: int | None = None  # the graphics clock now, MHz (nvmlDeviceGetClockInfo)
    # NVML has no getter for locked clocks: what reconcile set since the driver last loaded,
    # (min, max) MHz or "none"; None: no such record (docs/gpus.md#locked-clocks).
    locked_clocks: tuple[int, int] | str | None = None
    locked_at: str = ""  # when reconcile set them
    mig_pending: bool | None = None  # nvmlDeviceGetMigMode's pending mode (current: Gpu.mig)
    ecc: bool | None = None  # nvmlDeviceGetEccMode: current
    ecc_pending: bool | None = None  # takes effect at the next reboot
    unsupported: tuple[tuple[str, str], ...] = ()  # (setting, why): NOT_SUPPORTED, deprecated, not in this driver
    unreadable: tuple[tuple[str, str], ...] = ()  # (setting, the error)

    def why_unsupported(self, setting: str) -> str | None:
        return next((why for name, why in self.unsupported if name == setting), None)

    def why_unreadable(self, setting: str) -> str | None:
        return next((why for name, why in self.unreadable if name == setting), None)


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver reports it, and the health judged from it."""

    index: int
    name: str
    uuid: str
    bus_id: str
    # Bytes. None: the GPU does not report it (unified memory: GB10/DGX Spark, Grace), or it could
    # not be read: never 0. `used` is NVML v2's where the driver has it (excludes the reservation).
    memory_total: int | None
    memory_used: int | None
    temperature_c: int | None = None
    power_w: float | None = None
    # Memory health, as NVML/nvidia-smi report it; None: not supported on this GPU, or not read.
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None  # None under MIG: NVML does not report it then
    remapped_rows_failure: bool | None = None
    recovery_action: int | None = None  # NVML_GPU_RECOVERY_ACTION_* (0 none); -1: a value not known here
    lost: str | None = None  # NVML/nvidia-smi: "GPU is lost", "GPU requires reset" (from any call)
    read_errors: tuple[str, ...] = ()  # queries that failed (not merely unsupported): health unknown
    processes_listed: bool = True  # False: the process lists could not be read (who holds it is unknown)
    minor: int | None = None  # /dev/nvidiaN, the driver's number (NVML or /proc/driver/nvidia); None: not known
    mig: bool | None = None  # MIG mode (current); None: not supported
    mig_instances: tuple[MigInstance, ...] = ()
    # What the declared checks read (docs/gpus.md#checks); None: not reported by this GPU/driver.
    ecc_corrected_volatile: int | None = None
    vbios: str | None = None
    persistence_mode: bool | None = None
    pcie_gen: int | None = None  # current (drops at idle to save power)
    pcie_gen_max: int | None = None  # what this GPU in this slot can reach (GPU and system)
    pcie_gen_gpu_max: int | None = None  # the GPU's own maximum
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    clock_events: tuple[str, ...] | None = None  # active clock-event (throttle) reasons
    settings: GpuSettings | None = None  # None: no setting declared, none read
    nvlink_links: int | None = None  # links the GPU has (0: none)
    nvlink_down: tuple[int, ...] | None = None  # links that are not active
    # The verdict (health.py): healthy, unhealthy, unknown; the reasons and the step to take first.
    health: str = "unknown"
    problems: tuple[str, ...] = ()
    signals: tuple[Signal, ...] = ()
    step: str = ""

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.bus_id})"


@dataclass(frozen=True)
class GpuUse:
    """A process's use of one GPU (or one MIG instance of it)."""

    gpu: int  # NVML index
    used_bytes: int | None  # None: not reported (a device-file holder, NVML_VALUE_NOT_AVAILABLE, [N/A])
    gpu_instance: int | None = None  # MIG GPU instance the process runs in


@dataclass(frozen=True)
class Holder:
    """A process that holds GPU memory (NVML) or a GPU device file (/proc/PID/fd)."""

    pid: int
    name: str  # /proc/PID/comm ("" when the process is not visible from here): shown, never trusted
    exe: str = ""  # basename of argv[0]: shown, never trusted
    unit: str | None = None  # the system service it belongs to (/proc/PID/cgroup)
    starttime: int | None = None  # /proc/PID/stat field 22: guards against a reused PID
    uses: tuple[GpuUse, ...] = ()
    device_files: tuple[str, ...] = ()
    visible: bool = True  # False: NVML names a PID this /proc does not show (another PID namespace)
    # The container it runs in (/proc/PID/cgroup), with what its engine says of it; None: none.
    container: ContainerRef | None = None
    # The program it runs (/proc/PID/exe) when only root could have put it there (procfs.trusted_exe),
    # else "": what `allow`'s name globs and the NVIDIA tools' exemption are decided by.
    path: str = ""

    def label(self) -> str:
        where = f" in {self.container.label()}" if self.container is not None else ""
        return f"{self.pid} ({self.name or '?'}){where}"


@dataclass(frozen=True)
class KernelEvent:
    """A driver message about a GPU in the kernel log: an Xid, or a GPU fallen off the bus without one.

    Repeats of the same fault are one event with a count (an Xid storm is thousands of lines);
    fold.py says which lines are the same fault."""

    pci: str  # "0000:3b:00" (domain:bus:device), as the driver prints it
    xid: int | None  # None: "fallen off the bus" without an Xid number
    detail: str  # the message after the number, pid=/name= left out
    first: str = ""  # when, as the log prints it ("[ 4254.197860]", "[Sun Feb 23 16:24:18 2025]")
    last: str = ""
    count: int = 1
    gpu_instance: int | None = None  # MIG: "(PCI:0000:01:00 GPU-I:05)"
    current: bool = True  # False: before the GPU was last initialised (boot, driver load, reset): history
    keep_off: bool = False  # NVIDIA's catalogue (and the line) say a job must not run on the GPU
    action: str = ""  # the step's catalogue action: RESET_GPU, RESTART_BM, RESTART_APP, IGNORE, ...
    step: str = ""
    why: str = ""  # what decided it: "Xid 48: WORKFLOW_XID_48", "Xid 94: RESTART_APP; the driver says RST: Yes"
    varies: bool = False  # folded lines differ from `detail` (the first's) in hexadecimal values (addresses)

    def describe(self) -> str:
        what = f"Xid {self.xid}" if self.xid is not None else "GPU has fallen off the bus (no Xid number)"
        when = f" at {self.first}" if self.first else ""
        varies = ", addresses vary" if self.varies else ""
        times = f" ({self.count} times, last {self.last}{varies})" if self.count > 1 else ""
        return f"{what}{when}{times}" + (f": {self.detail}" if self.detail and self.xid is not None else "")


@dataclass(frozen=True)
class KernelLog:
    """Where the kernel log was read from, whether all of this boot's was, and what this read added."""

    source: str  # "/dev/kmsg", "journalctl -k -b 0", a file (RECONCILE_KERNEL_LOG); "" when not read
    readable: bool = True
    complete: bool = True  # False: it does not reach back to boot (ring buffer rotated)
    note: str = ""  # why not readable / not complete
    last_init: str = ""  # the latest boot/driver-load line it holds: Xids before it are history
    # Lines the source no longer held when they were to be read (the ring buffer wrapped, the
    # journal was vacuumed past the cursor) since the last boot or driver load: "between X and Y".
    lost: str = ""
    lines_read: int = 0  # lines this read parsed: only what is new since the last read when it went on
    resumed: bool = False  # True: this read went on from the record of the last one (kernel_log.py)


@dataclass(frozen=True)
class GpusObserved:
    """The host's GPUs, who holds them, and the driver's messages about them."""

    source: str  # "nvml" or "nvidia-smi"
    driver_version: str
    gpus: tuple[Gpu, ...]
    holders: tuple[Holder, ...] = ()
    xids: tuple[KernelEvent, ...] = ()  # every driver message about a GPU in this boot's kernel log
    notes: tuple[str, ...] = ()
    cuda_version: str | None = None  # the CUDA version the driver supports ("13.1")
    kernel_log: KernelLog | None = None
    settings_host: SettingsHost | None = None  # None: no setting declared
    recovery: RecoveryHost | None = None  # None: neither `recover` nor `validate` declared
    pci_bus: PciBus | None = None  # the NVIDIA GPUs on the PCI bus (pcibus.py); None: not read


@dataclass(frozen=True)
class SettingsHost:
    """What setting the GPUs depends on beyond the GPUs: nvidia-persistenced.service, this boot."""

    # nvidia-persistenced.service as systemd reports it; None: not installed, or systemd could not
    # be asked (`persistenced_note` says why). Read only when persistence_mode is declared.
    persistenced: Any = None  # common.systemd.UnitObserved
    persistenced_note: str = ""
    boot_id: str = ""  # /proc/sys/kernel/random/boot_id: locked clocks recorded in another boot are gone
    driver_load: str = ""  # the kernel log's last boot/driver-load line: the same for a driver reload


@dataclass(frozen=True)
class RecoveryHost:
    """What recovering the GPUs depends on beyond the GPUs (recovery.py, gate.py): this boot, whether
    the GPUs are reset only together, and the validation gate's result in this boot."""

    boot_id: str = ""  # /proc/sys/kernel/random/boot_id ($RECONCILE_BOOT_ID_FILE)
    nvswitches: tuple[str, ...] = ()  # NVSwitch devices: GPUs reset only together, with the fabric manager
    gate: Any = None  # gate.GateResult of this boot; None: the gate has not run in this boot
    # nvidia-persistenced.service as systemd reports it (read when `recover.reset` is declared): a
    # reset turns persistence mode off through it when it runs; None: not installed or not known.
    persistenced: Any = None


@dataclass(frozen=True)
class BusGpu:
    """One NVIDIA display or 3D controller on the PCI bus."""

    address: str  # as sysfs names it: "0000:3b:00.0"
    device: str  # the PCI device id: "0x2330"
    pci_class: str  # "0x030200"
    driver: str | None  # the bound driver ("nvidia", "vfio-pci"); None: none

    @property
    def for_this_host(self) -> bool:
        """Meant for the NVIDIA driver here: bound to it, or to nothing (its probe did not take it)."""
        return self.driver in (None, NVIDIA_DRIVER)


@dataclass(frozen=True)
class PciBus:
    """What sysfs shows of the NVIDIA GPUs on the PCI bus; `readable` False: nothing is known."""

    root: str
    readable: bool = True
    note: str = ""  # why it is not readable
    gpus: tuple[BusGpu, ...] = ()
    # GPUs the driver's /proc lists other GPUs but not these: a container given some of the GPUs.
    not_visible: tuple[str, ...] = ()
