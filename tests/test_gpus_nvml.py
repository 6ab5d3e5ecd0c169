"""What real hardware does that a happy-path fake would not, through the real pynvml and the fake
libnvidia-ml.so.1 (tests/fakenvml/fakenvml.c), the CLI as a user runs it, real processes holding
device files and fake "GPU memory". The expected answers come from pynvml itself where it can
say (tests/gpu_support.py's probe), from /proc for the processes."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import gpu_support as gs
import pytest

cli, write_state, gpus_report = gs.cli, gs.write_state, gs.gpus_report


def pynvml(lib: Path, config: Path, code: str) -> str:
    """Run CODE (pynvml imported as n, initialised) against the fake; its stdout."""
    env = {**os.environ, **gs.nvml_env(lib, config)}
    src = "import pynvml as n\nn.nvmlInit()\n" + textwrap.dedent(code)
    return subprocess.run([gs.sys.executable, "-c", src], env=env, capture_output=True, text=True, timeout=30,
                          check=True).stdout.strip()


def diff(tmp: Path, lib: Path, config: Path, state: str, **env: str) -> tuple[int, dict]:
    proc = cli(tmp, lib, config, "diff", str(write_state(tmp, state)), "--format", "json", **env)
    return proc.returncode, gpus_report(proc)


def devices(tmp: Path, n: int) -> tuple[Path, dict[str, str]]:
    d = tmp / "dev"
    d.mkdir()
    for i in range(n):
        (d / f"nvidia{i}").write_bytes(b"")
    (d / "nvidiactl").write_bytes(b"")
    return d, {"RECONCILE_NVIDIA_DEV_GLOB": str(d / "nvidia*")}


# --- device files, memory, process lists ---------------------------------------------------------

def test_device_files_map_by_minor_number_not_index(tmp_path, fake_lib, holders):
    """Minors 3,2,1,0 (the 8x RTX 4090 hosts' order): /dev/nvidia0 is GPU 3, /dev/nvidia3 is GPU 0."""
    gpus = gs.seed_gpus(4)
    for i, g in enumerate(gpus):
        g.minor = 3 - i
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gpus, holders=[gs.FakeHolder(mib=30000, gpus=[3], cmdline=tag, hidden=True)]
                           ).write(tmp_path / "nvml.conf")
    assert pynvml(fake_lib, config, "print([n.nvmlDeviceGetMinorNumber(n.nvmlDeviceGetHandleByIndex(i)) "
                                    "for i in range(4)])") == "[3, 2, 1, 0]"
    dev, env = devices(tmp_path, 4)
    busy = holders.start("vllm-worker", tag, hold=dev / "nvidia0")  # minor 0: GPU 3, the busy one
    idle = holders.start("vllm-idle", gs.new_tag(), hold=dev / "nvidia3")  # minor 3: GPU 0, idle
    state = "gpus:\n  max_memory_used: 0MiB\n  free_with: {kill: [\"vllm*\"], grace: 1s}\n"
    code, gpus_ = diff(tmp_path, fake_lib, config, state, **env)
    assert [a["description"] for a in gpus_["actions"]] == [
        f"terminate {busy.pid} (vllm-worker) holding {dev}/nvidia0 on GPU 3 (memory not reported by NVML)"]
    on = {h["pid"]: [u["gpu"] for u in h["uses"]] for h in gpus_["observed"]["holders"]}
    assert on[busy.pid] == [3] and on[idle.pid] == [0]


def test_unknown_minor_numbers_tie_no_device_file_to_a_gpu(tmp_path, fake_lib, holders):
    gpus = gs.seed_gpus(2, unsupported=("minor",))
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gpus, holders=[gs.FakeHolder(mib=30000, gpus=[1], cmdline=tag, hidden=True)]
                           ).write(tmp_path / "nvml.conf")
    dev, env = devices(tmp_path, 2)
    holder = holders.start("vllm-worker", tag, hold=dev / "nvidia1")
    code, gpus_ = diff(tmp_path, fake_lib, config, "gpus:\n  max_memory_used: 0MiB\n  free_with: {kill: [\"*\"]}\n",
                       **env)
    assert code == 2 and gpus_["status"] == "blocked" and gpus_["actions"] == []
    assert "GPU 1: 30000MiB held by no process visible here" in gpus_["message"]
    assert "its minor number is unknown" in gpus_["message"]
    assert holder.poll() is None


