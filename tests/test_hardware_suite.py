"""The hardware suite (tests/hardware/) run against the fake driver, to prove the suite itself.

No real NVIDIA driver is here, so its whole run — snapshot comparisons, the nvidia-smi path, the
kernel log, a holder found and freed, the setters round-tripped and restored — goes through the
fake libnvidia-ml.so.1 and a stand-in nvidia-smi (tests/hardware/fake_smi.py) that reads the same
fake through the real pynvml, as the real nvidia-smi reads NVML. What the report must say comes
from pynvml and the fake's call log at test time; a skewed or refusing nvidia-smi must show up
in the report as what it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gpu_support as gs
import pytest

HARDWARE = Path(__file__).resolve().parent / "hardware"
sys.path.insert(0, str(HARDWARE))
import hwcompare as hc  # noqa: E402
import hwsuite  # noqa: E402

ALWAYS_THERE = {"uuid", "pci.bus_id", "name", "memory.total", "persistence_mode", "power.limit", "power.min_limit",
                "power.max_limit", "compute_mode", "pcie.link.gen.max", "pcie.link.width.max", "mig.mode.current"}

FACTS = textwrap.dedent("""
    import json, pynvml as n
    n.nvmlInit()
    out = []
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        out.append({"uuid": n.nvmlDeviceGetUUID(h), "bus": str(n.nvmlDeviceGetPciInfo(h).busId),
                    "minor": n.nvmlDeviceGetMinorNumber(h), "limit": n.nvmlDeviceGetPowerManagementLimit(h),
                    "mode": n.nvmlDeviceGetComputeMode(h)})
    n.nvmlShutdown()
    print(json.dumps(out))
