"""Renderers of one RunReport: a Terraform-plan-like text, the JSON contract, JUnit XML."""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any

from .. import FORMAT_VERSION, __version__
from .base import Result, Status, to_plain
from .engine import ResourceReport, RunReport

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
    }


def render_json(report: RunReport, out: IO[str]) -> None:
    json.dump(to_json(report), out, indent=2)
    out.write("\n")


# --- text ----------------------------------------------------------------------------

class Style:
    """ANSI colour only on a terminal, never with NO_COLOR set (https://no-color.org)."""

    CODES = {"green": "32", "yellow": "33", "red": "31", "cyan": "36", "bold": "1", "dim": "2"}

    def __init__(self, out: IO[str], force: bool | None = None):
        if force is not None:
            self.enabled = force
        else:
            self.enabled = bool(getattr(out, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles:
            return text
        return "".join(f"\033[{self.CODES[s]}m" for s in styles) + text + "\033[0m"


SIGILS = {
    Status.OK: ("✓", "green"),
    Status.DRIFT: ("~", "yellow"),
    Status.CONVERGING: ("»", "cyan"),
    Status.BLOCKED: ("!", "red"),
    Status.ERROR: ("✗", "red"),
}
RESULT_MARK = {Result.PLANNED: "→", Result.DONE: "✓", Result.FAILED: "✗", Result.SKIPPED: "-"}


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    return str(v)


def render_text(report: RunReport, out: IO[str], verbose: bool = False, style: Style | None = None) -> None:
    s = style or Style(out)
    title = f"reconcile {report.command}{' --dry-run' if report.dry_run else ''}: {report.state_file}"
    out.write(s(title, "bold") + f" on {report.host}\n")
    for note in report.notes:
        out.write(s(f"warning: {note}", "yellow") + "\n")
    out.write("\n")
    for rr in report.resources:
        sigil, colour = SIGILS[rr.status]
        head = f"  {s(sigil, colour)} {rr.resource.id}"
        if rr.status is Status.OK:
            detail = rr.summary if verbose else ""
            out.write(head + s(f"  ok{'  (' + detail + ')' if detail else ''}", "dim") + "\n")
            if rr.message and verbose:
                out.write(f"      {rr.message}\n")
            continue
        out.write(head + "  " + s(rr.status.value, colour) + "\n")
        width = max((len(d.field) for d in rr.drift), default=0)
        for d in rr.drift:
            out.write(f"      {d.field + ':':<{width + 1}} {_value(d.have)} -> {s(_value(d.want), 'bold')}\n")
        for a in rr.actions:
            mark = RESULT_MARK[a.result]
            text = a.action.description or f"{a.action.action} {a.action.target}"
            tail = f"  ({a.result.value}{': ' + a.message if a.message and a.result is not Result.DONE else ''})"
            colour_a = {"done": "green", "failed": "red", "skipped": "dim"}.get(a.result.value)
            out.write(f"      {s(mark, colour_a) if colour_a else mark} {text}"
                      + (s(tail, "dim") if a.result is not Result.PLANNED else "") + "\n")
        if rr.message:
            for line in rr.message.split("\n"):
                out.write(f"      {s(line, 'dim') if rr.status is not Status.ERROR else s(line, 'red')}\n")
    out.write("\n")
    counts = ", ".join(f"{report.count(st)} {st.value}" for st in Status if report.count(st))
    if report.command == "apply" and not report.dry_run:
        n = report.actions_done
        failed = sum(1 for r in report.resources for a in r.actions if a.result is Result.FAILED)
        if n == 0 and failed == 0:
            verdict = "No changes: nothing to do." if report.exit_code == 0 else "No actions taken."
        else:
            verdict = f"Applied {n} action{'s' if n != 1 else ''}" + (f", {failed} failed" if failed else "") + "."
        out.write(s(verdict, "bold") + f" {counts}.\n")
    else:
        planned = sum(1 for r in report.resources for a in r.actions if a.result is Result.PLANNED)
        if report.exit_code == 0:
            out.write(s("No drift: the host matches the state file.", "bold") + f" {counts}.\n")
        else:
            out.write(s(f"Plan: {planned} action{'s' if planned != 1 else ''} to take.", "bold") + f" {counts}.\n")


def render(report: RunReport, fmt: str, out: IO[str] | None = None, verbose: bool = False) -> None:
    out = out or sys.stdout
    if fmt == "json":
        render_json(report, out)
    elif fmt == "junit":
        from .junit import render_junit

        render_junit(report, out)
    else:
        render_text(report, out, verbose=verbose)
