"""The job that writes the samples: the `job.command` started detached by reconcile (its pid
file names one process by pid and start time), or the `job.unit` started through systemd."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...common import systemd
from ...common.systemd import RUNNING
from ...core.atomic import write_json
from ...core.contract import ApplyError, ObserveError, Resource, utc_iso
from .records import load_json, state_dir

if TYPE_CHECKING:
    from ...core.host import Host


CALL_TIMEOUT = 30.0
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class JobObserved:
    """The job that writes an extraction's files: how it is resumed, and whether it runs."""

    how: str  # "unit", "command" or "none" (no job declared)
    target: str  # unit name or command line
    running: bool
    state: str  # "active/running", "pid 4242 running", "not running", "not found"
    pid: int = 0
    exists: bool = True  # False: the job's unit is not known to systemd
    # A job command reconcile started that has ended: how (its exit status; negative: killed by
    # that signal), when it was started, and the last lines of its log.
    exit_status: int | None = None
    started: str = ""
    log_tail: str = ""

    def ended(self) -> str:
        """How the last started command ended, with its log's last lines; "" if unknown or running."""
        if self.running or self.exit_status is None:
            return ""
        how = (f"killed by signal {-self.exit_status}" if self.exit_status < 0
               else f"exited with status {self.exit_status}")
        text = f"the job started {self.started} {how}" if self.started else f"the job {how}"
        return text + (f"; the end of its log: {self.log_tail}" if self.log_tail else "; its log is empty")



def observe_jobs(host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
    """Each extraction's job: its unit (one `systemctl show` for all) or command."""
    jobs: dict[str, Any] = {}
    units = [r for r in resources if r.spec["job"].get("unit")]
    if units:
        names = [r.spec["job"]["unit"] for r in units]
        try:
            shown = systemd.show(host, names, CALL_TIMEOUT)
        except ObserveError as exc:
            shown = ObserveError(f"the job's unit: {exc}")
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
        argv = r.spec["job"].get("command")
        if not argv:
            jobs[r.id] = JobObserved("none", "", False, "no job declared")
            continue
        pid = command_pid(host, r.name)
        if pid:
            jobs[r.id] = JobObserved("command", " ".join(argv), True, f"pid {pid} running", pid)
            continue
        status, started, tail = command_ended(r.name)
        state = "not running" if status is None else f"not running (exited {status})"
        jobs[r.id] = JobObserved("command", " ".join(argv), False, state, 0, exit_status=status,
                                 started=started, log_tail=tail)
    return jobs


LOG_TAIL_LINES = 5
LOG_TAIL_BYTES = 2048


def command_ended(name: str) -> tuple[int | None, str, str]:
    """How the command reconcile last started ended: (exit status, its start time, its log's last
    lines), from the status file its reaper wrote (local/host.py `_REAPER`) for that very pid;
    (None, "", "") when no such record exists (still starting, or started by an older reconcile)."""
    d = state_dir()
    info = load_json(os.path.join(d, f"{name}.pid"))
    ended = load_json(os.path.join(d, f"{name}.exit.json"))
    if not info or not ended or ended.get("pid") != info.get("pid") or not isinstance(ended.get("returncode"), int):
        return None, "", ""
    return ended["returncode"], str(info.get("started", "")), log_tail(os.path.join(d, f"{name}.log"))


def log_tail(path: os.PathLike | str) -> str:
    """The last LOG_TAIL_LINES non-empty lines of a log (at most LOG_TAIL_BYTES), joined by " | "."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - LOG_TAIL_BYTES))
            data = fh.read(LOG_TAIL_BYTES)
    except OSError:
        return ""
    lines = [x.strip() for x in data.decode("utf-8", "replace").splitlines() if x.strip()]
    return " | ".join(lines[-LOG_TAIL_LINES:])


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
    info = load_json(os.path.join(state_dir(), f"{name}.pid"))
    if not info or not isinstance(info.get("pid"), int) or info["pid"] <= 1:
        return None
    start = proc_starttime(host, info["pid"])
    return info["pid"] if start is not None and start == info.get("starttime") else None


def start_command(host: Host, resource: Resource) -> str:
    job = resource.spec["job"]
    argv = list(job["command"])
    d = state_dir()
    os.makedirs(d, mode=0o700, exist_ok=True)
    log = os.path.join(d, f"{resource.name}.log")
    status = os.path.join(d, f"{resource.name}.exit.json")
    try:
        try:
            os.unlink(status)  # how the previous job ended: not this one's
        except FileNotFoundError:
            pass
        pid = host.spawn_detached(argv, log, cwd=job.get("cwd"), status_path=status)
    except OSError as exc:
        raise ApplyError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    write_json(os.path.join(d, f"{resource.name}.pid"), {
        "pid": pid, "starttime": proc_starttime(host, pid), "argv": argv, "log": log,
        "status": status, "started": utc_iso(),
    })
    return f"started pid {pid}: {' '.join(argv)} (output in {log})"
