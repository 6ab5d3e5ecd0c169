"""The gpus kind's PCI bus check (reconcilers/gpus/pcibus.py): the NVIDIA GPUs sysfs
shows, held against the driver's list and the declared count.

The authorities: pciutils' `lspci` reading the same sysfs tree (the fake trees are built from real
lspci captures, tests/data/gpus/pci/, and read back by lspci), this machine's own /sys/bus/pci,
pynvml reading the fake driver, and NVIDIA's Xid catalogue (tests/data/gpus/xid-catalogue.yaml)
for the step. The CLI runs as a user runs it, with the fake libnvidia-ml (tests/gpu_support.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gpu_support as gs
import pci_support as ps
import pytest
import yaml
from reconcile_host.reconcilers.gpus.pcibus import read_pci_bus

CAPTURES = sorted(p.name for p in ps.DATA.glob("gpud__*.txt"))
needs_lspci = pytest.mark.skipif(shutil.which("lspci") is None, reason="lspci (pciutils) is not installed")


def xid79() -> dict:
    return yaml.safe_load((gs.DATA / "xid-catalogue.yaml").read_text())["xids"][79]


def nvml_bus_ids(lib: Path, config: Path) -> list[str]:
    """Each GPU's bus id as pynvml reads it from the fake driver, as sysfs names it."""
    code = ("import json, pynvml as n\nn.nvmlInit()\n"
            "print(json.dumps([n.nvmlDeviceGetPciInfo(n.nvmlDeviceGetHandleByIndex(i)).busId"
            " for i in range(n.nvmlDeviceGetCount())]))\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **gs.nvml_env(lib, config)},
                          capture_output=True, text=True, timeout=60, check=True)
    return [gs.slot_of(b if isinstance(b, str) else b.decode()) for b in json.loads(proc.stdout.splitlines()[-1])]


# --- the trees, and the parser, against lspci ------------------------------------------------------

@needs_lspci
@pytest.mark.parametrize("name", CAPTURES)
def test_a_tree_built_from_a_capture_reads_back_as_the_capture(tmp_path, name):
    """lspci reads the fake tree as it reads /sys: every device of the capture, with its numbers and
    its bound driver, comes back."""
    devices = ps.capture(name)
    assert ps.lspci_devices(ps.write_tree(tmp_path / "sys", devices)) == devices


@needs_lspci
@pytest.mark.parametrize("name", CAPTURES)
def test_the_gpus_are_what_lspci_lists_as_nvidia_display_and_3d_controllers(tmp_path, name):
    root = ps.write_tree(tmp_path / "sys", ps.capture(name))
    bus = read_pci_bus(str(root))
    assert bus.readable
    assert [g.address for g in bus.gpus] == ps.lspci_nvidia_gpus(root)
    # NVIDIA's other functions (the 8x machines' NVSwitches) are on the bus and are not GPUs.
    nvidia = [d for d in ps.lspci_devices(root) if d.vendor == 0x10DE]
    if "8x" in name:
        assert len(nvidia) > len(bus.gpus) == 8
    # Bound drivers as lspci -k says them.
    assert {g.address: g.driver for g in bus.gpus} == {d.slot: d.driver for d in nvidia if d.slot in
                                                       {g.address for g in bus.gpus}}


@needs_lspci
def test_a_vga_controller_of_another_vendor_is_not_a_gpu(tmp_path):
    """The Dell host's BMC display (Matrox, class 0300) is a VGA controller lspci lists; not a GPU."""
    root = ps.write_tree(tmp_path / "sys", ps.capture("gpud__dell-8x-h100__lspci-vvv.devices.txt"))
    vga = subprocess.run(ps.lspci_argv(root, "-D", "-n", "-d", "::0300"), capture_output=True, text=True,
                         check=True).stdout.split()
    assert vga and vga[0] not in {g.address for g in read_pci_bus(str(root)).gpus}


@needs_lspci
def test_this_machine_s_own_bus(tmp_path):
    """/sys/bus/pci here, as lspci reads it: the same NVIDIA GPUs (none on a machine without one)."""
    bus = read_pci_bus("/sys/bus/pci")
    assert bus.readable, bus.note
    assert [g.address for g in bus.gpus] == ps.lspci_nvidia_gpus(None)


def test_virtual_functions_are_left_out(tmp_path):
    """SR-IOV virtual functions of a GPU (vGPU hosts) carry a `physfn` link (kernel
    Documentation/ABI/testing/sysfs-bus-pci): NVML lists their physical GPU only."""
    devices = ps.capture(ps.DEFAULT_HOST)
    pf = next(d for d in devices if ps.is_gpu(d))
    vfs = [replace(pf, slot=f"0001:00:00.{fn}", physfn=pf.slot, driver="nvidia") for fn in (4, 5)]
    root = ps.write_tree(tmp_path / "sys", devices + vfs)
    addresses = [g.address for g in read_pci_bus(str(root)).gpus]
    assert pf.slot in addresses and not {v.slot for v in vfs} & set(addresses)
    if shutil.which("lspci"):
        assert {v.slot for v in vfs} <= set(ps.lspci_nvidia_gpus(root))  # lspci lists them; they are not GPUs