def test_unified_memory_not_supported_is_judged_from_processes(tmp_path, fake_lib, holders):
    """GB10 / DGX Spark: NVML reports no framebuffer memory (NOT_SUPPORTED); a process outside
    `allow` holding 19 GiB under max_memory_used: 0MiB is drift, never ok."""
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=[gs.FakeGpu(name="NVIDIA GB10", unsupported=("memory",))],
                           holders=[gs.FakeHolder(mib=19456, gpus=[0], cmdline=tag)]).write(tmp_path / "nvml.conf")
    assert "NotSupported" in pynvml(fake_lib, config, """
        try:
            n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0), version=n.nvmlMemory_v2)
        except n.NVMLError as e:
            print(type(e).__name__)""")
    stray = holders.start("python-stray", tag)
    state = "gpus:\n  max_memory_used: 0MiB\n  free_with: {kill: [\"python*\"], grace: 1s}\n  settle: 5s\n"
    code, gpus_ = diff(tmp_path, fake_lib, config, state)
    assert gpus_["drift"] == [{"field": "gpu0.memory_used", "want": "<= 0MiB", "have": "19456MiB"}]
    assert gpus_["observed"]["gpus"][0]["memory_used"] is None
    assert [a["target"] for a in gpus_["actions"]] == [f"pid {stray.pid}"]
    proc = cli(tmp_path, fake_lib, config, "apply", str(tmp_path / "state.yaml"), "--format", "json",
               "--journal", str(tmp_path / "journal.jsonl"))
    assert proc.returncode == 0 and gpus_report(proc)["status"] == "ok"
    assert stray.wait(timeout=10) == -15


def test_per_process_memory_not_available_is_unknown_not_zero(tmp_path, fake_lib, holders):
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=[gs.FakeGpu(name="NVIDIA GB10", unsupported=("memory",))],
                           holders=[gs.FakeHolder(mib=19456, gpus=[0], cmdline=tag, mem_na=True)]
                           ).write(tmp_path / "nvml.conf")
    holder = holders.start("python-job", tag)
    assert pynvml(fake_lib, config, "print(n.nvmlDeviceGetComputeRunningProcesses(n.nvmlDeviceGetHandleByIndex(0))"
                                    "[0].usedGpuMemory)") == "None"  # NVML_VALUE_NOT_AVAILABLE
    code, gpus_ = diff(tmp_path, fake_lib, config, "gpus:\n  max_memory_used: 0MiB\n  free_with: {kill: [\"*\"]}\n")
    assert code == 2 and gpus_["status"] == "blocked" and gpus_["actions"] == []
    assert gpus_["drift"] == [{"field": "gpu0.memory_used", "want": "<= 0MiB", "have": "unknown"}]
    assert f"{holder.pid} (python-job) holds it without reporting how much" in gpus_["message"]


def test_process_in_both_lists_is_counted_once(tmp_path, fake_lib, holders):
    """C+G: NVML lists it as compute and as graphics, its memory in each. Counted twice, an allowed
    holder would hide 10 GB held by someone else."""
    allowed_tag, other_tag = gs.new_tag(), gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), holders=[
        gs.FakeHolder(mib=10000, gpus=[0], cmdline=allowed_tag, both=True),
        gs.FakeHolder(mib=10000, gpus=[0], cmdline=other_tag, hidden=True)]).write(tmp_path / "nvml.conf")
    mine = holders.start("eagle3-extract", allowed_tag, program=gs.program_copy(tmp_path, "eagle3-extract"))
    holders.start("someone-else", other_tag)
    lists = pynvml(fake_lib, config, """
        h = n.nvmlDeviceGetHandleByIndex(0)
        print([p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
              [p.pid for p in n.nvmlDeviceGetGraphicsRunningProcesses(h)])""")
    assert lists == f"[{mine.pid}] [{mine.pid}]"
    code, gpus_ = diff(tmp_path, fake_lib, config, "gpus:\n  max_memory_used: 0MiB\n  allow: [\"eagle3*\"]\n")
    assert gpus_["drift"] == [{"field": "gpu0.memory_used", "want": "<= 0MiB", "have": "10000MiB"}]
    (me,) = [h for h in gpus_["observed"]["holders"] if h["pid"] == mine.pid]
    assert me["uses"] == [{"gpu": 0, "used_bytes": 10000 * 2**20, "gpu_instance": None}]


