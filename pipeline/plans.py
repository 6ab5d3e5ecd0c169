"""Saved plans, as Terraform has them: `reconcile diff --out plan.json`, then `reconcile apply plan.json`.

A plan file is the JSON report of the diff plus what is needed to tell, at apply time,
whether it still describes the host:

  plan_format     "1"; a plan file is told from a state file by this key
  state_file      the absolute path and sha256 of the state file the plan was made from
  host            the host name the plan was observed on
  fingerprints    per resource id, sha256 of what the plan decided about it (see `fingerprint`)
  report          the diff's JSON report (format_version "1"), the planned actions included

The fingerprint rule: a resource's fingerprint is the hash of its status, its drift (field,
want, have) and its planned actions (verb, target, params; not the human description). So
"the fingerprints match" means "the plan computed now is the saved plan". Any observed
change that does not change the plan (a PID of an ok unit, a timestamp) is ignored by
construction; any change that does (the unit was stopped meanwhile, a different process
holds the GPU) refuses the plan. Drift values that move by themselves (GPU memory in use,
free space, a progress counter) would make every plan stale within seconds: a reconciler
names those drift fields in `volatile_drift`, and only their field and want are hashed.

Apply re-reads the state file named in the plan (refused if its bytes changed), takes the
lock, observes, compares the fingerprints (refused, exit 1, naming each resource that
changed and how), then runs the ordinary engine limited to the saved actions: anything the
engine would plan beyond them (a step revealed only after the first, a new process) is
reported as skipped, never carried out.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.refusals import Refusal
    from .report import RunReport

from .. import FORMAT_VERSION, __version__
from ..core.contract import utc_iso
from ..core.values import format_value

PLAN_FORMAT = "1"
_SNIFF_BYTES = 4096
MAX_PLAN_BYTES = 64 * 2**20  # a plan of 10,000 resources is a few MiB
_STATUSES = ("ok", "drift", "converging", "blocked", "error")


class PlanError(Exception):
    """A saved plan that cannot be read or does not match itself; the message says why (first
    line) and what is wrong. `reason`: its refusal's (core/refusals.py)."""

    def __init__(self, message: str, reason: str = "plan-invalid"):
        super().__init__(message)
        self.reason = reason


# --- fingerprints ----------------------------------------------------------------------

