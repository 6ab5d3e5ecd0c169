"""Containers (Docker, Podman): running or not, and the restart policy that decides whether the
engine brings one back, read from the engine itself (`docker inspect`, `podman inspect`).

A container whose process is killed from outside comes back if its policy says so (`always`,
`unless-stopped`, `on-failure` after a non-zero exit), and `always` brings back even a container
stopped by hand once the daemon restarts: so a container is stopped through its engine, never by
signalling its processes, and when its policy is to change as well the policy is changed first
(`docker update --restart`), so no moment exists in which it is stopped and still set to return.
Podman 4.3 cannot change a policy in place (no `podman update --restart`): that drift is blocked
with the step, the container is never recreated behind its owner's back. A container a systemd
unit runs (`podman generate systemd`, a unit that runs `docker run`) is acted on through the unit,
which would otherwise start it again (its Restart=).

Reconcile never creates, pulls or removes a container: a missing one that must run, or one
created from another image than declared, is blocked with the step a person takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...common import systemd
from ...core.contract import (
    Action,
    ApplyError,
    Context,
    Drift,
    ObserveError,
    Plan,
    Reconciler,
    Resource,
    run_action,
)
from ...core.values import parse_duration
from .engines import (
    CALL_TIMEOUT,
    NOT_INSTALLED,
    STOP_TIMEOUT,
    EngineAnswer,
    compose_key,
    image_ref,
    inspect,
    normal_policy,
    observed_of,
    restart_settable,
)
from .observed import ENGINES, ContainerObserved

if TYPE_CHECKING:
    from ...core.host import Host

UNKNOWN = "unknown"
ABSENT = "no such container"


class ContainersReconciler(Reconciler):
    key = "containers"
    kind = "container"
    rank = 15  # after units (a unit that owns a container acts first), before the GPUs it frees

    def resources(self, section: Mapping[str, Any]) -> list[Resource]:
        out = []
        for name, raw in section.items():
            spec = {k: v for k, v in raw.items() if k != "needs"}
            if "stop_timeout" in spec:
                spec["stop_timeout"] = parse_duration(spec["stop_timeout"])
            if "restart" in spec:
                spec["restart"] = normal_policy(str(spec["restart"]))
            if "compose" in spec:
                spec["compose"] = (str(spec["compose"]["project"]), str(spec["compose"]["service"]))
            out.append(Resource(id=f"container:{name}", kind=self.kind, name=name, spec=spec,
                                needs=tuple(raw.get("needs", ()))))
        return out

    # --- observe ---

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        if not resources:
            return {}
        asked: dict[str, list[str]] = {}
        keys: dict[str, dict[str, Any]] = {}  # resource id -> engine -> what to look up (see _one)
        for r in resources:
            for engine in (r.spec["engine"],) if r.spec.get("engine") else ENGINES:
                key: Any = r.name
                if r.spec.get("compose"):
                    key = compose_key(host, engine, *r.spec["compose"])
                keys.setdefault(r.id, {})[engine] = key
                names = asked.setdefault(engine, [])
                if isinstance(key, str) and not key.startswith("!"):
                    names.append(key)
        answers = {engine: inspect(host, engine, names) if names else EngineAnswer({}, set())
                   for engine, names in asked.items()}
        local = not getattr(host, "prefix", ())  # behind a prefix, this /proc is not the containers' host
        settable: dict[str, bool] = {}

        def can_set(engine: str) -> bool:
            if engine not in settable:
                settable[engine] = restart_settable(host, engine)
            return settable[engine]

        out: dict[str, Any] = {}
        for r in resources:
            out[r.id] = self._one(r, answers, local, can_set, keys.get(r.id))
        return out

    @staticmethod
    def _one(r: Resource, answers: Mapping[str, Any], local: bool, can_set,
             keys: Mapping[str, Any] | None = None) -> ContainerObserved | ObserveError:
        """The resource as its engine reports it. KEYS: per engine, the name or id to look up (the
        declared name by default), None where a compose selector matched no container, or
        "!why" where the selector could not be resolved (several containers, an error)."""
        declared = r.spec.get("engine")
        engines = (declared,) if declared else ENGINES
        keys = keys or {e: r.name for e in engines}
        have, unknown, installed = [], [], []
        for engine in engines:
            a, key = answers[engine], keys[engine]
            if key is None:
                pass  # the selector matched no container: missing there
            elif key.startswith("!"):
                if key != NOT_INSTALLED:
                    unknown.append(key[1:])
                    installed.append(engine)
                continue
            elif key in a.found:
                have.append(engine)
            elif a.installed and key not in a.missing:
                unknown.append(a.error)
            if a.installed:
                installed.append(engine)
        if declared and not installed:
            return ObserveError(f"{declared} is not installed (not on PATH): cannot tell what runs in it")
        if not installed:
            return ObserveError("neither docker nor podman is installed (not on PATH)")
        if unknown and len(have) != 1:
            # An engine that cannot be asked may have the container: never read as "not there".
            hint = "" if declared else "; declare `engine:` if it is known which engine runs it"
            return ObserveError("; ".join(unknown) + hint)
        if len(have) > 1:
            return ObserveError(f"both docker and podman have a container named {r.name}: declare `engine:` "
                                "to say which one is meant")
        if not have:
            return ContainerObserved(r.name, "/".join(installed), exists=False, running=False, restart="")
        engine = have[0]
        want = r.spec.get("restart")
        settable = True if engine == "docker" or not want else can_set(engine)
        entry = answers[engine].found[keys[engine]]
        seen = observed_of(str(entry.get("Name", r.name)).lstrip("/"), engine, entry, local,
                           str(r.spec.get("unit") or ""), settable)
        if unknown:
            # One engine has it and the other cannot be asked (docker.io installed, its daemon down):
            # the one that answered is taken, and the report says what was not known.
            why = f"{'; '.join(unknown)}: taken to be {engine}'s (declare `engine: {engine}` to say so)"
            seen = replace(seen, note="; ".join(n for n in (seen.note, why) if n))
        return seen

    # --- diff / plan ---

    def diff(self, resource: Resource, observed: ContainerObserved) -> list[Drift]:
        spec = resource.spec
        if not observed.exists:
            # Nothing that is not there can come back: only a container that must run drifts.
            return [Drift("running", True, ABSENT)] if spec.get("running") is True else []
        drift = []
        if spec.get("running") is not None and observed.running != spec["running"]:
            drift.append(Drift("running", spec["running"], UNKNOWN if observed.running is None else observed.running))
        if spec.get("restart") is not None and observed.restart != spec["restart"]:
            drift.append(Drift("restart", spec["restart"], observed.restart))
        want_image = spec.get("image")
        if want_image and not _same_image(want_image, observed):
            drift.append(Drift("image", want_image, observed.image))
        return drift

    def plan(self, resource: Resource, observed: ContainerObserved, drift: Sequence[Drift], ctx: Context) -> Plan:
        if not drift:
            return Plan(message="" if observed.exists else f"{ABSENT} ({observed.engine})",
                        caveats=(observed.note,) if observed.exists and observed.note else ())
        # The container's own name (a compose selector's container is named by compose).
        name, engine = (observed.name if observed.exists else resource.name), observed.engine
        fields = {d.field: d for d in drift}
        if not observed.exists:
            return Plan(blocked=f"{engine} has no container named {name}: create it (`{engine.split('/')[0]} run -d "
                                f"--name {name} ... IMAGE`); reconcile never creates, pulls or recreates containers")
        actions: list[Action] = []
        blocked: list[str] = []
        notes: list[str] = [observed.note] if observed.note else []
        if "image" in fields:
            blocked.append(f"{name} was created from {observed.image or observed.image_id}, not "
                           f"{fields['image'].want}: recreate it from that image (`{engine} rm`, then `{engine} run`); "
                           "reconcile never pulls or recreates a container")
        if observed.unit:
            self._plan_owned(resource, observed, fields, ctx, actions, blocked, notes)
        else:
            if "restart" in fields:
                want = fields["restart"].want
                if observed.restart_settable:
                    # First: a container stopped while its policy still says `always` comes back at
                    # the next daemon restart; changed first, no such moment exists.
                    actions.append(Action("update-restart", name, f"{engine} update --restart={want} {name}",
                                          {"engine": engine, "restart": want, "id": observed.id}))
                else:
                    blocked.append(
                        f"{engine} cannot change the restart policy of an existing container ({engine} update has "
                        f"no --restart here): recreate {name} with --restart={want} (`{engine} rm {name}`, then "
                        f"`{engine} run --restart={want} ...`) or run it from a unit (`podman generate systemd "
                        "--new`); reconcile never recreates a container"
                        + (". Until then the engine starts it again at boot (podman-restart.service)"
                           if observed.restart == "always" else ""))
            if "running" in fields and fields["running"].have != UNKNOWN:
                timeout = resource.spec.get("stop_timeout")
                verb = "stop" if fields["running"].want is False else "start"
                params = {"engine": engine, "id": observed.id}
                if verb == "stop" and timeout is not None:
                    params["timeout"] = timeout
                actions.append(Action(verb, name, f"{engine} {verb} {name}", params))
        if "running" in fields and fields["running"].have == UNKNOWN:
            blocked.append(observed.note or f"{engine} cannot say whether {name} runs")
            notes = []
        return Plan(actions=tuple(actions), blocked="; ".join(blocked) or None, message="; ".join(notes))

    @staticmethod
    def _plan_owned(resource: Resource, observed: ContainerObserved, fields: Mapping[str, Drift], ctx: Context,
                    actions: list[Action], blocked: list[str], notes: list[str]) -> None:
        """A container a systemd unit runs: the unit is stopped or started, not the container."""
        name, unit = resource.name, observed.unit
        declared = ctx.resources.get(f"unit:{unit}")
        if "restart" in fields:
            blocked.append(f"{name} is run by {unit} ({observed.unit_from}): what brings it back is the unit's "
                           f"Restart= and whether it is enabled, not the container's policy: declare units: {unit}: "
                           "{active: ..., enabled: ...} and leave `restart` out")
        if "running" in fields and fields["running"].have != UNKNOWN:
            want = fields["running"].want
            if declared is not None and declared.spec.get("active") is want:
                notes.append(f"{name} is run by {unit}: acted on through unit:{unit} (declared active: "
                             f"{str(want).lower()}, acted on first)")
            elif declared is not None and declared.spec.get("active") is not None:
                blocked.append(f"{name} is run by {unit}, which the state declares active: "
                               f"{str(declared.spec['active']).lower()}: the two cannot both hold")
            else:
                verb = "start" if want else "stop"
                actions.append(Action(f"{verb}-unit", unit, f"{verb} unit {unit} (it runs container {name}; "
                                      f"{observed.unit_from})", {"unit": unit}))

    # --- apply ---

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        p = action.params
        if action.action in ("stop-unit", "start-unit"):
            verb = action.action.split("-")[0]
            return systemd.act(host, verb, p["unit"], STOP_TIMEOUT) or f"{verb}ped {p['unit']}"
        engine = p.get("engine")
        if engine not in ENGINES:
            raise ApplyError(f"unknown engine {engine!r}")
        if action.action == "update-restart":
            run_action(host, [engine, "update", f"--restart={p['restart']}", action.target], CALL_TIMEOUT)
            return f"restart policy set to {p['restart']}"
        if action.action == "stop":
            argv = [engine, "stop"]
            timeout = STOP_TIMEOUT
            if p.get("timeout") is not None:
                argv += ["-t", str(int(p["timeout"]))]
                timeout = max(timeout, float(p["timeout"]) + 60)
            run_action(host, [*argv, action.target], timeout)
            return f"stopped through {engine}"
        if action.action == "start":
            run_action(host, [engine, "start", action.target], STOP_TIMEOUT)
            return f"started through {engine}"
        raise ApplyError(f"unknown container action {action.action!r}")

    def summary(self, resource: Resource, observed: ContainerObserved) -> str:
        if not observed.exists:
            return f"{ABSENT} ({observed.engine})"
        running = {True: "running", False: "not running", None: "running state unknown"}[observed.running]
        pids = f", PID {observed.host_pids[0]}" if observed.running and observed.host_pids else ""
        owner = f", run by {observed.unit}" if observed.unit else ""
        return (f"{observed.engine} {observed.status} ({running}{pids}), restart {observed.restart} "
                f"({observed.restart_count} restarts), image {observed.image}{owner}")


def _same_image(want: str, observed: ContainerObserved) -> bool:
    if want.startswith("sha256:"):
        return observed.image_id == want or observed.image == want
    return image_ref(want) == image_ref(observed.image)
