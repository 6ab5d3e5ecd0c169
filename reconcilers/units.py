"""systemd units: running or not (active), starting at boot or not (enabled), or masked.

All declared units are observed with ONE `systemctl show` call. A manager that cannot
be reached is an error, never "inactive" (testinfra's `is_running` reads a broken host
as passing). Units are stopped through systemd, never by killing their processes: a
`Restart=always` unit would respawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import Action, ApplyError, Context, Drift, ObserveError, Plan, Reconciler, Resource
from .host import CommandTimeout, Host

PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "MainPID", "FragmentPath")
# systemctl mask replaces the unit file in /etc with a link to /dev/null and refuses when the
# unit file itself lives there.
ADMIN_UNIT_DIR = "/etc/systemd/system/"

# UnitFileState values (systemctl is-enabled) that `enable`/`disable` cannot change:
# the unit has no [Install] section, or is pulled in by another unit, or is made at boot.
UNCHANGEABLE = {"static", "indirect", "generated", "transient", "alias"}
ENABLED = {"enabled", "enabled-runtime", "linked", "linked-runtime", "alias"}
MASKED = {"masked", "masked-runtime"}
# ActiveState values that mean "running, or about to be": activating covers SubState=auto-restart,
# a unit waiting out RestartSec= after its process died, which will come back by itself.
RUNNING = {"active", "reloading", "activating", "deactivating", "refreshing"}

STOP_TIMEOUT = 120.0  # systemd's default stop timeout is 90 s; allow it to finish
CALL_TIMEOUT = 30.0


@dataclass(frozen=True)
class UnitObserved:
    name: str
    load_state: str  # loaded, not-found, masked, bad-setting, error
    active_state: str  # active, inactive, failed, activating, deactivating, reloading
    sub_state: str  # running, dead, exited, auto-restart, ...
    unit_file_state: str  # enabled, disabled, static, masked, ... ("" when not found)
    main_pid: int
    fragment_path: str = ""

    @property
    def exists(self) -> bool:
        return self.load_state != "not-found"

    @property
    def active(self) -> bool:
        return self.active_state in RUNNING

    @property
    def enabled(self) -> bool | str:
        """The value comparable with the declared `enabled`: True, False, 'masked', or the raw
        UnitFileState where it is neither (static, indirect, generated, ...)."""
        state = self.unit_file_state
        if state in MASKED or self.load_state == "masked":
            return "masked"
        if state in ENABLED:
            return True
        if state in ("disabled", "") or not self.exists:
            return False
        return state


def parse_show(output: str, names: Sequence[str]) -> dict[str, UnitObserved]:
    """`systemctl show` output for several units: one block of Key=Value lines each,
    separated by blank lines, in the order the units were named."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in output.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition("=")
        if sep:
            current[key] = value
    if current:
        blocks.append(current)
    if len(blocks) != len(names):
        raise ObserveError(f"systemctl show returned {len(blocks)} unit blocks for {len(names)} units")
    observed = {}
    for name, props in zip(names, blocks, strict=True):
        try:
            pid = int(props.get("MainPID", "0") or 0)
        except ValueError:
            pid = 0
        observed[name] = UnitObserved(
            name=name,
            load_state=props.get("LoadState", ""),
            active_state=props.get("ActiveState", ""),
            sub_state=props.get("SubState", ""),
            unit_file_state=props.get("UnitFileState", ""),
            main_pid=pid,
            fragment_path=props.get("FragmentPath", ""),
        )
    return observed


