"""GPU settings as desired state (`gpus.settings`, docs/gpus.md#settings): the declared values,
the drift per GPU per setting, and the minimal plan (pure: observed data in, actions out).

Rules, and where they come from:
- a value outside what the GPU supports (nvmlDeviceGetPowerManagementLimitConstraints,
  nvmlDeviceGetSupportedMemoryClocks / GraphicsClocks) is `blocked` with the allowed range: the
  driver would refuse it (INVALID_ARGUMENT), so it is never tried;
- a setting the GPU or driver does not have (NOT_SUPPORTED; application clocks on drivers 590+,
  NVML_ERROR_DEPRECATED) or that cannot be read is blocked for that GPU, the others go on;
- MIG and ECC changes take effect later (NVML's pending mode: a GPU reset for MIG, a reboot for
  ECC): a pending change that is what the state wants is `converging` ("pending: reset GPU 3"),
  never done; and they are refused on a GPU any process holds (NVIDIA's MIG user guide: no
  process may use the GPU), naming the holders;
- persistence mode: NVIDIA deprecates setting it through NVML in favour of nvidia-persistenced
  (docs.nvidia.com/deploy/driver-persistence): where nvidia-persistenced.service exists the plan is
  that unit enabled and running, planned by the units kind's own rules; else the NVML setter.
- NVML cannot read locked clocks back: reconcile's record of what it set since the driver last
  loaded (setters.py) is what is compared; no record is `unknown`, and unknown is set, never ok.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...core.contract import Action, Context, Drift, Resource
from .observed import Gpu, GpuSettings, GpusObserved, Holder

# The order actions are taken in on each GPU: persistence first (without it the driver unloads a
# GPU's state when no client holds it), MIG and ECC last (they take effect only later).
SETTINGS = ("persistence_mode", "compute_mode", "power_limit", "application_clocks", "locked_clocks", "ecc", "mig")
PERSISTENCED = "nvidia-persistenced.service"
UNKNOWN = "unknown"
NOT_SUPPORTED = "not supported"
_POWER_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(W|kW)\s*$")
_CLOCK_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(MHz|GHz)\s*$")


# --- the state file ---------------------------------------------------------------------------------

def parse_power(value: str) -> int | str:
    """'450W', '0.45kW' -> milliwatts (NVML's unit); 'default' stays. Raises ValueError."""
    if value == "default":
        return value
    m = _POWER_RE.match(str(value))
    if not m:
        raise ValueError(value)
    return round(float(m.group(1)) * (1_000_000 if m.group(2) == "kW" else 1000))


def parse_clock(value: str) -> int:
    """'1980MHz', '1.98GHz' -> MHz. Raises ValueError."""
    m = _CLOCK_RE.match(str(value))
    if not m:
        raise ValueError(value)
    return round(float(m.group(1)) * (1000 if m.group(2) == "GHz" else 1))


def _one(raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "persistence_mode" in raw:
        out["persistence_mode"] = bool(raw["persistence_mode"])
    if "power_limit" in raw:
        out["power_limit"] = parse_power(raw["power_limit"])
    if "compute_mode" in raw:
        out["compute_mode"] = raw["compute_mode"]
    if "application_clocks" in raw:
        c = raw["application_clocks"]
        out["application_clocks"] = c if c == "default" else (parse_clock(c["memory"]), parse_clock(c["graphics"]))
    if "locked_clocks" in raw:
        c = raw["locked_clocks"]
        out["locked_clocks"] = c if c == "none" else (parse_clock(c["min"]), parse_clock(c["max"]))
    for key in ("mig", "ecc"):
        if key in raw:
            out[key] = raw[key] == "enabled"
    return out


def parse_settings(section: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`gpus.settings` (schema-validated) -> {"all": {...}, "per_gpu": {index: {...}}} with power in
    milliwatts, clocks in MHz, modes as booleans; None when not declared."""
    if not section:
        return None
    per = section.get("per_gpu") or {}
    return {"all": _one({k: v for k, v in section.items() if k != "per_gpu"}),
            "per_gpu": {int(k): _one(v or {}) for k, v in per.items()}}


def settings_problems(section: Mapping[str, Any]) -> list[tuple[tuple, str]]:
    """What the schema cannot say about `gpus`: (path inside the section, message)."""
    out: list[tuple[tuple, str]] = []
    settings = section.get("settings")
    if not isinstance(settings, Mapping):
        return out
    scopes: list[tuple[tuple, Mapping[str, Any]]] = [(("settings",), settings)]
    seen: dict[int, Any] = {}
    for key, value in (settings.get("per_gpu") or {}).items():
        index = int(key)
        if index in seen:
            out.append((("settings", "per_gpu", key), f"settings.per_gpu: GPU {index} is declared twice "
                                                        f"({seen[index]!r} and {key!r})"))
        seen[index] = key
        if isinstance(value, Mapping):
            scopes.append((("settings", "per_gpu", key), value))
    for path, scope in scopes:
        locked = scope.get("locked_clocks")
        if isinstance(locked, Mapping) and parse_clock(locked["min"]) > parse_clock(locked["max"]):
            out.append(((*path, "locked_clocks", "min"), f"{_dotted(path)}.locked_clocks: min {locked['min']} is "
                                                          f"above max {locked['max']}"))
        check = (section.get("checks") or {}).get("persistence_mode")
        pm = scope.get("persistence_mode")
        if check is not None and pm is not None and (check == "enabled") != bool(pm):
            out.append(((*path, "persistence_mode"), f"{_dotted(path)}.persistence_mode: {str(pm).lower()} "
                                                     f"contradicts checks.persistence_mode: {check}"))
    return out


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def declared(spec: Mapping[str, Any] | None) -> frozenset[str]:
    """Every setting the state declares for some GPU (what observe reads)."""
    if not spec:
        return frozenset()
    names = set(spec["all"])
    for one in spec["per_gpu"].values():
        names.update(one)
    return frozenset(names)


def wanted(spec: Mapping[str, Any], index: int) -> dict[str, Any]:
    """GPU INDEX's settings: those for every GPU, with its `per_gpu` entry over them."""
    return {**spec["all"], **spec["per_gpu"].get(index, {})}


# --- how values read ---------------------------------------------------------------------------------

def watts(mw: int | None) -> str:
    return UNKNOWN if mw is None else f"{mw / 1000:g} W"


def clocks(pair: Any) -> str:
    return f"memory {pair[0]} MHz, graphics {pair[1]} MHz"


def locked(value: Any) -> str:
    return "none" if value == "none" else f"{value[0]}-{value[1]} MHz"


def mode(on: bool | None) -> str:
    return UNKNOWN if on is None else ("enabled" if on else "disabled")


def _want_text(name: str, value: Any, s: GpuSettings | None) -> Any:
    if name == "power_limit":
        if value == "default":
            return f"default ({watts(s.power_default_mw)})" if s and s.power_default_mw is not None else "default"
        return watts(value)
    if name == "application_clocks":
        if value == "default":
            dflt = s.default_application_clocks if s else None
            return f"default ({clocks(dflt)})" if dflt else "default"
        return clocks(value)
    if name == "locked_clocks":
        return locked(value)
    if name in ("mig", "ecc"):
        return mode(value)
    return value


# --- drift --------------------------------------------------------------------------------------------

def _have(name: str, want: Any, g: Gpu) -> tuple[bool, Any]:
    """(whether GPU g has the wanted value, what it has as the report shows it)."""
    s = g.settings or GpuSettings()
    if g.lost:
        return False, UNKNOWN
    if name != "persistence_mode" and (s.why_unsupported(name) or s.why_unreadable(name)):
        return False, NOT_SUPPORTED if s.why_unsupported(name) else UNKNOWN
    if name == "persistence_mode":
        have = g.persistence_mode
        return have == want, UNKNOWN if have is None else have
    if name == "power_limit":
        target = s.power_default_mw if want == "default" else want
        return target is not None and s.power_limit_mw == target, watts(s.power_limit_mw)
    if name == "compute_mode":
        return s.compute_mode == want, s.compute_mode or UNKNOWN
    if name == "application_clocks":
        target = s.default_application_clocks if want == "default" else tuple(want)
        have = s.application_clocks
        return have is not None and have == target, clocks(have) if have else UNKNOWN
    if name == "locked_clocks":
        rec = s.locked_clocks
        if rec is None:
            return False, UNKNOWN
        if rec != "none" and s.graphics_clock is not None and s.graphics_clock > rec[1]:
            # The GPU runs faster than the lock allows: the lock is gone (reset, another tool).
            return False, f"not in force (graphics clock {s.graphics_clock} MHz, above {rec[1]} MHz)"
        have = rec if rec == "none" else tuple(rec)
        return have == (want if want == "none" else tuple(want)), locked(have)
    current, pending = (g.mig, s.mig_pending) if name == "mig" else (s.ecc, s.ecc_pending)
    if current is None:
        return False, UNKNOWN
    text = mode(current) + ("" if pending is None or pending == current else f" (pending: {mode(pending)})")
    return current == want and pending in (None, want), text


def settings_drift(spec: Mapping[str, Any] | None, observed: GpusObserved, healthy: bool = True) -> list[Drift]:
    """`gpuI.SETTING: want, have` for each declared setting a GPU does not have. A lost GPU's settings
    are unknown; with `healthy` judged, the GPU is blocked with its step already, and they are left
    out (as the checks leave its readings out)."""
    if not spec:
        return []
    out = []
    for g in observed.gpus:
        if g.lost and healthy:
            continue
        want = wanted(spec, g.index)
        for name in SETTINGS:
            if name in want:
                ok, have = _have(name, want[name], g)
                if not ok:
                    out.append(Drift(f"gpu{g.index}.{name}", _want_text(name, want[name], g.settings), have))
    present = {g.index for g in observed.gpus}
    for index in sorted(set(spec["per_gpu"]) - present):
        out.append(Drift(f"gpu{index}.settings", "a GPU to set", "no such GPU"))
    return out


# --- plan ---------------------------------------------------------------------------------------------

def _gpu_label(idx: Iterable[int]) -> str:
    idx = sorted(set(idx))
    if len(idx) > 2 and idx == list(range(idx[0], idx[-1] + 1)):
        return f"GPUs {idx[0]}-{idx[-1]}"
    return ("GPU " if len(idx) == 1 else "GPUs ") + ",".join(map(str, idx))


def _range(values: Sequence[int]) -> str:
    return f"{min(values)}-{max(values)} MHz" if values else "none"


def _holders_of(g: Gpu, holders: Sequence[Holder]) -> list[Holder]:
    return [h for h in holders if any(u.gpu == g.index for u in h.uses)]


def _holder_text(h: Holder) -> str:
    where = f" in {h.unit}" if h.unit else ""
    seen = "" if h.visible else " (not visible from here: another PID namespace?)"
    return f"{h.label()}{where}{seen}"


class SettingsPlan:
    """The plan's settings part: actions, what is blocked, what is pending, notes."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.blocked: list[str] = []
        self.pending: list[str] = []
        self.notes: list[str] = []


def settings_plan(resource: Resource, observed: GpusObserved, fields: set[str], ctx: Context,
                  freed: set[int]) -> SettingsPlan:
    """FIELDS: this resource's drift fields. FREED: PIDs this plan (or a declared unit acted on first)
    frees: a MIG/ECC change waits for them instead of being refused."""
    spec = resource.spec.get("settings")
    out = SettingsPlan()
    if not spec:
        return out
    timeout = float(resource.spec.get("observe_timeout") or 60)
    host = observed.settings_host
    for f in sorted(fields):
        if f.endswith(".settings") and f.startswith("gpu"):
            out.blocked.append(f"settings.per_gpu names GPU {f[3:-9]}, which this host does not have "
                               f"({len(observed.gpus)} GPUs)")
    todo = [(g, name) for name in SETTINGS for g in observed.gpus if f"gpu{g.index}.{name}" in fields]
    if not todo:
        return out
    if observed.source != "nvml":
        out.blocked.append("GPU settings are set through NVML, which is unavailable here (read through nvidia-smi): "
                           "set them by hand (nvidia-smi -pm/-pl/-c/-lgc/-mig/-e) or fix NVML")
        return out
    lost_said: set[int] = set()
    for g in sorted({g.index: g for g, _ in todo}.values(), key=lambda g: g.index):
        if g.lost:
            lost_said.add(g.index)
            out.blocked.append(f"GPU {g.index} is lost ({g.lost}): its settings can be neither read nor set")
    persistence = [g for g, name in todo if name == "persistence_mode" and g.index not in lost_said]
    if persistence:
        _persistence(spec, persistence, observed, ctx, timeout, out)
    for g, name in todo:
        if name == "persistence_mode" or g.index in lost_said:
            continue
        want = wanted(spec, g.index)[name]
        s = g.settings or GpuSettings()
        why = s.why_unsupported(name)
        if why:
            hint = ": declare locked_clocks instead" if name == "application_clocks" and "deprecated" in why else ""
            out.blocked.append(f"GPU {g.index}: {name} cannot be set: {why}{hint}")
            continue
        why = s.why_unreadable(name)
        if why:
            out.blocked.append(f"GPU {g.index}: {name} cannot be read ({why}): not set")
            continue
        refusal = _out_of_range(name, want, g, s)
        if refusal:
            out.blocked.append(refusal)
            continue
        if name in ("mig", "ecc") and _later(name, want, g, s, observed.holders, freed, out):
            continue
        params: dict[str, Any] = {"gpu": g.index, "uuid": g.uuid, "setting": name, "timeout": timeout,
                                  "value": _value(name, want, s)}
        if name == "locked_clocks" and host is not None:
            params.update(boot_id=host.boot_id, driver_load=host.driver_load)
            if s.locked_clocks is None and not any(n.startswith("locked clocks") for n in out.notes):
                out.notes.append("locked clocks: NVML cannot read them back, and reconcile has no record of setting "
                                 "them since the driver loaded: they are set (docs/gpus.md#locked-clocks)")
        out.actions.append(Action("set", f"gpu{g.index}.{name}", _describe(name, want, g, s), params))
    return out


def _value(name: str, want: Any, s: GpuSettings) -> Any:
    if name == "power_limit" and want == "default":
        return s.power_default_mw
    if name in ("application_clocks", "locked_clocks") and not isinstance(want, str):
        return list(want)
    return want


def _out_of_range(name: str, want: Any, g: Gpu, s: GpuSettings) -> str | None:
    if name == "power_limit":
        target = s.power_default_mw if want == "default" else want
        if target is None:
            return f"GPU {g.index}: its default power limit cannot be read: power_limit not set"
        lo, hi = s.power_min_mw, s.power_max_mw
        if lo is None or hi is None:
            return f"GPU {g.index}: its power limit constraints cannot be read: power_limit not set"
        if not lo <= target <= hi:
            return (f"GPU {g.index}: power_limit {watts(target)} is outside what it supports: {watts(lo)} to "
                    f"{watts(hi)} (nvmlDeviceGetPowerManagementLimitConstraints)")
    if name == "application_clocks" and want != "default":
        table = dict(s.supported_clocks or ())
        if not table:
            return f"GPU {g.index}: its supported clocks cannot be read: application_clocks not set"
        mem, gr = want
        if mem not in table:
            supported = ", ".join(f"{m} MHz" for m in sorted(table, reverse=True))
            return (f"GPU {g.index}: application_clocks memory {mem} MHz is not a memory clock it supports: "
                    f"{supported} (nvmlDeviceGetSupportedMemoryClocks)")
        if gr not in table[mem]:
            return (f"GPU {g.index}: application_clocks graphics {gr} MHz is not a graphics clock it supports with "
                    f"memory at {mem} MHz: {_range(table[mem])}, {len(table[mem])} clocks "
                    f"(nvmlDeviceGetSupportedGraphicsClocks)")
    if name == "locked_clocks" and want != "none":
        every = sorted({c for _, grs in (s.supported_clocks or ()) for c in grs})
        if not every:
            return f"GPU {g.index}: its supported clocks cannot be read: locked_clocks not set"
        lo, hi = want
        if lo < every[0] or hi > every[-1]:
            return (f"GPU {g.index}: locked_clocks {lo}-{hi} MHz is outside the graphics clocks it supports: "
                    f"{_range(every)} (nvmlDeviceGetSupportedGraphicsClocks)")
    return None


def _later(name: str, want: bool, g: Gpu, s: GpuSettings, holders: Sequence[Holder], freed: set[int],
           out: SettingsPlan) -> bool:
    """True when the MIG/ECC change is not planned now: pending already, or the GPU is held."""
    what = "MIG mode" if name == "mig" else "ECC mode"
    pending = s.mig_pending if name == "mig" else s.ecc_pending
    if pending == want:
        step = f"reset GPU {g.index}" if name == "mig" else "reboot"
        out.pending.append(f"GPU {g.index}: {what} {mode(want)} is pending: {step}")
        return True
    held = _holders_of(g, holders)
    if not held:
        return False
    waiting = [h for h in held if h.pid in freed]
    if len(waiting) == len(held):
        out.notes.append(f"GPU {g.index}: {what} is set once {', '.join(_holder_text(h) for h in held)} "
                         f"{'has' if len(held) == 1 else 'have'} let go of it (freed first)")
    else:
        others = [h for h in held if h.pid not in freed]
        out.blocked.append(f"GPU {g.index}: {what} cannot be changed while a process holds the GPU: "
                           f"{', '.join(_holder_text(h) for h in others)} (stop it first: declare its unit "
                           "active: false, or free_with)")
    return True


def _describe(name: str, want: Any, g: Gpu, s: GpuSettings) -> str:
    gpu = f"GPU {g.index}"
    if name == "power_limit":
        target = s.power_default_mw if want == "default" else want
        return f"set {gpu}'s power limit to {watts(target)} (now {watts(s.power_limit_mw)})"
    if name == "compute_mode":
        return f"set {gpu}'s compute mode to {want} (now {s.compute_mode})"
    if name == "application_clocks":
        now = clocks(s.application_clocks) if s.application_clocks else UNKNOWN
        if want == "default":
            return f"reset {gpu}'s application clocks to the defaults (now {now})"
        return f"set {gpu}'s application clocks to {clocks(want)} (now {now})"
    if name == "locked_clocks":
        if want == "none":
            return f"reset {gpu}'s locked graphics clocks (nvmlDeviceResetGpuLockedClocks)"
        return f"lock {gpu}'s graphics clocks to {locked(want)}"
    if name == "mig":
        return f"{'enable' if want else 'disable'} MIG mode on {gpu} (takes effect when the GPU is reset)"
    return f"{'enable' if want else 'disable'} ECC on {gpu} (takes effect at the next reboot)"


def _nvml_persistence(gpus: Sequence[Gpu], spec: Mapping[str, Any], timeout: float, out: SettingsPlan) -> None:
    for g in gpus:
        want = wanted(spec, g.index)["persistence_mode"]
        out.actions.append(Action("set", f"gpu{g.index}.persistence_mode",
                                  f"{'enable' if want else 'disable'} persistence mode on GPU {g.index} "
                                  "(nvmlDeviceSetPersistenceMode)",
                                  {"gpu": g.index, "uuid": g.uuid, "setting": "persistence_mode", "value": want,
                                   "timeout": timeout}))


def _persistence(spec: Mapping[str, Any], gpus: list[Gpu], observed: GpusObserved, ctx: Context, timeout: float,
                 out: SettingsPlan) -> None:
    """nvidia-persistenced.service enabled and running where it exists (the units kind's plan for it);
    else, or when the daemon runs and a GPU still differs, nvmlDeviceSetPersistenceMode."""
    from ..units import UnitsReconciler

    host = observed.settings_host
    unit = host.persistenced if host else None
    unread = [g for g in gpus if g.persistence_mode is None]
    for g in unread:
        out.blocked.append(f"GPU {g.index}: persistence mode is not reported by this GPU or driver: not set")
    gpus = [g for g in gpus if g.persistence_mode is not None]
    if not gpus:
        return
    values = {wanted(spec, g.index)["persistence_mode"] for g in observed.gpus
              if "persistence_mode" in wanted(spec, g.index)}
    label = _gpu_label(g.index for g in gpus)
    masked = unit is not None and unit.exists and unit.enabled == "masked"
    if unit is None or not unit.exists or masked or len(values) != 1:
        why = (host.persistenced_note if host and host.persistenced_note else
               "persistence mode differs between GPUs (nvidia-persistenced sets every GPU alike)" if len(values) != 1
               else f"{PERSISTENCED} is masked" if masked else f"{PERSISTENCED} is not installed")
        out.notes.append(f"{why}: persistence mode on {label} is set through NVML (nvmlDeviceSetPersistenceMode, "
                         "which NVIDIA deprecates in favour of nvidia-persistenced; it is lost when the driver "
                         "unloads, so the boot-time apply sets it again)")
        _nvml_persistence(gpus, spec, timeout, out)
        return
    want = values.pop()
    units = UnitsReconciler()
    declared = ctx.resources.get(f"unit:{PERSISTENCED}")
    if declared is not None:
        if declared.spec.get("active") not in (None, want):
            out.blocked.append(f"persistence_mode: {str(want).lower()} needs {PERSISTENCED} "
                               f"{'running' if want else 'stopped'}, but the state declares it active: "
                               f"{str(declared.spec.get('active')).lower()}")
            return
        if unit.active != want:
            out.notes.append(f"persistence mode on {label}: by unit:{PERSISTENCED} (declared, acted on first)")
            return
    else:
        # Enabled too, so it starts at every boot; a unit without an [Install] section of its own
        # (static, indirect) is started by whatever pulls it in: running is what counts then.
        unit_spec: dict[str, Any] = {"active": want}
        if isinstance(unit.enabled, bool):
            unit_spec["enabled"] = want
        res = Resource(id=f"unit:{PERSISTENCED}", kind="unit", name=PERSISTENCED, spec=unit_spec)
        drift = units.diff(res, unit)
        if drift:
            plan = units.plan(res, unit, drift, ctx)
            why = f"persistence mode on {label} (NVIDIA's persistence daemon)"
            out.actions.extend(Action(a.action, a.target, f"{a.description}: {why}", {"unit": a.target})
                               for a in plan.actions)
            if plan.blocked:
                out.blocked.append(f"{plan.blocked}: persistence mode on {label} cannot be set through it")
            return
    out.notes.append(f"{PERSISTENCED} is {'running' if want else 'stopped'}, yet persistence mode on {label} is "
                     f"{'off' if want else 'on'} (a daemon started with --no-persistence-mode?): set through NVML")
    _nvml_persistence(gpus, spec, timeout, out)


def freed_pids(holders: Sequence[Holder], actions: Sequence[Action], ctx: Context) -> set[int]:
    """The holders this plan frees: stopped units, terminated PIDs, and units the state declares
    `active: false` (the units kind acts on them first)."""
    stopped = {a.params.get("unit") or a.target for a in actions if a.action == "stop"}
    killed = {int(a.params["pid"]) for a in actions if a.action == "terminate" and "pid" in a.params}
    containers = {a.params.get("id") for a in actions if a.action == "stop-container"}
    out = set()
    for h in holders:
        declared = ctx.resources.get(f"unit:{h.unit}") if h.unit else None
        if h.pid in killed or (h.unit and (h.unit in stopped or (declared and declared.spec.get("active") is False))):
            out.add(h.pid)
        c = h.container
        if c is not None and (c.id in containers or c.unit in stopped or (
                c.name and getattr(ctx.resources.get(f"container:{c.name}"), "spec", {}).get("running") is False)):
            out.add(h.pid)
    return out
