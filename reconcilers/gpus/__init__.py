"""GPUs: how many, how much memory is held and by whom, and whether they are healthy.

Observed through NVML (the `pynvml` module of nvidia-ml-py), in this process: the
gpus kind always describes the machine reconcile runs on. Without NVML it falls
back to `nvidia-smi --query-...` CSV; with neither, the resource is an error.

Memory is freed by stopping the systemd unit a holder belongs to, or by signalling
a process whose name the state allows to be killed — never by a blind
`fuser -k /dev/nvidia*`: a holder that is neither is reported and left alone.
A unit killed from outside with Restart=always comes back; a stop through systemd
does not, which is why units are stopped rather than their processes killed.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...pipeline.contract import (
    Action,
    ApplyError,
    CommandTimeout,
    Context,
    Drift,
    ObserveError,
    Plan,
    Reconciler,
    Resource,
    run_action,
)
from ...pipeline.values import parse_duration, parse_size
from .nvml import NvmlUnavailable, nvml_observe
from .observed import MIB, Gpu, GpusObserved, GpuUse, Holder
from .procfs import DEFAULT_DEV_GLOB, DEV_GLOB_ENV, DEV_GPU_RE, EXCLUDED_NAMES, proc_info, scan_device_holders
from .smi import SMI_APP_FIELDS, SMI_GPU_FIELDS, SMI_REMAP_FIELDS, parse_smi_apps, parse_smi_gpus
from .xid import KERNEL_LOG_ENV, parse_xids

if TYPE_CHECKING:
    from ...machines.host import Host

DEFAULT_SETTLE = 30.0
# NVML calls can block for minutes on a wedged driver or a GPU fallen off the bus; the GPUs
# are read in a child the engine abandons after this long (`observe_timeout`).
DEFAULT_OBSERVE_TIMEOUT = "60s"
DEFAULT_GRACE = 10.0
KILL_WAIT = 5.0  # after SIGKILL: a process stuck in D-state may take a moment; longer means trouble
STOP_TIMEOUT = 120.0
SMI_TIMEOUT = 30.0


# --- plan helpers (pure) ------------------------------------------------------------------------

def allowed(holder: Holder, allow: Sequence[str]) -> bool:
    for entry in allow:
        if entry.startswith("unit:"):
            if holder.unit and fnmatch.fnmatchcase(holder.unit, entry[5:]):
                return True
        elif holder.visible and any(n and fnmatch.fnmatchcase(n, entry) for n in (holder.name, holder.exe)):
            return True
    return False


def counted_used(gpu: Gpu, holders: Sequence[Holder], allow: Sequence[str]) -> int:
    """The GPU's used memory minus what allowed holders are known to hold on it."""
    expected = sum(u.used_bytes or 0 for h in holders if allowed(h, allow) for u in h.uses if u.gpu == gpu.index)
    return max(0, gpu.memory_used - expected)


def mib(n: int) -> str:
    return f"{n // MIB}MiB"


def _gpu_list(idx: Sequence[int]) -> str:
    idx = sorted(set(idx))
    if len(idx) > 2 and idx == list(range(idx[0], idx[-1] + 1)):
        return f"GPUs {idx[0]}-{idx[-1]}"
    return ("GPU " if len(idx) == 1 else "GPUs ") + ",".join(str(i) for i in idx)


def _holding(h: Holder, gpus: Sequence[int]) -> str:
    uses = [u for u in h.uses if u.gpu in gpus]
    known = [u.used_bytes for u in uses if u.used_bytes is not None]
    if not known:
        files = ", ".join(h.device_files) or "a GPU device file"
        return f"holding {files} on {_gpu_list([u.gpu for u in uses])} (memory not reported by NVML)"
    each = {b for b in known}
    amount = mib(known[0]) + (" each" if len(known) > 1 else "") if len(each) == 1 else f"{mib(sum(known))} in all"
    return f"holding {amount} on {_gpu_list([u.gpu for u in uses])}"


# --- the reconciler ------------------------------------------------------------------------------