# --- lost GPUs, init failures ----------------------------------------------------------------------

@pytest.mark.parametrize("error, on, step", [
    ("lost", ("handle",), "reboot the node"),
    ("lost", ("memory", "processes"), "reboot the node"),
    ("reset_required", ("processes",), "reset the GPU"),
])
def test_gpu_lost_or_needing_reset_from_any_call(tmp_path, fake_lib, error, on, step):
    gpus = gs.seed_gpus(2)
    gpus[1].error, gpus[1].error_on = error, on
    config = gs.FakeConfig(gpus=gpus).write(tmp_path / "nvml.conf")
    code, gpus_ = diff(tmp_path, fake_lib, config, "gpus:\n  count: 2\n  max_memory_used: 0MiB\n  healthy: true\n")
    assert code == 2 and gpus_["status"] == "blocked"
    assert {"field": "gpu1.healthy", "want": True, "have": False} in gpus_["drift"]
    memory_unknown = {"field": "gpu1.memory_used", "want": "<= 0MiB", "have": "unknown"} in gpus_["drift"]
    assert memory_unknown == ("memory" in on or "handle" in on)  # the used memory itself still reads 0 MiB
    assert not any(d["field"] == "count" for d in gpus_["drift"])  # still counted
    assert f"GPU 1 ({gs.bus_of(1) if on != ('handle',) else '?'}) must not run jobs: {step}" in gpus_["message"]
    assert gpus_["observed"]["gpus"][0]["health"] == "healthy"


@pytest.mark.parametrize("init_error, said, hint", [
    ("lib_rm_mismatch", "RM has detected an NVML/RM version mismatch", "reboot the node, or reload the nvidia"),
    ("no_permission", "Insufficient Permissions", "run as root"),
    ("driver_not_loaded", "Driver Not Loaded", "modprobe nvidia"),
])
def test_nvml_init_failures_say_what_to_do(tmp_path, fake_lib, init_error, said, hint):
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), init_error=init_error).write(tmp_path / "nvml.conf")
    proc = cli(tmp_path, fake_lib, config, "diff", str(write_state(tmp_path, "gpus:\n  count: 1\n")),
               PATH=gs.path_without(["nvidia-smi"]))
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert said in proc.stdout and hint in proc.stdout and "nvidia-smi is not installed" in proc.stdout


# --- MIG, recovery action ----------------------------------------------------------------------------

