"""Real container engines for tests: a dockerd started by the test (Debian's docker.io) and a
rootful podman with a store of its own, both under a temporary directory, with a busybox-static
root filesystem instead of a registry image.

What is kept off the host (tests/test_containers*.py; docs/testing.md):
- dockerd: `--data-root`, `--exec-root`, `--pidfile`, its socket and its config file (which moves
  the trust key, 20.10's `deprecated-key-path`, out of /etc/docker) in the temporary directory;
  `--iptables=false --ip6tables=false --bridge=none`: no firewall rule, no bridge; containers run
  with `--network none`. It starts its own containerd, whose state is under those roots too.
- podman: CONTAINERS_CONF and CONTAINERS_STORAGE_CONF name a graph root, run root, tmp dir and
  file locks in the temporary directory (shm locks would share /dev/shm/libpod_lock with every
  other store). The storage driver is fixed in the config from the first command (the first
  command on a store fixes it; a mismatch later makes `--restart` silently never work).
  `default_ulimits` because root here lacks CAP_SYS_RESOURCE (podman would raise nofile). The
  static dir is left at its default (under the graph root): conmon's cleanup command, which does
  the restarting, is told the graph root but not a moved static dir, and then finds no
  container. Containers run from a root-filesystem directory (`--rootfs`), so no image is
  copied: an image copy writes a blob cache under /var/lib/containers whatever the store.

The client is /usr/bin/docker, Debian's CLI of the same release as the daemon: CI's Debian 12 has
no other. A machine may have a newer CLI first on PATH (/usr/local/bin/docker 28.x here); it
downgrades its API version to the daemon's (1.41) and words errors differently ("Error response
from daemon: No such container"), which reconcile must read too (tests/test_containers_plan.py),
but the real tests hold reconcile to what CI runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

DOCKERD = "/usr/sbin/dockerd"
DOCKER = "/usr/bin/docker"
PODMAN = "/usr/bin/podman"
BUSYBOX = "/bin/busybox"
IMAGE = "rbox:1"


def _static(path: str) -> bool:
    """True when the ELF at PATH has no program interpreter (busybox-static's, not busybox's)."""
    try:
        head = Path(path).read_bytes()[:8192]
    except OSError:
        return False
    return head.startswith(b"\x7fELF") and b"/ld-linux" not in head and b"ld-musl" not in head


def missing(*tools: str) -> str | None:
    if os.geteuid() != 0:
        return "needs root (container engines)"
    for tool, pkg in ((DOCKERD, "docker.io"), (DOCKER, "docker.io"), (PODMAN, "podman")):
        if tool in tools and not os.path.exists(tool):
            return f"{tool} not installed (apt-get install {pkg})"
    if not _static(BUSYBOX):
        return f"{BUSYBOX} is not static (apt-get install busybox-static)"
    return None


def make_rootfs(where: Path) -> Path:
    """A busybox-static root filesystem: /bin/busybox and its applets as links."""
    root = where / "rootfs"
    for d in ("bin", "dev", "proc", "sys", "etc", "tmp", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in ("sh", "sleep", "cat", "true", "false", "kill"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    return root


def _unmount_under(path: Path) -> None:
    """Unmount whatever an engine left mounted under PATH (deepest first)."""
    prefix = str(path) + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix) or point == str(path):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def wait_for(what: str, check, timeout: float = 60.0, step: float = 0.05):
    """Poll CHECK() until it returns something true: the work decides, the deadline only catches a hang."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step)


