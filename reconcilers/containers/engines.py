"""Asking Docker and Podman: `docker inspect` / `podman inspect` through their own CLIs, parsed.

Why the CLIs and not the engines' HTTP APIs: the CLI is what the operator's shell uses, so it
honours the same DOCKER_HOST, docker contexts, CONTAINERS_CONF and storage configuration, and it
negotiates the API version with the daemon (a CLI newer than the daemon downgrades); Podman 4.3 has
no API at all unless `podman system service` runs. `inspect` is the engines' own record of a
container (`.State`, `.HostConfig.RestartPolicy`), where `ps` is a table for people.

What each engine says, as probed on Debian 12 (docker.io 20.10, podman 4.3):
- Docker: `.Name` has a leading `/`; the default policy is `"no"`; `.RestartCount` is top level.
  A missing container and an unreachable daemon both exit 1: only stderr tells them apart ("No
  such container: NAME" vs "Cannot connect to the Docker daemon"). Found containers are still
  printed when others are missing, so one call serves every declared container.
- Podman: the default policy name is `""` (it means no); a missing container exits 125 with "no
  such container NAME"; `podman update` has no `--restart` before podman 5 (checked with
  `podman update --help`, not by version number).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...core.host import CommandTimeout
from .cgroup import pids_in, read_cgroup, service_of_cgroup
from .observed import ContainerObserved

if TYPE_CHECKING:
    from ...core.host import Host

CALL_TIMEOUT = 30.0
STOP_TIMEOUT = 180.0  # a container's own stop timeout (10 s by default) and then some
_MISSING = re.compile(r"no such (?:container|object):? (\S+)", re.IGNORECASE)
COMPOSE_PROJECT, COMPOSE_SERVICE = "com.docker.compose.project", "com.docker.compose.service"
# Set by podman from the environment of the unit `podman generate systemd` writes (libpod's
# define.SystemdUnitLabel... the variable is PODMAN_SYSTEMD_UNIT, kept as a label).
PODMAN_UNIT_LABEL = "PODMAN_SYSTEMD_UNIT"


class EngineAnswer:
    """What one `ENGINE inspect NAMES` call gave: entries by name, the names the engine says it does
    not have, and an error when it could not be asked (then nothing is known of the rest)."""

    def __init__(self, found: dict[str, dict[str, Any]], missing: set[str], error: str = "",
                 installed: bool = True):
        self.found, self.missing, self.error, self.installed = found, missing, error, installed


def inspect(host: Host, engine: str, names: Sequence[str]) -> EngineAnswer:
    try:
        res = host.run([engine, "inspect", "--type", "container", *names], timeout=CALL_TIMEOUT)
    except CommandTimeout as exc:
        return EngineAnswer({}, set(), f"{engine} did not answer: {exc}")
    if res.returncode == 127:
        return EngineAnswer({}, set(names), f"{engine} is not installed", installed=False)
    found: dict[str, dict[str, Any]] = {}
    try:
        entries = json.loads(res.stdout or "[]")
    except ValueError:
        entries = None
    if not isinstance(entries, list):
        return EngineAnswer({}, set(), f"cannot read {engine}'s answer: {res.brief()}")
    for entry in entries:
        if isinstance(entry, dict):
            name = str(entry.get("Name", "")).lstrip("/")
            found[name] = entry
            found.setdefault(str(entry.get("Id", "")), entry)
    said_missing = {m.group(1).strip("\"'") for m in _MISSING.finditer(res.stderr)}
    missing = {n for n in names if n not in found and n in said_missing}
    unknown = [n for n in names if n not in found and n not in missing]
    error = ""
    if unknown:
        # Not "no such container": the daemon is down, the socket refused, the store is locked...
        error = f"cannot ask {engine} about {', '.join(unknown)}: {res.brief()}"
    return EngineAnswer(found, missing, error)


NOT_INSTALLED = "!not installed"


def compose_key(host: Host, engine: str, project: str, service: str) -> str | None:
    """The id of the one container of a compose service (its com.docker.compose.* labels, which
    docker compose and podman-compose both set), None for none, "!why" when it cannot be said.
    `ps -q` prints ids only: nothing of the table is parsed."""
    argv = [engine, "ps", "-a", "-q", "--no-trunc", "--filter", f"label={COMPOSE_PROJECT}={project}",
            "--filter", f"label={COMPOSE_SERVICE}={service}"]
    try:
        res = host.run(argv, timeout=CALL_TIMEOUT)
    except CommandTimeout as exc:
        return f"!{engine} did not answer: {exc}"
    if res.returncode == 127:
        return NOT_INSTALLED
    if not res.ok:
        return f"!cannot ask {engine} for compose service {project}/{service}: {res.brief()}"
    ids = res.stdout.split()
    if len(ids) > 1:
        return (f"!compose service {project}/{service} has {len(ids)} containers in {engine} (scaled): "
                "declare each by name")
    return ids[0] if ids else None


def restart_of(entry: Mapping[str, Any]) -> str:
    """The restart policy in the engine's own words (`docker run --restart`): no, always,
    unless-stopped, on-failure or on-failure:N. Podman's "" is "no"."""
    policy = (entry.get("HostConfig") or {}).get("RestartPolicy") or {}
    name = policy.get("Name") or "no"
    retries = int(policy.get("MaximumRetryCount") or 0)
    return f"{name}:{retries}" if name == "on-failure" and retries > 0 else name


