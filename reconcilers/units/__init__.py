"""systemd units: running or not (active), starting at boot or not (enabled), or masked.

Observed without making systemd load anything. `systemctl show` loads every unit it is asked
about that systemd does not hold in memory (a disabled unit, usually) and works out its
UnitFileState by reading every unit directory, so it costs ~2-10 ms a unit; on systemd 252
`list-unit-files NAMES` costs as much (the same lookup). A single declared unit is shown
(one call, the cheapest way for one); for several:

1. `systemctl list-units --all NAMES` (ListUnitsByPatterns) gives LoadState, ActiveState and
   SubState of the declared units systemd holds in memory. A unit it does not list is not in
   memory, so it is not running: inactive/dead, as `show` would report once it had loaded it.
2. The unit-file state (enabled, disabled, static, indirect, masked) is worked out here, in one
   pass over the manager's unit search path (`UnitPath`) and the units' unit files, where a
   port of systemd 252's install logic follows it exactly (`UnitFiles`, `syntax`).
3. One `systemctl show` of only the units these cannot settle for sure (instances, aliases,
   linked, generated or transient units, scopes, units without a unit file or not found, files
   systemd would call bad, ...) and of every unit that drifts, so a plan is always made from
   systemd's own word (FragmentPath for the mask refusal, MainPID).

Which of systemd's two answers wins: the disk's. `is-enabled` reads the unit directories each
time; `show` repeats, for a unit systemd holds in memory, the state it worked out when first
asked, until a daemon-reload. The reader reads the disk; a unit shown that may be stale (in
memory, or declared alone) gets its state from `list-unit-files` (the disk, one call). That is
what the next boot and `systemctl enable/disable` act on (docs/units.md). Names systemd refuses
to look up never reach systemctl: they would end a batched `show`.

A manager that cannot be reached is an error, never "inactive" (testinfra's `is_running` reads a
broken host as passing). Units are stopped through systemd, never by killing their processes: a
`Restart=always` unit would respawn.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...common import systemd
from ...common.systemd import (
    GLOB_CHARS,
    IS_ENABLED,
    LIST_UNIT_FILES,
    LIST_UNITS,
    MASK_PENDING,
    MASKED,
    UNCHANGEABLE,
    UNIT_PATH,
    UnitObserved,
    is_enabled_error,
    parse_list_unit_files,
    parse_list_units,
    parse_show,
)
from ...core.contract import Action, Context, Drift, ObserveError, Plan, Reconciler, Resource
from ...core.host import CommandTimeout
from ...core.values import dotted
from .syntax import name_kind, systemd_refuses
from .unitfiles import UnitFiles

if TYPE_CHECKING:
    from ...core.host import Host

# systemctl mask replaces the unit file in /etc with a link to /dev/null and refuses when the
# unit file itself lives there.
ADMIN_UNIT_DIR = "/etc/systemd/system/"


STOP_TIMEOUT = 120.0  # systemd's default stop timeout is 90 s; allow it to finish
CALL_TIMEOUT = 30.0


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

    def problems(self, section: Any) -> list[tuple[tuple, str]]:
        out = []
        for name, spec in section.items():
            if name_kind(name) != "template":
                continue
            stem, _, suffix = name.rpartition(".")
            instead = f"declare an instance such as {stem}NAME.{suffix}"
            if isinstance(spec, dict) and spec.get("active") is True:
                # systemd refuses to start one ("Unit name foo@.service is missing the instance
                # name", unit-name.c unit_name_is_template): said at the value.
                out.append(((name, "active"), f"{dotted((name, 'active'))}: a template cannot be active (systemd "
                                              f"starts only its instances); {instead}"))
            else:
                # Whatever else is declared, diff could never observe it: `systemctl show` and
                # `is-active` refuse a template's name (systemd 252: "Unit name foo@.service is
                # neither a valid invocation ID nor unit name"). `is-enabled` does read a
                # template's unit file, but enabling one acts on an instance (DefaultInstance=)
                # and masking one masks every instance: declared per instance, each is observed.
                # Refused at the name, before diff says so.
                out.append(((name,), f"{dotted((name,))}: a template has no state of its own to check: systemd "
                                      f"keeps one only for its instances (`systemctl show {name}`: "
                                      f"\"neither a valid invocation ID nor unit name\"); {instead}"))
        return out

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        if not resources:
            return {}
        out: dict[str, Any] = {}
        todo = []
        for r in resources:
            refused = None if name_kind(r.name) != "template" else (
                f"{r.name} is a template: systemd has a state only for its instances (NAME@INSTANCE.service)")
            refused = refused or systemd_refuses(r.name)
            if refused:
                # Kept out of every systemctl call: `show` of such a name fails, and ends a batched
                # `show` there (bus: "Unknown object").
                out[r.id] = ObserveError(refused)
            else:
                todo.append(r)
        if not todo:
            return out
        if len(todo) == 1:
            # One unit: a single `show` (~13 ms) costs less than the listings it would replace, and
            # a recovery's one unit usually drifts, which would mean a `show` after them anyway.
            # Whether systemd held it in memory is not known here, so its unit-file state is read
            # from the disk as well (stale=None: the unit may be stale).
            shown = self._show(host, [todo[0].name], None)
            out[todo[0].id] = shown[todo[0].name]
            return out
        listed, files = self._listings(host, [r.name for r in todo])
        by_name: dict[str, UnitObserved | ObserveError] = {}
        ask = []
        for r in todo:
            seen = self._from_listings(r.name, listed.get(r.name), files)
            # A drifting unit is planned from systemd's own word (and needs its FragmentPath).
            if seen is None or self.diff(r, seen):
                ask.append(r.name)
            else:
                by_name[r.name] = seen
        if ask:
            by_name.update(self._show(host, ask, {n for n in ask if n in listed}))
        out.update({r.id: by_name[r.name] for r in todo})
        return out

    def _listings(self, host: Host, names: list[str]) -> tuple[dict[str, tuple[str, str, str]], UnitFiles | None]:
        """list-units of the declared units and, meanwhile, the manager's unit search path and a
        scan of it (None when it cannot be read here: every unit is then shown)."""
        local = not getattr(host, "prefix", ())  # behind a prefix the unit files are not ours to read
        found: dict[str, Any] = {}

        def search_path() -> None:
            try:
                res = host.run(list(UNIT_PATH), timeout=CALL_TIMEOUT)
                if res.ok and res.stdout.split():
                    found["files"] = UnitFiles(res.stdout.split())
            except Exception:
                pass  # whatever goes wrong here only costs time: systemd is asked instead

        worker = threading.Thread(target=search_path, daemon=True) if local else None
        if worker:
            worker.start()
        try:
            res = host.run([*LIST_UNITS, *names], timeout=CALL_TIMEOUT)
        except CommandTimeout as exc:
            raise ObserveError(str(exc)) from None
        finally:
            if worker:
                worker.join()
        if not res.ok:
            raise ObserveError(f"cannot read unit state from systemd: {res.brief()}")
        return parse_list_units(res.stdout), found.get("files")

    @staticmethod
    def _from_listings(name: str, row: tuple[str, str, str] | None, files: UnitFiles | None) -> UnitObserved | None:
        """The unit as `systemctl show` would report it, or None where the listings cannot say."""
        if files is None or "@" in name:
            return None  # an instance's state also depends on its template's and its own links
        state = files.state(name)
        if state is None:
            return None
        file_state, path = state
        masked = file_state in MASKED
        if row is None:
            if GLOB_CHARS.intersection(name):
                return None
            # Not in memory, so not running; show would load it: loaded (or masked), inactive/dead.
            return UnitObserved(name, "masked" if masked else "loaded", "inactive", "dead", file_state, 0, path)
        load, active, sub = row
        # not-found, bad-setting, error, or a memory that disagrees with the disk (no daemon-reload
        # since the unit was masked or unmasked): systemd's word.
        if load not in ("loaded", "masked") or (load == "masked") != masked:
            return None
        return UnitObserved(name, load, active, sub, file_state, 0, path)

    def _show(self, host: Host, names: list[str], stale: set[str] | None) -> dict[str, UnitObserved | ObserveError]:
        """`systemctl show` of these units, in one call; then, for those systemd may hold in memory
        with a state worked out before the last change on disk (`stale`; None: any of them), the
        disk's own answer (`list-unit-files`, one call), and for `bad` ones the reason systemd
        gives (`is-enabled`)."""
        check = [n for n in names if stale is None or n in stale]
        disk: dict[str, str] = {}
        worker = None
        if check:
            def from_disk() -> None:
                try:
                    res = host.run([*LIST_UNIT_FILES, *check], timeout=CALL_TIMEOUT)
                    if res.ok:
                        disk.update(parse_list_unit_files(res.stdout))
                except Exception:
                    disk.clear()  # the states show gave stand
            worker = threading.Thread(target=from_disk, daemon=True)
            worker.start()
        try:
            shown = self._show_all(host, names)
        finally:
            if worker:
                worker.join()
        for name, seen in shown.items():
            if not isinstance(seen, UnitObserved):
                continue
            # Only for the unit's own name: `show ALIAS` reports the unit the alias names.
            # Only where show gave a state at all: a unit without a unit file the manager uses
            # (not-found, a .scope file, a slice it makes up) has none in either answer of show.
            if (name in disk and seen.unit_id in ("", name) and seen.exists and seen.unit_file_state
                    and disk[name] != seen.unit_file_state):
                seen = shown[name] = replace(seen, unit_file_state=disk[name])
            if seen.unit_file_state == "bad":
                shown[name] = replace(seen, unit_file_error=self._why_bad(host, seen.unit_id or name))
        return shown

    @staticmethod
    def _show_all(host: Host, names: list[str]) -> dict[str, UnitObserved | ObserveError]:
        argv = list(systemd.SHOW)
        try:
            res = host.run([*argv, *names], timeout=CALL_TIMEOUT)
            if res.ok:
                return dict(parse_show(res.stdout, names))
            if len(names) == 1:
                raise ObserveError(f"cannot read unit state from systemd: {res.brief()}")
            # One name systemd cannot resolve ends a batched show after the blocks before it: ask
            # for each unit on its own, so the others are still read.
            out: dict[str, UnitObserved | ObserveError] = {}
            for name in names:
                one = host.run([*argv, name], timeout=CALL_TIMEOUT)
                out[name] = parse_show(one.stdout, [name])[name] if one.ok else ObserveError(
                    f"cannot read unit state from systemd: {one.brief()}")
            return out
        except CommandTimeout as exc:
            raise ObserveError(str(exc)) from None

    @staticmethod
    def _why_bad(host: Host, name: str) -> str:
        """What `systemctl is-enabled` says of a unit whose UnitFileState is bad: the error
        systemd met reading its unit file ("Invalid argument", "Bad message", ...)."""
        try:
            res = host.run([*IS_ENABLED, name], timeout=CALL_TIMEOUT)
        except Exception:
            return ""
        return is_enabled_error(res.stderr) if not res.ok else ""

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
            if have_enabled == MASK_PENDING:
                # Masked on disk by hand, not yet loaded so: `systemctl mask` (link already there)
                # or `unmask` reloads systemd, which puts the disk's word in force.
                verb = "mask" if want_enabled == "masked" else "unmask"
                actions.append(Action(verb, name, f"{verb} {name}"))
            elif want_enabled == "masked":
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
            elif have_enabled == "bad":
                why = f" ({observed.unit_file_error})" if observed.unit_file_error else ""
                blocked.append(f"{name} is bad: systemd cannot read its unit file{why}, so systemctl "
                               f"{'enable' if want_enabled else 'disable'} would fail; fix the unit file")
            elif want_enabled is True and observed.unit_file_state == "":
                # A unit systemd made from the running system (a mount unit from the mount table,
                # a device, a scope) has no unit file to enable: UnitFileState is empty, and
                # `systemctl enable` refuses ("Unit file NAME does not exist").
                made = " (systemd made it from the mount table)" if name.endswith((".mount", ".swap")) else ""
                fix = ("add an /etc/fstab entry (systemd-fstab-generator makes a unit of it) or write a unit file"
                       if made else "write a unit file with an [Install] section")
                blocked.append(f"{name} has no unit file{made}, so it cannot be enabled (systemctl enable would "
                               f"fail: Unit file {name} does not exist); to have it at boot, {fix}")
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
        timeout = STOP_TIMEOUT if verb in ("start", "stop") else CALL_TIMEOUT
        return systemd.act(host, verb, action.target, timeout)

    def summary(self, resource: Resource, observed: UnitObserved) -> str:
        if not observed.exists:
            return "not found"
        return f"{observed.active_state}/{observed.sub_state}, {observed.unit_file_state or 'no unit file'}"