class Dockerd:
    """dockerd started by the test; every container it runs is removed and it is stopped at close()."""

    def __init__(self) -> None:
        # A short path: the socket's must fit sun_path (108 bytes).
        self.dir = Path(tempfile.mkdtemp(prefix="rdk-", dir="/tmp"))
        self.sock = self.dir / "docker.sock"
        self.bin = self.dir / "bin"
        self.bin.mkdir()
        (self.bin / "docker").symlink_to(DOCKER)
        (self.dir / "daemon.json").write_text(json.dumps({"deprecated-key-path": str(self.dir / "key.json")}))
        self.proc: subprocess.Popen | None = None
        self.rootfs = make_rootfs(self.dir)

    def env(self) -> dict[str, str]:
        """What a client (reconcile, the test) needs to talk to this daemon with Debian's CLI."""
        return {"DOCKER_HOST": f"unix://{self.sock}", "DOCKER_CONFIG": str(self.dir / "cli"),
                "PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def start(self) -> Dockerd:
        with open(self.dir / "dockerd.log", "ab") as log:
            self.proc = subprocess.Popen(
                [DOCKERD, "--config-file", str(self.dir / "daemon.json"), "--iptables=false", "--ip6tables=false",
                 "--bridge=none", "--storage-driver", "vfs", "--data-root", str(self.dir / "data"),
                 "--exec-root", str(self.dir / "exec"), "--pidfile", str(self.dir / "docker.pid"),
                 "-H", f"unix://{self.sock}"], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        wait_for("dockerd to answer", lambda: self.proc.poll() is not None or self.docker("version", check=False)
                 .returncode == 0)
        if self.proc.poll() is not None:
            raise RuntimeError(f"dockerd exited {self.proc.returncode}: {self.log_tail()}")
        return self

    def log_tail(self, n: int = 20) -> str:
        return "\n".join((self.dir / "dockerd.log").read_text(errors="replace").splitlines()[-n:])

    def docker(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env()})
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def import_image(self, ref: str = IMAGE) -> str:
        tar = subprocess.run(["tar", "-C", str(self.rootfs), "-c", "."], capture_output=True, check=True).stdout
        subprocess.run([DOCKER, "import", "-", ref], input=tar, capture_output=True, check=True,
                       env={**os.environ, **self.env()}, timeout=120)
        return ref

    def inspect(self, name: str) -> dict:
        return json.loads(self.docker("inspect", "--type", "container", name).stdout)[0]

    def seen(self, name: str) -> dict | None:
        """One `docker inspect`: the container as the engine has it, or None where it has none by that
        name ("No such container": a `--rm` container between its removal and the next one's start).
        One call, so the readings a test takes belong to one container."""
        return seen_once(self.docker("inspect", "--type", "container", name, check=False), "docker")

    def stop_daemon(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # our child, by PID; it stops its containers and containerd
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> None:
        """What a host reboot or `systemctl restart docker` does to the containers: the daemon goes
        away (stopping them) and comes back, applying each container's restart policy."""
        self.stop_daemon()
        self.start()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            ids = self.docker("ps", "-aq", check=False).stdout.split()
            if ids:
                self.docker("rm", "-f", *ids, check=False)
        self.stop_daemon()
        _unmount_under(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


class Podman:
    """Rootful podman with a store of its own under a temporary directory."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rpm-", dir="/tmp"))
        d = self.dir
        (d / "containers.conf").write_text(
            "[containers]\n"
            'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'events_logfile_path = "{d}/events.log"\n'
            f'tmp_dir = "{d}/tmp"\n'
            'lock_type = "file"\n'
            "[network]\n"
            f'network_config_dir = "{d}/net"\n')
        (d / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{d}/graph"\nrunroot = "{d}/run"\n')
        self.rootfs = make_rootfs(d)

    def env(self) -> dict[str, str]:
        return {"CONTAINERS_CONF": str(self.dir / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.dir / "storage.conf")}

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env()})
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def run(self, name: str, restart: str, *cmd: str) -> str:
        return self.podman("run", "-d", "--name", name, "--network", "none", f"--restart={restart}",
                           "--rootfs", str(self.rootfs), *cmd).stdout.strip()

    def inspect(self, name: str) -> dict:
        return json.loads(self.podman("inspect", "--type", "container", name).stdout)[0]

    def seen(self, name: str) -> dict | None:
        """As Dockerd.seen: one `podman inspect`, None where podman has no container by that name."""
        return seen_once(self.podman("inspect", "--type", "container", name, check=False), "podman")

    def close(self) -> None:
        self.podman("rm", "-f", "-a", "-t", "0", check=False)
        _unmount_under(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


def seen_once(proc: subprocess.CompletedProcess, engine: str) -> dict | None:
    if proc.returncode == 0:
        return json.loads(proc.stdout)[0]
    # docker: "Error: No such container: NAME"; podman: "no such container" (either capitalisation).
    if "no such container" in proc.stderr.lower():
        return None
    raise AssertionError(f"{engine} inspect exited {proc.returncode}: {proc.stderr}")


def host_pid(inspected: dict) -> int:
    return int(inspected["State"]["Pid"])


def policy(inspected: dict) -> str:
    """The restart policy as the engine stores it (podman's "" means no)."""
    p = inspected["HostConfig"]["RestartPolicy"]
    name = p.get("Name") or "no"
    return f"{name}:{p['MaximumRetryCount']}" if name == "on-failure" and p.get("MaximumRetryCount") else name


@contextlib.contextmanager
def fresh_names(remove):
    """new(prefix) -> a container name no other test uses; every name handed out is passed to
    remove(*names) at the end, whatever the test did with it."""
    made: list[str] = []

    def new(prefix: str = "c") -> str:
        made.append(f"{prefix}-{uuid.uuid4().hex[:8]}")
        return made[-1]

    try:
        yield new
    finally:
        if made:
            remove(*made)
