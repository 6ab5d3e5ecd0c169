"""Which container a process runs in, from /proc/PID/cgroup (the kernel's answer, whatever the
engine's PID namespace: a podman in another PID namespace reports PIDs this /proc does not have).

The cgroup path names the container: `/docker/<id>` and `/libpod_parent/libpod-<id>` (the cgroupfs
driver), `docker-<id>.scope` and `libpod-<id>.scope` (the systemd driver), `libpod-payload-<id>`
(podman's `--cgroups=split`, inside the unit that runs it). Containers add cgroup v1 hierarchies
until reboot, so no fixed set of lines is assumed: every line is looked at.
"""

from __future__ import annotations

import os
import re

_HEX64 = re.compile(r"[0-9a-f]{64}")
# One path component: ENGINE-ID[.scope], libpod-payload-ID, or a bare ID under /docker/.
_COMPONENT = re.compile(r"^(?:(docker|libpod)-(?:payload-)?)?([0-9a-f]{64})(?:\.scope)?$")


def container_of_cgroup(text: str) -> tuple[str, str] | None:
    """(engine, 64-hex id) of the container a /proc/PID/cgroup text names, or None."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        comps = [c for c in parts[2].split("/") if c]
        for i in range(len(comps) - 1, -1, -1):  # the innermost container wins (docker in docker)
            m = _COMPONENT.match(comps[i])
            if not m:
                continue
            prefix, cid = m.groups()
            if prefix == "docker" or (prefix is None and i > 0 and comps[i - 1] == "docker"):
                return "docker", cid
            if prefix == "libpod":
                return "podman", cid
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
