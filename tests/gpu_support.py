"""Helpers for the GPU tests: build the fake libnvidia-ml.so.1, write its config,
start stand-in GPU processes and read the fake "GPUs" back through the real pynvml.

Imported by name (tests/ is on sys.path under pytest's default import mode).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FAKE_SRC = tuple(HERE / "fakenvml" / f for f in ("fakenvml.c", "fakenvml_procs.c", "fakenvml_more.c",
                                                 "fakenvml_errors.c", "fakenvml_settings.c"))
HOLDER = HERE / "fakenvml" / "holder.py"
DATA = HERE / "data" / "gpus"
SEED_TOTAL_MIB = 97887  # RTX PRO 6000 Blackwell, as nvidia-smi showed it on the seed host
SEED_GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


# nvml.h's prototypes are the fake's: a function whose prototype differs from the header's is a compile
# error (C's "conflicting types"), and so is one the header does not declare (missing-prototypes).
FAKE_CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wno-format-truncation", "-Werror=missing-prototypes",
               "-Werror=incompatible-pointer-types", "-Werror=int-conversion",
               "-Werror=implicit-function-declaration")


def build_fake_nvml(outdir: Path, old_driver: bool = False, temperature_v: bool = True,
                    sources: Sequence[Path] = FAKE_SRC) -> Path:
    """Compile the fake against NVIDIA's nvml.h (tests/nvml_header.py: fetched into OUTDIR when not
    cached) into OUTDIR/libnvidia-ml.so.1; return OUTDIR (for LD_LIBRARY_PATH).
    OLD_DRIVER: a driver before 510 (no _v3 process lists, memory v2, nvmlDeviceGetTemperatureV or the
    clocks-event names); TEMPERATURE_V=False: a driver with all of those but nvmlDeviceGetTemperatureV.
    Raises OSError (nvml_header.NvmlHeaderUnavailable, no gcc) or CalledProcessError (with gcc's stderr)."""
    from nvml_header import include_dir

    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise FileNotFoundError("gcc not found")
    outdir.mkdir(parents=True, exist_ok=True)
    include = include_dir(outdir)
    cmd = [gcc, *FAKE_CFLAGS, f"-I{HERE / 'fakenvml'}", f"-I{include}", "-o", str(outdir / "libnvidia-ml.so.1"),
           *map(str, sources)]
    if old_driver:
        cmd.insert(1, "-DFAKE_OLD_DRIVER")
    if not temperature_v:
        cmd.insert(1, "-DFAKE_NO_TEMPERATURE_V")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
    return outdir


@dataclass
class FakeGpu:
    """One GPU of the fake (tests/fakenvml/fakenvml.c documents every key)."""

    name: str = SEED_GPU_NAME
    total_mib: int = SEED_TOTAL_MIB
    used_mib: int = 0
    reserved_mib: int = 0
    temp: int = 28
    power_mw: int = 84000
    ecc_volatile: int = 0
    ecc_corrected: int = 0
    retired_pending: int = 0
    remap_pending: int = 0
    remap_failure: int = 0
    unsupported: tuple[str, ...] = ()
    minor: int | None = None  # default: the index
    recovery: int = 0  # NVML_GPU_RECOVERY_ACTION_*
    vbios: str = "98.02.2E.00.01"
    persistence: int = 1
    clocks_event: int = 0x1  # GpuIdle
    pcie: tuple[int, int, int, int, int] = (5, 5, 5, 16, 16)  # gen, max gen, GPU max gen, width, max width
    nvlink: tuple[int, ...] | None = None  # one active flag per link; None: no NVLink
    mig: bool = False
    mig_instances: tuple[tuple[int, int, int], ...] = ()  # (gpu instance, compute instance, MiB)
    error: str = ""  # lost, reset_required, unknown, no_permission
    error_on: tuple[str, ...] = ()  # call names, "all" (the default with an error) or "handle"
    bus: str | None = None  # default 00000000:<11 + 16 i>:00.0
    broken: bool = False  # a reset does not mend it: its faults read the same after one
    # Settings keys of tests/fakenvml/fakenvml_settings.c, verbatim: power_limit_mw, compute_mode,
    # mem_clocks, gr_clocks, clock_gr, ecc, ecc_pending, mig_pending, ... (milliwatts, MHz).
    settings: dict[str, object] = field(default_factory=dict)
    fail: dict[str, str] = field(default_factory=dict)  # call -> error: that call alone fails so
    lose_on: str = ""  # the GPU falls off the bus at this call
    hang_on: str = ""  # this call blocks for an hour (a wedged driver)


@dataclass
class FakeHolder:
    mib: int
    gpus: Sequence[int]
    comm: str = ""
    cmdline: str = ""  # a substring of the command line, e.g. a holder's tag
    hidden: bool = False
    graphics: bool = False
    both: bool = False  # listed as compute and as graphics ("C+G")
    mem_na: bool = False  # usedGpuMemory NVML_VALUE_NOT_AVAILABLE
    gi: int | None = None  # MIG GPU instance


@dataclass
class FakeConfig:
    gpus: list[FakeGpu] = field(default_factory=list)
    holders: list[FakeHolder] = field(default_factory=list)
    driver: str = "590.48.01"
    cuda: int = 13010  # CUDA_VERSION encoding: 13.1
    init_error: str = ""  # lib_rm_mismatch, no_permission, driver_not_loaded
    hang_init_s: int = 0  # nvmlInit blocks this long, as on a wedged driver
    # The PCI bus (tests/pci_support.py), written beside the config (pci_root): the devices of a real
    # capture (tests/data/gpus/pci/) with its GPUs replaced by one at each listed GPU's bus id.
    pci_host: str = "gpud__azure-8x-a100__lspci-nn.txt"  # pci_support.DEFAULT_HOST
    off_bus: tuple[int, ...] = ()  # GPUs the fake NVML lists that the bus does not show
    bus_only: tuple[tuple[str, str | None], ...] = ()  # (slot, driver) of GPUs on the bus NVML does not list
    pci_tree: bool = True  # False: no tree at all (sysfs cannot be read)

    def text(self) -> str:
        head = f"driver version={self.driver} cuda={self.cuda}"
        if self.init_error:
            head += f" init_error={self.init_error}"
        if self.hang_init_s:
            head += f" hang_init_s={self.hang_init_s}"
        lines = [head]
        for i, g in enumerate(self.gpus):
            parts = [f'name="{g.name}"', f"uuid=GPU-{uuid.UUID(int=i + 1)}",
                     f"bus={g.bus or bus_of(i)}", f"total_mib={g.total_mib}",
                     f"used_mib={g.used_mib}", f"reserved_mib={g.reserved_mib}", f"temp={g.temp}",
                     f"power_mw={g.power_mw}", f"ecc_volatile={g.ecc_volatile}", f"ecc_corrected={g.ecc_corrected}",
                     f"retired_pending={g.retired_pending}", f"remap_pending={g.remap_pending}",
                     f"remap_failure={g.remap_failure}", f"recovery={g.recovery}", f"vbios={g.vbios}",
                     f"persistence={g.persistence}", f"clocks_event={g.clocks_event:#x}",
                     "pcie=" + ",".join(map(str, g.pcie)), f"mig={int(g.mig)}"]
            if g.minor is not None:
                parts.append(f"minor={g.minor}")
            if g.nvlink is not None:
                parts.append("nvlink=" + ",".join(map(str, g.nvlink)))
            if g.mig_instances:
                parts.append("mig_instances=" + ",".join(f"{a}:{b}:{c}" for a, b, c in g.mig_instances))
            if g.error:
                parts.append(f"error={g.error}")
            if g.error_on:
                parts.append("error_on=" + ",".join(g.error_on))
            if g.unsupported:
                parts.append("unsupported=" + ",".join(g.unsupported))
            parts.extend(f"{k}={v}" for k, v in g.settings.items())
            if g.fail:
                parts.append("fail=" + ",".join(f"{k}:{v}" for k, v in g.fail.items()))
            if g.lose_on:
                parts.append(f"lose_on={g.lose_on}")
            if g.hang_on:
                parts.append(f"hang_on={g.hang_on}")
            if g.broken:
                parts.append("broken=1")
            lines.append("gpu " + " ".join(parts))
        for h in self.holders:
            parts = [f"mib={h.mib}", "gpus=" + ",".join(str(g) for g in h.gpus),
                     f"hidden={int(h.hidden)}", f"graphics={int(h.graphics)}", f"both={int(h.both)}",
                     f"mem_na={int(h.mem_na)}"]
            if h.gi is not None:
                parts.append(f"gi={h.gi}")
            if h.comm:
                parts.append(f"comm={h.comm}")
            if h.cmdline:
                parts.append(f"cmdline={h.cmdline}")
            lines.append("holder " + " ".join(parts))
        return "\n".join(lines) + "\n"

    def write(self, path: Path, whole: bool = False) -> Path:
        """The config at PATH and its PCI bus beside it (pci_root). WHOLE: the config replaced by a
        rename, so that a reader never sees half of it (a watch or slurmd's health check running)."""
        if whole:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(self.text())
            os.replace(tmp, path)
        else:
            path.write_text(self.text())
        # The bus: a new tree each time, swapped in by renaming a link over CONFIG.pci, so that a
        # reconcile reading it while a test rewrites the config (a watch, slurmd's health check)
        # sees the old tree or the new one, never a half-written one. Old trees stay (tmp_path).
        link = Path(f"{path}.pci")
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        if self.pci_tree:
            import pci_support

            tree = Path(f"{path}.pci-{uuid.uuid4().hex[:12]}")
            pci_support.write_tree(tree / "sys", self.bus_devices())
            swap = Path(f"{tree}.link")
            swap.symlink_to(tree.name)
            os.replace(swap, link)
        elif link.is_symlink():
            link.unlink()
        return path

    def bus_devices(self) -> list:
        """The PCI devices of the fake's bus: the capture PCI_HOST's, its GPUs replaced by one at each
        listed GPU's bus id (bar off_bus) bound to nvidia, and one at each bus_only slot."""
        import pci_support

        gpus = [(slot_of(g.bus or bus_of(i)), "nvidia") for i, g in enumerate(self.gpus) if i not in self.off_bus]
        return pci_support.bus_with_gpus(self.pci_host, [*gpus, *self.bus_only])


def bus_of(i: int) -> str:
    """The fake's default PCI bus id of GPU i (00000000:11:00.0, 00000000:21:00.0, ...)."""
    return f"00000000:{0x11 + i * 0x10:02X}:00.0"


def slot_of(bus_id: str) -> str:
    """NVML's bus id (00000000:11:00.0) as sysfs names the device (0000:11:00.0)."""
    domain, rest = bus_id.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def pci_root(config: Path | str) -> Path:
    """The fake's /sys/bus/pci (RECONCILE_SYSFS_PCI), beside its config."""
    return Path(f"{config}.pci") / "sys" / "bus" / "pci"


def pci_of(i: int) -> str:
    """GPU i's address as the driver prints it in Xid lines (0000:11:00)."""
    return f"0000:{0x11 + i * 0x10:02x}:00"


def seed_gpus(n: int = 8, **kw) -> list[FakeGpu]:
    return [FakeGpu(**kw) for _ in range(n)]


def nvml_env(libdir: Path | None, config: Path | None) -> dict[str, str]:
    """Environment entries that point pynvml at the fake (None: no library at all), and the gpus
    kind's kernel log at an empty file beside the config (its state directory too): what this
    machine's ring buffer holds (it may no longer reach back to boot, which makes every GPU's
    health unknown) is not the test's input. A test that gives its own RECONCILE_KERNEL_LOG puts
    it after these."""
    env = {}
    if libdir is not None:
        env["LD_LIBRARY_PATH"] = str(libdir)
    if config is not None:
        env["FAKE_NVML_CONFIG"] = str(config)
        env["RECONCILE_SYSFS_PCI"] = str(pci_root(config))  # the fake's PCI bus, not this machine's
        # Nor this machine's /proc/driver/nvidia/gpus (a lent GPU host has one): the fake has none.
        env["RECONCILE_NVIDIA_PROC_DIR"] = f"{config}.proc-driver-nvidia-gpus"
        klog = Path(config).parent / "empty-kern.log"
        klog.touch()
        env["RECONCILE_KERNEL_LOG"] = str(klog)
        # The kernel log's read record and the locked-clock record: beside the config, never /var/lib.
        env["RECONCILE_STATE_DIR"] = str(Path(config).parent / "state")
    return env


def new_tag() -> str:
    return f"gpu-holder-{uuid.uuid4().hex[:12]}"


class Holders:
    """Stand-in GPU processes started by a test; every one is killed by PID at the end."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, tag: str, hold: Path | None = None, ignore_term: bool = False,
              program: Path | None = None, user: int | None = None) -> subprocess.Popen:
        """NAME: the process name it sets (comm); PROGRAM: the file it runs (a copy of Python, see
        program_copy; default this Python); USER: the uid it runs as (it then holds HOLD through
        its stdin, opened here: the test's folders are root's alone)."""
        argv = [str(program or sys.executable), str(HOLDER), name, tag]
        stdin: Any = subprocess.DEVNULL
        if hold is not None and user is None:
            argv += ["--hold", str(hold)]
        elif hold is not None:
            stdin = open(hold, "rb")  # noqa: SIM115 - closed below, once the child has its copy
        if ignore_term:
            argv.append("--ignore-term")
        ids: dict[str, Any] = {} if user is None else {"user": user, "group": user, "extra_groups": []}
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=stdin, text=True, **ids)
        finally:
            if stdin is not subprocess.DEVNULL:
                stdin.close()
        self.procs.append(proc)
        line = proc.stdout.readline()  # "ready": the name is set and the file is held
        assert line.strip() == "ready", f"holder {name} did not start: {line!r}"
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)  # our own child, by PID
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()


def program_copy(directory: Path, name: str, owner: int = 0) -> Path:
    """A copy of the Python running the tests at DIRECTORY/NAME (mode 0755), owned by OWNER: a
    program of that name, installed by root (owner 0, in root's folders) or by a user. Python finds
    its standard library by its compiled-in prefix, wherever the copy lies."""
    path = directory / name
    shutil.copyfile(os.path.realpath(sys.executable), path)
    os.chmod(path, 0o755)
    os.chown(path, owner, owner)
    return path


def proc_alive(pid: int) -> bool:
    """True while /proc shows the process and it is not a zombie (what `ps` would say)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


PYNVML_PROBE = textwrap.dedent("""
    import json, pynvml
    pynvml.nvmlInit()
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        except pynvml.NVMLError as exc:  # a lost GPU: what pynvml says instead of a reading
            out.append({"used_mib": None, "total_mib": None, "pids": None, "error": str(exc)})
            continue
        out.append({"used_mib": m.used // 2**20, "total_mib": m.total // 2**20,
                    "pids": sorted(p.pid for p in procs)})
    pynvml.nvmlShutdown()
    print(json.dumps(out))
""")


def pynvml_probe_argv() -> list[str]:
    """A python command that prints each GPU's used/total MiB and PIDs as pynvml sees them (or the
    error pynvml raises for it)."""
    return [sys.executable, "-c", PYNVML_PROBE]


def parse_probe(stdout: str) -> list[dict]:
    return json.loads(stdout.strip().splitlines()[-1])


def path_without(names: Iterable[str]) -> str:
    """$PATH minus the directories that hold any of NAMES (e.g. a real nvidia-smi)."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.path.exists(os.path.join(d, n)) for n in names)]
    return os.pathsep.join(dirs)


# --- running the CLI against the fake ---------------------------------------------------------------

def write_state(tmp: Path, body: str) -> Path:
    path = tmp / "state.yaml"
    path.write_text("version: 1\n" + textwrap.dedent(body))
    return path


def gpus_of(report: dict) -> dict:
    return next(r for r in report["resources"] if r["id"] == "gpus")


def gpus_report(proc) -> dict:
    from cli_support import report_of

    assert "Traceback" not in proc.stderr, proc.stderr
    return gpus_of(report_of(proc))


def fake_nvml_env(tmp: Path, lib: Path | None, config: Path | None, **env: str) -> dict[str, str]:
    """What the CLI's environment adds for the fake NVML (or none). The kernel log is an empty
    file unless the test gives one: what this machine's dmesg holds is not the test's input."""
    extra = nvml_env(lib, config)
    if lib is None:
        extra["LD_LIBRARY_PATH"] = ""
    if "RECONCILE_KERNEL_LOG" not in env:
        klog = tmp / "empty-kern.log"
        klog.touch()
        env["RECONCILE_KERNEL_LOG"] = str(klog)
    env.setdefault("RECONCILE_STATE_DIR", str(tmp / "state"))  # the locked-clock record, never /var/lib
    return {**extra, **env}


def cli(tmp: Path, lib: Path | None, config: Path | None, *args: str, **env: str):
    """The CLI on this host with the fake NVML (or none) in its environment (fake_nvml_env)."""
    from cli_support import run_cli

    return run_cli(tmp, *args, **fake_nvml_env(tmp, lib, config, **env))


def cli_json(tmp: Path, lib: Path | None, config: Path | None, *args: str, runner=None, **env: str):
    """`reconcile ARGS --format json` with the fake NVML (cli_support.reconcile_json; RUNNER: a
    namespaced systemd to run it in): code, report, stderr."""
    from cli_support import reconcile_json

    return reconcile_json(tmp, *args, runner=runner, **fake_nvml_env(tmp, lib, config, **env))


# --- settings: what the fake driver holds, what was called, resets and reboots ----------------------

def setter_calls(config: Path) -> list[tuple[str, int, str, str]]:
    """The fake's call log ($FAKE_NVML_CONFIG.calls): (NVML function, GPU index, arguments, result)
    for every setter called (and every test-made reset or reboot), in order."""
    path = Path(f"{config}.calls")
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        head, _, result = line.rpartition(" -> ")
        call, gpu, *args = head.split(" ")
        out.append((call, int(gpu.split("=", 1)[1]), " ".join(args), result))
    return out


def _ctypes_call(lib: Path, config: Path, expr: str) -> int:
    code = f"import ctypes, sys\nlib = ctypes.CDLL('libnvidia-ml.so.1')\nsys.exit({expr})\n"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **nvml_env(lib, config)},
                          capture_output=True, text=True, timeout=60)
    return proc.returncode


def reset_gpu(lib: Path, config: Path, index: int) -> int:
    """What `nvidia-smi -r -i INDEX` does to the fake: a pending MIG mode becomes current, clocks set on
    it are lost, volatile ECC counts, pending remaps and retirements and the recovery action are cleared
    (unless the GPU is `broken`); refused (19, NVML_ERROR_IN_USE) while a process holds it or persistence
    mode is on, and (15, GPU_IS_LOST) for a lost GPU. Returns NVML's code. tests/fakenvml/bin/nvidia-smi
    is the same as a command, with nvidia-smi's words."""
    return _ctypes_call(lib, config, f"lib.fake_nvml_reset_gpu({int(index)})")


def reboot(lib: Path, config: Path) -> int:
    """What a reboot does to the fake: pending MIG/ECC modes become current; power limits, compute
    modes, clocks and persistence mode are lost."""
    return _ctypes_call(lib, config, "lib.fake_nvml_reboot()")


SETTINGS_PROBE = textwrap.dedent("""
    import json, sys, pynvml as n
    n.nvmlInit()
    def get(fn, *a):
        try:
            return fn(*a)
        except n.NVMLError as exc:
            return "error: " + str(exc)
    out = []
    for i in range(n.nvmlDeviceGetCount()):
        try:
            h = n.nvmlDeviceGetHandleByIndex(i)
        except n.NVMLError as exc:  # a lost GPU: every reading is what pynvml says instead
            out.append(dict.fromkeys(("persistence_mode", "power_limit_mw", "compute_mode", "application_clocks",
                                      "graphics_clock", "mig", "ecc"), "error: " + str(exc)))
            continue
        out.append({
            "persistence_mode": get(n.nvmlDeviceGetPersistenceMode, h),
            "power_limit_mw": get(n.nvmlDeviceGetPowerManagementLimit, h),
            "compute_mode": get(n.nvmlDeviceGetComputeMode, h),
            "application_clocks": [get(n.nvmlDeviceGetApplicationsClock, h, n.NVML_CLOCK_MEM),
                                   get(n.nvmlDeviceGetApplicationsClock, h, n.NVML_CLOCK_GRAPHICS)],
            "graphics_clock": get(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_GRAPHICS),
            "mig": get(n.nvmlDeviceGetMigMode, h),
            "ecc": get(n.nvmlDeviceGetEccMode, h),
        })
    n.nvmlShutdown()
    print(json.dumps(out))
""")


def nvml_settings(lib: Path, config: Path, runner=None) -> list[dict]:
    """Each GPU's settings as pynvml reads them from the fake (the driver's own answer, in a process
    of the test's): persistence, power limit (mW), compute mode, application clocks [memory,
    graphics], the current graphics clock, MIG and ECC [current, pending]; "error: ..." where NVML
    refuses. RUNNER(argv, env) runs it elsewhere (inside a namespace); default: here."""
    argv = [sys.executable, "-c", SETTINGS_PROBE]
    env = {**os.environ, **nvml_env(lib, config)}
    if runner is None:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True)
    else:
        proc = runner(argv, env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def nvml_do(lib: Path, config: Path, code: str) -> None:
    """Run pynvml CODE against the fake as an operator would with nvidia-smi (`h(i)` is GPU i's
    handle; root is needed for setters, as on a real driver)."""
    prog = "import pynvml as n\nn.nvmlInit()\nh = n.nvmlDeviceGetHandleByIndex\n" + textwrap.dedent(code) + \
        "\nn.nvmlShutdown()\n"
    subprocess.run([sys.executable, "-c", prog], env={**os.environ, **nvml_env(lib, config)}, check=True,
                   capture_output=True, text=True, timeout=60)


def persistenced_unit(lib: Path, config: Path, pidfile: str = "/run/nvidia-persistenced.pid") -> str:
    """nvidia-persistenced.service as NVIDIA's sample unit has it (Type=forking with a PID file,
    WantedBy=multi-user.target), running the stand-in daemon tests/fakenvml/persistenced.py on the
    fake driver."""
    return (f"[Unit]\nDescription=NVIDIA Persistence Daemon (stand-in)\n[Service]\nType=forking\n"
            f"PIDFile={pidfile}\nEnvironment=LD_LIBRARY_PATH={lib} FAKE_NVML_CONFIG={config}\n"
            f"ExecStart={sys.executable} {HERE / 'fakenvml' / 'persistenced.py'} {pidfile}\n"
            "[Install]\nWantedBy=multi-user.target\n")