class GpusReconciler(Reconciler):
    key = "gpus"
    kind = "gpus"
    rank = 20
    # Memory in use moves by itself: a saved plan keeps these fields' want, not their have.
    volatile_drift = ("gpu*.memory_used",)

    def resources(self, section: Mapping[str, Any]) -> list[Resource]:
        free = section.get("free_with") or {}
        spec = {
            "count": section.get("count"),
            "max_memory_used": parse_size(section["max_memory_used"]) if "max_memory_used" in section else None,
            "allow": tuple(section.get("allow", ())),
            "healthy": section.get("healthy", True),
            "free_with": {
                "stop_units": bool(free.get("stop_units", False)),
                "kill": tuple(free.get("kill", ())),
                "grace": parse_duration(free.get("grace", DEFAULT_GRACE)),
            },
            "observe_timeout": parse_duration(section.get("observe_timeout", DEFAULT_OBSERVE_TIMEOUT)),
        }
        settle = parse_duration(section.get("settle", DEFAULT_SETTLE))
        return [Resource(id="gpus", kind=self.kind, name="gpus", spec=spec,
                         needs=tuple(section.get("needs", ())), settle=settle)]

    # --- observe ---

    def observe_deadline(self, resources: Sequence[Resource]) -> float | None:
        return max(float(r.spec["observe_timeout"]) for r in resources)

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        if not resources:
            return {}
        obs = self._observe(host)
        return {r.id: obs for r in resources}

    def _observe(self, host: Host) -> GpusObserved:
        notes: list[str] = []
        try:
            driver, gpus, uses, nvml_notes = nvml_observe()
            source = "nvml"
            notes.extend(nvml_notes)
        except NvmlUnavailable as nvml_error:
            source = "nvidia-smi"
            driver, gpus, uses = self._smi_observe(host, str(nvml_error))
            notes.append(f"NVML unavailable ({nvml_error}): read through nvidia-smi")
        holders = self._holders(uses, gpus)
        xids, xid_note = self._xids(host) if gpus else ((), "")
        if xid_note:
            notes.append(xid_note)
        return GpusObserved(source, driver, tuple(gpus), tuple(holders), xids, tuple(notes))

    def _smi_observe(self, host: Host, nvml_error: str) -> tuple[str, list[Gpu], dict[int, list[GpuUse]]]:
        def smi(query: str, fields: str):
            try:
                return host.run(["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
                                timeout=SMI_TIMEOUT)
            except CommandTimeout as exc:
                raise ObserveError(str(exc)) from None

        res = smi("gpu", SMI_GPU_FIELDS)
        if res.returncode == 127:
            raise ObserveError(f"cannot read GPUs: NVML is unavailable ({nvml_error}) and nvidia-smi is not "
                               "installed: no NVIDIA driver on this host?")
        if not res.ok:
            raise ObserveError(f"cannot read GPUs: NVML is unavailable ({nvml_error}) and {res.brief()}")
        remap = smi("gpu", SMI_REMAP_FIELDS)  # older nvidia-smi lacks these fields: then unknown
        gpus = parse_smi_gpus(res.stdout, remap.stdout if remap.ok else "")
        apps = smi("compute-apps", SMI_APP_FIELDS)
        if not apps.ok:
            raise ObserveError(f"cannot list GPU processes: {apps.brief()}")
        uses = parse_smi_apps(apps.stdout, {g.uuid: g.index for g in gpus})
        drv = host.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=SMI_TIMEOUT)
        driver = drv.stdout.splitlines()[0].strip() if drv.ok and drv.stdout.strip() else "?"
        return driver, gpus, uses

    def _holders(self, uses: Mapping[int, list[GpuUse]], gpus: Sequence[Gpu]) -> list[Holder]:
        by_minor = {g.minor if g.minor is not None else g.index: g.index for g in gpus}
        devices = scan_device_holders(os.environ.get(DEV_GLOB_ENV) or DEFAULT_DEV_GLOB)
        me = os.getpid()
        holders = []
        for pid in sorted(set(uses) | set(devices)):
            if pid == me:
                continue
            info = proc_info(pid)
            if info is not None and info["name"] in EXCLUDED_NAMES:
                continue
            if info is None and pid not in uses:
                continue  # gone since the scan
            pid_uses = list(uses.get(pid, ()))
            nvml_gpus = {u.gpu for u in pid_uses}
            for path in devices.get(pid, ()):
                m = DEV_GPU_RE.search(path)
                gpu = by_minor.get(int(m.group(1))) if m else None
                if gpu is not None and gpu not in nvml_gpus:
                    pid_uses.append(GpuUse(gpu, None))
                    nvml_gpus.add(gpu)
            holders.append(Holder(
                pid=pid, name=info["name"] if info else "", exe=info["exe"] if info else "",
                unit=info["unit"] if info else None, starttime=info["starttime"] if info else None,
                uses=tuple(sorted(pid_uses, key=lambda u: u.gpu)), device_files=devices.get(pid, ()),
                visible=info is not None,
            ))
        return holders

    def _xids(self, host: Host) -> tuple[tuple[str, ...], str]:
        path = os.environ.get(KERNEL_LOG_ENV)
        if path:
            try:
                return parse_xids(host.read_text(path)), ""
            except OSError as exc:
                return (), f"kernel log {path} unreadable: {exc.strerror}"
        try:
            res = host.run(["dmesg"], timeout=5)
        except CommandTimeout:
            return (), "kernel log not read (dmesg timed out): Xid errors unknown"
        if not res.ok:
            return (), f"kernel log not readable ({res.brief()}): Xid errors unknown"
        return parse_xids(res.stdout), ""

    # --- diff / plan ---

    def diff(self, resource: Resource, observed: GpusObserved) -> list[Drift]:
        spec = resource.spec
        drift = []
        if spec.get("count") is not None and len(observed.gpus) != spec["count"]:
            drift.append(Drift("count", spec["count"], len(observed.gpus)))
        if spec.get("healthy"):
            for g in observed.gpus:
                if g.health == "unhealthy":
                    drift.append(Drift(f"gpu{g.index}.healthy", True, False))
        limit = spec.get("max_memory_used")
        if limit is not None:
            for g in observed.gpus:
                used = counted_used(g, observed.holders, spec.get("allow", ()))
                if used > limit:
                    drift.append(Drift(f"gpu{g.index}.memory_used", f"<= {mib(limit)}", mib(used)))
        return drift

    def plan(self, resource: Resource, observed: GpusObserved, drift: Sequence[Drift], ctx: Context) -> Plan:
        spec = resource.spec
        allow = spec.get("allow", ())
        free = spec.get("free_with") or {}
        fields = {d.field for d in drift}
        blocked: list[str] = []
        notes: list[str] = []
        actions: list[Action] = []

        if "count" in fields:
            blocked.append(f"expected {spec['count']} GPUs, found {len(observed.gpus)}: a person must check the "
                           "hardware and driver (nvidia-smi -L, the kernel log)")
        for g in observed.gpus:
            if f"gpu{g.index}.healthy" in fields:
                blocked.append(f"GPU {g.index} ({g.bus_id}) is unhealthy: {'; '.join(g.problems)}: "
                               "a person must reset or replace it")

        over = [g for g in observed.gpus if f"gpu{g.index}.memory_used" in fields]
        if over:
            limit = spec["max_memory_used"]
            over_idx = {g.index for g in over}
            others = [h for h in observed.holders if not allowed(h, allow)]
            # Memory no listed process accounts for: device-file holders are then suspects too.
            unexplained = {}
            for g in over:
                known = sum(u.used_bytes or 0 for h in others for u in h.uses if u.gpu == g.index)
                unexplained[g.index] = counted_used(g, observed.holders, allow) - known
            suspects = []
            for h in others:
                hit = [u.gpu for u in h.uses if u.gpu in over_idx
                       and ((u.used_bytes or 0) > 0 or (u.used_bytes is None and unexplained[u.gpu] > limit))]
                if hit:
                    suspects.append((h, hit))
            seen_units: set[str] = set()
            for h, hit in suspects:
                what = f"{h.label()} {_holding(h, hit)}"
                if not h.visible:
                    blocked.append(f"pid {h.pid} {_holding(h, hit)} is not visible from here (another PID "
                                   "namespace or container?): free it where it runs")
                elif h.pid <= 1 or h.pid == os.getpid():
                    blocked.append(f"{what}: PID 1 and reconcile itself are never signalled")
                elif h.unit and free.get("stop_units"):
                    if h.unit in seen_units:
                        continue
                    seen_units.add(h.unit)
                    declared = ctx.resources.get(f"unit:{h.unit}")
                    if declared is not None and declared.spec.get("active") is False:
                        notes.append(f"{what}: freed by unit:{h.unit} (declared active: false, acted on first)")
                    elif declared is not None:
                        blocked.append(f"{what} belongs to {h.unit}, which the state declares active: add "
                                       f"unit:{h.unit} to gpus.allow or declare it active: false")
                    else:
                        actions.append(Action("stop", h.unit, f"stop unit {h.unit} ({what})",
                                              {"unit": h.unit}))
                elif self._killable(h, free.get("kill", ())):
                    verb = f"terminate {h.pid} ({h.name}) {_holding(h, hit)}"
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
            for g in over:
                # Still over the limit with every listed holder gone, and no device-file holder to blame.
                if unexplained[g.index] > limit and not any(
                        u.used_bytes is None and u.gpu == g.index for h, _ in suspects for u in h.uses):
                    blocked.append(f"GPU {g.index}: {mib(unexplained[g.index])} held by no process visible here "
                                   "(NVML lists none and no process has its device file open)")
        message = "\n".join([*notes, *self._gpu_lines(observed, spec), *self._xid_lines(observed)]) if drift else ""
        if blocked and message:
            message = "\n" + message  # the report joins blocked and message on one line otherwise
        return Plan(actions=tuple(actions), blocked="\n".join(blocked) or None, message=message)

    @staticmethod
    def _killable(h: Holder, globs: Sequence[str]) -> bool:
        return any(n and fnmatch.fnmatchcase(n, g) for g in globs for n in (h.name, h.exe))

    @staticmethod
    def _gpu_lines(observed: GpusObserved, spec: Mapping[str, Any]) -> list[str]:
        lines = []
        for g in observed.gpus:
            counted = counted_used(g, observed.holders, spec.get("allow", ()))
            extra = f" ({mib(counted)} counted)" if counted != g.memory_used else ""
            lines.append(f"GPU {g.index}: {mib(g.memory_used)} / {mib(g.memory_total)}{extra}, {g.health}")
        return lines

    @staticmethod
    def _xid_lines(observed: GpusObserved) -> list[str]:
        return [f"kernel log: {x}" for x in observed.xids]

    # --- apply ---

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        if action.action == "stop":
            unit = action.params.get("unit") or action.target
            run_action(host, ["systemctl", "stop", "--", unit], STOP_TIMEOUT)
            return f"stopped {unit}"
        if action.action == "terminate":
            return self._terminate(host, action.params)
        raise ApplyError(f"unknown gpus action {action.action!r}")

    @staticmethod
    def _terminate(host: Host, params: Mapping[str, Any]) -> str:
        pid = int(params["pid"])
        grace = float(params.get("grace", DEFAULT_GRACE))

        def same_process() -> bool:
            info = proc_info(pid)
            return info is not None and (params.get("starttime") is None or info["starttime"] == params["starttime"])

        def gone_within(seconds: float) -> float | None:
            """Seconds it took the process to go, or None if it is still there after `seconds`."""
            t0 = time.monotonic()
            while True:
                if not host.pid_alive(pid) or not same_process():
                    return time.monotonic() - t0
                if time.monotonic() - t0 >= seconds:
                    return None
                host.sleep(0.05)

        if not same_process():
            return f"{pid} had already exited"
        host.signal(pid, signal.SIGTERM)
        took = gone_within(grace)
        if took is not None:
            return f"exited {took:.1f}s after SIGTERM"
        if not same_process():  # the PID was reused in between: never SIGKILL a stranger
            return f"exited {grace:g}s after SIGTERM"
        host.signal(pid, signal.SIGKILL)
        if gone_within(KILL_WAIT) is not None:
            return f"still running {grace:g}s after SIGTERM; killed with SIGKILL"
        raise ApplyError(f"{pid} survived SIGKILL for {KILL_WAIT:g}s (uninterruptible sleep?)")

    def summary(self, resource: Resource, observed: GpusObserved) -> str:
        per = ", ".join(f"GPU{g.index} {mib(g.memory_used)} / {mib(g.memory_total)}" for g in observed.gpus)
        health = {g.health for g in observed.gpus}
        word = "unhealthy" if "unhealthy" in health else ("health unknown" if "unknown" in health else "healthy")
        via = "NVML" if observed.source == "nvml" else "nvidia-smi"
        return f"{len(observed.gpus)} GPUs via {via} (driver {observed.driver_version}), {word}: {per}"