def _volatile(kind: str) -> tuple[str, ...]:
    from ..reconcilers import key_of, reconciler_class

    key = key_of(kind)
    if key is None:
        return ()
    return tuple(getattr(reconciler_class(key), "volatile_drift", ()))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def decision(res: Mapping[str, Any], volatile: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What the plan decided about one resource (from its JSON report entry): the hashed content."""
    if volatile is None:
        volatile = _volatile(res["kind"])
    drift = []
    for d in res.get("drift", []):
        moving = any(fnmatch.fnmatchcase(d["field"], p) for p in volatile)
        drift.append({"field": d["field"], "want": d["want"], "have": None if moving else d["have"],
                      **({"volatile": True} if moving else {})})
    actions = [{"action": a["action"], "target": a["target"], "params": a.get("params", {})}
               for a in res.get("actions", [])]
    return {"id": res["id"], "status": res["status"], "drift": drift, "actions": actions}


def fingerprint(res: Mapping[str, Any], volatile: tuple[str, ...] | None = None) -> str:
    return hashlib.sha256(_canonical(decision(res, volatile)).encode()).hexdigest()


def fingerprints(doc: Mapping[str, Any]) -> dict[str, str]:
    cache: dict[str, tuple[str, ...]] = {}
    out = {}
    for res in doc["resources"]:
        if res["kind"] not in cache:
            cache[res["kind"]] = _volatile(res["kind"])
        out[res["id"]] = fingerprint(res, cache[res["kind"]])
    return out


def file_sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --- writing and reading -----------------------------------------------------------------


def make_plan(doc: dict[str, Any], state_path: str, created: float | None = None) -> dict[str, Any]:
    return {
        "plan_format": PLAN_FORMAT,
        "format_version": FORMAT_VERSION,
        "reconcile_version": __version__,
        "created": utc_iso(created),
        "host": doc["host"],
        "state_file": {"path": str(Path(state_path).resolve()), "sha256": file_sha256(state_path)},
        "fingerprints": fingerprints(doc),
        "report": doc,
    }


def write_plan(doc: dict[str, Any], state_path: str, out: str | os.PathLike) -> dict[str, Any]:
    """Write the plan atomically (a half-written plan must never be applied)."""
    from ..core.atomic import write_json

    plan = make_plan(doc, state_path)
    write_json(out, plan, indent=2)
    return plan


def is_saved_plan(path: str | os.PathLike) -> bool:
    """A JSON object with a plan_format key; a state file (YAML, or JSON with `version`) is not.
    Only the first bytes are read: a JSON object that mentions "plan_format" there is taken for a
    plan, and load_plan says what is wrong with it."""
    from .statefile.text import read_regular

    try:  # a FIFO or a device is no plan (and is not opened): the state file's loader refuses it
        head = read_regular(os.fspath(path), _SNIFF_BYTES)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and b'"plan_format"' in head


def load_plan(path: str | os.PathLike) -> dict[str, Any]:
    """The saved plan, checked whole before anything is done: its shape, and that it matches itself
    (check_plan). PlanError otherwise."""
    from .statefile.text import NotRegularFile, UntrustedFile, read_regular

    try:
        raw = read_regular(os.fspath(path), MAX_PLAN_BYTES + 1, trusted=True)
        if len(raw) > MAX_PLAN_BYTES:
            raise PlanError(f"refusing the saved plan {path}: larger than {MAX_PLAN_BYTES // 2**20} MiB")
        plan = json.loads(raw)
    except NotRegularFile as exc:
        raise PlanError(f"refusing the saved plan {path}: it is {exc.what}, not a regular file") from None
    except UntrustedFile as exc:
        raise PlanError(f"refusing the saved plan {path}: {exc.what}: reconcile applies no plan another user "
                        "can change") from None
    except OSError as exc:
        raise PlanError(f"cannot read the saved plan {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise PlanError(f"cannot read the saved plan {path}: not JSON ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(plan, dict):
        raise PlanError(f"refusing the saved plan {path}: not a JSON object")
    if plan.get("plan_format") != PLAN_FORMAT:
        shown = plan.get("plan_format")
        shown = shown if isinstance(shown, (str, int, float, bool, type(None))) else type(shown).__name__
        raise PlanError(f"{path}: plan format {shown!r} is not one this reconcile reads "
                        f"({PLAN_FORMAT!r}); make the plan again with this version")
    for key in ("state_file", "host", "fingerprints", "report"):
        if key not in plan:
            raise PlanError(f"{path}: not a complete saved plan (no {key!r})")
    problems = check_plan(plan)
    if problems:
        raise PlanError(f"refusing the saved plan {path}: it does not match itself (edited or damaged?); "
                        f"make it again with `reconcile diff --out {path}`\n" + "\n".join(f"  {p}" for p in problems))
    return plan


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def check_plan(plan: Mapping[str, Any], limit: int = 10) -> list[str]:
    """What is wrong with a plan's shape, and where its actions and drift do not match its own
    fingerprints (each resource's is the hash of its decision), its ids or its summary: a plan
    whose actions were edited, retargeted, added, reordered or given another verb is refused whole."""
    problems: list[str] = []
    sf = plan.get("state_file")
    if not (isinstance(sf, dict) and _is_str(sf.get("path")) and _is_str(sf.get("sha256"))):
        problems.append("state_file: expected {path, sha256} strings")
    if not _is_str(plan.get("host")):
        problems.append("host: expected a string")
    fps = plan.get("fingerprints")
    if not (isinstance(fps, dict) and all(_is_str(v) for v in fps.values())):
        problems.append("fingerprints: expected a mapping of resource id to sha256")
        fps = {}
    report = plan.get("report")
    resources = report.get("resources") if isinstance(report, dict) else None
    if not isinstance(resources, list):
        return problems + ["report.resources: expected a list"]
    seen: set[str] = set()
    planned = 0
    for i, res in enumerate(resources):
        where = f"report.resources[{i}]"
        shape = _resource_shape(res)
        if shape:
            problems.append(f"{where}: {shape}")
            continue
        rid = res["id"]
        if rid in seen:
            problems.append(f"{where}: {rid} appears twice")
        seen.add(rid)
        planned += sum(1 for a in res.get("actions", []) if a.get("result") == "planned")
        if any(a.get("result") != "planned" for a in res.get("actions", [])):
            problems.append(f"{rid}: an action of a saved plan is 'planned', not carried out")
        if fps.get(rid) != fingerprint(res):
            problems.append(f"{rid}: its status, drift or actions do not match its fingerprint")
    for rid in set(fps) - seen:
        problems.append(f"{rid}: has a fingerprint but is not in the report")
    summary = report.get("summary") if isinstance(report, dict) else None
    if not (isinstance(summary, dict) and summary.get("actions_planned") == planned):
        problems.append(f"report.summary.actions_planned: expected {planned}, the planned actions listed")
    more = len(problems) - limit
    return problems[:limit] + ([f"(+{more} more)"] if more > 0 else [])


def _resource_shape(res: Any) -> str:
    if not isinstance(res, dict):
        return "expected a mapping"
    if not (_is_str(res.get("id")) and _is_str(res.get("kind"))):
        return "expected id and kind strings"
    if res.get("status") not in _STATUSES:
        return f"status: expected one of {', '.join(_STATUSES)}"
    drift, actions = res.get("drift", []), res.get("actions", [])
    if not (isinstance(drift, list) and all(isinstance(d, dict) and _is_str(d.get("field")) and "want" in d
                                             and "have" in d for d in drift)):
        return "drift: expected a list of {field, want, have}"
    if not (isinstance(actions, list) and all(isinstance(a, dict) and _is_str(a.get("action"))
                                               and _is_str(a.get("target")) and isinstance(a.get("params", {}), dict)
                                               for a in actions)):
        return "actions: expected a list of {action, target, params}"
    if "message" in res and not _is_str(res["message"]):
        return "message: expected a string"
    return ""


# --- comparing -------------------------------------------------------------------------

def _describe(res: Mapping[str, Any] | None) -> str:
    if res is None:
        return "not declared"
    parts = [res["status"]]
    if res.get("drift"):
        parts.append(", ".join(f"{d['field']}: {format_value(d['have'])} -> {format_value(d['want'])}"
                               for d in res["drift"]))
    acts = [f"{a['action']} {a['target']}" for a in res.get("actions", [])]
    parts.append("actions: " + (", ".join(acts) if acts else "none"))
    if res["status"] == "error" and res.get("message"):
        parts.append(res["message"].split("\n", 1)[0])
    return "; ".join(parts)


def changes(plan: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """One line per resource whose plan differs now from the saved one; empty when the plan holds."""
    saved = {r["id"]: r for r in plan["report"]["resources"]}
    current = {r["id"]: r for r in now["resources"]}
    now_fp = fingerprints(now)
    lines = []
    for rid in list(saved) + [i for i in current if i not in saved]:
        if plan["fingerprints"].get(rid) == now_fp.get(rid):
            continue
        lines.append(f"{rid}: planned {_describe(saved.get(rid))}; now {_describe(current.get(rid))}")
        before, after = (saved.get(rid) or {}).get("observed"), (current.get(rid) or {}).get("observed")
        if before is not None and after is not None:
            seen = observed_changes(before, after)
            if seen:
                lines.append(f"  observed since the plan: {seen}")
    return lines


def observed_changes(before: Any, after: Any, limit: int = 8) -> str:
    """What changed in a resource's observation between the plan and now, field by field,
    e.g. "active_state: active -> inactive". deepdiff is imported only here, when a plan is
    refused (it costs ~80 ms to import)."""
    from deepdiff import DeepDiff

    diff = DeepDiff(before, after, verbose_level=2)
    parts = []
    for kind in ("values_changed", "type_changes"):
        for path, change in diff.get(kind, {}).items():
            parts.append(f"{_field(path)}: {format_value(change['old_value'])} -> {format_value(change['new_value'])}")
    for kind, verb in (("dictionary_item_added", "added"), ("dictionary_item_removed", "removed"),
                       ("iterable_item_added", "added"), ("iterable_item_removed", "removed")):
        for path in diff.get(kind, {}):
            parts.append(f"{_field(path)} {verb}")
    more = len(parts) - limit
    return ", ".join(parts[:limit]) + (f" (+{more} more)" if more > 0 else "")


def _field(path: str) -> str:
    """DeepDiff's "root['gpus'][3]['memory_used']" -> "gpus[3].memory_used"."""
    import re

    out = re.sub(r"\['([^']*)'\]", r".\1", path.removeprefix("root")).lstrip(".")
    return out or "(the whole observation)"


def allowed_actions(plan: Mapping[str, Any]) -> dict[str, set[tuple[str, str]]]:
    return {r["id"]: {(a["action"], a["target"]) for a in r.get("actions", [])} for r in plan["report"]["resources"]}


# --- applying ----------------------------------------------------------------------------

def apply_saved_plan(path: str, *, dry_run: bool = False, journal_path: str | None = None,
                     lock_wait: float = 0.0) -> RunReport | Refusal:
    """Check the plan still holds, then carry out its actions and nothing else, through
    pipeline/runs.py (which takes the lock, and looks at the host under it before acting).
    Returns the run's report, or the Refusal (exit 1) when the plan is refused: plan-invalid (it
    cannot be read, or does not match itself), plan-stale (the state file or the host changed
    since), host-mismatch / machine-mismatch (made on another machine), state-file, lock-held,
    journal."""
    from ..core.refusals import Refusal
    from ..local.host import LocalHost
    from . import runs
    from .journal import Journal
    from .report import to_json
    from .statefile import StateFileError, load

    try:
        plan = load_plan(path)  # checked whole, against itself, before anything is done
    except PlanError as exc:
        return Refusal(exc.reason, str(exc))
    state_path = plan["state_file"]["path"]
    made = f"made {plan.get('created', '?')}"
    try:
        sha = file_sha256(state_path)
    except OSError as exc:
        return Refusal("plan-stale", f"refusing the saved plan {path}: its state file {state_path} cannot be read "
                                     f"({exc.strerror})")
    if sha != plan["state_file"]["sha256"]:
        return Refusal("plan-stale", f"refusing the saved plan {path} ({made}): the state file {state_path} "
                                     f"changed since; run `reconcile diff --out {path}` again")
    try:
        state = load(state_path)
    except StateFileError as exc:
        return Refusal("state-file", "\n".join(exc.problems), problems=tuple(exc.problems))
    host = LocalHost()
    hostname = host.hostname()
    if hostname != plan["host"]:
        return Refusal("host-mismatch", f"refusing the saved plan {path}: it was made on {plan['host']!r}, "
                                        f"this host is {hostname!r}")

    def holds(now: RunReport) -> Refusal | None:
        """None when the host, as observed now, is still the one the plan was made on and for."""
        made_on = ((plan.get("report") or {}).get("machine") or {}).get("machine_id")
        here = (now.machine or {}).get("machine_id")
        if made_on and here != made_on:  # same hostname, another machine (a recreated VM)
            return Refusal("machine-mismatch", f"refusing the saved plan {path}: it was made on machine-id "
                                               f"{made_on}, this machine has {here or 'no readable /etc/machine-id'}",
                           now.machine)
        changed = changes(plan, to_json(now))
        if changed:
            return Refusal("plan-stale", f"refusing the saved plan {path} ({made}): the host no longer matches "
                                         f"it; run `reconcile diff --out {path}` again\n"
                                         + "\n".join(f"  {c}" for c in changed), now.machine)
        return None

    if dry_run:
        now = runs.diff(state, host, command="apply")
        return now if isinstance(now, Refusal) else holds(now) or now
    return runs.apply(state, host, Journal.at(journal_path), lock_wait, only=allowed_actions(plan), before=holds)
