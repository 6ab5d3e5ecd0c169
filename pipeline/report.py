"""The outcome of one run as plain data (RunReport, one ResourceReport per resource) and its
JSON form, the `format_version` contract every view, saved plan and remote run is built on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import FORMAT_VERSION, __version__
from ..core.contract import ActionResult, Drift, Resource, Result, Status, to_plain

if TYPE_CHECKING:
    from ..core.refusals import Refusal


@dataclass(frozen=True)
class ResourceReport:
    """One resource's outcome: its status, drift, actions and what was observed."""

    resource: Resource
    status: Status
    drift: tuple[Drift, ...] = ()
    actions: tuple[ActionResult, ...] = ()
    message: str = ""
    observed: Any = None
    summary: str = ""
    caveats: tuple[str, ...] = ()  # Plan.caveats

    @property
    def changed(self) -> bool:
        return any(a.result is Result.DONE for a in self.actions)


@dataclass(frozen=True)
class RunReport:
    """The outcome of one run (diff or apply) on one host, resource by resource."""

    command: str
    state_file: str
    host: str
    resources: tuple[ResourceReport, ...]
    host_pattern: str | None = None
    host_matches: bool = True
    dry_run: bool = False
    started: float = 0.0
    finished: float = 0.0
    notes: tuple[str, ...] = ()
    machine: dict[str, Any] | None = None  # machine_identity(): which machine answered

    def count(self, status: Status) -> int:
        return sum(1 for r in self.resources if r.status is status)

    @property
    def actions_done(self) -> int:
        return sum(1 for r in self.resources for a in r.actions if a.result is Result.DONE)

    @property
    def exit_code(self) -> int:
        """0 converged, 1 error, 2 drift remains (diff: any drift at all)."""
        statuses = {r.status for r in self.resources}
        if Status.ERROR in statuses:
            return 1
        settled = {Status.OK} if self.command == "diff" or self.dry_run else {Status.OK, Status.CONVERGING}
        return 0 if statuses <= settled else 2


STATUSES = [s.value for s in Status]


# --- JSON ----------------------------------------------------------------------------

def resource_json(rr: ResourceReport) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rr.resource.id,
        "kind": rr.resource.kind,
        "status": rr.status.value,
        "drift": [d.to_json() for d in rr.drift],
        "actions": [
            {**a.action.to_json(), "result": a.result.value, **({"message": a.message} if a.message else {})}
            for a in rr.actions
        ],
        "message": rr.message,
    }
    if rr.summary:
        out["summary"] = rr.summary
    if rr.caveats:
        out["caveats"] = list(rr.caveats)
    if rr.resource.needs:
        out["needs"] = list(rr.resource.needs)
    if rr.observed is not None:
        out["observed"] = to_plain(rr.observed)
    return out


def to_json(report: RunReport) -> dict[str, Any]:
    summary: dict[str, int] = {s: report.count(Status(s)) for s in STATUSES}
    summary["actions_planned"] = sum(1 for r in report.resources for a in r.actions if a.result is Result.PLANNED)
    summary["actions_done"] = report.actions_done
    summary["actions_failed"] = sum(1 for r in report.resources for a in r.actions if a.result is Result.FAILED)
    return {
        "format_version": FORMAT_VERSION,
        "reconcile_version": __version__,
        "command": report.command,
        "dry_run": report.dry_run,
        "state_file": report.state_file,
        "host": report.host,
        "host_pattern": report.host_pattern,
        "host_matches": report.host_matches,
        "started": report.started,
        "duration_s": round(report.finished - report.started, 3),
        "exit_code": report.exit_code,
        "resources": [resource_json(r) for r in report.resources],
        "summary": summary,
        "notes": list(report.notes),
        **({"machine": report.machine} if report.machine else {}),
    }


def drifted_count(doc: dict[str, Any]) -> int:
    """Resources of a report's JSON form with some drift (the inventory's DRIFT column)."""
    return sum(1 for r in doc["resources"] if r["drift"])


def action_count(doc: dict[str, Any]) -> int:
    """A report's actions: those carried out (done or failed) by an apply, else those planned."""
    s = doc["summary"]
    applied = doc["command"] == "apply" and not doc.get("dry_run")
    return s.get("actions_done", 0) + s.get("actions_failed", 0) if applied else s.get("actions_planned", 0)


def refusal_doc(refusal: Refusal, command: str, state_file: str, dry_run: bool = False,
                host: str | None = None) -> dict[str, Any]:
    """A Refusal (pipeline/runs.py) as the error report every format renders: with `problems`
    for a state file that does not validate, else `error` {reason, message}."""
    if refusal.problems:
        doc = error_report(command, state_file, list(refusal.problems), dry_run=dry_run, host=host)
    else:
        doc = refusal_report(command, state_file, refusal.reason, refusal.message, dry_run=dry_run, host=host,
                             machine=refusal.machine)
    return doc


def parse_problem(problem: str, label: str) -> dict[str, Any]:
    """`FILE:LINE:COL: message` -> {"file", "line", "column", "message", "text"}."""
    import re

    rest = problem[len(label) + 1:] if problem.startswith(label + ":") else None
    m = re.match(r"(\d+):(\d+): (.*)", rest or "", re.S)
    if rest is None or not m:
        m2 = re.match(r"(.*?):(\d+):(\d+): (.*)", problem, re.S)
        if not m2:
            return {"file": label, "line": 1, "column": 1, "message": problem, "text": problem}
        return {"file": m2.group(1), "line": int(m2.group(2)), "column": int(m2.group(3)),
                "message": m2.group(4), "text": problem}
    return {"file": label, "line": int(m.group(1)), "column": int(m.group(2)), "message": m.group(3),
            "text": problem}


def error_report(command: str, state_file: str, problems: list[str], dry_run: bool = False,
                 host: str | None = None) -> dict[str, Any]:
    """The JSON report of a run that could not start because its input is bad: no resources,
    exit_code 1, and `problems`, each with its position (report.schema.json). Consumers that only
    read `exit_code`, `resources` and `summary` see an error with nothing observed."""
    doc = refusal_report(command, state_file, "state-file", problems[0] if problems else "invalid state file",
                         dry_run=dry_run, host=host)
    doc["notes"] = [f"{state_file} is not a valid state file: nothing was observed or changed"]
    doc["problems"] = [parse_problem(p, state_file) for p in problems]
    return doc


def refusal_report(command: str, state_file: str, reason: str, message: str, dry_run: bool = False,
                   host: str | None = None, machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON report of a run that was refused or could not reach its host (the lock is held,
    another machine, unreachable): no resources, exit_code 1, and `error` {reason, message}, the
    message being the one line also printed on stderr (report.schema.json)."""
    import os
    import time

    now = time.time()
    doc = {
        "format_version": FORMAT_VERSION,
        "reconcile_version": __version__,
        "command": command,
        "dry_run": dry_run,
        "state_file": state_file,
        "host": host or os.uname().nodename,
        "host_pattern": None,
        "host_matches": True,
        "started": now,
        "duration_s": 0.0,
        "exit_code": 1,
        "resources": [],
        "summary": {**{s: 0 for s in STATUSES}, "actions_planned": 0, "actions_done": 0, "actions_failed": 0},
        "notes": [message],
        "error": {"reason": reason, "message": message},
    }
    if machine:
        doc["machine"] = machine
    return doc
