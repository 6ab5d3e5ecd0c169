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
   pass over the manager's unit search path (`UnitPath`) and the units' `[Install]` sections,
   following systemd's install logic for the plain cases only (`UnitFiles`).
3. One `systemctl show` of only the units these cannot settle for sure (instances, aliases,
   linked, generated or transient units, units without a unit file or not found, drop-ins with
   an `[Install]` section, ...) and of every unit that drifts, so a plan is always made from
   systemd's own word (FragmentPath for the mask refusal, MainPID).

A manager that cannot be reached is an error, never "inactive" (testinfra's `is_running` reads a
broken host as passing). Units are stopped through systemd, never by killing their processes: a
`Restart=always` unit would respawn.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Action, ApplyError, Context, Drift, ObserveError, Plan, Reconciler, Resource, run_action
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

LIST_UNITS = ("systemctl", "list-units", "--all", "--full", "--plain", "--no-legend", "--no-pager", "--")
UNIT_PATH = ("systemctl", "show", "--no-pager", "-p", "UnitPath", "--value")
# list-units takes its arguments as fnmatch patterns: for a name with one of these in it, not
# being listed would not prove that systemd does not hold the unit.
GLOB_CHARS = frozenset("*?[\\")
# The "failed/not-found" marker column: hidden by --plain on systemd 252, shown by others.
LIST_MARKERS = ("●", "*")
# Where a unit file's state depends only on its [Install] section and on links to it. Units in
# the control, attached, transient and generator directories are left to systemd.
INSTALL_DIRS = frozenset({"/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                          "/usr/lib/systemd/system", "/lib/systemd/system"})
# systemd reports "enabled" as soon as this directory holds a NAME link in a *.wants or
# *.requires directory (its `persistent_config`), whatever other links there are.
PERSISTENT_CONFIG = "/etc/systemd/system"


@dataclass(frozen=True)
class UnitObserved:
    """What `systemctl show` reports, or would report, about a unit.

    A unit observed without `show` (one that does not drift; see the module docstring) has
    main_pid 0 (not read), fragment_path the unit file found in the search path, and, when
    systemd does not hold it in memory, load_state "loaded" (or "masked") with inactive/dead:
    what `show` says after loading it (it would say "bad-setting" for a unit file it cannot
    use; `exists`, `active` and `enabled` are the same either way)."""

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


def parse_list_units(output: str) -> dict[str, tuple[str, str, str]]:
    """`systemctl list-units --plain --no-legend` rows by unit name: (LOAD, ACTIVE, SUB).
    Columns: [marker] UNIT LOAD ACTIVE SUB [JOB] DESCRIPTION. Unit names and states hold no
    spaces, so the first four words are unambiguous; a JOB column (shown while any listed unit
    has a job) and a description with spaces come after them."""
    rows = {}
    for line in output.splitlines():
        words = line.split()
        if words and words[0] in LIST_MARKERS:
            words = words[1:]
        if not words:
            continue
        if len(words) < 4:
            raise ObserveError(f"unexpected line from systemctl list-units: {line.strip()!r}")
        rows[words[0]] = (words[1], words[2], words[3])
    return rows


def parse_install(text: str) -> tuple[bool, bool] | None:
    """(has rules, has Also=) of a unit file's [Install] section, as systemd's install logic reads
    it: WantedBy=/RequiredBy=/Alias= make a unit "disabled" rather than "static", Also= alone
    makes it "indirect". An empty assignment resets the list. None where this simple reading might
    differ from systemd's (continuation lines in [Install], specifiers, quotes, .include,
    UpheldBy=, which older systemd ignores): the caller then asks systemd."""
    keys = {"WantedBy": [], "RequiredBy": [], "Alias": [], "Also": []}
    section = None
    continued = False
    for raw in text.splitlines():
        line = raw.strip()
        if continued:
            # Part of the previous line (an ExecStart= spread over lines, say): it cannot start a
            # section. A comment line in between is where versions of systemd differ.
            if section == "Install" or line.startswith(("[", "#", ";")):
                return None
            continued = line.endswith("\\")
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            if section == "Install" or line.startswith("["):
                return None
            continued = True
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                return None
            section = line[1:-1]
            continue
        if line.startswith(".include"):
            return None
        if section != "Install":
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key == "UpheldBy" or (key in keys and any(c in value for c in "%\"'\\")):
            return None
        if key in keys:
            keys[key] = keys[key] + value.split() if value else []
    has_rules = bool(keys["WantedBy"] or keys["RequiredBy"] or keys["Alias"])
    return has_rules, bool(keys["Also"])


def has_install_section(text: str) -> bool:
    """Whether a drop-in may change the [Install] section (systemd 252 reads drop-ins' too)."""
    return any(line.strip().startswith("[Install") for line in text.splitlines())


class UnitFiles:
    """The unit search path read once: the first file or link of each name (the one systemd
    uses), every symlink (a link to a unit is what makes it enabled, indirect or linked), and
    the drop-in directories. `state(name)` is the UnitFileState systemd would report, for the
    plain cases only (systemd 252's unit_file_lookup_state, checked against it in tests):

    - the first entry of the name is a link to /dev/null: masked (masked-runtime under /run);
    - else it must be a non-empty regular file in one of INSTALL_DIRS, then
      - a NAME link to NAME in /etc/systemd/system/*.wants/ or *.requires/: enabled;
      - no symlink anywhere named NAME or pointing to NAME (directly or through an alias
        link): disabled, indirect or static, by its [Install] section.

    Everything else is None, for systemd to answer: aliases, linked units, links in /run or in
    vendor directories, drop-ins with an [Install] section, an [Install] section read as
    `parse_install` cannot be sure of. Costs one readlink per symlink and one read per declared
    unit file, where systemd scans every directory again for each unit. `root` is prepended to
    every path read (tests), never to the paths reported."""

    def __init__(self, search_path: Sequence[str], read_text: Callable[[str], str] | None = None, root: str = ""):
        self.read_text = read_text or _read_text
        self.root = root
        # name -> (path, link target; None for a regular file, "" for neither)
        self.first: dict[str, tuple[str, str | None]] = {}
        self.links: list[tuple[str, str]] = []  # (link name, target) of every symlink
        self.aliases: dict[str, set[str]] = {}  # top-level link name -> names of what it points to
        self.enabled: set[str] = set()  # names linked from /etc/systemd/system/*.wants|*.requires
        self.dropin_dirs: dict[str, list[str]] = {}  # "NAME.d" -> its paths
        self._referenced: set[str] | None = None
        for top in search_path:
            self._scan_top(top.rstrip("/") or "/")

    def _scan_top(self, top: str) -> None:
        try:
            entries = list(os.scandir(self.root + top))
        except FileNotFoundError:
            return
        for e in entries:
            path = f"{top}/{e.name}"
            if e.name.endswith(".d"):
                self.dropin_dirs.setdefault(e.name, []).append(path)
            if e.is_symlink():
                target = os.readlink(e.path)
                self.links.append((e.name, target))
                self.aliases.setdefault(e.name, set()).add(os.path.basename(target))
                self.first.setdefault(e.name, (path, target))
            elif e.is_dir(follow_symlinks=False):
                wants = top == PERSISTENT_CONFIG and e.name.endswith((".wants", ".requires"))
                self._scan_links(e.path, wants)
            else:
                # A regular file; anything else (a FIFO, say) is not read here: state() defers.
                self.first.setdefault(e.name, (path, None if e.is_file(follow_symlinks=False) else ""))

    def _scan_links(self, path: str, wants: bool, depth: int = 1) -> None:
        # Every symlink below the top level, not just in *.wants: more links than systemd looks at
        # only means more units left to systemd, never a wrong state.
        for e in os.scandir(path):
            if e.is_symlink():
                target = os.readlink(e.path)
                self.links.append((e.name, target))
                if wants and os.path.basename(target) == e.name:
                    self.enabled.add(e.name)
            elif e.is_dir(follow_symlinks=False) and depth < 8:
                self._scan_links(e.path, False, depth + 1)

    def referenced(self) -> set[str]:
        """Names some symlink has or points to, through chains of alias links."""
        if self._referenced is None:
            seen: set[str] = set()
            for name, target in self.links:
                seen.add(name)
                todo = [os.path.basename(target)]
                while todo:
                    n = todo.pop()
                    if n not in seen:
                        seen.add(n)
                        todo.extend(self.aliases.get(n, ()))
            self._referenced = seen
        return self._referenced

    def state(self, name: str) -> tuple[str, str] | None:
        """(UnitFileState, unit file path) where it is certain; None: ask systemd."""
        entry = self.first.get(name)
        if entry is None:
            return None  # no unit file: not found, or a unit made without one (device, mount, scope)
        path, target = entry
        if target is not None:
            if target == "/dev/null":
                return ("masked-runtime" if path.startswith("/run/") else "masked"), path
            return None  # an alias, a linked unit file, not a file at all
        if os.path.dirname(path) not in INSTALL_DIRS:
            return None
        try:
            text = self.read_text(self.root + path)
        except (OSError, UnicodeDecodeError):
            return None
        rules = parse_install(text) if text else None  # an empty unit file masks the unit
        if rules is None or self._dropins_touch_install(name):
            return None
        if name in self.enabled:
            return "enabled", path
        if name in self.referenced():
            return None
        has_rules, has_also = rules
        return ("disabled" if has_rules else "indirect" if has_also else "static"), path

    def _dropins_touch_install(self, name: str) -> bool:
        stem, _, suffix = name.rpartition(".")
        dirs = [f"{name}.d", f"{suffix}.d"]  # the unit's own, and those for every unit of its type
        parts = stem.split("-")
        dirs += [f"{'-'.join(parts[:i])}-.{suffix}.d" for i in range(1, len(parts))]  # foo-.service.d
        for d in dirs:
            for path in self.dropin_dirs.get(d, ()):
                try:
                    for conf in os.scandir(self.root + path):
                        if has_install_section(self.read_text(conf.path)):
                            return True
                except (OSError, UnicodeDecodeError):
                    return True
        return False


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        return fh.read()


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
        out: dict[str, Any] = {}
        todo = []
        for r in resources:
            if r.name.rpartition(".")[0].endswith("@"):
                out[r.id] = ObserveError(f"{r.name} is a template: systemd has a state only for its instances "
                                         f"(NAME@INSTANCE.service)")
            else:
                todo.append(r)
        if not todo:
            return out
        if len(todo) == 1:
            # One unit: a single `show` (~13 ms) costs less than the listings it would replace, and
            # the seed's one unit usually drifts, which would mean a `show` after them anyway.
            shown = self._show(host, [todo[0].name])
            out[todo[0].id] = shown[todo[0].name]
            return out
        listed, files = self._listings(host, [r.name for r in todo])
        by_name: dict[str, UnitObserved] = {}
        ask = []
        for r in todo:
            seen = self._from_listings(r.name, listed.get(r.name), files)
            # A drifting unit is planned from systemd's own word (and needs its FragmentPath).
            if seen is None or self.diff(r, seen):
                ask.append(r.name)
            else:
                by_name[r.name] = seen
        if ask:
            by_name.update(self._show(host, ask))
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
                    found["files"] = UnitFiles(res.stdout.split(), host.read_text)
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

    @staticmethod
    def _show(host: Host, names: list[str]) -> dict[str, UnitObserved]:
        try:
            res = host.run(["systemctl", "show", "--no-pager", "-p", ",".join(PROPERTIES), "--", *names],
                           timeout=CALL_TIMEOUT)
        except CommandTimeout as exc:
            raise ObserveError(str(exc)) from None
        if not res.ok:
            raise ObserveError(f"cannot read unit state from systemd: {res.brief()}")
        return parse_show(res.stdout, names)

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
        return run_action(host, ["systemctl", verb, "--", action.target], timeout)

    def summary(self, resource: Resource, observed: UnitObserved) -> str:
        if not observed.exists:
            return "not found"
        return f"{observed.active_state}/{observed.sub_state}, {observed.unit_file_state or 'no unit file'}"
