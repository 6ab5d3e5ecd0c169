"""The containers GPU holders run in (the gpus kind's question): each PID's container from its
/proc/PID/cgroup, then one `inspect` per engine for their names, images, policies and owners."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .cgroup import container_of_cgroup, read_cgroup, service_of_cgroup
from .engines import PODMAN_UNIT_LABEL, inspect, restart_of
from .observed import ContainerRef

if TYPE_CHECKING:
    from ...core.host import Host


def containers_of(host: Host, pids: Iterable[int]) -> dict[int, ContainerRef]:
    """PID -> the container it runs in, for the PIDs that run in one."""
    where: dict[int, tuple[str, str]] = {}
    for pid in pids:
        found = container_of_cgroup(read_cgroup(pid))
        if found:
            where[pid] = found
    by_engine: dict[str, set[str]] = {}
    for engine, cid in where.values():
        by_engine.setdefault(engine, set()).add(cid)
    refs: dict[tuple[str, str], ContainerRef] = {}
    for engine, ids in by_engine.items():
        answer = inspect(host, engine, sorted(ids))
        for cid in ids:
            entry = answer.found.get(cid)
            if entry is None:
                error = answer.error or f"{engine} does not know it"
                refs[(engine, cid)] = ContainerRef(engine, cid, error=error)
                continue
            labels = (entry.get("Config") or {}).get("Labels") or {}
            state = entry.get("State") or {}
            unit = str(labels.get(PODMAN_UNIT_LABEL) or "")
            if not unit and state.get("ConmonPid"):
                unit = service_of_cgroup(read_cgroup(int(state["ConmonPid"])))
            refs[(engine, cid)] = ContainerRef(
                engine, cid, name=str(entry.get("Name", "")).lstrip("/"),
                image=str((entry.get("Config") or {}).get("Image", "")), restart=restart_of(entry), unit=unit)
    return {pid: refs[key] for pid, key in where.items()}
