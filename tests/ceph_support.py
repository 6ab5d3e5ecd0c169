"""A throwaway Ceph cluster for the pools tests: one mon, one mgr, one memstore OSD, cephx,
loopback only, everything under one temporary directory (its own fsid and ceph.conf, the mon
on a free port). Started once per session; every daemon is started here in the foreground
(`-f`) and stopped by the PID this module holds, never by name.

Debian's packages (ceph-mon, ceph-osd, ceph-mgr, ceph-common, python3-rados) are installed by
.ci/run. memstore keeps the objects in the OSD's memory (no loop device, no disk):
`memstore_device_bytes` is the size `ceph df` reports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BINARIES = ("/usr/bin/ceph", "/usr/bin/ceph-mon", "/usr/bin/ceph-osd", "/usr/bin/ceph-mgr", "/usr/bin/monmaptool",
            "/usr/bin/ceph-authtool", "/usr/bin/rados", "/usr/bin/rbd")
HAVE_CEPH = all(os.access(b, os.X_OK) for b in BINARIES)
needs_ceph = pytest.mark.skipif(not HAVE_CEPH, reason="Ceph not installed (Debian: ceph-mon ceph-osd ceph-mgr "
                                                      "ceph-common python3-rados; .ci/run installs them)")
DEVICE_BYTES = 1 << 30  # what the one OSD holds (memstore)
POOL = "vm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    dir: Path
    port: int
    fsid: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.dir / "ceph.conf"

    @property
    def admin_keyring(self) -> Path:
        return self.dir / "admin.keyring"

    @property
    def reader_keyring(self) -> Path:
        return self.dir / "reconcile.keyring"

    @property
    def audit_log(self) -> Path:
        return self.dir / "log" / "ceph.audit.log"

    def ceph(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """The `ceph` CLI as the cluster's admin."""
        res = subprocess.run(["ceph", "-c", str(self.conf), "-n", "client.admin", "-k", str(self.admin_keyring),
                              "--connect-timeout", "30", *args], capture_output=True, text=True, timeout=timeout)
        if check and res.returncode:
            raise AssertionError(f"ceph {' '.join(args)}: exit {res.returncode}: {res.stderr}")
        return res

    def json(self, *args: str) -> dict:
        return json.loads(self.ceph(*args, "-f", "json").stdout)

    def tool(self, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        res = subprocess.run([name, "-c", str(self.conf), "-n", "client.admin", "-k", str(self.admin_keyring), *args],
                             capture_output=True, text=True, timeout=timeout)
        if res.returncode:
            raise AssertionError(f"{name} {' '.join(args)}: exit {res.returncode}: {res.stderr}")
        return res

    def start(self, name: str, argv: list[str]) -> None:
        with open(self.dir / "log" / f"{name}.out", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)

    def osd_state(self) -> tuple[bool, bool]:
        osd = self.json("osd", "dump")["osds"][0]
        return bool(osd["up"]), bool(osd["in"])

    def wait_osd(self, up: bool, deadline: float = 180) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.osd_state() == (up, True):
                return
            time.sleep(0.5)
        raise AssertionError(f"osd.0 not {'up' if up else 'down'} and in after {deadline}s")

    def start_osd(self) -> None:
        self.start("osd.0", ["ceph-osd", "-f", "-c", str(self.conf), "-i", "0"])
        self.wait_osd(True)

    def stop_osd(self) -> None:
        self.stop("osd.0")
        self.wait_osd(False)

    def wait_clean(self, deadline: float = 180) -> None:
        """Until every PG is active (the pools can take writes and `df` counts them)."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            stat = self.json("pg", "stat")
            by_state = stat.get("pg_summary", {}).get("num_pg_by_state", [])
            total = stat.get("pg_summary", {}).get("num_pgs", 0)
            if total and sum(s["num"] for s in by_state if "active" in s["name"].split("+")) == total:
                return
            time.sleep(0.5)
        raise AssertionError("PGs not active")

    def stop_all(self) -> None:
        for name in ("osd.0", "mgr.x", "mon.a"):
            self.stop(name)


CONF = """\
[global]
fsid = {fsid}
mon_host = [v2:127.0.0.1:{port}]
ms_bind_msgr1 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
run_dir = {dir}/run
admin_socket = {dir}/run/$name.asok
pid_file = {dir}/run/$name.pid
log_file = {dir}/log/$name.log
mon_cluster_log_file = {dir}/log/$cluster.$channel.log
crash_dir = {dir}/crash
mon_data = {dir}/mon/$cluster-$id
mgr_data = {dir}/mgr/$cluster-$id
osd_data = {dir}/osd/$cluster-$id
osd_objectstore = memstore
memstore_device_bytes = {device_bytes}
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
osd_crush_chooseleaf_type = 0
mon_warn_on_pool_no_redundancy = false
auth_allow_insecure_global_id_reclaim = false
mon_data_avail_warn = 1
osd_heartbeat_grace = 600
"""


@pytest.fixture(scope="session", name="ceph_cluster")
def session_cluster(tmp_path_factory):
    """The session's cluster (one per xdist worker), stopped by PID at the end."""
    if not HAVE_CEPH:
        pytest.skip("Ceph not installed (Debian: ceph-mon ceph-osd ceph-mgr ceph-common python3-rados)")
    c = Cluster(dir=tmp_path_factory.mktemp("ceph"), port=free_port(), fsid=str(uuid.uuid4()))
    try:
        start_cluster(c)
        yield c
    finally:
        c.stop_all()


def start_cluster(c: Cluster) -> Cluster:
    base = c.dir
    for sub in ("run", "log", "crash", "mon/ceph-a", "mgr/ceph-x", "osd/ceph-0"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    c.conf.write_text(CONF.format(fsid=c.fsid, port=c.port, dir=base, device_bytes=DEVICE_BYTES))
    mon_keyring = base / "mon.keyring"
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, timeout=120)  # noqa: E731
    run("ceph-authtool", "--create-keyring", str(mon_keyring), "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")
    run("ceph-authtool", "--create-keyring", str(c.admin_keyring), "--gen-key", "-n", "client.admin",
        "--cap", "mon", "allow *", "--cap", "osd", "allow *", "--cap", "mgr", "allow *")
    run("ceph-authtool", str(mon_keyring), "--import-keyring", str(c.admin_keyring))
    run("monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{c.port}]", "--fsid", c.fsid, str(base / "monmap"))
    run("ceph-mon", "-c", str(c.conf), "--mkfs", "-i", "a", "--monmap", str(base / "monmap"),
        "--keyring", str(mon_keyring))
    c.start("mon.a", ["ceph-mon", "-f", "-c", str(c.conf), "-i", "a"])
    c.ceph("auth", "get-or-create", "mgr.x", "mon", "allow profile mgr", "osd", "allow *", "mds", "allow *",
           "-o", str(base / "mgr/ceph-x/keyring"))
    c.start("mgr.x", ["ceph-mgr", "-f", "-c", str(c.conf), "-i", "x"])
    osd_uuid = str(uuid.uuid4())
    osd_id = c.ceph("osd", "new", osd_uuid).stdout.strip()
    assert osd_id == "0", osd_id
    c.ceph("auth", "get-or-create", "osd.0", "mon", "allow profile osd", "mgr", "allow profile osd", "osd", "allow *",
           "-o", str(base / "osd/ceph-0/keyring"))
    run("ceph-osd", "-c", str(c.conf), "-i", "0", "--mkfs", "--osd-uuid", osd_uuid)
    c.start_osd()
    c.ceph("osd", "pool", "create", POOL, "8")
    c.ceph("osd", "pool", "application", "enable", POOL, "rbd")
    c.ceph("auth", "get-or-create", "client.reconcile", "mon", "allow r", "mgr", "allow r",
           "osd", "profile rbd-read-only", "-o", str(c.reader_keyring))
    c.wait_clean()
    return c
