"""contrib/reconcile-boot.service: the GPU settings applied at every boot, after nvidia-persistenced.

A namespaced systemd is booted with the shipped unit (pointed at the test's files) and the stand-in
nvidia-persistenced both enabled; the fake driver then "reboots" (power limits, clocks and
persistence lost, as on real hardware) and a second systemd boots. Each time, what the GPUs are set
to is read through pynvml, and the order of the two units from systemd's own timestamps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import gpu_support as gs
import pytest
from nsystemd import NamespacedSystemd

REPO = Path(__file__).resolve().parent.parent
BOOT_UNIT = "reconcile-boot.service"
PERSISTENCED = "nvidia-persistenced.service"
STATE = """gpus:
  count: 2
  settings:
    persistence_mode: true
    power_limit: 450W
    locked_clocks: {min: 1500MHz, max: 1980MHz}
"""


def reconcile_bin_dir() -> str:
    beside = Path(sys.executable).parent / "reconcile"
    found = str(beside) if beside.exists() else shutil.which("reconcile")
    assert found, "the reconcile command is not installed"
    return os.path.dirname(found)


def boot_unit(tmp: Path, state: Path, lib: Path, config: Path, klog: Path) -> str:
    """contrib/reconcile-boot.service as shipped, its command found on the PATH its comments say to set,
    pointed at the test's state file, journal and fake driver."""
    text = (REPO / "contrib" / BOOT_UNIT).read_text()
    text, n = re.subn(r"^(ExecStart=/usr/bin/env reconcile apply) --lock-timeout 10m$",
                      rf"\1 {state} --journal {tmp}/journal.jsonl --lock-timeout 10m", text, flags=re.M)
    assert n == 1
    text, n = re.subn(r"^Environment=PATH=", f"Environment=PATH={reconcile_bin_dir()}:", text, flags=re.M)
    assert n == 1
    text = re.sub(r"^WorkingDirectory=.*$", f"WorkingDirectory={tmp}", text, flags=re.M)
    text = re.sub(r"^StateDirectory=.*$\n", "", text, flags=re.M)  # the namespace shares the host's /var
    env = (f"Environment=RECONCILE_CACHE_DIR={tmp}/cache RECONCILE_STATE_DIR={tmp}/state "
           f"RECONCILE_KERNEL_LOG={klog} LD_LIBRARY_PATH={lib} FAKE_NVML_CONFIG={config} "
           f"RECONCILE_SYSFS_PCI={gs.pci_root(config)}\n")
    return text.replace("\n[Service]\n", f"\n[Service]\n{env}StandardOutput=append:{tmp}/boot.log\n"
                        f"StandardError=append:{tmp}/boot.log\n", 1)


def wait_done(nsd: NamespacedSystemd, unit: str, timeout: float = 90) -> str:
    """The oneshot's ActiveState once it has run: active (RemainAfterExit) or failed."""
    deadline = time.monotonic() + timeout
    while True:
        state = nsd.show(unit, "ActiveState")
        if state in ("active", "failed"):
            return state
        assert time.monotonic() < deadline, nsd.systemctl("status", unit).stdout
        time.sleep(0.1)


def staged(name: str, units: dict[str, str]) -> NamespacedSystemd:
    """A namespaced systemd that boots (as a `with` block) with UNITS enabled."""
    nsd = NamespacedSystemd(name)
    for unit, text in units.items():
        nsd.write_unit(unit, text, enable=True)
    return nsd


def test_boot_unit_sets_the_gpus_after_nvidia_persistenced_at_every_boot(tmp_path, fake_lib):
    why = NamespacedSystemd.missing_prerequisites()
    if why:
        pytest.skip(f"namespaced systemd unavailable: {why}")
    config = gs.FakeConfig(gpus=gs.seed_gpus(2, persistence=0)).write(tmp_path / "nvml.conf")
    klog = tmp_path / "kern.log"
    klog.write_text("[    0.000000] Linux version 6.1.0-18-amd64\n"
                    "[    4.212001] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  590.48.01\n")
    state = gs.write_state(tmp_path, STATE)
    units = {PERSISTENCED: gs.persistenced_unit(fake_lib, config),
             BOOT_UNIT: boot_unit(tmp_path, state, fake_lib, config, klog)}

    for n, name in enumerate(("nsd-boot-1", "nsd-boot-2")):
        with staged(name, units) as nsd:
            assert wait_done(nsd, BOOT_UNIT) == "active", (tmp_path / "boot.log").read_text()
            assert nsd.show(BOOT_UNIT, "Result") == "success"
            # systemd's own clock: the apply started only once nvidia-persistenced was up.
            up = int(nsd.show(PERSISTENCED, "ActiveEnterTimestampMonotonic"))
            started = int(nsd.show(BOOT_UNIT, "ExecMainStartTimestampMonotonic"))
            assert 0 < up <= started
            nvml = gs.nvml_settings(fake_lib, config)
            assert [(g["persistence_mode"], g["power_limit_mw"], g["graphics_clock"]) for g in nvml] == \
                [(1, 450000, 1500)] * 2
        journal = [e for line in (tmp_path / "journal.jsonl").read_text().splitlines()
                   if (e := json.loads(line))["event"] == "result"]
        # Persistence came from the daemon, which ran first: reconcile set power limits and clocks only.
        assert [(e["action"], e["target"]) for e in journal[-4:]] == [
            ("set", "gpu0.power_limit"), ("set", "gpu1.power_limit"), ("set", "gpu0.locked_clocks"),
            ("set", "gpu1.locked_clocks")]
        assert len(journal) == 4 * (n + 1)
        if n == 0:
            # The reboot: the driver forgets them all (and this boot's kernel log has its own driver load).
            assert gs.reboot(fake_lib, config) == 0
            assert [(g["persistence_mode"], g["power_limit_mw"]) for g in gs.nvml_settings(fake_lib, config)] == \
                [(0, 600000)] * 2
            klog.write_text(klog.read_text().replace("4.212001", "4.187220"))
