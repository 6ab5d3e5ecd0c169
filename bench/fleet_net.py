"""The fleet over a network: the targets' sshds in a network namespace of their own, reached
from a controller namespace across a veth pair, through a relay that gives each direction its
one-way delay (bench/netdelay.py: this kernel has no sch_netem). Only these two namespaces talk;
nothing leaves them.

    controller ns (rfc-PID)                     target ns (rft-PID)
    tools -> 127.0.0.1:PORT -> netdelay.py -> 10.251.X.1 ==veth== 10.251.X.2:PORT -> sshd (in the
                                                                    namespaced systemd's mounts)

1. Per host, one host at a time (its CPU not shared with other hosts): every tool's run on a
   one-host inventory, at each round-trip time (0.2 ms LAN, 5 ms, 50 ms across regions).
2. A measured run of many hosts at 0.2 ms, to check the projection (fleet_model.py).

    sudo .venv/bin/python bench/run.py --only netfleet
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from fleet_measure import Fleet

from common import HERE, log, median

RTTS_MS = (0.2, 5.0, 50.0)
# How the processes measured run, on a machine shared with other work. One host at a time: at
# real-time priority (SCHED_FIFO 10, below the relay's 50), so that one host's latency is the
# network's and the host's own, not a turn in the run queue behind other processes (measured
# here: nice -19 alone still left `reconcile --version` at 5x its CPU time in wall time, at load
# 14 on 2 CPUs). Many hosts at once: nice -19 only, so that the run cannot starve the machine
# (the check says what share of the CPUs it got), unless --netfleet-big-rt (the kernel's RT
# throttling still leaves others 5 %).
RT = ["chrt", "-f", "10"]
NICE = ["nice", "-n", "-19"]


class NetFleet(Fleet):
    def __init__(self, args):
        super().__init__(args)
        tag = os.getpid() % 100000
        self.ns_ctl, self.ns_tgt = f"rfc-{tag}", f"rft-{tag}"
        self.addr_ctl, self.addr_tgt = "10.251.7.1", "10.251.7.2"
        self.relay: subprocess.Popen | None = None
        self.echo: subprocess.Popen | None = None
        self.echo_port = 0
        self.netns_made: list[str] = []
        self.listen_addr = self.addr_tgt
        self.sshd_ns = [f"--net=/run/netns/{self.ns_tgt}"]
        # Every process measured (the tools, the sshds and their sessions, the namespaces' systemd)
        # at nice -19: on a machine shared with other work, one host's latency is the network's and
        # the host's own, not a turn in the run queue behind someone else's processes.
        self.sshd_prefix = NICE
        self.prio = RT  # see RT above; fleet_net sets each target process's to match (set_prio)

    # --- the network ----------------------------------------------------------------------

    def _ip(self, *argv: str) -> None:
        subprocess.run(["ip", *argv], check=True)

    def make_network(self) -> None:
        veth_c, veth_t = f"rfc{os.getpid() % 100000}", f"rft{os.getpid() % 100000}"
        for ns in (self.ns_ctl, self.ns_tgt):
            self._ip("netns", "add", ns)
            self.netns_made.append(ns)
            self._ip("-n", ns, "link", "set", "lo", "up")
        self._ip("link", "add", veth_c, "type", "veth", "peer", "name", veth_t)
        self._ip("link", "set", veth_c, "netns", self.ns_ctl)
        self._ip("link", "set", veth_t, "netns", self.ns_tgt)
        self._ip("-n", self.ns_ctl, "addr", "add", f"{self.addr_ctl}/30", "dev", veth_c)
        self._ip("-n", self.ns_tgt, "addr", "add", f"{self.addr_tgt}/30", "dev", veth_t)
        self._ip("-n", self.ns_ctl, "link", "set", veth_c, "up")
        self._ip("-n", self.ns_tgt, "link", "set", veth_t, "up")

    def in_ns(self, ns: str, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{ns}", "--", *argv]

    def measure(self, job: dict, name: str, grp=None, keep: bool = False) -> dict:
        return super().measure({**job, "argv": [*self.prio, *job["argv"]]}, name, grp, keep)

    def set_prio(self, rt: bool) -> None:
        """The tools' priority from now on, and every target process's (the sshds, whose sessions
        inherit it, and the namespaces' systemd)."""
        self.prio = RT if rt else NICE
        pids = descendants(set(self.targets.pids()) | {nsd.pid for nsd in self.nsds} | {p.pid for p in self.sshds})
        for pid in pids:
            try:
                if rt:
                    os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(10))
                else:
                    os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
                    os.setpriority(os.PRIO_PROCESS, pid, -19)
            except OSError:
                pass  # gone meanwhile

    def start_relay(self, rtt_ms: float) -> float:
        """(Re)start the relay with rtt_ms/2 each way; the effective RTT a probe measures, ms."""
        self.stop_relay()
        maps = [f"--map={h['port']}:{self.addr_tgt}:{h['port']}" for h in self.hosts]
        maps.append(f"--map={self.echo_port}:{self.addr_tgt}:{self.echo_port}")
        argv = ["chrt", "-f", "50", sys.executable, str(HERE / "netdelay.py"), "--delay", str(rtt_ms / 2000),
                "--lifetime", "7200", *maps]
        self.relay = subprocess.Popen(self.in_ns(self.ns_ctl, argv), stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        if self.relay.stdout.readline().strip() != b"ready":
            raise RuntimeError("the delay relay did not start")
        # The probe at real-time priority too: the network's RTT, not this machine's wake-up delays.
        out = subprocess.run(self.in_ns(self.ns_ctl, ["chrt", "-f", "50", sys.executable, str(HERE / "netdelay.py"),
                                                      "--probe", str(self.echo_port)]),
                             capture_output=True, text=True, check=True, timeout=60)
        return float(out.stdout) * 1000

    def stop_relay(self) -> None:
        if self.relay is not None:
            _kill(self.relay)
            self.relay = None

    # --- the machines: the fleet's, with the sshds in the target namespace -------------------

    def start(self) -> None:
        self.make_network()
        from fleet import free_ports

        self.echo_port = free_ports(1)[0]
        self.echo = subprocess.Popen(
            self.in_ns(self.ns_tgt, ["chrt", "-f", "50", sys.executable, str(HERE / "netdelay.py"), "--echo",
                                     str(self.echo_port), "--lifetime", "7200"]),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        if self.echo.stdout.readline().strip() != b"ready":
            raise RuntimeError("the echo server did not start")
        super().start()
        for nsd in self.nsds:
            os.setpriority(os.PRIO_PROCESS, nsd.pid, -19)

    def _wait_listening(self, ports: list[int], timeout: float = 60) -> None:
        code = (f"import socket,sys,time\nd=time.monotonic()+{timeout!r}\n"
                "for p in sys.argv[1:]:\n while True:\n  try:\n"
                f"   socket.create_connection(({self.addr_tgt!r},int(p)),timeout=1).close();break\n  except OSError:\n"
                "   assert time.monotonic()<d, p\n   time.sleep(0.05)\n")
        subprocess.run(self.in_ns(self.ns_tgt, [sys.executable, "-c", code, *map(str, ports)]), check=True,
                       timeout=timeout + 10)

    def stop(self) -> None:
        self.stop_relay()
        if self.echo is not None:
            _kill(self.echo)
            self.echo = None
        try:
            super().stop()
        finally:
            for ns in self.netns_made:  # the veth pair goes with its namespaces
                subprocess.run(["ip", "netns", "del", ns], check=False)
            self.netns_made = []

    # --- the tools, from the controller's namespace ------------------------------------------

    def fleet_jobs(self, n: int) -> list[dict]:
        jobs = super().fleet_jobs(n)
        if n > 1:  # --netfleet-skip: tools left out of the many-host run
            skip = {t.strip() for t in (getattr(self.args, "netfleet_skip", "") or "").split(",") if t.strip()}
            jobs = [j for j in jobs if j["tool"].split(",")[0] not in skip]
        for j in jobs:
            j["argv"] = self.in_ns(self.ns_ctl, j["argv"])
        return jobs

    def run_at(self, rtt_ms: float, hosts: int, runs: int) -> dict:
        """Every tool on the first `hosts` hosts at this RTT: Fleet.run_fleet's rounds."""
        self.set_prio(hosts == 1 or bool(getattr(self.args, "netfleet_big_rt", False)))
        eff = self.start_relay(rtt_ms)
        log(f"netfleet: RTT {rtt_ms:g} ms (a probe through the relay: {eff:.2f} ms), {hosts} host(s), {runs} runs; "
            f"load {os.getloadavg()[0]:.1f}")
        saved = self.args.fleet_hosts, self.args.fleet_runs
        self.args.fleet_hosts, self.args.fleet_runs = [hosts], runs
        try:
            self.run_fleet()
        finally:
            self.args.fleet_hosts, self.args.fleet_runs = saved
        return {"rtt_ms": rtt_ms, "rtt_effective_ms": eff, "hosts": hosts, "load": os.getloadavg(),
                "priority": " ".join(self.prio),
                "tools": self.results.pop("fleet")[str(hosts)]}


def startups(f: NetFleet, reps: int = 5) -> dict:
    """Each controller's start-up with no host (`--version`): the part of a one-host run that
    is not per host (a lower bound: a playbook's parse is not in it, so the per-host part the
    model takes is an upper bound)."""
    from common import PEERS

    cmds = {"reconcile": [*f.rec, "--version"], "pyinfra": [str(PEERS / "bin" / "pyinfra"), "--version"],
            "ansible": [str(PEERS / "bin" / "ansible-playbook"), "--version"]}
    out = {}
    for tool, argv in cmds.items():
        if tool != "reconcile" and f.args.no_peers:
            continue
        job = {"argv": argv, "env": f.peer_env() if tool != "reconcile" else f.env, "cwd": str(f.work),
               "rcs": [0], "expect": []}
        rows = [f.measure(job, f"startup-{tool}-{i}") for i in range(reps + 1)][1:]
        out[tool] = {"wall": median([r["wall"] for r in rows]), "cpu": median([r["cpu"] for r in rows])}
        log(f"netfleet: {tool} start-up {out[tool]['wall']:.3f}s wall, {out[tool]['cpu']:.3f}s CPU")
    return out


def descendants(pids: set[int]) -> set[int]:
    out, todo = set(), list(pids)
    while todo and len(out) < 100000:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _kill(p: subprocess.Popen) -> None:
    """Our own child's process group (start_new_session), by its id."""
    try:
        os.killpg(p.pid, 15)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.wait()


def summary(rows: list[dict]) -> dict:
    """Per tool and RTT: median wall, controller CPU and target CPU, per host."""
    out: dict = {}
    for r in rows:
        for tool, t in r["tools"].items():
            rs = t["runs"]
            if not rs:
                continue
            out.setdefault(tool, {"label": t["label"]})[f"{r['rtt_ms']:g}@{r['hosts']}"] = {
                "wall": median([x["wall"] for x in rs]), "cpu": median([x["cpu"] for x in rs]),
                "target_cpu": median([x["target_cpu"] for x in rs]),
                "problems": sorted({p[:200] for x in rs for p in x["problems"]})}
    return out


def main_netfleet(args) -> dict:
    """The per-host latencies at each RTT, then the many-host check at 0.2 ms."""
    big = max(args.fleet_hosts)
    args.fleet_hosts = sorted({1, big})
    f = NetFleet(args)
    rows: list[dict] = []
    starts: dict = {}
    t0 = time.monotonic()
    try:
        f.start()
        starts = startups(f)
        for rtt in RTTS_MS:
            rows.append(f.run_at(rtt, 1, args.fleet_runs))
        if big > 1:
            rows.append(f.run_at(0.2, big, max(1, args.fleet_runs // 3)))
    finally:
        f.stop()
    return {"rows": rows, "summary": summary(rows), "startups": starts, "probe": "fifo",
            "parallel": args.fleet_parallel,
            "files": args.fleet_files, "namespaces": args.fleet_namespaces, "gpus": f.gpus,
            "seconds": time.monotonic() - t0, "cpus": os.cpu_count()}
