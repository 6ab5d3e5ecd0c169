"""CPU seconds and peak memory of a whole process tree, daemons included, from a cgroup of its own.

`wait4` only counts the children a process waited for: the ssh masters that `ControlPersist`
sends to the background (reconcile's and Ansible's) would be missed, and so would their
memory. A cgroup counts every process started inside it, whoever its parent ends up being.
cgroup v2 (`cpu.stat`, `memory.peak`) or the v1 `cpuacct` and `memory` controllers, whichever
this machine has; without either, `Group.available` is False and the caller falls back to
wait4's figures and says so."""

from __future__ import annotations

import os
import shlex
import signal
import time
from pathlib import Path

V2_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


def _v2_root() -> Path | None:
    for root in map(Path, V2_ROOTS):
        if (root / "cgroup.controllers").exists() and (root / "cgroup.subtree_control").exists():
            return root
    return None


def _v1_dir(controller: str) -> Path | None:
    """Where our own process sits in a v1 controller's hierarchy (a child of it is ours to make)."""
    base = Path("/sys/fs/cgroup") / controller
    if not (base / "cgroup.procs").exists():
        return None
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                return base / path.lstrip("/")
    except (OSError, ValueError):
        return None
    return base


class Group:
    """One cgroup (v1: one per controller) named NAME under the bench's own."""

    def __init__(self, name: str):
        self.dirs: list[Path] = []
        self.cpu_dir: Path | None = None
        self.mem_dir: Path | None = None
        self.version = 0
        try:
            self._make(name)
        except OSError:
            self.remove()
            self.dirs, self.cpu_dir, self.mem_dir, self.version = [], None, None, 0

    def _make(self, name: str) -> None:
        cpuacct, memory = _v1_dir("cpuacct"), _v1_dir("memory")
        if cpuacct is not None:
            self.version = 1
            self.cpu_dir = cpuacct / name
            self.cpu_dir.mkdir()
            self.dirs.append(self.cpu_dir)
            if memory is not None:
                self.mem_dir = memory / name
                self.mem_dir.mkdir()
                self.dirs.append(self.mem_dir)
            return
        root = _v2_root()
        if root is None:
            return
        self.version = 2
        d = root / name
        d.mkdir()
        self.dirs.append(d)
        self.cpu_dir = d  # cpu.stat's usage fields exist without the cpu controller
        if "memory" in (root / "cgroup.subtree_control").read_text().split() and (d / "memory.peak").exists():
            self.mem_dir = d

    @property
    def available(self) -> bool:
        return self.cpu_dir is not None

    def wrap(self, argv: list[str]) -> list[str]:
        """argv, started inside this group: a shell moves itself in, then execs it, so that
        nothing the command starts can escape (no preexec_fn in a threaded parent)."""
        if not self.available:
            return argv
        moves = " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self.dirs)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "sh", *argv]

    def add(self, pid: int) -> None:
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def cpu(self) -> tuple[float, float]:
        """(user, system) seconds used by every process that ever ran in the group."""
        if self.cpu_dir is None:
            return float("nan"), float("nan")
        if self.version == 1:
            user = int((self.cpu_dir / "cpuacct.usage_user").read_text()) / 1e9
            system = int((self.cpu_dir / "cpuacct.usage_sys").read_text()) / 1e9
            return user, system
        stat = dict(line.split() for line in (self.cpu_dir / "cpu.stat").read_text().splitlines())
        return int(stat["user_usec"]) / 1e6, int(stat["system_usec"]) / 1e6

    def peak_bytes(self) -> int | None:
        """The group's memory high-water mark (anonymous memory, and page cache it brought in)."""
        if self.mem_dir is None:
            return None
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        return int((self.mem_dir / name).read_text())

    def reset_peak(self) -> bool:
        """Start the high-water mark afresh (v1: write 0; v2: any write, Linux 6.12 and later)."""
        if self.mem_dir is None:
            return False
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            (self.mem_dir / name).write_text("0")
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        if not self.dirs:
            return []
        return [int(p) for p in (self.dirs[0] / "cgroup.procs").read_text().split()]

    def stop_all(self, grace: float = 2.0) -> int:
        """SIGTERM what is left in the group (the ssh masters a tool left behind), then SIGKILL;
        every one of them was started by the command we ran in it."""
        left = self.pids()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            if not self.pids():
                break
        return len(left)

    def remove(self) -> None:
        for d in reversed(self.dirs):
            try:
                d.rmdir()
            except OSError:
                pass