def test_what_cannot_be_read_is_unknown_never_zero(tmp_path):
    assert not read_pci_bus(str(tmp_path / "absent")).readable
    (tmp_path / "empty" / "devices").mkdir(parents=True)
    assert not read_pci_bus(str(tmp_path / "empty")).readable  # no machine has an empty bus
    root = ps.write_tree(tmp_path / "sys", ps.capture(ps.DEFAULT_HOST))
    (root / "devices" / "0001:00:00.0" / "class").resolve().write_text("0xGARBAGE\n")
    bus = read_pci_bus(str(root))
    assert not bus.readable and "0001:00:00.0" in bus.note


# --- through the CLI, with the fake driver ---------------------------------------------------------

def test_all_agree(tmp_path, fake_lib):
    config = gs.FakeConfig(gpus=gs.seed_gpus(8)).write(tmp_path / "nvml.conf")
    state = gs.write_state(tmp_path, "gpus:\n  count: 8\n  healthy: true\n")
    proc = gs.cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = gs.gpus_report(proc)
    assert report["status"] == "ok" and report["drift"] == []
    on_bus = [g["address"] for g in report["observed"]["pci_bus"]["gpus"]]
    assert on_bus == sorted(nvml_bus_ids(fake_lib, config))
    if shutil.which("lspci"):
        assert on_bus == ps.lspci_nvidia_gpus(gs.pci_root(config))


@pytest.mark.parametrize("driver", ["nvidia", None])
def test_a_gpu_on_the_bus_the_driver_does_not_list_is_named_with_the_step(tmp_path, fake_lib, driver):
    """Fallen off the bus without a word: no Xid in the log, NVML lists 7; the bus shows 8."""
    config = gs.FakeConfig(gpus=gs.seed_gpus(7), bus_only=(("0000:91:00.0", driver),)).write(tmp_path / "nvml.conf")
    state = gs.write_state(tmp_path, "gpus:\n  count: 8\n  healthy: true\n")
    proc = gs.cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    report = gs.gpus_report(proc)
    nvml = nvml_bus_ids(fake_lib, config)
    on_bus = [g["address"] for g in report["observed"]["pci_bus"]["gpus"]]
    [missing] = sorted(set(on_bus) - set(nvml))
    if shutil.which("lspci"):
        assert on_bus == ps.lspci_nvidia_gpus(gs.pci_root(config))
    key = missing.rsplit(".", 1)[0]  # domain:bus:device, as the kernel log's Xid lines name a GPU
    assert report["status"] == "blocked"
    assert {"field": "count", "want": 8, "have": len(nvml)} in report["drift"]
    assert {"field": f"gpu@{key}.healthy", "want": True, "have": False} in report["drift"]
    assert not any(d["field"] == "pci_count" for d in report["drift"])  # the bus has the 8
    catalogue = xid79()
    line = next(x for x in report["message"].splitlines() if missing in x)
    assert "fallen off the bus" in line and catalogue["step"].split(" (")[0] in line
    assert f"[as Xid 79 in the NVIDIA Xid catalogue: {catalogue['immediate_action']}]" in line
    assert ("bound to no driver" in line) == (driver is None)