def test_mig_gpu_counted_once_healthy_without_remapped_rows_and_xid_63_blocks(tmp_path, fake_lib, holders):
    tag = gs.new_tag()
    gpus = gs.seed_gpus(2)
    gpus[0].mig, gpus[0].mig_instances = True, ((1, 0, 40000), (2, 0, 40000))
    config = gs.FakeConfig(gpus=gpus, holders=[gs.FakeHolder(mib=12000, gpus=[0], cmdline=tag, gi=2)]
                           ).write(tmp_path / "nvml.conf")
    job = holders.start("python-mig", tag)
    assert "NotSupported" in pynvml(fake_lib, config, """
        try:
            n.nvmlDeviceGetRemappedRows(n.nvmlDeviceGetHandleByIndex(0))
        except n.NVMLError as e:
            print(type(e).__name__)""")
    code, gpus_ = diff(tmp_path, fake_lib, config, "gpus:\n  count: 2\n  healthy: true\n")
    assert code == 0 and gpus_["status"] == "ok", gpus_["message"]
    mig = gpus_["observed"]["gpus"][0]
    assert mig["mig"] is True and mig["health"] == "healthy" and mig["remapped_rows_pending"] is None
    assert [(i["gpu_instance"], i["memory_total"] // 2**20, i["memory_used"] // 2**20)
            for i in mig["mig_instances"]] == [(1, 40000, 0), (2, 40000, 12000)]
    assert mig["memory_used"] == 12000 * 2**20
    (h,) = [h for h in gpus_["observed"]["holders"] if h["pid"] == job.pid]
    assert h["uses"] == [{"gpu": 0, "used_bytes": 12000 * 2**20, "gpu_instance": 2}]
    # With MIG on, NVML cannot say a row remap is pending: Xid 63 since boot says it.
    klog = tmp_path / "kern.log"
    klog.write_text(f"[ 50.0] NVRM: Xid (PCI:{gs.pci_of(0)} GPU-I:02): 63, pid={job.pid}, Row Remapper: New row "
                    "marked for remapping, reset gpu to activate.\n"
                    f"[ 51.0] NVRM: Xid (PCI:{gs.pci_of(1)}): 63, pid=1, Row Remapper: New row marked\n")
    code, gpus_ = diff(tmp_path, fake_lib, config, "gpus:\n  count: 2\n  healthy: true\n",
                       RECONCILE_KERNEL_LOG=str(klog))
    assert code == 2 and [d["field"] for d in gpus_["drift"]] == ["gpu0.healthy"]  # GPU 1: NVML reports no pending
    assert f"GPU 0 ({gs.bus_of(0)}) must not run jobs: reset the GPU" in gpus_["message"]


@pytest.mark.parametrize("value, step", [(1, "reset the GPU"), (2, "reboot the node"),
                                         (3, "drain peer-to-peer traffic from the GPU"),
                                         (4, "drain the GPU's work, then reset the GPU")])
def test_recovery_action_field_names_the_step(tmp_path, fake_lib, value, step):
    gpus = gs.seed_gpus(2)
    gpus[1].recovery = value
    config = gs.FakeConfig(gpus=gpus).write(tmp_path / "nvml.conf")
    assert pynvml(fake_lib, config, "h = n.nvmlDeviceGetHandleByIndex(1)\n"
                                    "print(n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])"
                                    "[0].value.uiVal)") == str(value)
    code, gpus_ = diff(tmp_path, fake_lib, config, "gpus:\n  healthy: true\n")
    assert code == 2 and f"GPU 1 ({gs.bus_of(1)}) must not run jobs: {step}" in gpus_["message"]
    assert "[NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]" in gpus_["message"]


# --- the declared checks ------------------------------------------------------------------------------

CHECKS = """\
gpus:
  count: 4
  checks:
    driver: ">=590"
    cuda: ">=13.0"
    max_temperature: 85
    no_slowdown: true
    pcie: {min_gen: max, min_width: max}
    max_nvlink_down: 0
    max_ecc_corrected: 1000
    same_vbios: true
    persistence_mode: enabled
"""


def test_checks_pass_on_a_host_that_meets_them(tmp_path, fake_lib):
    gpus = gs.seed_gpus(4, nvlink=(1, 1, 1, 1))
    config = gs.FakeConfig(gpus=gpus).write(tmp_path / "nvml.conf")
    code, gpus_ = diff(tmp_path, fake_lib, config, CHECKS)
    assert code == 0 and gpus_["status"] == "ok", gpus_["message"]
    assert gpus_["observed"]["cuda_version"] == "13.1"


def test_each_check_that_fails_is_blocked_with_its_step(tmp_path, fake_lib):
    gpus = gs.seed_gpus(4, nvlink=(1, 1, 1, 1))
    gpus[0].temp = 91
    gpus[1].clocks_event = 0x40 | 0x4  # HW thermal slowdown (and SW power cap, which the default allows)
    gpus[1].pcie = (3, 5, 5, 8, 16)  # busy (not idle): gen 3 of 5, x8 of x16
    gpus[1].clocks_event |= 0  # not idle: the current generation is judged
    gpus[2].nvlink = (1, 0, 1, 0)
    gpus[2].ecc_corrected = 2000
    gpus[3].vbios = "98.02.2E.00.99"
    gpus[3].persistence = 0
    config = gs.FakeConfig(gpus=gpus, driver="580.95.05", cuda=12020).write(tmp_path / "nvml.conf")
    code, gpus_ = diff(tmp_path, fake_lib, config, CHECKS)
    assert code == 2 and gpus_["status"] == "blocked"
    have = {d["field"]: d["have"] for d in gpus_["drift"]}
    assert have == {
        "driver": "580.95.05", "cuda": "12.2", "gpu0.temperature": "91C", "gpu1.slowdown": "hw_thermal",
        "gpu1.pcie_width": "x8", "gpu1.pcie_gen": "3 (under load)", "gpu2.nvlink_down": "2 of 4 (links 1, 3)",
        "gpu2.ecc_corrected": 2000, "gpu3.persistence_mode": "disabled",
        "vbios": "98.02.2E.00.01 on GPUs 0,1,2; 98.02.2E.00.99 on GPU 3"}
    msg = gpus_["message"]
    for step in ("driver 580.95.05 does not satisfy >=590: install a driver that does",
                 "GPU 0 is at 91C, above 85C: check its cooling",
                 "GPU 1 is slowed down (hw_thermal): check the GPU's cooling",
                 "GPU 1's PCIe link width is x8, wanted >= x16: reseat the GPU",
                 "GPU 2 has NVLink links down (2 of 4 (links 1, 3))",
                 "GPU 2 has 2000 corrected ECC errors since the driver loaded",
                 "the GPUs' VBIOS versions differ", "GPU 3 has persistence mode disabled: set it enabled"):
        assert step in msg, step
    # An idle GPU's link runs below its generation to save power: that is not drift.
    gpus = gs.seed_gpus(4, nvlink=(1, 1, 1, 1), pcie=(1, 5, 5, 16, 16), clocks_event=0x1)
    config = gs.FakeConfig(gpus=gpus).write(tmp_path / "nvml.conf")
    assert diff(tmp_path, fake_lib, config, CHECKS)[0] == 0


def test_checks_on_values_not_reported_cannot_pass(tmp_path, fake_lib):
    gpus = gs.seed_gpus(4, unsupported=("temp", "clocks", "persistence"))
    config = gs.FakeConfig(gpus=gpus).write(tmp_path / "nvml.conf")
    code, gpus_ = diff(tmp_path, fake_lib, config, CHECKS)
    assert code == 2
    unknown = sorted(d["field"] for d in gpus_["drift"] if d["have"] == "unknown")
    assert unknown == sorted(f"gpu{i}.{f}" for i in range(4) for f in ("temperature", "slowdown", "persistence_mode"))
    assert "GPU 0: `temperature` cannot be checked: not reported by this GPU or driver" in gpus_["message"]


def test_kernel_log_is_read_from_the_ring_buffer_or_else_the_journal(tmp_path, fake_lib):
    """No RECONCILE_KERNEL_LOG: reconcile reads /dev/kmsg (here a file in its format); a wrapped ring
    buffer (its first record is not the boot's, number 0) sends it to `journalctl -k -b 0`, which
    holds the Xid 79 the ring buffer lost."""
    config = gs.FakeConfig(gpus=gs.seed_gpus(2)).write(tmp_path / "nvml.conf")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    xid = f"[ 4254.197860] host kernel: NVRM: Xid (PCI:{gs.pci_of(1)}): 79, GPU has fallen off the bus."
    (tmp_path / "kmsg").write_text("6,9000,9000000001,-;usb 1-1: new device\n")
    (bindir / "journalctl.out").write_text(f"[    0.000000] host kernel: Linux version 6.1.0\n{xid}\n")
    (bindir / "journalctl").write_text(f"#!/bin/sh\ncat '{bindir / 'journalctl'}.out'\n")
    (bindir / "journalctl").chmod(0o755)
    path = f"{bindir}{os.pathsep}{os.environ['PATH']}"
    kmsg = str(tmp_path / "kmsg")
    code, gpus_ = diff(tmp_path, fake_lib, config, "gpus:\n  healthy: true\n", PATH=path, RECONCILE_KERNEL_LOG="",
                       RECONCILE_KMSG=kmsg)
    assert code == 2 and gpus_["observed"]["kernel_log"]["source"] == "journalctl -k -b 0"
    assert f"GPU 1 ({gs.bus_of(1)}) must not run jobs: reboot the node" in gpus_["message"]
    # Neither reaches back to boot: the Xids before are unknown, and unknown is not healthy.
    (bindir / "journalctl.out").write_text("[ 9000.5] host kernel: later\n")
    code, gpus_ = diff(tmp_path, fake_lib, config, "gpus:\n  healthy: true\n", PATH=path, RECONCILE_KERNEL_LOG="",
                       RECONCILE_KMSG=kmsg)
    assert code == 2 and {d["have"] for d in gpus_["drift"]} == {"unknown"}
    assert "cannot tell whether a job may run on it: Xid errors unknown before the kernel log starts" \
        in gpus_["message"]
