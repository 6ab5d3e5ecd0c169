"""The text view: a Terraform-plan-like report, coloured only on a terminal."""

from __future__ import annotations

import os
from typing import IO, Any

from ..core.values import format_value
from ..pipeline.report import STATUSES


def colour_wanted(out: IO[str]) -> bool:
    """Colour on a terminal, unless NO_COLOR is set to anything but the empty string (no-color.org:
    "when present and not an empty string") or the terminal is TERM=dumb (terminfo's `dumb` has
    no escape sequences; clig.dev: "disable color if TERM=dumb")."""
    try:
        tty = bool(out.isatty())
    except (AttributeError, ValueError):
        tty = False
    return tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class Style:
    """ANSI colour only where colour_wanted says so."""

    CODES = {"green": "32", "yellow": "33", "red": "31", "cyan": "36", "bold": "1", "dim": "2"}

    def __init__(self, out: IO[str], force: bool | None = None):
        self.enabled = colour_wanted(out) if force is None else force

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles:
            return text
        return "".join(f"\033[{self.CODES[s]}m" for s in styles) + text + "\033[0m"


SIGILS = {
    "ok": ("✓", "green"),
    "drift": ("~", "yellow"),
    "converging": ("»", "cyan"),
    "blocked": ("!", "red"),
    "error": ("✗", "red"),
}
RESULT_MARK = {"planned": "→", "done": "✓", "failed": "✗", "skipped": "-"}
RESULT_COLOUR = {"done": "green", "failed": "red", "skipped": "dim"}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def render_text(doc: dict[str, Any], out: IO[str], verbose: bool = False, style: Style | None = None) -> None:
    """Text view of the JSON report, so a report from a remote host renders exactly like a local one."""
    s = style or Style(out)
    title = f"reconcile {doc['command']}{' --dry-run' if doc.get('dry_run') else ''}: {doc['state_file']}"
    out.write(s(title, "bold") + f" on {doc['host']}\n")
    machine = doc.get("machine") or {}
    ids = [f"{label} {machine[key]}" for key, label in (("machine_id", "machine-id"), ("boot_id", "boot"),
                                                         ("ssh_host_key", "host key")) if machine.get(key)]
    if ids:  # which machine answered: a recreated VM or a reused address shows here first
        out.write(s("  " + ", ".join(ids), "dim") + "\n")
    for note in doc.get("notes", []):
        out.write(s(f"warning: {note}", "yellow") + "\n")
    out.write("\n")
    for res in doc["resources"]:
        status = res["status"]
        sigil, colour = SIGILS[status]
        head = f"  {s(sigil, colour)} {res['id']}"
        if status == "ok" and not res["actions"]:
            detail = res.get("summary", "") if verbose else ""
            out.write(head + s(f"  ok{'  (' + detail + ')' if detail else ''}", "dim") + "\n")
            for note in res.get("caveats", ()):
                out.write(f"      {s('note: ' + note, 'yellow')}\n")
            if res["message"] and verbose:
                out.write(f"      {res['message']}\n")
            continue
        out.write(head + "  " + s(status, colour) + "\n")
        width = max((len(d["field"]) for d in res["drift"]), default=0)
        for d in res["drift"]:
            have, want = format_value(d["have"]), s(format_value(d["want"]), "bold")
            out.write(f"      {d['field'] + ':':<{width + 1}} {have} -> {want}\n")
        for a in res["actions"]:
            result = a["result"]
            text = a.get("description") or f"{a['action']} {a['target']}"
            line = f"      {s(RESULT_MARK[result], RESULT_COLOUR.get(result, ''))} {text}"
            if result != "planned":
                why = f": {a['message']}" if a.get("message") and result != "done" else ""
                line += s(f"  ({result}{why})", "dim")
            out.write(line + "\n")
        for line in res["message"].split("\n") if res["message"] else ():
            out.write(f"      {s(line, 'red' if status == 'error' else 'dim')}\n")
        for note in res.get("caveats", ()):
            out.write(f"      {s('note: ' + note, 'yellow')}\n")
    out.write("\n")
    summary = doc["summary"]
    counts = ", ".join(f"{summary[st]} {st}" for st in STATUSES if summary.get(st))
    if doc["command"] == "apply" and not doc.get("dry_run"):
        done, failed = summary["actions_done"], summary["actions_failed"]
        if done == 0 and failed == 0:
            verdict = "No changes: nothing to do." if doc["exit_code"] == 0 else "No actions taken."
        else:
            verdict = f"Applied {_plural(done, 'action')}" + (f", {failed} failed" if failed else "") + "."
    elif doc["exit_code"] == 0:
        verdict = "No drift: the host matches the state file."
    elif summary.get("error"):
        verdict = f"Error: {_plural(summary['error'], 'resource')} could not be observed."
    elif summary["actions_planned"]:
        verdict = f"Plan: {_plural(summary['actions_planned'], 'action')} to take."
    else:
        verdict = "No actions planned."
    out.write(s(verdict, "bold") + f" {counts}.\n")
