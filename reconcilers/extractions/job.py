"""The job that writes the samples: a resume `command` started detached by reconcile (its pid
file names one process by pid and start time), or a resume unit started through systemd."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...pipeline.atomic import write_json
from ...pipeline.contract import ApplyError, CommandTimeout, ObserveError, Resource, utc_iso
from ..units.systemctl import PROPERTIES, RUNNING, parse_show
from .records import load_json, state_dir

if TYPE_CHECKING:
    from ...machines.host import Host


CALL_TIMEOUT = 30.0
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class JobObserved:
    """The job that writes an extraction's files: how it is resumed, and whether it runs."""

    how: str  # "unit", "command" or "none" (no resume declared)
    target: str  # unit name or command line
    running: bool
    state: str  # "active/running", "pid 4242 running", "not running", "not found"
    pid: int = 0
    exists: bool = True  # False: the resume unit is not known to systemd



def observe_jobs(host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
    """Each extraction's job: its resume unit (one `systemctl show` for all) or command."""
    jobs: dict[str, Any] = {}
    units = [r for r in resources if r.spec["resume"].get("unit")]
    if units:
        names = [r.spec["resume"]["unit"] for r in units]
        try:
            res = host.run(["systemctl", "show", "--no-pager", "-p", ",".join(PROPERTIES), "--", *names],
                           timeout=CALL_TIMEOUT)
            if not res.ok:
                raise ObserveError(f"cannot read the resume unit's state from systemd: {res.brief()}")
            shown = parse_show(res.stdout, names)
        except (ObserveError, CommandTimeout) as exc:
            shown = ObserveError(str(exc))
        for r, name in zip(units, names, strict=True):
            if isinstance(shown, ObserveError):
                jobs[r.id] = shown
                continue
            u = shown[name]
            jobs[r.id] = JobObserved("unit", name, u.active_state in RUNNING,
                                     f"{u.active_state}/{u.sub_state}" if u.exists else "not found",
                                     u.main_pid, u.exists)
    for r in resources:
        if r.id in jobs:
            continue
        argv = r.spec["resume"].get("command")
        if not argv:
            jobs[r.id] = JobObserved("none", "", False, "no resume declared")
            continue
        pid = command_pid(host, r.name)
        jobs[r.id] = JobObserved("command", " ".join(argv), bool(pid),
                                 f"pid {pid} running" if pid else "not running", pid or 0)
    return jobs


def proc_starttime(host: Host, pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot): with the pid it
    names one process, so a reused pid is not taken for our job. None if gone or a zombie."""
    try:
        stat = host.read_text(f"/proc/{pid}/stat")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return fields[19]


def command_pid(host: Host, name: str) -> int | None:
    info = load_json(state_dir() / f"{name}.pid")
    if not info or not isinstance(info.get("pid"), int) or info["pid"] <= 1:
        return None
    start = proc_starttime(host, info["pid"])
    return info["pid"] if start is not None and start == info.get("starttime") else None


def start_command(host: Host, resource: Resource) -> str:
    resume = resource.spec["resume"]
    argv = list(resume["command"])
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    log = d / f"{resource.name}.log"
    try:
        pid = host.spawn_detached(argv, str(log), cwd=resume.get("cwd"))
    except OSError as exc:
        raise ApplyError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    write_json(d / f"{resource.name}.pid", {
        "pid": pid, "starttime": proc_starttime(host, pid), "argv": argv, "log": str(log),
        "started": utc_iso(),
    })
    return f"started pid {pid}: {' '.join(argv)} (output in {log})"