def test_a_gpu_bound_to_another_driver_is_not_counted(tmp_path, fake_lib):
    """A GPU given to vfio-pci (passed through to a VM) is the host's choice: reported, not a fault."""
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), bus_only=(("0000:91:00.0", "vfio-pci"),)).write(tmp_path / "nvml.conf")
    state = gs.write_state(tmp_path, "gpus:\n  count: 2\n  healthy: true\n")
    report = gs.gpus_report(gs.cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json"))
    assert report["status"] == "ok", report
    drivers = {g["address"]: g["driver"] for g in report["observed"]["pci_bus"]["gpus"]}
    if shutil.which("lspci"):
        said = {d.slot: d.driver for d in ps.lspci_devices(gs.pci_root(config))}
        assert drivers == {a: said[a] for a in drivers}
    assert drivers["0000:91:00.0"] == "vfio-pci"


def test_a_gpu_the_driver_lists_that_the_bus_does_not_show_is_an_error(tmp_path, fake_lib):
    config = gs.FakeConfig(gpus=gs.seed_gpus(3), off_bus=(2,)).write(tmp_path / "nvml.conf")
    state = gs.write_state(tmp_path, "gpus:\n  count: 3\n")
    proc = gs.cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = gs.gpus_report(proc)
    third = nvml_bus_ids(fake_lib, config)[2]
    assert third not in [g.address for g in read_pci_bus(str(gs.pci_root(config))).gpus]
    assert report["status"] == "error"
    assert "the driver lists GPU 2 (" in report["message"] and "does not show" in report["message"]
    # The text report says it too, without a traceback.
    text = gs.cli(tmp_path, fake_lib, config, "diff", str(state))
    assert text.returncode == 1 and "does not show" in text.stdout and "Traceback" not in text.stdout + text.stderr


def test_an_unreadable_bus_is_unknown_never_zero(tmp_path, fake_lib):
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), pci_tree=False).write(tmp_path / "nvml.conf")
    counted = gs.write_state(tmp_path, "gpus:\n  count: 2\n")
    report = gs.gpus_report(gs.cli(tmp_path, fake_lib, config, "diff", str(counted), "--format", "json"))
    assert report["status"] == "blocked"
    assert report["drift"] == [{"field": "pci_count", "want": 2, "have": "unknown"}]
    assert "how many are on it is unknown" in report["message"]
    # Without a count, the GPUs' own verdicts stand, and the report says what was not proven.
    plain = gs.write_state(tmp_path, "gpus:\n  healthy: true\n")
    report = gs.gpus_report(gs.cli(tmp_path, fake_lib, config, "diff", str(plain), "--format", "json"))
    assert report["status"] == "ok"
    assert any("PCI bus not read" in c for c in report["caveats"])
    assert report["observed"]["pci_bus"]["readable"] is False


def test_an_xid_79_for_the_same_gpu_is_one_line(tmp_path, fake_lib):
    """The kernel log names the GPU gone from the driver too: one drift, one blocked line, the Xid's."""
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), bus_only=(("0000:91:00.0", "nvidia"),)).write(tmp_path / "nvml.conf")
    klog = tmp_path / "kern.log"
    klog.write_text("[    0.0] Linux version 6.1.0 (fake)\n"
                    "[ 4254.1] NVRM: Xid (PCI:0000:91:00): 79, pid=0, GPU has fallen off the bus.\n")
    state = gs.write_state(tmp_path, "gpus:\n  healthy: true\n")
    report = gs.gpus_report(gs.cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json",
                                   RECONCILE_KERNEL_LOG=str(klog)))
    assert report["status"] == "blocked"
    assert [d["field"] for d in report["drift"]] == ["gpu@0000:91:00.healthy"]
    blocked = [x for x in report["message"].splitlines() if "0000:91:00" in x and "must not run jobs" in x]
    assert len(blocked) == 1 and "Xid 79" in blocked[0]


def test_gpus_not_given_to_a_container_are_not_fallen_off(tmp_path, fake_lib):
    """In a container given some of the GPUs, the driver's /proc/driver/nvidia/gpus lists only those
    (the NVIDIA container toolkit mounts them alone), while sysfs shows all of the host's."""
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), bus_only=(("0000:91:00.0", "nvidia"),)).write(tmp_path / "nvml.conf")
    proc_dir = tmp_path / "proc-gpus"
    for i, bus in enumerate(nvml_bus_ids(fake_lib, config)):
        (proc_dir / bus).mkdir(parents=True)
        (proc_dir / bus / "information").write_text(f"Device Minor: \t {i}\nBus Location: \t {bus}\n")
    state = gs.write_state(tmp_path, "gpus:\n  count: 2\n  healthy: true\n")
    report = gs.gpus_report(gs.cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json",
                                   RECONCILE_NVIDIA_PROC_DIR=str(proc_dir)))
    assert report["status"] == "ok", report
    assert report["observed"]["pci_bus"]["not_visible"] == ["0000:91:00.0"]


def test_the_nvidia_smi_capture_of_the_same_host_agrees_with_its_bus(tmp_path):
    """gpud's 8x H100 nvidia-smi -q and its lspci (the same GPU bus ids): the fallback path, the bus
    built from the real listing, NVSwitches and all."""
    import smi_capture as sc

    name = next(iter(ps.SAME_HOST))
    env = sc.install(sc.load(sc.REAL / name), tmp_path)
    state = gs.write_state(tmp_path, "gpus:\n  count: 8\n")
    report = gs.gpus_report(gs.cli(tmp_path, None, None, "diff", str(state), "--format", "json", **env))
    assert report["status"] == "ok", report
    listed = sorted(gs.slot_of(g["bus_id"]) for g in report["observed"]["gpus"])
    assert [g["address"] for g in report["observed"]["pci_bus"]["gpus"]] == listed
