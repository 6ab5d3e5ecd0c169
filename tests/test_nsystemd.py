"""Tests of the namespaced-systemd test helper itself (tests/nsystemd.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from nsystemd import NamespacedSystemd, NamespacedSystemdError

_missing = NamespacedSystemd.missing_prerequisites()
needs_ns = pytest.mark.skipif(_missing is not None, reason=f"namespaced systemd: {_missing}")

SLEEPER = """\
[Unit]
Description=test sleeper

[Service]
ExecStart=/bin/sleep infinity
"""

RESTARTER = """\
[Service]
ExecStart=/bin/sleep infinity
Restart=always
RestartSec=100ms
"""


def _pids_in_pid_ns(ns_link: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == ns_link:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_boots(systemd_ns):
    assert systemd_ns.boot_state in ("running", "degraded"), systemd_ns.failed_units
    state = systemd_ns.systemctl("is-system-running").stdout.strip()
    assert state in ("running", "degraded")
    assert Path(f"/proc/{systemd_ns.pid}/comm").read_text().strip() == "systemd"
    # PID 1 inside, and /proc inside shows only the namespace.
    assert systemd_ns.run(["cat", "/proc/1/comm"], check=True).stdout.strip() == "systemd"
    assert systemd_ns.host_pid_of(1) == systemd_ns.pid
    # The boot target pulled in multi-user.target.
    assert systemd_ns.show("multi-user.target", "ActiveState") == "active"


def test_unit_start_stop_enable(nsystemd, tmp_path):
    path = nsystemd.write_unit("nsd-sleeper.service", SLEEPER)
    assert path == nsystemd.root / "etc/systemd/system/nsd-sleeper.service"
    assert nsystemd.show("nsd-sleeper.service", "LoadState") == "loaded"
    assert nsystemd.systemctl("is-enabled", "nsd-sleeper.service").stdout.strip() == "static"

    nsystemd.systemctl("start", "nsd-sleeper.service", check=True)
    nsystemd.wait_active("nsd-sleeper.service")
    ns_pid = nsystemd.main_pid("nsd-sleeper.service")
    assert ns_pid > 1
    host_pid = nsystemd.host_pid_of(ns_pid)
    assert Path(f"/proc/{host_pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"/bin/sleep", b"infinity"]

    nsystemd.systemctl("stop", "nsd-sleeper.service", check=True)
    nsystemd.wait_state("nsd-sleeper.service", "inactive")
    assert nsystemd.main_pid("nsd-sleeper.service") == 0

    # WantedBy= plus the enable link.
    nsystemd.write_unit("nsd-sleeper.service", SLEEPER + "\n[Install]\nWantedBy=multi-user.target\n", enable=True)
    assert (nsystemd.root / "etc/systemd/system/multi-user.target.wants/nsd-sleeper.service").is_symlink()
    assert nsystemd.systemctl("is-enabled", "nsd-sleeper.service").stdout.strip() == "enabled"

    # pytest's tmp_path (under the shared /tmp) is visible inside.
    (tmp_path / "probe").write_text("hello")
    assert nsystemd.run(["cat", str(tmp_path / "probe")], check=True).stdout == "hello"
    assert nsystemd.run(["pwd"], cwd=str(tmp_path), check=True).stdout.strip() == str(tmp_path)

    nsystemd.remove_unit("nsd-sleeper.service")
    assert nsystemd.show("nsd-sleeper.service", "LoadState") == "not-found"
    assert not (nsystemd.root / "etc/systemd/system/multi-user.target.wants/nsd-sleeper.service").exists()


def test_failed_unit_is_reported_and_reset(nsystemd):
    nsystemd.write_unit("nsd-fails.service", "[Service]\nType=oneshot\nExecStart=/bin/false\n")
    assert nsystemd.systemctl("start", "nsd-fails.service").returncode != 0
    assert nsystemd.show("nsd-fails.service", "ActiveState") == "failed"
    nsystemd.remove_unit("nsd-fails.service")
    assert "nsd-fails" not in nsystemd.systemctl("--failed", "--no-legend").stdout


def test_restart_always_then_stop(nsystemd):
    """kill -9 of MainPID -> systemd restarts it; systemctl stop -> gone."""
    unit = "nsd-restarter.service"
    nsystemd.write_unit(unit, RESTARTER)
    nsystemd.systemctl("start", unit, check=True)
    nsystemd.wait_active(unit)
    first = nsystemd.main_pid(unit)
    assert first > 1

    nsystemd.run(["kill", "-9", str(first)], check=True)
    deadline = time.monotonic() + 10
    while True:
        pid = nsystemd.main_pid(unit)
        if pid not in (0, first) and nsystemd.show(unit, "ActiveState") == "active":
            break
        assert time.monotonic() < deadline, nsystemd.systemctl("status", unit).stdout
        time.sleep(0.05)
    assert int(nsystemd.show(unit, "NRestarts")) == 1

    nsystemd.systemctl("stop", unit, check=True)
    nsystemd.wait_state(unit, "inactive")
    time.sleep(0.5)  # several RestartSec periods: it must stay stopped
    assert nsystemd.show(unit, "ActiveState") == "inactive"
    assert nsystemd.main_pid(unit) == 0
    assert nsystemd.run(["kill", "-0", str(pid)]).returncode != 0


def test_hostname_is_private(nsystemd):
    host = socket.gethostname()
    nsystemd.set_hostname("nsd-web-01")
    assert nsystemd.run(["hostname"], check=True).stdout.strip() == "nsd-web-01"
    assert socket.gethostname() == host
    nsystemd.reset()  # what the fixture does after the test
    assert nsystemd.run(["hostname"], check=True).stdout.strip() == nsystemd.boot_hostname


def test_popen_runs_inside(nsystemd):
    proc = nsystemd.popen(
        ["sh", "-c", "echo $$; read line; echo got $line"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate("x\n", timeout=30)
    ns_pid, got = out.splitlines()
    assert got == "got x"
    assert int(ns_pid) < 10_000  # a namespace PID, not a host one
    assert proc.returncode == 0


@needs_ns
def test_lifecycle_keeps_host_tmp_and_kills_everything():
    """Own instance: /tmp survives boot, an enabled unit starts at boot, and
    teardown leaves no process, cgroup or work directory behind."""
    fd, marker = tempfile.mkstemp(prefix="nsd-marker-", dir="/tmp")
    os.close(fd)
    try:
        nsd = NamespacedSystemd("nsd-lifecycle")
        # Written before start(): staged and present at boot.
        nsd.write_unit("nsd-boot.service", SLEEPER + "\n[Install]\nWantedBy=multi-user.target\n", enable=True)
        with nsd:
            assert os.path.exists(marker), "booting wiped the host's /tmp"
            assert nsd.run(["test", "-e", marker]).returncode == 0
            nsd.wait_active("nsd-boot.service")
            host_pid = nsd.host_pid_of(nsd.main_pid("nsd-boot.service"))
            ns_link = os.readlink(f"/proc/{nsd.pid}/ns/pid")
            assert host_pid in _pids_in_pid_ns(ns_link)
            cgroups = [Path(h) / nsd.cgroup for h in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified")]
            assert all(c.is_dir() for c in cgroups)
            assert "Startup finished" in nsd.log_path.read_text()
            workdir = nsd.workdir
        assert os.path.exists(marker)
        assert nsd.pid is None
        assert _pids_in_pid_ns(ns_link) == []
        assert not any(c.exists() for c in cgroups)
        assert not workdir.exists()
    finally:
        os.unlink(marker)


@needs_ns
def test_boot_timeout_reports_and_cleans_up():
    nsd = NamespacedSystemd("nsd-timeout")
    with pytest.raises(NamespacedSystemdError, match="did not"):
        nsd.start(timeout=0.001)
    assert nsd.pid is None
    assert not (Path("/sys/fs/cgroup/systemd") / nsd.cgroup).exists()
    assert nsd.log_path.parent.is_dir()  # kept for diagnosis
    nsd.stop()  # idempotent; removes the kept work directory
    assert not nsd.workdir.exists()
