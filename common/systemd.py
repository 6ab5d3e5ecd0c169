"""systemd, for every kind: what `systemctl show` and `systemctl list-units` say, parsed, the
UnitFileState/ActiveState words that matter to a declared unit, and the one place a kind asks
systemd about units (`show`) or acts on one (`act`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.contract import ApplyError, ObserveError, run_action
from ..core.host import CommandTimeout

if TYPE_CHECKING:
    from ..core.host import Host

PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "MainPID", "FragmentPath")
# UnitFileState values (systemctl is-enabled) that `enable`/`disable` cannot change:
# the unit has no [Install] section, or is pulled in by another unit, or is made at boot.
UNCHANGEABLE = {"static", "indirect", "generated", "transient", "alias"}
ENABLED = {"enabled", "enabled-runtime", "linked", "linked-runtime", "alias"}
MASKED = {"masked", "masked-runtime"}
# ActiveState values that mean "running, or about to be": activating covers SubState=auto-restart,
# a unit waiting out RestartSec= after its process died, which will come back by itself.
RUNNING = {"active", "reloading", "activating", "deactivating", "refreshing"}
LIST_UNITS = ("systemctl", "list-units", "--all", "--full", "--plain", "--no-legend", "--no-pager", "--")
# GetUnitFileState's answers for many names in one call, read from the disk now (ListUnitFiles-
# ByPatterns, install.c:unit_file_get_list), where `show` may repeat what the manager worked out
# when it loaded the unit. Lists only names with a file or link of their own (no instances of a
# template, no hidden names); a unit file systemd cannot read is listed "bad", never an error.
LIST_UNIT_FILES = ("systemctl", "list-unit-files", "--full", "--plain", "--no-legend", "--no-pager", "--")
IS_ENABLED = ("systemctl", "is-enabled", "--no-pager", "--")
# `enabled` of a unit masked on disk that systemd still holds loaded, not masked: the mask takes
# effect at the next daemon-reload (systemctl mask/unmask/enable/disable do one).
MASK_PENDING = "masked on disk, not yet in effect (daemon-reload pending)"
UNIT_PATH = ("systemctl", "show", "--no-pager", "-p", "UnitPath", "--value")
# list-units takes its arguments as fnmatch patterns: for a name with one of these in it, not
# being listed would not prove that systemd does not hold the unit.
GLOB_CHARS = frozenset("*?[\\")
# The "failed/not-found" marker column: hidden by --plain on systemd 252, shown by others.
LIST_MARKERS = ("●", "*")


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
    unit_id: str = ""  # the unit the name resolved to (show's Id; another name for an alias)
    unit_file_error: str = ""  # why the unit file is "bad", as `systemctl is-enabled` says

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
        if self.load_state == "masked":
            return "masked"
        if state in MASKED:
            # masked on disk; in force only once systemd loads the unit so (not in memory yet, or
            # after a daemon-reload): a unit it holds loaded can still be started.
            return "masked" if self.load_state in ("", "not-found") else MASK_PENDING
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
            unit_id=props.get("Id", ""),
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


def parse_list_unit_files(output: str) -> dict[str, str]:
    """`systemctl list-unit-files --plain --no-legend` rows: UNIT-FILE STATE [VENDOR-PRESET]."""
    rows = {}
    for line in output.splitlines():
        words = line.split()
        if len(words) >= 2:
            rows[words[0]] = words[1]
    return rows


def is_enabled_error(stderr: str) -> str:
    """The reason in `systemctl is-enabled`'s last error line (`Failed to get unit file state for
    NAME: REASON`, systemctl-is-enabled.c; `Failed to look up unit file state: REASON` from its
    SysV check): an strerror() text."""
    lines = stderr.strip().splitlines()
    return lines[-1].rsplit(": ", 1)[-1].strip() if lines else ""


# --- asking and acting: every kind reaches systemd through these two -----------------------

SHOW = ("systemctl", "show", "--no-pager", "-p", ",".join(PROPERTIES), "--")
# Verbs reconcile may ask of systemctl for a unit (systemctl(1)); anything else is a bug.
VERBS = ("start", "stop", "enable", "disable", "mask", "unmask")


def show(host: Host, names: Sequence[str], timeout: float) -> dict[str, UnitObserved]:
    """One `systemctl show` of NAMES, parsed; ObserveError (never "inactive") when systemd cannot
    be asked or does not answer. A name systemd cannot resolve ends a batched show: callers that
    declare many units each ask about them one by one then (units/__init__.py _show_all)."""
    try:
        res = host.run([*SHOW, *names], timeout=timeout)
    except CommandTimeout as exc:
        raise ObserveError(f"systemd did not answer ({exc})") from None
    if res.returncode == 127:
        raise ObserveError("systemctl is not installed")
    if not res.ok:
        raise ObserveError(f"cannot read unit state from systemd: {res.brief()}")
    return parse_show(res.stdout, names)


def act(host: Host, verb: str, unit: str, timeout: float) -> str:
    """`systemctl VERB -- UNIT`: its output on one line, or ApplyError (non-zero, or past the
    deadline). `start`/`stop` wait for the job, as systemctl does without --no-block."""
    if verb not in VERBS:
        raise ApplyError(f"unknown unit action {verb!r}")
    return run_action(host, ["systemctl", verb, "--", unit], timeout)


def reboot(host: Host, timeout: float) -> str:
    """`systemctl reboot`: the init system queues the reboot job and returns (systemctl(1): without
    --no-block it waits for the job to be queued, not done); the units are stopped in order, as at any
    shutdown. Its output on one line, or ApplyError (refused, or past the deadline)."""
    return run_action(host, ["systemctl", "reboot"], timeout)
