"""GPUs: how many, how much memory is held and by whom, whether a job may run on them, and the
checks operators run.

Observed through NVML (the `pynvml` module of nvidia-ml-py) in a forked child: the gpus kind
always describes the machine reconcile runs on. Without NVML it falls back to `nvidia-smi
--query-...` CSV; with neither, the resource is an error. The kernel log adds the driver's Xid
messages, judged by NVIDIA's Xid catalogue (xid.py, catalogue.py, health.py). The PCI bus
(sysfs: pcibus.py) holds the driver's list and `count`: a GPU gone from the driver is still named.

Memory is freed by stopping the systemd unit a holder belongs to, or by signalling a process
whose name the state allows to be killed — never by a blind `fuser -k /dev/nvidia*`: a holder
that is neither is reported and left alone. A unit killed from outside with Restart=always
comes back; a stop through systemd does not, which is why units are stopped rather than their
processes killed. A GPU that must not run jobs is `blocked` with the step a person must take:
reconcile never resets a GPU or reboots a node itself, unless the state declares `recover` (recovery.py:
the step carried out within caps counted from the journal) with `validate` (gate.py: an active check
that must pass before recovered GPUs count as healthy).

The declared settings (`gpus.settings`: persistence, power limit, compute mode, clocks, MIG, ECC)
are read with the GPUs, planned per GPU per setting (settings.py) and set through NVML's setters
in a forked child with a deadline, read back (setters.py, nvml_settings.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...core.contract import (
    Action,
    ApplyError,
    Context,
    Drift,
    Metric,
    ObserveError,
    Plan,
    Reconciler,
    Resource,
    run_action,
)
from ...core.values import never_answers, parse_duration, parse_size
from . import health, pcibus
from .checks import check_blocked, check_drift, parse_checks
from .memory import UNKNOWN, counted_used, memory_lines, memory_plan, mib
from .observed import Gpu, GpusObserved, GpuUse, Holder, RecoveryHost, SettingsHost

# What only some runs need is imported where it is used: the observation's readers
# (kernel_log, nvml, procfs, smi, the containers' cgroups) in the forked observer child; recovery,
# the validation gate and the settings only when the state declares `recover`, `validate` or
# `settings`; the setters when an apply sets. A `diff` of `count` and `max_memory_used` imports
# none of them in the parent (tests/test_startup_imports.py).
if TYPE_CHECKING:
    from ...core.host import Host
    from .recovery import History
    from .setters import Setters

DEFAULT_SETTLE = 30.0
# NVML calls can block for minutes on a wedged driver or a GPU fallen off the bus; the GPUs
# are read in a child the engine abandons after this long (`observe_timeout`).
DEFAULT_OBSERVE_TIMEOUT = "60s"
DEFAULT_GRACE = 10.0
KILL_WAIT = 5.0  # after SIGKILL: a process stuck in D-state may take a moment; longer means trouble
STOP_TIMEOUT = 120.0
PERSISTENCED_TIMEOUT = 30.0  # systemctl show of nvidia-persistenced.service
HISTORY_MIN = 86400.0  # the journal is read back at least this far for recoveries and acks


def nvml_observe(settings: frozenset[str]) -> Any:
    """nvml.nvml_observe, imported in the observer child (pynvml with it); a name of this module so
    that a test of the nvidia-smi fallback can stand another in (tests/hardware/observe.py)."""
    from .nvml import nvml_observe as observe

    return observe(settings)


def _declared(settings: Mapping[str, Any] | None) -> frozenset[str]:
    if not settings:
        return frozenset()
    from .settings import declared

    return declared(settings)


def _settings_drift(spec: Mapping[str, Any], observed: GpusObserved) -> list[Drift]:
    if not spec.get("settings"):
        return []
    from .settings import settings_drift

    return settings_drift(spec["settings"], observed, bool(spec.get("healthy")))


class _Background:
    """fn(*args) in a thread of its own; result() waits for it and returns what it returned, or
    raises what it raised."""

    def __init__(self, fn: Any, *args: Any):
        import threading

        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn(*args)
            except BaseException as exc:  # handed to the caller of result()
                self._error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class GpusReconciler(Reconciler):
    key = "gpus"
    kind = "gpus"
    rank = 20
    # Values that move by themselves: a saved plan keeps these fields' want, not their have.
    # (A lock that is not in force shows the graphics clock it runs at.)
    volatile_drift = ("gpu*.memory_used", "gpu*.temperature", "gpu*.slowdown", "gpu*.pcie_gen", "gpu*.ecc_corrected",
                      "gpu*.locked_clocks")

    def __init__(self) -> None:
        self._setters_of_run: Setters | None = None

    @property
    def _setters(self) -> Setters:
        """One per run: a GPU lost during this apply is not tried again."""
        if self._setters_of_run is None:
            from .setters import Setters

            self._setters_of_run = Setters()
        return self._setters_of_run

    def metrics(self, resource: Mapping[str, Any], report: Mapping[str, Any]) -> list[Metric]:
        from .metrics import gpu_metrics

        return gpu_metrics(resource, report)

    def resources(self, section: Mapping[str, Any]) -> list[Resource]:
        free = section.get("free_with") or {}
        spec = {
            "count": section.get("count"),
            "max_memory_used": parse_size(section["max_memory_used"]) if "max_memory_used" in section else None,
            "allow": tuple(section.get("allow", ())),
            "healthy": section.get("healthy", True),
            "free_with": {
                "stop_units": bool(free.get("stop_units", False)),
                "stop_containers": bool(free.get("stop_containers", False)),
                "kill": tuple(free.get("kill", ())),
                "grace": parse_duration(free.get("grace", DEFAULT_GRACE)),
            },
            "observe_timeout": parse_duration(section.get("observe_timeout", DEFAULT_OBSERVE_TIMEOUT)),
            "checks": parse_checks(section.get("checks")),
            "settings": None,
            "recover": None,
            "validate": None,
        }
        if section.get("settings"):
            from .settings import parse_settings

            spec["settings"] = parse_settings(section["settings"])
        if section.get("recover"):
            from .recovery import parse_recover

            spec["recover"] = parse_recover(section["recover"])
        if section.get("validate"):
            from .gate import parse_validate

            spec["validate"] = parse_validate(section["validate"])
        settle = parse_duration(section.get("settle", DEFAULT_SETTLE))
        return [Resource(id="gpus", kind=self.kind, name="gpus", spec=spec,
                         needs=tuple(section.get("needs", ())), settle=settle)]

    def problems(self, section: Mapping[str, Any]) -> list[tuple[tuple, str]]:
        found = never_answers([((), section)], "observe_timeout")
        if isinstance(section.get("settings"), Mapping):
            from .settings import settings_problems

            found += settings_problems(section)
        if isinstance(section.get("recover"), Mapping):
            from .recovery import recover_problems

            found += recover_problems(section)
        return found

    # --- observe ---

    def observe_deadline(self, resources: Sequence[Resource]) -> float | None:
        return max(float(r.spec["observe_timeout"]) for r in resources)

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        if not resources:
            return {}
        spec = resources[0].spec
        obs = self._observe(host, spec.get("checks") or {}, _declared(spec.get("settings")))
        if spec.get("recover") or spec.get("validate"):
            from .gate import read_result
            from .recovery import boot_id as recovery_boot_id
            from .recovery import nvswitches

            boot = recovery_boot_id()
            unit = _persistenced(host)[0] if (spec.get("recover") or {}).get("reset") else None
            obs = replace(obs, recovery=RecoveryHost(boot, nvswitches(), read_result(boot), unit))
        return {r.id: obs for r in resources}

    def _observe(self, host: Host, checks: Mapping[str, Any], settings: frozenset[str] = frozenset()) -> GpusObserved:
        from .kernel_log import read_kernel_log
        from .nvml import NvmlUnavailable
        from .procfs import DEFAULT_PROC_GPUS, PROC_GPUS_ENV, gpu_minors

        notes: list[str] = []
        # The kernel log is read (/dev/kmsg or the journal, only what is new since the last read)
        # while the driver is: neither needs the other; the log is judged against the GPUs after.
        kernel_log = _Background(read_kernel_log, host)
        try:
            try:
                reading = nvml_observe(settings)
                source, driver, cuda, gpus, uses = "nvml", reading.driver, reading.cuda, reading.gpus, reading.uses
                notes.extend(reading.notes)
            except NvmlUnavailable as nvml_error:
                source = "nvidia-smi"
                from .smi import smi_observe

                driver, cuda, gpus, uses = smi_observe(host, nvml_error, checks, settings)
                notes.append(f"NVML unavailable ({nvml_error}): read through nvidia-smi")
            holders = self._holders(host, uses, gpus)
        except BaseException:
            kernel_log.join()  # the GPUs could not be read: the log is not needed, its reader is waited for
            raise
        events, log = (), None
        if gpus:
            fold, log = kernel_log.result()
            events = fold.kernel_events([g.bus_id for g in gpus if g.mig])
        else:
            kernel_log.join()  # no GPU to judge: what it read is not needed
        gpus = [health.judge(g, events, log) for g in gpus]
        for g in gpus:
            notes.extend(f"GPU {g.index}: could not read {e}" for e in g.read_errors)
        # --- the PCI bus, held against the driver's list (pcibus.py) ---
        bus = pcibus.with_visibility(pcibus.read_pci_bus(pcibus.sysfs_root()),
                                     gpu_minors(os.environ.get(PROC_GPUS_ENV) or DEFAULT_PROC_GPUS))
        if (wrong := pcibus.disagreement(gpus, bus)) is not None:
            raise ObserveError(wrong)
        # --- end of the PCI bus ---
        setting = None
        if settings:
            setting, gpus = self._settings_host(host, settings, gpus, log.last_init if log else "")
        return GpusObserved(source, driver, tuple(gpus), tuple(holders), tuple(events), tuple(notes), cuda, log,
                            setting, pci_bus=bus)

    @staticmethod
    def _settings_host(host: Host, settings: frozenset[str], gpus: list[Gpu], driver_load: str
                       ) -> tuple[SettingsHost, list[Gpu]]:
        """nvidia-persistenced.service (when persistence is declared), this boot, and the locked clocks
        reconcile recorded setting since the driver loaded (NVML cannot read them back)."""
        from .setters import boot_id, locked_of, read_locked

        unit, note = None, ""
        if "persistence_mode" in settings:
            unit, note = _persistenced(host)
        boot = boot_id()
        if "locked_clocks" in settings:
            record = read_locked(boot, driver_load)
            out = []
            for g in gpus:
                value, at = locked_of(record.get(g.uuid))
                if g.settings is not None and value is not None:
                    g = replace(g, settings=replace(g.settings, locked_clocks=value, locked_at=at))
                out.append(g)
            gpus = out
        return SettingsHost(unit, note, boot, driver_load), gpus

    def _holders(self, host: Host, uses: Mapping[int, list[GpuUse]], gpus: Sequence[Gpu]) -> list[Holder]:
        from ..containers.refs import containers_of
        from .procfs import DEFAULT_DEV_GLOB, DEV_GLOB_ENV, DEV_GPU_RE, excluded, proc_info, scan_device_holders

        # /dev/nvidiaN is the driver's minor number N, not NVML's index N (8x RTX 4090 hosts have
        # minors 3,2,1,0,7,6,5,4 by index). A GPU whose minor is unknown maps no device file.
        by_minor = {g.minor: g.index for g in gpus if g.minor is not None}
        devices = scan_device_holders(os.environ.get(DEV_GLOB_ENV) or DEFAULT_DEV_GLOB)
        me = os.getpid()
        holders = []
        for pid in sorted(set(uses) | set(devices)):
            if pid == me:
                continue
            info = proc_info(pid)
            if info is not None and excluded(info):
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
                uses=tuple(sorted(pid_uses, key=lambda u: (u.gpu, u.gpu_instance or 0))),
                device_files=devices.get(pid, ()), visible=info is not None, path=info["path"] if info else "",
            ))
        # A holder in a container is freed through its engine (or the unit that runs it), never
        # signalled: the engine would start it again (its restart policy).
        inside = containers_of(host, [h.pid for h in holders if h.visible])
        return [replace(h, container=inside[h.pid]) if h.pid in inside else h for h in holders]

    # --- diff / plan ---

    def diff(self, resource: Resource, observed: GpusObserved) -> list[Drift]:
        spec = resource.spec
        drift = []
        if spec.get("count") is not None and len(observed.gpus) != spec["count"]:
            drift.append(Drift("count", spec["count"], len(observed.gpus)))
        if spec.get("healthy"):
            for g in observed.gpus:
                if g.health != "healthy":
                    drift.append(Drift(f"gpu{g.index}.healthy", True, False if g.health == "unhealthy" else UNKNOWN))
            for pci in dict.fromkeys(e.pci for e in health.unlisted_events(observed.gpus, observed.xids)):
                drift.append(Drift(f"gpu@{pci}.healthy", True, False))
        drift.extend(d for d in pcibus.bus_drift(spec, observed) if d not in drift)  # the PCI bus
        limit = spec.get("max_memory_used")
        if limit is not None:
            for g in observed.gpus:
                used = counted_used(g, observed.holders, spec.get("allow", ()))
                if used is None or used > limit:
                    drift.append(Drift(f"gpu{g.index}.memory_used", f"<= {mib(limit)}",
                                       UNKNOWN if used is None else mib(used)))
        wanted = _settings_drift(spec, observed)
        # A setting the state declares is set, not only checked: its drift stands for the check's.
        own = {d.field for d in wanted}
        drift.extend(d for d in check_drift(spec, observed) if d.field not in own)
        drift.extend(wanted)
        if spec.get("validate") and observed.recovery is not None:
            from .gate import FIELD, gate_drift_have

            have = gate_drift_have(spec["validate"], observed.recovery.gate, self._history(spec, observed, None))
            if have:
                drift.append(Drift(FIELD, "passed", have))
        return drift

    def _history(self, spec: Mapping[str, Any], observed: GpusObserved, ctx: Context | None) -> History | None:
        """What the journal says reconcile did to these GPUs recently (recovery.py); None without one."""
        ctx = ctx or self.context
        if ctx is None or observed.recovery is None:
            return None
        from .recovery import History

        rec = spec.get("recover") or {}
        now = time.time()
        return History.read(ctx, now - max(float(rec.get("window", 0.0)), HISTORY_MIN), observed.recovery.boot_id, now)

    def settles(self, drift: Sequence[Drift]) -> bool:
        # Only memory still being released is worth waiting for; health, checks and memory that
        # cannot be read do not change by waiting.
        return any(d.field.endswith(".memory_used") and d.have != UNKNOWN for d in drift)

    def plan(self, resource: Resource, observed: GpusObserved, drift: Sequence[Drift], ctx: Context) -> Plan:
        spec = resource.spec
        fields = {d.field for d in drift}
        blocked: list[str] = []
        if "count" in fields:
            blocked.append(f"expected {spec['count']} GPUs, found {len(observed.gpus)}: a person must check the "
                           "hardware and driver (nvidia-smi -L, the kernel log)")
        history = self._history(spec, observed, ctx) if spec.get("recover") or spec.get("validate") else None
        recovery = None
        if spec.get("recover"):
            from .recovery import recovery_plan

            recovery = recovery_plan(spec, observed, fields, ctx, history)
            blocked.extend(recovery.blocked)
        for g in observed.gpus:
            if f"gpu{g.index}.healthy" not in fields or (recovery is not None and g.index in recovery.handled):
                continue
            if g.health == "unhealthy":
                blocked.append(f"{g.label} must not run jobs: {g.step}. Why: {'; '.join(g.problems)}")
            else:
                blocked.append(f"{g.label}: cannot tell whether a job may run on it: {'; '.join(g.problems)}")
        for ev in health.unlisted_events(observed.gpus, observed.xids):
            if f"gpu@{ev.pci}.healthy" in fields:
                blocked.append(f"the GPU at PCI {ev.pci}, which the driver does not list, must not run jobs: "
                               f"{ev.step}. Why: {ev.describe()} [NVIDIA Xid catalogue: {ev.why}]")
        blocked.extend(pcibus.bus_blocked(spec, observed, fields, {  # the PCI bus
            f"gpu@{ev.pci}.healthy" for ev in health.unlisted_events(observed.gpus, observed.xids)}))
        actions, notes, mem_blocked = memory_plan(spec, observed, fields, ctx)
        blocked.extend(mem_blocked)
        own = {d.field for d in _settings_drift(spec, observed)}
        checked = {d.field for d in check_drift(spec, observed)} - own
        blocked.extend(check_blocked([d for d in drift if d.field in checked]))
        pending: list[str] = []
        if spec.get("settings"):
            from .settings import freed_pids, settings_plan

            settings = settings_plan(resource, observed, fields, ctx, freed_pids(observed.holders, actions, ctx))
            actions.extend(settings.actions)
            blocked.extend(settings.blocked)
            notes.extend(settings.notes)
            pending = settings.pending
        if recovery is not None:
            notes.extend(recovery.notes)
            planned = {(a.action, a.target) for a in actions}
            actions.extend(a for a in recovery.actions if (a.action, a.target) not in planned)
        actions.sort(key=lambda a: a.ends_run)  # a reboot is the last thing done
        if spec.get("validate") and observed.recovery is not None:
            from .gate import FIELD, gate_plan

            if FIELD in fields:
                ready = not actions and not any(f.endswith(".healthy") for f in fields)
                gate_actions, gate_blocked = gate_plan(spec["validate"], observed.recovery.gate, history, ready,
                                                       spec.get("recover"))
                planned = {(a.action, a.target) for a in actions}
                actions.extend(a for a in gate_actions if (a.action, a.target) not in planned)
                blocked.extend(b for b in gate_blocked if b not in blocked)
        # A pending MIG/ECC change is converging only when nothing else is to be done or blocked.
        converging = "; ".join(pending) if pending and not actions and not blocked else None
        if pending and not converging:
            notes.extend(pending)
        notes.extend(pcibus.bus_notes(observed))  # the PCI bus
        gate: Sequence[str] = ()
        if spec.get("validate") and observed.recovery is not None:
            from .gate import gate_lines

            gate = gate_lines(spec["validate"], observed.recovery.gate)
        message = "\n".join([*notes, *memory_lines(observed, spec), *gate, *self._xid_lines(observed)]) if drift else ""
        if (blocked or converging) and message:
            message = "\n" + message  # the report joins blocked and message on one line otherwise
        return Plan(actions=tuple(actions), blocked="\n".join(blocked) or None, converging=converging,
                    message=message, caveats=pcibus.bus_caveats(observed))

    @staticmethod
    def _xid_lines(observed: GpusObserved) -> list[str]:
        lines = []
        for e in observed.xids:
            when = "" if e.current else ", before the GPU was last initialised: history"
            lines.append(f"kernel log: {e.pci}: {e.describe()} [{e.why}: {e.step}{when}]")
        return lines

    # --- apply ---

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        from .settings import PERSISTENCED

        if action.action == "set":
            return self._setters.set(host, action)
        if action.action == "reset":
            from .recovery import reset

            return reset(host, action.params, self._setters)
        if action.action == "reboot":
            from .recovery import reboot

            return reboot(host, action.params)
        if action.action == "validate":
            from .gate import run_gate
            from .recovery import boot_id as recovery_boot_id

            return run_gate(host, action.params, recovery_boot_id())
        if action.action in ("start", "enable", "disable", "unmask") or (
                action.action == "stop" and action.target == PERSISTENCED):
            from .setters import unit_action

            return unit_action(host, action)
        if action.action == "stop":
            from ...common import systemd

            unit = action.params.get("unit") or action.target
            systemd.act(host, "stop", unit, STOP_TIMEOUT)
            return f"stopped {unit}"
        if action.action == "terminate":
            return self._terminate(host, action.params)
        if action.action == "stop-container":
            engine = action.params.get("engine")
            if engine not in ("docker", "podman"):
                raise ApplyError(f"unknown container engine {engine!r}")
            run_action(host, [engine, "stop", "--", action.params["id"]], STOP_TIMEOUT)
            return f"stopped container {action.target} through {engine}"
        raise ApplyError(f"unknown gpus action {action.action!r}")

    @staticmethod
    def _terminate(host: Host, params: Mapping[str, Any]) -> str:
        from .procfs import proc_info

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

        # Each signal goes through a pidfd with the start time checked on it (LocalHost.signal):
        # a PID reused in between is never signalled.
        started = params.get("starttime")
        if not same_process():
            return f"{pid} had already exited"
        try:
            host.signal(pid, signal.SIGTERM, started)
        except ProcessLookupError:
            return f"{pid} had already exited"
        took = gone_within(grace)
        if took is not None:
            return f"exited {took:.1f}s after SIGTERM"
        if not same_process():  # the PID was reused in between: never SIGKILL a stranger
            return f"exited {grace:g}s after SIGTERM"
        try:
            host.signal(pid, signal.SIGKILL, started)
        except ProcessLookupError:
            return f"exited {grace:g}s after SIGTERM"
        if gone_within(KILL_WAIT) is not None:
            return f"still running {grace:g}s after SIGTERM; killed with SIGKILL"
        raise ApplyError(f"{pid} survived SIGKILL for {KILL_WAIT:g}s (uninterruptible sleep?)")

    def summary(self, resource: Resource, observed: GpusObserved) -> str:
        def mem(g: Gpu) -> str:
            used = "?" if g.memory_used is None else mib(g.memory_used)
            total = "?" if g.memory_total is None else mib(g.memory_total)
            mig = f" (MIG, {len(g.mig_instances)} instances)" if g.mig else ""
            return f"GPU{g.index} {used} / {total}{mig}"

        per = ", ".join(mem(g) for g in observed.gpus)
        bad = [g for g in observed.gpus if g.health == "unhealthy"]
        if bad:
            word = "unhealthy (" + "; ".join(f"GPU {g.index}: {g.step}" for g in bad) + ")"
        elif any(g.health != "healthy" for g in observed.gpus):
            word = "health unknown"
        else:
            word = "healthy"
        via = "NVML" if observed.source == "nvml" else "nvidia-smi"
        current = [e for e in observed.xids if e.current]
        log = ""
        if current:
            keep = sum(1 for e in current if e.keep_off)
            log = f"; kernel log: {len(current)} driver message{'s' if len(current) != 1 else ''} since the GPUs " \
                  f"were initialised, {keep} keeping a job off"
        return f"{len(observed.gpus)} GPUs via {via} (driver {observed.driver_version}), {word}: {per}{log}"


def _persistenced(host: Host) -> tuple[Any, str]:
    """nvidia-persistenced.service as `systemctl show` reports it, or (None, why systemd cannot say)."""
    from ...common import systemd
    from .settings import PERSISTENCED

    try:
        return systemd.show(host, [PERSISTENCED], PERSISTENCED_TIMEOUT)[PERSISTENCED], ""
    except ObserveError as exc:
        return None, str(exc)
