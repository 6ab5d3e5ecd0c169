"""Which container a process runs in, from /proc/PID/cgroup (the kernel's answer, whatever the
engine's PID namespace: a podman in another PID namespace reports PIDs this /proc does not have).

The cgroup path names the container, only where the engine itself puts it: `/docker/<id>` and
`/libpod_parent/libpod-<id>` (the cgroupfs driver), `/system.slice/docker-<id>.scope` and
`/machine.slice/libpod-<id>.scope` (the systemd driver), `libpod-payload-<id>` (podman's
`--cgroups=split`, inside the system service that runs it). Containers add cgroup v1 hierarchies
until reboot, so no fixed set of lines is assumed: every line is looked at.
"""

from __future__ import annotations

import os
import re

_HEX64 = re.compile(r"[0-9a-f]{64}")
# The cgroups the engines themselves create, as whole paths from the hierarchy's root (a process
# may sit in a cgroup below its container's own). Nothing else counts: a user may create a cgroup
# of any name in their delegated subtree (user@UID.service, systemd.resource-control(5)
# Delegate=), `docker-<id>.scope` included, and must not be taken for that container.
# - docker, cgroupfs driver: /docker/<id> (moby daemon/oci cgroupsPath "/docker/<id>");
#   systemd driver: /system.slice/docker-<id>.scope (moby's "system.slice:docker:<id>");
# - podman, cgroupfs: /libpod_parent/libpod-<id>; systemd: /machine.slice/libpod-<id>.scope;
#   --cgroups=split: libpod-payload-<id> inside the system service that runs it.
_ENGINE_PATHS = (
    ("docker", re.compile(r"/docker/([0-9a-f]{64})(?:/.*)?")),
    ("docker", re.compile(r"/system\.slice/docker-([0-9a-f]{64})\.scope(?:/.*)?")),
    ("podman", re.compile(r"/libpod_parent/libpod-([0-9a-f]{64})(?:/.*)?")),
    ("podman", re.compile(r"/machine\.slice/libpod-([0-9a-f]{64})\.scope(?:/.*)?")),
    ("podman", re.compile(r"/system\.slice/(?!user@)[^/]+\.service/libpod-payload-([0-9a-f]{64})(?:/.*)?")),
)


def container_of_cgroup(text: str) -> tuple[str, str] | None:
    """(engine, 64-hex id) of the container a /proc/PID/cgroup text names, or None: only from a
    path the engine itself creates (_ENGINE_PATHS), whole from the hierarchy's root."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for engine, rx in _ENGINE_PATHS:
            m = rx.fullmatch(parts[2])
            if m:
                return engine, m.group(1)
    return None


def service_of_cgroup(text: str) -> str:
    """The system service a /proc/PID/cgroup text names ("" for none, a scope or a user manager): the
    unit that owns a container's conmon (podman generate systemd) or its payload (--cgroups=split)."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == "name=systemd" or (parts[0] == "0" and parts[1] == "")):
            for comp in parts[2].split("/"):
                if comp.endswith(".service") and not comp.startswith("user@"):
                    return comp
    return ""


def read_cgroup(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def pids_in(container_ids: set[str]) -> dict[str, list[int]]:
    """Container id -> the host PIDs /proc shows in its cgroup (one pass over /proc)."""
    out: dict[str, list[int]] = {}
    if not container_ids:
        return out
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        text = read_cgroup(int(entry))
        if not text or not _HEX64.search(text):
            continue
        found = container_of_cgroup(text)
        if found and found[1] in container_ids and _alive(int(entry)):
            out.setdefault(found[1], []).append(int(entry))
    return {k: sorted(v) for k, v in out.items()}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