""")


def facts(lib: Path, config: Path) -> list[dict]:
    """What the fake driver says through pynvml: the test's authority."""
    env = {**os.environ, **gs.nvml_env(lib, config)}
    proc = subprocess.run([sys.executable, "-c", FACTS], env=env, capture_output=True, text=True, check=True,
                          timeout=60)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rig(tmp: Path, lib: Path, config: Path, holders, **smi_env: str) -> hwsuite.Rig:
    """The fake driver, a stand-in nvidia-smi on PATH, /proc/driver/nvidia/gpus written from what
    pynvml says, and a kernel log with Xid lines for two of the GPUs."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HARDWARE / "fake_smi.py"}" "$@"\n')
    smi.chmod(0o755)
    proc_dir = tmp / "proc-gpus"
    for g in facts(lib, config):
        d = proc_dir / hc.bus_key(g["bus"])
        d.mkdir(parents=True, exist_ok=True)
        (d / "information").write_text(f"Model: \t\t Fake\nIRQ:   \t\t 42\nGPU UUID: \t {g['uuid']}\n"
                                       f"Device Minor: \t {g['minor']}\nBus Location: \t {hc.bus_key(g['bus'])}\n")
    klog = tmp / "kern.log"
    klog.write_text("[    1.0] Linux version 6.1.0 (fake)\n"
                    f"[  12.1] NVRM: Xid (PCI:{gs.pci_of(1)}): 13, pid=99, name=python, Graphics Exception\n"
                    f"[  12.5] NVRM: Xid (PCI:{gs.pci_of(1)}): 13, pid=99, name=python, Graphics Exception\n"
                    f"[  13.0] NVRM: Xid (PCI:{gs.pci_of(0)}): 31, pid=7, name=x, MMU Fault\n")
    env = {**gs.nvml_env(lib, config), "RECONCILE_KERNEL_LOG": str(klog), "RECONCILE_NVIDIA_PROC_DIR": str(proc_dir),
           "PATH": f"{bindir}{os.pathsep}{gs.path_without(['nvidia-smi'])}",
           # No device file of this machine is the fake's: only the fake's own holders count.
           "RECONCILE_NVIDIA_DEV_GLOB": str(tmp / "no-dev" / "nvidia[0-9]*"), **smi_env}

    def start_holder(_tmp: Path):
        p = holders.start("hw-holder", tag)
        return p.pid, None, "hw-holder", lambda: None  # the fixture kills it by PID

    return hwsuite.Rig(env=env, proc_dir=proc_dir, kernel_log=klog.read_text, start_holder=start_holder, mode="fake")


tag = gs.new_tag()


def fake_config(tmp: Path) -> Path:
    gpus = gs.seed_gpus(2)
    gpus[0].minor, gpus[1].minor = 3, 0  # the driver's minors are not the indices on real 8-GPU hosts
    gpus[1].pcie = (4, 5, 5, 8, 16)  # a link trained down
    return gs.FakeConfig(gpus=gpus, holders=[gs.FakeHolder(mib=hwsuite.HOLD_MIB, gpus=[0], cmdline=tag)]
                         ).write(tmp / "nvml.conf")


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory, fake_lib):
    tmp = tmp_path_factory.mktemp("hwsuite")
    config = fake_config(tmp)
    before = facts(fake_lib, config)
    h = gs.Holders()
    try:
        # The fake refuses setters without root, as a real driver does: no setters section then.
        sections = ("snapshot", "xid", "holder", "setters")[:None if os.geteuid() == 0 else 3]
        report = hwsuite.Suite(tmp / "out", rig(tmp, fake_lib, config, h)).run_all(sections)
    finally:
        h.cleanup()
    return tmp, config, before, report


def checks_of(report: dict, section: str) -> list[dict]:
    return report["sections"][section]["checks"]


def test_every_section_agrees_with_the_fake_driver(suite_run):
    tmp, _, _, report = suite_run
    statuses = {k: v["status"] for k, v in report["sections"].items()}
    want = ("count", "query-gpu", "q-x", "minors", "pci-bus", "smi-path", "health", "xid", "holder", "setters")
    assert statuses == dict.fromkeys(want[:None if os.geteuid() == 0 else -1], "agree"), \
        (tmp / "out" / "report.txt").read_text()
    # The report is on disk, as JSON and as text, and says the same.
    on_disk = json.loads((tmp / "out" / "report.json").read_text())
    assert on_disk["summary"] == report["summary"] and "disagree" not in report["summary"]["verdicts"]
    assert (tmp / "out" / "report.txt").read_text().splitlines()[0].startswith("reconcile hardware suite")


def test_snapshot_compares_the_driver_s_facts(suite_run, fake_lib):
    _, config, before, report = suite_run
    assert [g["uuid"] for g in report["gpus"]] == [g["uuid"] for g in before]
    assert [g["minor"] for g in report["gpus"]] == [g["minor"] for g in before]
    for section in ("query-gpu", "q-x"):
        seen = {c["field"] for c in checks_of(report, section) if c["verdict"] == "agree"}
        assert seen >= ALWAYS_THERE, (section, ALWAYS_THERE - seen)
        for c in checks_of(report, section):
            if c["field"] == "pci.bus_id":
                assert c["authority"] == hc.bus_key(before[c["gpu"]]["bus"])
    minors = [c for c in checks_of(report, "minors") if c["field"].startswith("minor (/proc")]
    assert [c["authority"] for c in minors] == [g["minor"] for g in before]
    # The nvidia-smi path read every field the NVML path did, the verdict included.
    paths = checks_of(report, "smi-path")
    assert {c["field"] for c in paths} >= {"uuid", "bus_id", "minor", "memory_total", "health",
                                           "settings.power_limit_mw", "settings.compute_mode", "pcie_width"}
    assert [c["reconcile"] for c in checks_of(report, "health") if c["field"].startswith("health")] == \
        ["healthy", "healthy"]


def test_kernel_log_and_holder(suite_run):
    _, _, _, report = suite_run
    xid = {c["field"]: c for c in checks_of(report, "xid") if c["gpu"] is not None}
    assert xid["Xid 13 count"]["authority"] == 2 and xid["Xid 31 count"]["authority"] == 1
    holder = {c["field"]: c for c in checks_of(report, "holder")}
    assert holder["holder's memory (MiB)"]["authority"] == hwsuite.HOLD_MIB
    assert holder["holder gone"]["reconcile"] is False


def test_setters_round_tripped_and_restored(suite_run, fake_lib):
    if os.geteuid() != 0:
        pytest.skip("needs root: the fake driver refuses setters without it, as a real one does")
    _, config, before, report = suite_run
    # The setters went through the fake driver (its call log), and the GPU is as it was.
    calls = [(c, g, a) for c, g, a, _ in gs.setter_calls(config)]
    was = before[0]["limit"]
    assert ("nvmlDeviceSetPowerManagementLimit", 0, f"{was - 1000}") in calls, calls
    assert ("nvmlDeviceSetComputeMode", 0, "3") in calls, calls
    assert facts(fake_lib, config)[0]["limit"] == was and facts(fake_lib, config)[0]["mode"] == before[0]["mode"]


def test_skewed_and_refusing_nvidia_smi_show_in_the_report(tmp_path, fake_lib, holders):
    config = fake_config(tmp_path)
    r = rig(tmp_path, fake_lib, config, holders, FAKE_SMI_SKEW="power.max_limit=599.00,pcie.link.width.max=8",
            FAKE_SMI_REFUSE="pcie.link.gen.gpumax")
    suite = hwsuite.Suite(tmp_path / "out", r)
    report = suite.run_all(("snapshot",))
    bad = {(c["section"], c["gpu"], c["field"]) for s in report["sections"].values() for c in s["checks"]
           if c["verdict"] == "disagree"}
    # The CSV lies about both; -q -x prints through the same skew; the nvidia-smi path reads the CSV.
    for section in ("query-gpu", "q-x"):
        assert {(section, i, "power.max_limit") for i in (0, 1)} <= bad
        assert {(section, i, "pcie.link.width.max") for i in (0, 1)} <= bad
    assert ("smi-path", 0, "settings.power_max_mw") in bad
    refused = [c for c in checks_of(report, "query-gpu") if c["field"] == "pcie.link.gen.gpumax"]
    assert [c["verdict"] for c in refused] == ["not asked", "not asked"]
    assert "refused by this nvidia-smi: pcie.link.gen.gpumax" in report["sections"]["query-gpu"]["note"]
    text = (tmp_path / "out" / "report.txt").read_text()
    assert "- query-gpu: disagree" in text
    assert "disagree: GPU 0 power.max_limit: reconcile 600000, authority 599000" in text


def test_real_entry_point_skips_without_a_driver(tmp_path):
    why = hwsuite.hardware_missing()
    if why is None:
        pytest.skip("a real NVIDIA driver is here: tests/hardware runs the suite itself [ci-ok]")
    assert "[ci-ok]" in why
    proc = subprocess.run([sys.executable, str(HARDWARE / "hwsuite.py"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("skipped: ")
    assert (tmp_path / "o" / "report.txt").read_text().startswith("reconcile hardware suite: skipped")
    # The one command: it finds a Python with reconcile's dependencies and says the same.
    proc = subprocess.run([str(HARDWARE / "run.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OUT": str(tmp_path / "r")})
    assert proc.returncode == 0 and proc.stdout == f"skipped: {why}\n", proc.stderr
    assert (tmp_path / "r" / "report.txt").read_text() == f"reconcile hardware suite: skipped: {why}\n"


def test_without_cuda_a_device_file_holder_is_named(tmp_path, fake_lib, holders):
    """The suite's last way to hold a GPU (no torch, no libcuda): a process with the device file
    open, which NVML does not list; reconcile must still name it with that file."""
    config = gs.FakeConfig(gpus=gs.seed_gpus(1)).write(tmp_path / "nvml.conf")
    r = rig(tmp_path, fake_lib, config, holders)
    dev = tmp_path / "dev" / "nvidia0"
    dev.parent.mkdir()
    dev.write_bytes(b"")
    r.env["RECONCILE_NVIDIA_DEV_GLOB"] = str(tmp_path / "dev" / "nvidia[0-9]*")

    def start(_tmp):
        p = holders.start("hw-devholder", gs.new_tag(), hold=dev)
        return p.pid, None, f"python3 holding {dev}", lambda: None

    r.start_holder = start
    report = hwsuite.Suite(tmp_path / "out", r).run_all(("snapshot", "holder"))
    assert report["sections"]["holder"]["status"] == "agree", (tmp_path / "out" / "report.txt").read_text()
    assert [c["authority"] for c in checks_of(report, "holder")][1] == [str(dev)]


def test_xml_reader_on_real_nvidia_smi_output():
    """The suite's `-q -x` reader on NVIDIA's own XML (the 19 real captures of tests/data/gpus/real,
    drivers 418 to 595, power limits under power_readings and gpu_power_readings): each value
    reads as smi_capture's translation of the same file (held against features.json) reads it."""
    import smi_capture as sc

    kinds = {f[0]: f[3] for f in hc.FIELDS}
    compared, valued = 0, set()
    captures = sorted(sc.REAL.glob("*.xml"))
    assert len(captures) >= 19
    for path in captures:
        cap = sc.load_xml(path)
        _, gpus = hc.parse_xml(path.read_text())
        assert [g["uuid"] for g in gpus] == [g["uuid"] for g in cap.gpus], path.name
        for mine, theirs in zip(gpus, cap.gpus, strict=True):
            for field in set(mine) & set(theirs) & set(kinds):
                got = hc.value(kinds[field], mine[field])
                assert got == hc.value(kinds[field], theirs[field]), (path.name, field, mine[field], theirs[field])
                compared += 1
                valued |= {field} if got is not None else set()
    assert compared > 600
    assert {"memory.total", "power.limit", "power.min_limit", "pcie.link.width.max", "compute_mode",
            "persistence_mode", "ecc.errors.uncorrected.volatile.total"} <= valued


def test_pci_bus_section_reads_the_bus_lspci_reads(suite_run, fake_lib):
    """The bus section (read-only) holds reconcile's bus reading against lspci on the same tree and
    against the driver's list: the fake's GPUs, bound to nvidia, the NVSwitches of the capture left out."""
    import pci_support as ps

    _, config, before, report = suite_run
    checks = checks_of(report, "pci-bus")
    assert checks and all(c["verdict"] == "agree" for c in checks), checks
    slots = sorted(gs.slot_of(g["bus"]) for g in before)
    if ps.shutil.which("lspci"):
        assert ps.lspci_nvidia_gpus(gs.pci_root(config)) == slots
    assert checks[0]["reconcile"] == slots and checks[-1]["authority"] == slots