class UnitsReconciler(Reconciler):
    key = "units"
    kind = "unit"
    rank = 10

    def resources(self, section: dict[str, Any]) -> list[Resource]:
        return [
            Resource(id=f"unit:{name}", kind=self.kind, name=name,
                     spec={k: v for k, v in spec.items() if k != "needs"},
                     needs=tuple(spec.get("needs", ())))
            for name, spec in section.items()
        ]

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        if not resources:
            return {}
        names = [r.name for r in resources]
        try:
            res = host.run(["systemctl", "show", "--no-pager", "-p", ",".join(PROPERTIES), "--", *names],
                           timeout=CALL_TIMEOUT)
        except CommandTimeout as exc:
            raise ObserveError(str(exc)) from None
        if not res.ok:
            raise ObserveError(f"cannot read unit state from systemd: {res.brief()}")
        by_name = parse_show(res.stdout, names)
        return {r.id: by_name[r.name] for r in resources}

    def diff(self, resource: Resource, observed: UnitObserved) -> list[Drift]:
        drift = []
        want_active = resource.spec.get("active")
        if want_active is not None and observed.active != want_active:
            drift.append(Drift("active", want_active, observed.active))
        want_enabled = resource.spec.get("enabled")
        if want_enabled is not None and observed.enabled != want_enabled:
            drift.append(Drift("enabled", want_enabled, observed.enabled))
        return drift

    def plan(self, resource: Resource, observed: UnitObserved, drift: Sequence[Drift], ctx: Context) -> Plan:
        if not drift:
            if not observed.exists:
                return Plan(message="not installed")
            return Plan()
        name = resource.name
        fields = {d.field: d for d in drift}
        actions: list[Action] = []
        blocked: list[str] = []

        if not observed.exists and fields:
            # A unit that does not exist can still be masked (that is how one pre-empts it).
            if fields.get("enabled") and fields["enabled"].want == "masked":
                actions.append(Action("mask", name, f"mask {name}"))
                fields.pop("enabled")
            if fields:
                return Plan(actions=tuple(actions), blocked=f"unit {name} not found (LoadState=not-found)")

        # Boot-time state first, so a stopped unit cannot be re-triggered in between
        # (a disabled unit can still be started by a dependency, socket or timer; only
        # a mask prevents that).
        want_enabled = fields["enabled"].want if "enabled" in fields else None
        have_enabled = observed.enabled
        if want_enabled is not None:
            if want_enabled == "masked":
                if observed.fragment_path.startswith(ADMIN_UNIT_DIR):
                    blocked.append(
                        f"{name} cannot be masked: its unit file is {observed.fragment_path}, which a mask "
                        f"would have to replace (systemctl refuses); move it to /usr/local/lib/systemd/system "
                        f"or declare `enabled: false`"
                    )
                else:
                    actions.append(Action("mask", name, f"mask {name}"))
            elif have_enabled == "masked":
                actions.append(Action("unmask", name, f"unmask {name}"))
                # What the unit is after unmasking cannot be seen while it is masked; the
                # engine observes again and plans the enable/disable that may still be needed.
            elif have_enabled in UNCHANGEABLE or isinstance(have_enabled, str):
                blocked.append(
                    f"{name} is {have_enabled}: it has no [Install] section of its own and cannot be "
                    f"{'enabled' if want_enabled else 'disabled'}"
                    + ("; declare `enabled: masked` to keep it from starting" if not want_enabled else "")
                )
            elif want_enabled is True:
                actions.append(Action("enable", name, f"enable {name}"))
            else:
                actions.append(Action("disable", name, f"disable {name}"))

        if "active" in fields:
            if fields["active"].want:
                if want_enabled == "masked" or (have_enabled == "masked" and want_enabled is None):
                    blocked.append(f"{name} is masked and cannot be started")
                else:
                    actions.append(Action("start", name, f"start {name}"))
            else:
                actions.append(Action("stop", name, f"stop {name}"))
        return Plan(actions=tuple(actions), blocked="; ".join(blocked) or None)

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        verb = action.action
        if verb not in ("start", "stop", "enable", "disable", "mask", "unmask"):
            raise ApplyError(f"unknown unit action {verb!r}")
        timeout = STOP_TIMEOUT if verb in ("start", "stop") else CALL_TIMEOUT
        try:
            res = host.run(["systemctl", verb, "--", action.target], timeout=timeout)
        except CommandTimeout as exc:
            raise ApplyError(str(exc)) from None
        if not res.ok:
            raise ApplyError(res.brief())
        return (res.stderr.strip() or res.stdout.strip()).replace("\n", "; ")

    def summary(self, resource: Resource, observed: UnitObserved) -> str:
        if not observed.exists:
            return "not found"
        return f"{observed.active_state}/{observed.sub_state}, {observed.unit_file_state or 'no unit file'}"