def normal_policy(value: str) -> str:
    """A declared policy as restart_of reports it: on-failure:0 is on-failure (no limit)."""
    return "on-failure" if value == "on-failure:0" else value


def image_ref(ref: str) -> str:
    """An image reference without the defaults the engines fill in (docker.io/library/, podman's
    localhost/, the :latest tag), so `vllm/vllm-openai` and `docker.io/vllm/vllm-openai:latest` are one."""
    ref = ref.strip()
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/", "localhost/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix):]
            break
    if ref.startswith("library/"):
        ref = ref[len("library/"):]
    last = ref.rsplit("/", 1)[-1]
    if "@" not in ref and ":" not in last:
        ref += ":latest"
    return ref


def restart_settable(host: Host, engine: str) -> bool:
    """Whether `ENGINE update` takes --restart (docker: yes; podman: only from podman 5)."""
    if engine == "docker":
        return True
    try:
        res = host.run([engine, "update", "--help"], timeout=CALL_TIMEOUT)
    except CommandTimeout:
        return False
    return res.ok and "--restart" in res.stdout


# The kernel's initial PID namespace has this fixed inode number (include/linux/proc_ns.h,
# PROC_PID_INIT_INO): from there every process on the host is in /proc.
PROC_PID_INIT_INO = 0xEFFFFFFC


def initial_pid_namespace() -> bool:
    try:
        return os.stat("/proc/self/ns/pid").st_ino == PROC_PID_INIT_INO
    except OSError:
        return False


def observed_of(name: str, engine: str, entry: Mapping[str, Any], local: bool,
                declared_unit: str = "", settable: bool = True) -> ContainerObserved:
    state = entry.get("State") or {}
    config = entry.get("Config") or {}
    labels = config.get("Labels") or {}
    cid = str(entry.get("Id", ""))
    running: bool | None = bool(state.get("Running"))
    pid = int(state.get("Pid") or 0)
    host_pids: tuple[int, ...] = ()
    note = ""
    unit, unit_from = declared_unit, "declared" if declared_unit else ""
    if local:
        host_pids = tuple(pids_in({cid}).get(cid, ()))
        if running and not host_pids and not initial_pid_namespace():
            # Run in a PID namespace of its own (a container, a namespaced systemd), reconcile does
            # not see the engine's processes: absence here proves nothing, the engine's word stands.
            note = f"{engine}'s processes are not visible from this PID namespace: its word is taken"
        elif running and not host_pids:
            # Podman's record can say running after conmon died with the container: the engine's
            # word and the kernel's disagree, so neither is taken.
            running = None
            note = (f"{engine} says {name} is running (PID {pid}), but no process is in its cgroup: "
                    f"its monitor (conmon) may have died; `{engine} stop {name}` or `{engine} rm` settles it")
        elif running and pid and pid not in host_pids:
            note = f"{engine} reports PID {pid} from another PID namespace; here it is {host_pids[0]}"
        if not unit and engine == "podman" and state.get("ConmonPid"):
            conmon_unit = service_of_cgroup(read_cgroup(int(state["ConmonPid"])))
            if conmon_unit:
                unit, unit_from = conmon_unit, f"its conmon runs in {conmon_unit}"
    if not unit and labels.get(PODMAN_UNIT_LABEL):
        unit, unit_from = labels[PODMAN_UNIT_LABEL], f"label {PODMAN_UNIT_LABEL}"
    return ContainerObserved(
        name=name, engine=engine, exists=True, id=cid, status=str(state.get("Status", "")), running=running,
        pid=pid, host_pids=host_pids, restart=restart_of(entry), restart_count=int(entry.get("RestartCount") or 0),
        image=str(config.get("Image", "")), image_id=str(entry.get("Image", "")), unit=unit, unit_from=unit_from,
        compose=(str(labels.get(COMPOSE_PROJECT, "")), str(labels.get(COMPOSE_SERVICE, ""))),
        restart_settable=settable, note=note)
