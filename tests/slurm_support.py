"""A real Slurm cluster for the tests: munged, slurmctld and slurmd from Debian's packages
(slurm-wlm 22.05), started without systemd in a temporary directory, on free ports of
127.0.0.1, with no cgroups (proctrack/linuxproc, task/none). One slurmd, for the node under
test; more configured nodes (`others`) at the same address come up IDLE too (observed:
slurmctld's pings to 127.0.0.1 are answered by that slurmd), so their states are whatever
`scontrol update` makes them.

Found the hard way (see docs/slurm.md): munged wants execute permission for everyone on every
directory above its socket and a 0600 key; the daemons fork into the background by themselves;
scontrol and sinfo find this cluster only through SLURM_CONF.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ssh_support import free_port

MUNGED, MUNGEKEY = "/usr/sbin/munged", "/usr/sbin/mungekey"
SLURMCTLD, SLURMD = "/usr/sbin/slurmctld", "/usr/sbin/slurmd"
SCONTROL = "/usr/bin/scontrol"

CONF = """\
ClusterName=rtest
SlurmctldHost=localhost
AuthType=auth/munge
AuthInfo=socket={dir}/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
{health_check}
{extra}
NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
{nodes}"""

OTHER_NODE = "NodeName={name} NodeHostname={hostname} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\n"
PARTITION = "PartitionName={name} Nodes={nodes} Default={default} MaxTime=INFINITE State=UP\n"


def missing_prerequisites() -> str | None:
    if os.geteuid() != 0:
        return "needs root (munged, slurmctld and slurmd run as root here)"
    for tool in (MUNGED, MUNGEKEY, SLURMCTLD, SLURMD, SCONTROL):
        if not os.access(tool, os.X_OK):
            return f"{tool} not installed (Debian: slurmctld slurmd munge)"
    return None


def running_cluster(**config) -> Iterator[SlurmCluster]:
    """A started SlurmCluster(**config) for a fixture to `yield from`, stopped after; the test is
    skipped, saying why, where real Slurm cannot run."""
    import pytest

    why = missing_prerequisites()
    if why:
        pytest.skip(f"real Slurm unavailable: {why}")
    with SlurmCluster(**config) as cluster:
        yield cluster


class SlurmCluster:
    """One node named `node` (not the host name: slurmd -N), optionally with a HealthCheckProgram
    and `extra` slurm.conf lines;
    `others`: more node names; `partitions`: name -> its nodes (the first is the default),
    else one partition `debug` of every node."""

    def __init__(self, node: str = "rnode1", health_check: str | None = None, interval: int = 2,
                 others: tuple[str, ...] = (), partitions: dict[str, list[str]] | None = None,
                 extra: str = ""):
        self.node = node
        self.others = others
        self.partitions = partitions or {"debug": [node, *others]}
        self.dir = Path(tempfile.mkdtemp(prefix="rslurm", dir="/tmp"))  # short: the munge socket path
        self.health_check = health_check
        self.extra = extra  # more slurm.conf lines (a RebootProgram, say)
        self.interval = interval
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        d = self.dir
        d.chmod(0o711)  # munged: every directory above its socket must be o+x
        for sub in ("munge", "state", "spool"):
            (d / sub).mkdir()
        (d / "munge").chmod(0o711)
        key = d / "munge" / "munge.key"
        subprocess.run([MUNGEKEY, "-c", "-k", str(key)], check=True, capture_output=True)
        subprocess.run([MUNGED, f"--key-file={key}", f"--socket={d}/munge/munge.socket",
                        f"--pid-file={d}/munge/munged.pid", f"--log-file={d}/munge/munged.log",
                        f"--seed-file={d}/munge/munged.seed"], check=True, capture_output=True)
        hc = ""
        if self.health_check:
            hc = (f"HealthCheckProgram={self.health_check}\nHealthCheckInterval={self.interval}\n"
                  "HealthCheckNodeState=ANY")
        hostname = os.uname().nodename.split(".")[0]
        nodes = "".join(OTHER_NODE.format(name=n, hostname=hostname) for n in self.others)
        nodes += "".join(PARTITION.format(name=name, nodes=",".join(members), default="YES" if i == 0 else "NO")
                         for i, (name, members) in enumerate(self.partitions.items()))
        self.conf.write_text(CONF.format(dir=d, ctld_port=free_port(), slurmd_port=free_port(), health_check=hc,
                                         node=self.node, hostname=hostname, cpus=os.cpu_count() or 1,
                                         nodes=nodes, extra=self.extra))
        subprocess.run([SLURMCTLD, "-f", str(self.conf)], check=True, env=self.env, capture_output=True)
        subprocess.run([SLURMD, "-f", str(self.conf), "-N", self.node], check=True, env=self.env,
                       capture_output=True)
        try:
            self.wait_for(lambda st: not st.startswith(("UNKNOWN", "DOWN")) and "NOT_RESPONDING" not in st,
                          "the node to register", timeout=30)
            for other in self.others:
                self.wait_for(lambda st: st == "IDLE", f"node {other} to come up", timeout=60, node=other)
        except BaseException:
            self.stop()
            raise
        return self

    # -- what Slurm says ----------------------------------------------------------------

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([SCONTROL, *args], capture_output=True, text=True, env=self.env, timeout=30,
                              check=check)

    def node_line(self, node: str | None = None) -> str:
        return self.scontrol("show", "node", node or self.node, "-o").stdout.strip()

    def state(self, node: str | None = None) -> str:
        """State= as scontrol shows it (IDLE, IDLE+DRAIN, ...)."""
        line = self.node_line(node)
        for field in line.split(" "):
            if field.startswith("State="):
                return field[len("State="):]
        raise AssertionError(f"no State= in {line!r}")

    def reason(self, node: str | None = None) -> str:
        """sinfo's %E: the reason as stored, without scontrol's [user@time]; '' for none."""
        out = subprocess.run(["sinfo", "-h", "-N", "-n", node or self.node, "-o", "%E"], capture_output=True, text=True,
                             env=self.env, timeout=30, check=True).stdout
        first = out.splitlines()[0] if out.strip() else "none"
        return "" if first == "none" else first

    def wait_for(self, predicate, what: str, timeout: float = 60, node: str | None = None) -> str:
        """Poll the node's state until predicate(state) holds (a resumed node shows NOT_RESPONDING
        until slurmctld's next ping: never assert at once)."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.state(node)
            if predicate(st):
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; state {st}; "
                                     f"{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for name in ("slurmd.log", "slurmctld.log"):
            path = self.dir / name
            if path.exists():
                out.append(f"--- {name}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        if self.conf.exists():
            subprocess.run([SCONTROL, "shutdown"], env=self.env, capture_output=True, timeout=30)
        for pidfile in ("slurmd.pid", "slurmctld.pid"):
            self._stop_pid(self.dir / pidfile, grace=10)
        self._stop_pid(self.dir / "munge/munged.pid", grace=0)
        shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def _stop_pid(pidfile: Path, grace: float) -> None:
        """Wait for a daemon we started to exit (scontrol shutdown), else SIGTERM it by its PID."""
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        deadline = time.monotonic() + grace
        sent = False
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            if time.monotonic() > deadline:
                if sent:
                    return
                os.kill(pid, 15)
                sent, deadline = True, time.monotonic() + 5
            time.sleep(0.05)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
