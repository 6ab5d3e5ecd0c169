"""The fleet: a hundred inventory hosts on this machine, and the same audit written for each tool.

Each host is an sshd port on 127.0.0.1 (an sshd listens on at most 16), and each sshd runs
inside one of a few namespaced systemds (tests/nsystemd.py): a session on host i lands in
namespace i mod K, where the vLLM unit runs, `/data` is a tmpfs of that namespace only and
the fake GPUs are held. Every host has its own address (port), host-key entry, state file,
journal, cache and integrity records, so no tool can share a connection or a cache between
two hosts; hosts in one namespace share its systemd, as containers on one node do.

Sessions start with HOME set to an empty directory (sshd's SetEnv): this machine's
/root/.bashrc runs `pyenv init`, which costs every ssh command about 80 ms of CPU, a cost of
this machine and not of any tool.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

from cgroups import Group
from install import registered_kinds
from samples import generate_files
from scenario import Scenario

from common import PEERS, VLLM, log

SSHD = "/usr/sbin/sshd"
PORTS_PER_SSHD = 16  # sshd's MAX_LISTEN_SOCKS
# The cheaper key exchange a fleet may choose (not post-quantum; reconcile's default keeps
# OpenSSH's own sntrup761x25519 on 9.0-9.8, docs/remote.md): a row with it shows what the key
# exchange costs.
FAST_KEX = "^curve25519-sha256"


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together, so no two are the same)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class FleetScenario(Scenario):
    def __init__(self, args):
        super().__init__(args)
        self.nsds: list = []
        self.sshds: list[subprocess.Popen] = []
        self.hosts: list[dict] = []  # name, port, ns (index), dir
        self.cg_prefix = f"reconcile-fleet-{os.getpid()}"
        self.targets = Group(f"{self.cg_prefix}-targets")
        self.keys = self.work / "keys"
        self.remote_home = self.work / "remote-home"
        self.env.update({"XDG_RUNTIME_DIR": str(self.work / "run")})
        # Where the sshds listen, and nsenter's extra options for them (fleet_net.py: a network namespace).
        self.listen_addr = "127.0.0.1"
        self.sshd_ns: list[str] = []
        self.sshd_prefix: list[str] = []  # before sshd itself (fleet_net.py: nice)

    # --- the machines ------------------------------------------------------------------

    def start(self) -> None:
        import sys

        from common import ROOT

        sys.path.insert(0, str(ROOT / "tests"))
        from nsystemd import NamespacedSystemd

        why = NamespacedSystemd.missing_prerequisites()
        if why:
            sys.exit(f"bench: cannot boot the namespaced systemd: {why}")
        for tool in (SSHD, "/usr/bin/ssh", "/usr/bin/ssh-keygen"):
            if not os.access(tool, os.X_OK):
                sys.exit(f"bench: the fleet needs OpenSSH ({tool} missing: apt-get install openssh-server)")
        n_hosts = max(self.args.fleet_hosts)
        k = max(1, min(self.args.fleet_namespaces, n_hosts))
        self.build_fake_nvml()
        self.kinds = {"units"} | ({"mounts", "extractions"} & registered_kinds()) | ({"gpus"} if self.gpus else set())
        self.data.mkdir()
        for d in (self.keys, self.remote_home, self.work / "run", self.work / "acp"):
            d.mkdir(mode=0o700)
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key, "-f", str(self.keys / key)],
                           check=True)
        (self.keys / "authorized_keys").write_text((self.keys / "client_key.pub").read_text())
        ports = free_ports(n_hosts)
        names = [f"h{i + 1:03d}" for i in range(n_hosts)]
        self.hosts = [{"name": name, "port": ports[i], "ns": i % k, "dir": self.work / "hosts" / name}
                      for i, name in enumerate(names)]
        t0 = time.perf_counter()
        for j in range(k):
            nsd = NamespacedSystemd(f"{self.cg_prefix}-{j}")
            nsd.write_unit(VLLM, "[Unit]\nDescription=vLLM Kimi-K2.5 INT4 (benchmark stand-in)\n\n"
                           "[Service]\nExecStart=/bin/sleep infinity\nRestart=always\n\n"
                           "[Install]\nWantedBy=multi-user.target\n", enable=True)
            nsd.start()
            self.nsds.append(nsd)
            nsd.wait_active(VLLM)
            # The namespace's systemd answers every tool's systemctl: its CPU is the targets'.
            if self.targets.version == 1:
                self.targets.add(nsd.pid)
            nsd.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(self.data)], check=True)
            generate_files(nsd.root / str(self.hs).lstrip("/"), self.args.fleet_files,
                           recent=min(200, self.args.fleet_files))
            nsd.run(["mkdir", "-p", "-m", "0755", "/run/sshd"], check=True)
            mine = [h for h in self.hosts if h["ns"] == j]
            for s in range(0, len(mine), PORTS_PER_SSHD):
                self._start_sshd(nsd, j, s // PORTS_PER_SSHD, [h["port"] for h in mine[s:s + PORTS_PER_SSHD]])
        self._wait_listening([h["port"] for h in self.hosts])
        log(f"fleet: {n_hosts} hosts on {len(self.sshds)} sshds in {k} namespaced systemds "
            f"({time.perf_counter() - t0:.1f}s); {self.args.fleet_files:,} sample files in each namespace's /data")
        hostkey = " ".join((self.keys / "host_key.pub").read_text().split()[:2])
        (self.keys / "known_hosts").write_text("".join(f"[127.0.0.1]:{h['port']} {hostkey}\n" for h in self.hosts))
        self.state = self.work / "fleet-state.yaml"
        self.state.write_text(self.state_yaml(total=self.args.fleet_files))
        for h in self.hosts:
            h["dir"].mkdir(parents=True)
            (h["dir"] / "state.yaml").write_text(self.state.read_text())
        self.write_fleet_tools()

    def _start_sshd(self, nsd, j: int, s: int, ports: list[int]) -> None:
        conf = self.work / f"sshd-{j}-{s}.conf"
        setenv = [f"HOME={self.remote_home}"]
        if self.gpus:
            setenv += [f"{k}={self.env[k]}" for k in ("LD_LIBRARY_PATH", "FAKE_NVML_CONFIG", "RECONCILE_SYSFS_PCI",
                                                  "RECONCILE_NVIDIA_PROC_DIR")]
        conf.write_text("".join(f"ListenAddress {self.listen_addr}:{p}\n" for p in ports) + "\n".join([
            f"HostKey {self.keys / 'host_key'}",
            "PidFile none",
            f"AuthorizedKeysFile {self.keys / 'authorized_keys'}",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "StrictModes no",
            "PrintMotd no",
            "PrintLastLog no",
            # Every tool opens up to --parallel connections at once to each sshd.
            "MaxStartups 500",
            "MaxSessions 200",
            "LogLevel ERROR",
            "Subsystem sftp internal-sftp",
            f"SetEnv {' '.join(setenv)}",
        ]) + "\n")
        argv = ["nsenter", "-t", str(nsd.pid), "-m", "-p", "-u", *self.sshd_ns, "--", *self.sshd_prefix, SSHD,
                "-D", "-e", "-f", str(conf)]
        with open(self.work / f"sshd-{j}-{s}.log", "ab") as err:
            # Inside the targets' cgroup: every session, and all it runs, is counted there.
            self.sshds.append(subprocess.Popen(self.targets.wrap(argv), stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=err, start_new_session=True))

    def _wait_listening(self, ports: list[int], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for port in ports:
            while True:
                dead = [p for p in self.sshds if p.poll() is not None]
                if dead:
                    logs = "".join(p.read_text() for p in self.work.glob("sshd-*.log"))
                    raise RuntimeError(f"an sshd exited {dead[0].returncode}: {logs[-2000:]}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"no sshd listening on 127.0.0.1:{port}") from None
                    time.sleep(0.05)

    def stop(self) -> None:
        for p in self.sshds:
            try:
                os.killpg(p.pid, 15)  # our own sshd (nsenter's process group)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        self.sshds = []
        for nsd in self.nsds:
            nsd.stop()  # SIGKILL to its PID 1: the sessions, their processes and the tmpfs go with it
        self.nsds = []
        self.targets.stop_all()
        self.targets.remove()
        super().stop()

    # --- the audit, for each tool --------------------------------------------------------

    def ssh_options(self) -> list[str]:
        """The client options every ssh-based tool gets: our key, our known_hosts, no prompts."""
        return [f"IdentityFile={self.keys / 'client_key'}", "IdentitiesOnly=yes",
                f"UserKnownHostsFile={self.keys / 'known_hosts'}", "StrictHostKeyChecking=yes"]

    def remote_command(self, h: dict, script: str | None = None, tag: str = "") -> str:
        """reconcile on the target as installed there, with this host's own cache and records."""
        d = h["dir"]
        return (f"env RECONCILE_CACHE_DIR={d / ('cache' + tag)} RECONCILE_STATE_DIR={d / ('state' + tag)} "
                f"{script or self.rec[0]}")

    def builds(self) -> list[tuple[str, str]]:
        """(tag, reconcile script) of each reconcile timed: this tree's, and --fleet-compare's."""
        out = [("", self.rec[0])]
        if self.args.fleet_compare:
            out.append(("-compare", self.args.fleet_compare))
        return out

    def write_fleet_tools(self) -> None:
        nvsmi, data, hs = str(self.work / "nvsmi"), str(self.data), str(self.hs)
        find_sh = f"find {hs} -name 'data_*' | wc -l"
        opts = self.ssh_options()
        for n in self.args.fleet_hosts:
            hosts = self.hosts[:n]
            # reconcile (and the build compared with it, with caches of its own)
            for tag, script in self.builds():
                lines = ["version: 1", "defaults:", "  connect_timeout: 30s", "  ssh_options:",
                         *(f"    - {json.dumps(o)}" for o in opts), "hosts:"]
                for h in hosts:
                    lines += [f"  {h['name']}:", f"    address: ssh://root@127.0.0.1:{h['port']}",
                              f"    state: hosts/{h['name']}/state.yaml",
                              f"    remote_command: {json.dumps(self.remote_command(h, script, tag))}"]
                    if not tag:  # (a build before the fix passed a host's journal to diff, which refused it)
                        lines.append(f"    journal: {h['dir'] / 'journal.jsonl'}")
                (self.work / f"inventory-{n}{tag}.yaml").write_text("\n".join(lines) + "\n")
            # Ansible
            (self.work / "ansible").mkdir(exist_ok=True)
            ini = [f"{h['name']} ansible_host=127.0.0.1 ansible_port={h['port']}" for h in hosts]
            ini += ["", "[all:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={self.keys / 'client_key'}",
                    "ansible_ssh_common_args=" + " ".join(f"-o {o}" for o in opts[1:]),
                    "ansible_python_interpreter=/usr/bin/python3"]
            (self.work / "ansible" / f"hosts-{n}.ini").write_text("\n".join(ini) + "\n")
            # pyinfra
            (self.work / "pyinfra").mkdir(exist_ok=True)
            common = {"ssh_user": "root", "ssh_key": str(self.keys / "client_key"),
                      "ssh_known_hosts_file": str(self.keys / "known_hosts"), "ssh_strict_host_key_checking": "yes",
                      "ssh_look_for_keys": False, "ssh_allow_agent": False}
            inv = [(h["name"], {"ssh_hostname": "127.0.0.1", "ssh_port": h["port"], **common}) for h in hosts]
            (self.work / "pyinfra" / f"inventory_{n}.py").write_text(f"hosts = {inv!r}\n")

        # Ansible: the best-known tuning (pipelining, facts off, its default ControlPersist).
        (self.work / "ansible" / "ansible.cfg").write_text("\n".join([
            "[defaults]", f"forks = {self.args.fleet_parallel}", "gathering = explicit", "host_key_checking = True",
            "retry_files_enabled = False", "nocolor = True",
            "[ssh_connection]", "pipelining = True", f"control_path_dir = {self.work / 'acp'}",
        ]) + "\n")
        tasks = [
            "    - name: vLLM unit stopped and disabled",
            "      ansible.builtin.systemd_service:",
            f"        name: {VLLM}", "        state: stopped", "        enabled: false",
        ]
        if self.gpus:
            tasks += [
                "    - name: GPU memory in use (nvidia-smi)", f"      ansible.builtin.command: {nvsmi}",
                "      check_mode: false", "      changed_when: false", "      register: gpu",
                "    - name: GPUs free", "      ansible.builtin.assert:",
                "        that: \"{{ gpu.stdout_lines | map('split', ', ') | map('last') | map('int') | max == 0 }}\"",
                "      ignore_errors: true",
            ]
        tasks += [
            "    - name: mount facts", "      ansible.builtin.mount_facts:", "        fstypes: [tmpfs]",
            "    - name: /data mounted, tmpfs, enough free space", "      ansible.builtin.assert:", "        that:",
            f"          - \"'{data}' in ansible_facts.mount_points\"",
            f"          - \"ansible_facts.mount_points['{data}'].fstype == 'tmpfs'\"",
            f"          - \"ansible_facts.mount_points['{data}'].size_available >= 104857600\"",
            "      ignore_errors: true",
            "    - name: count the extraction's files", f"      ansible.builtin.shell: \"{find_sh}\"",
            "      check_mode: false", "      changed_when: false", "      register: files",
            "    - name: files done", "      ansible.builtin.debug:", "        msg: \"files={{ files.stdout | int }}\"",
        ]
        (self.work / "ansible" / "audit.yml").write_text("\n".join([
            "- name: audit the fleet", "  hosts: all", "  gather_facts: false", "  tasks:", *tasks]) + "\n")

        # pyinfra: the incident's deploy, with the faster file count (a command, not the FindFiles fact).
        deploy = [
            "from pyinfra import host",
            "from pyinfra.facts.server import Command, Mounts",
            "from pyinfra.operations import systemd",
            "",
            f"systemd.service(name='vLLM unit stopped and disabled', service={VLLM!r}, running=False, enabled=False)",
            f"m = host.get_fact(Mounts).get({data!r})",
            "print(host.name, 'mount', 'ok' if m and m.get('type') == 'tmpfs' else 'MISSING', flush=True)",
            f"avail = int(host.get_fact(Command, command={f'df -B1 --output=avail {data} | tail -1'!r}))",
            "print(host.name, 'free', 'ok' if avail >= 104857600 else 'LOW', flush=True)",
            f"files = int(host.get_fact(Command, command={find_sh!r}))",
            "print(host.name, f'files={files}', flush=True)",
        ]
        if self.gpus:
            deploy += [
                f"used = [int(line.split(', ')[1]) for line in host.get_fact(Command, command={nvsmi!r}).splitlines()]",
                "print(host.name, 'gpus', 'free' if max(used) == 0 else f'BUSY {max(used)} MiB', flush=True)",
            ]
        (self.work / "pyinfra" / "audit.py").write_text("\n".join(deploy) + "\n")

    def fleet_jobs(self, n: int) -> list[dict]:
        """The three tools on the first n hosts: argv, environment, and what their output must show."""
        p = self.args.fleet_parallel
        penv = self.peer_env()
        penv.update({"ANSIBLE_CONFIG": str(self.work / "ansible" / "ansible.cfg")})
        rec = [*self.rec, "diff", "--inventory", str(self.work / f"inventory-{n}.yaml"), "--parallel", str(p)]
        expect = [(rf"(?m)^{n} hosts?: {n} drift\.$", 1), (r"(?m)^h\d{3}\s+drift\s", n)]
        fast = [*rec, "--ssh-option", f"KexAlgorithms={FAST_KEX}"]
        # curve25519 first (what paramiko, and so pyinfra, negotiates): the key exchange a fleet may
        # choose for CPU. The default row keeps OpenSSH 9.0-9.8's own sntrup761x25519 (post-quantum),
        # whose key generation is most of the ssh client's CPU.
        jobs = [{"tool": "reconcile", "label": f"reconcile diff --inventory --parallel {p} --ssh-option "
                 f"KexAlgorithms={FAST_KEX}", "argv": fast,
                 "env": self.env, "cwd": str(self.work), "rcs": [2], "expect": expect, "warm": "reconcile, warm",
                 "warmup_each": True},
                {"tool": "reconcile, sntrup761", "argv": rec,
                 "label": f"reconcile diff --inventory --parallel {p} (the default key exchange)",
                 "env": self.env, "cwd": str(self.work), "rcs": [2], "expect": expect}]
        if self.args.fleet_compare:
            jobs.append({"tool": "reconcile, compared", "env": self.env, "cwd": str(self.work), "rcs": [2],
                         "label": f"{self.args.fleet_compare} diff --inventory --parallel {p} (--fleet-compare)",
                         "argv": [self.args.fleet_compare, "diff", "--inventory",
                                  str(self.work / f"inventory-{n}-compare.yaml"), "--parallel", str(p)],
                         "expect": expect, "warmup_each": True})
        if not self.args.no_peers:
            jobs += [
                {"tool": "pyinfra", "label": f"pyinfra --dry --parallel {p}",
                 "argv": [str(PEERS / "bin" / "pyinfra"), f"inventory_{n}.py", "audit.py", "--dry",
                          "--parallel", str(p)],
                 "env": penv, "cwd": str(self.work / "pyinfra"), "rcs": [0],
                 "expect": [(rf"(?m)^h\d{{3}} files={self.args.fleet_files}$", n)]},
                {"tool": "ansible", "label": f"ansible-playbook --check --diff, forks {p}",
                 "argv": [str(PEERS / "bin" / "ansible-playbook"), "-i", f"hosts-{n}.ini", "--check", "--diff",
                          "audit.yml"],
                 "env": penv, "cwd": str(self.work / "ansible"), "rcs": [0],
                 "expect": [(rf"\"msg\": \"files={self.args.fleet_files}\"|msg: files={self.args.fleet_files}", n),
                            (r"(?m)^h\d{3}\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", n)]},
            ]
        return jobs
