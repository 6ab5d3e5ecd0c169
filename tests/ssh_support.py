"""A real OpenSSH server on 127.0.0.1 for the remote tests, and the client options to reach it.

The server runs as root (it must, to switch to the logged-in user) with its own generated
host key, an authorized client key and a config in a temporary directory; nothing listens
anywhere but on loopback.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from nsystemd import children_of

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_prerequisites() -> str | None:
    if os.geteuid() != 0:
        return "needs root (sshd must switch to the logged-in user)"
    for tool in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen")):
        if not tool or not os.access(tool, os.X_OK):
            return "OpenSSH (openssh-server, openssh-client) not installed"
    return None


class Sshd:
    """`sshd -D` on 127.0.0.1:<free port>; `.client_options` are --ssh-option values reaching it."""

    def __init__(self) -> None:
        # Short: the ControlPath socket inside must stay under the 108-byte sun_path limit.
        self.dir = Path(tempfile.mkdtemp(prefix="rsshd", dir="/tmp"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> Sshd:
        d = self.dir
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key, "-f", str(d / key)], check=True)
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        (d / "sshd_config").write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {d / 'host_key'}\n"
            f"PidFile {d / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\n"
            "UsePAM no\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "StrictModes no\n"
            "PrintMotd no\n"
            # Twenty inventory hosts in parallel share this one server.
            "MaxStartups 200\n"
            "MaxSessions 200\n"
            "LogLevel ERROR\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "ab"))  # noqa: SIM115
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {(d / 'sshd.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("sshd did not start listening") from None
                time.sleep(0.05)
        return self

    @property
    def address(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    @property
    def control_dir(self) -> Path:
        path = self.dir / "cm"
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    @property
    def client_options(self) -> list[str]:
        return [
            f"IdentityFile={self.dir / 'client_key'}",
            "IdentitiesOnly=yes",
            f"UserKnownHostsFile={self.dir / 'known_hosts'}",
            "StrictHostKeyChecking=accept-new",
            f"ControlPath={self.control_dir}/%C",
        ]

    def ssh_option_args(self) -> list[str]:
        return [a for opt in self.client_options for a in ("--ssh-option", opt)]

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listener, and theirs)."""
        if self.proc is None:
            return []
        found, frontier = [], [self.proc.pid]
        while frontier:
            for pid, comm in children_of(frontier.pop()):
                if comm == "sshd":
                    found.append(pid)
                    frontier.append(pid)
        return found

    def drop_connections(self) -> int:
        """SIGKILL every per-connection sshd: the TCP connections drop; what they started runs on."""
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def stop(self) -> None:
        if self.proc is not None:
            self.drop_connections()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def sshd():
    why = missing_prerequisites()
    if why:
        pytest.skip(f"real sshd unavailable: {why}")
    server = Sshd().start()
    yield server
    server.stop()
