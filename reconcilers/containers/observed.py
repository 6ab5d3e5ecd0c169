"""What the containers kind observes: one container as its engine reports it, and the reference the
gpus kind gives a holder that runs inside a container."""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("docker", "podman")


@dataclass(frozen=True)
class ContainerObserved:
    """One declared container, as `docker inspect` / `podman inspect` report it (exists=False: the
    engine answered that it has no container of that name)."""

    name: str
    engine: str  # docker | podman (for a missing container: the engine asked, or "docker/podman")
    exists: bool
    id: str = ""
    status: str = ""  # .State.Status: created, running, restarting, paused, exited, dead (podman: configured, stopped)
    # True/False: running or not; None: the engine and /proc disagree (podman's state says running
    # for a PID that is gone once conmon died), see `note`.
    running: bool | None = False
    pid: int = 0  # .State.Pid, as the engine reports it (a namespace PID for a podman in another PID namespace)
    host_pids: tuple[int, ...] = ()  # the processes /proc shows in the container's cgroup (local host only)
    restart: str = "no"  # the engine's policy in its own words: no, always, unless-stopped, on-failure[:N]
    restart_count: int = 0  # .RestartCount
    image: str = ""  # .Config.Image: the reference it was created from
    image_id: str = ""  # .Image
    unit: str = ""  # the systemd unit that owns it (declared, PODMAN_SYSTEMD_UNIT, conmon's service)
    unit_from: str = ""  # how the owner was found
    compose: tuple[str, str] = ("", "")  # com.docker.compose.project / .service labels
    # Whether the engine can change a container's restart policy in place (`docker update
    # --restart`; podman 4.3's `podman update` has no --restart).
    restart_settable: bool = True
    note: str = ""  # a disagreement worth saying (engine vs /proc)


@dataclass(frozen=True)
class ContainerRef:
    """The container a GPU holder runs in, from its /proc/PID/cgroup, and what its engine says of it
    (`name` empty and `error` set when the engine could not be asked)."""

    engine: str
    id: str  # the 64-hex container id from the cgroup path
    name: str = ""
    image: str = ""
    restart: str = ""
    unit: str = ""  # the systemd unit that owns it, if any
    error: str = ""

    def label(self) -> str:
        if not self.name:
            return f"{self.engine} container {self.id[:12]} ({self.error or 'not known to its engine'})"
        extra = [self.engine, f"image {self.image}" if self.image else "", f"restart {self.restart}"]
        if self.unit:
            extra.append(f"owned by {self.unit}")
        return f"container:{self.name} ({', '.join(e for e in extra if e)})"
