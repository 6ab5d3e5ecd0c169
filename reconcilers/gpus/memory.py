"""Who holds GPU memory outside `allow`, and how to free it (pure: observed data in, plan out).

Memory the GPU cannot report (`[N/A]` in nvidia-smi, NOT_SUPPORTED from NVML: the unified
memory of GB10/DGX Spark and Grace) is never 0 MiB: the GPU is then judged from the memory its
processes are reported to hold, and when one of them does not report it (or the process lists
cannot be read) the memory is `unknown` and the plan is blocked saying why.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ...core.contract import Action, Context
from .observed import MIB, Gpu, GpusObserved, Holder

UNKNOWN = "unknown"
DEFAULT_GRACE = 10.0


def allowed(holder: Holder, allow: Sequence[str]) -> bool:
    for entry in allow:
        if entry.startswith("unit:"):
            if holder.unit and fnmatch.fnmatchcase(holder.unit, entry[5:]):
                return True
        elif entry.startswith("container:"):
            c = holder.container
            if c is not None and c.name and fnmatch.fnmatchcase(c.name, entry[10:]):
                return True
        elif holder.visible and holder.path and fnmatch.fnmatchcase(
                holder.path if "/" in entry else os.path.basename(holder.path), entry):
            # The program the process runs, when only root could have put it there: never its
            # comm or argv[0], which any user sets (a process calling itself `vllm-server`).
            return True
    return False


def counted_used(gpu: Gpu, holders: Sequence[Holder], allow: Sequence[str]) -> int | None:
    """The GPU's memory in use that `allow` does not cover; None when it cannot be known.

    The GPU reports its use: that, minus what allowed holders are known to hold on it. It does not:
    the sum of what the other processes hold, if every one of them reports it."""
    if gpu.memory_used is not None:
        expected = sum(u.used_bytes or 0 for h in holders if allowed(h, allow) for u in h.uses if u.gpu == gpu.index)
        return max(0, gpu.memory_used - expected)
    if not gpu.processes_listed:
        return None
    others = [u.used_bytes for h in holders if not allowed(h, allow) for u in h.uses if u.gpu == gpu.index]
    if any(b is None for b in others):
        return None
    return sum(b for b in others if b is not None)


def mib(n: int) -> str:
    return f"{n // MIB}MiB"


def _gpu_list(idx: Sequence[int]) -> str:
    idx = sorted(set(idx))
    if len(idx) > 2 and idx == list(range(idx[0], idx[-1] + 1)):
        return f"GPUs {idx[0]}-{idx[-1]}"
    return ("GPU " if len(idx) == 1 else "GPUs ") + ",".join(str(i) for i in idx)


def holding(h: Holder, gpus: Sequence[int]) -> str:
    uses = [u for u in h.uses if u.gpu in gpus]
    known = [u.used_bytes for u in uses if u.used_bytes is not None]
    if not known:
        what = ", ".join(h.device_files) if h.device_files else "memory"
        return f"holding {what} on {_gpu_list([u.gpu for u in uses])} (memory not reported by NVML)"
    each = set(known)
    amount = mib(known[0]) + (" each" if len(known) > 1 else "") if len(each) == 1 else f"{mib(sum(known))} in all"
    return f"holding {amount} on {_gpu_list([u.gpu for u in uses])}"


def _killable(h: Holder, globs: Sequence[str]) -> bool:
    return any(n and fnmatch.fnmatchcase(n, g) for g in globs for n in (h.name, h.exe))


def _why_unknown(g: Gpu, holders: Sequence[Holder], allow: Sequence[str]) -> str:
    if g.lost or not g.processes_listed:
        return (f"GPU {g.index}: its memory and who holds it cannot be read ({g.lost or 'the process lists failed'}): "
                "nothing was signalled")
    silent = [h for h in holders if not allowed(h, allow)
              for u in h.uses if u.gpu == g.index and u.used_bytes is None]
    who = ", ".join(f"{h.label()}" + (f" ({', '.join(h.device_files)})" if h.device_files else "") for h in silent)
    return (f"GPU {g.index} reports no memory use (NOT_SUPPORTED: unified memory?) and {who} hold"
            f"{'s' if len(silent) == 1 else ''} it without reporting how much: cannot tell whether it is over "
            "max_memory_used; nothing was signalled")


def memory_plan(spec: Mapping[str, Any], observed: GpusObserved, fields: set[str], ctx: Context
                ) -> tuple[list[Action], list[str], list[str]]:
    """(actions, notes, blocked) for the GPUs over `max_memory_used`."""
    allow = spec.get("allow", ())
    free = spec.get("free_with") or {}
    actions: list[Action] = []
    notes: list[str] = []
    blocked: list[str] = []
    over_all = [g for g in observed.gpus if f"gpu{g.index}.memory_used" in fields]
    if not over_all:
        return actions, notes, blocked
    used = {g.index: counted_used(g, observed.holders, allow) for g in over_all}
    blocked.extend(_why_unknown(g, observed.holders, allow) for g in over_all if used[g.index] is None)
    over = [g for g in over_all if used[g.index] is not None]
    limit = spec["max_memory_used"]
    over_idx = {g.index for g in over}
    others = [h for h in observed.holders if not allowed(h, allow)]
    # Memory no listed process accounts for: device-file holders are then suspects too.
    unexplained = {}
    for g in over:
        known = sum(u.used_bytes or 0 for h in others for u in h.uses if u.gpu == g.index)
        unexplained[g.index] = (used[g.index] or 0) - known
    suspects = []
    for h in others:
        hit = [u.gpu for u in h.uses if u.gpu in over_idx
               and ((u.used_bytes or 0) > 0 or (u.used_bytes is None and unexplained[u.gpu] > limit))]
        if hit:
            suspects.append((h, sorted(set(hit))))
    seen_units: set[str] = set()
    seen_containers: set[str] = set()
    for h, hit in suspects:
        free_holder(h, hit, free, ctx, (seen_units, seen_containers), actions, notes, blocked)
    unmapped = [g.index for g in observed.gpus if g.minor is None]
    for g in over:
        # Still over the limit with every listed holder gone, and no device-file holder to blame.
        if unexplained[g.index] > limit and not any(
                u.used_bytes is None and u.gpu == g.index for h, _ in suspects for u in h.uses):
            why = "NVML lists none and no process has its device file open"
            if g.index in unmapped:
                why = ("NVML lists none, and its minor number is unknown, so no device file can be tied to it "
                       "(no holder of a device file is signalled)")
            blocked.append(f"GPU {g.index}: {mib(unexplained[g.index])} held by no process visible here ({why})")
    return actions, notes, blocked


def free_holder(h: Holder, hit: Sequence[int], free: Mapping[str, Any], ctx: Context,
                seen: tuple[set[str], set[str]], actions: list[Action], notes: list[str], blocked: list[str]) -> None:
    """How one holder outside `allow` of the GPUs HIT is freed, as `free_with` allows (its unit
    stopped, its container stopped through the engine, the process terminated), or why it is not:
    appended to ACTIONS, NOTES or BLOCKED. SEEN: the units and containers already planned (one stop
    each). Also how a GPU is freed before it is reset (recovery.py)."""
    seen_units, seen_containers = seen
    what = f"{h.label()} {holding(h, hit)}"
    if h.container is not None and not h.container.unit and h.container.id in seen_containers:
        return
    if h.container is not None and not h.container.unit:
        seen_containers.add(h.container.id)
        _container_plan(h, what, free, ctx, actions, notes, blocked)
    elif not h.visible:
        blocked.append(f"pid {h.pid} {holding(h, hit)} is not visible from here (another PID "
                       "namespace or container?): free it where it runs")
    elif h.pid <= 1 or h.pid == os.getpid():
        blocked.append(f"{what}: PID 1 and reconcile itself are never signalled")
    elif (h.unit or (h.container and h.container.unit)) and free.get("stop_units"):
        unit = h.container.unit if h.container and h.container.unit else h.unit
        if unit in seen_units:
            return
        seen_units.add(unit)
        h = replace(h, unit=unit)  # a container a unit runs is freed through the unit
        declared = ctx.resources.get(f"unit:{h.unit}")
        if declared is not None and declared.spec.get("active") is False:
            notes.append(f"{what}: freed by unit:{h.unit} (declared active: false, acted on first)")
        elif declared is not None:
            blocked.append(f"{what} belongs to {h.unit}, which the state declares active: add "
                           f"unit:{h.unit} to gpus.allow or declare it active: false")
        else:
            actions.append(Action("stop", h.unit, f"stop unit {h.unit} ({what})", {"unit": h.unit}))
    elif h.container is not None:
        blocked.append(f"{what}, run by {h.container.unit}, is not in gpus.allow and stop_units is off: "
                       "nothing was signalled (a container's processes never are)")
    elif _killable(h, free.get("kill", ())):
        verb = f"terminate {h.pid} ({h.name}) {holding(h, hit)}"
        if h.unit:
            verb += f" [in {h.unit}: with Restart= it may come back; stop_units is off]"
        actions.append(Action("terminate", f"pid {h.pid}", verb, {
            "pid": h.pid, "name": h.name, "starttime": h.starttime,
            "grace": free.get("grace", DEFAULT_GRACE)}))
    else:
        where = f" in {h.unit}" if h.unit else ""
        blocked.append(f"{what}{where} is not in gpus.allow"
                       + (" and stop_units is off" if h.unit else "")
                       + " nor matched by free_with.kill: nothing was signalled")

def _container_plan(h: Holder, what: str, free: Mapping[str, Any], ctx: Context, actions: list[Action],
                    notes: list[str], blocked: list[str]) -> None:
    """A holder in a container no unit runs: the container is stopped through its engine, never its
    processes signalled (the engine restarts them) nor its scope unit stopped (the same)."""
    c = h.container
    assert c is not None
    if not c.name:
        blocked.append(f"{what}: its engine cannot be asked about it, so it is not stopped: nothing was signalled")
        return
    declared = ctx.resources.get(f"container:{c.name}")
    when = "when dockerd restarts" if c.engine == "docker" else "at boot (podman-restart.service)"
    back = {"always": f"; its policy (always) starts it again {when}: declare containers: "
                      f"{c.name}: {{running: false, restart: \"no\"}}",
            "unless-stopped": "", "no": ""}.get(c.restart, f"; its policy is {c.restart}")
    if declared is not None and declared.spec.get("running") is False:
        notes.append(f"{what}: freed by container:{c.name} (declared running: false, acted on first)")
    elif declared is not None:
        blocked.append(f"{what}: the state declares container:{c.name} running: add container:{c.name} to "
                       "gpus.allow or declare it running: false")
    elif free.get("stop_containers"):
        actions.append(Action("stop-container", c.name, f"stop container {c.name} through {c.engine} ({what}){back}",
                              {"engine": c.engine, "id": c.id, "name": c.name}))
    else:
        blocked.append(f"{what} is not in gpus.allow and stop_containers is off: nothing was stopped or "
                       f"signalled (a container's processes never are){back}")


def memory_lines(observed: GpusObserved, spec: Mapping[str, Any]) -> list[str]:
    """`GPU i: used / total (counted), health` for each GPU."""
    lines = []
    for g in observed.gpus:
        counted = counted_used(g, observed.holders, spec.get("allow", ()))
        used = ("memory not readable" if g.lost or g.read_errors else "memory not reported") \
            if g.memory_used is None else mib(g.memory_used)
        total = "" if g.memory_total is None else f" / {mib(g.memory_total)}"
        if counted is None:
            extra = " (counted: unknown)"
        elif counted != g.memory_used:
            extra = f" ({mib(counted)} counted)"
        else:
            extra = ""
        mig = f", MIG with {len(g.mig_instances)} GPU instances" if g.mig else ""
        verdict = f"{g.health}: {g.step}" if g.step else g.health
        lines.append(f"GPU {g.index}: {used}{total}{extra}{mig}, {verdict}")
    return lines
