"""The text view: a Terraform-plan-like report, coloured only on a terminal."""

from __future__ import annotations

import os
from typing import IO, Any

from ..core.escape import escape_controls as esc
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
        # An empty name is "no style": a planned action has no colour of its own (RESULT_COLOUR),
        # nor an outcome the log does not colour; looking it up crashed diff on a colour terminal.
        codes = [self.CODES[s] for s in styles if s]
        if not self.enabled or not codes:
            return text
        return "".join(f"\033[{c}m" for c in codes) + text + "\033[0m"


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
    # Every name and message below is the host's (or a remote target's) text: escaped before it
    # reaches the terminal (core/escape.py); the colour codes are the only controls written.
    dry = " --dry-run" if doc.get("dry_run") else ""
    title = f"reconcile {esc(doc['command'])}{dry}: {esc(doc['state_file'])}"
    out.write(s(title, "bold") + f" on {esc(doc['host'])}\n")
    machine = doc.get("machine") or {}
    ids = [f"{label} {esc(machine[key])}" for key, label in (("machine_id", "machine-id"), ("boot_id", "boot"),
                                                         ("ssh_host_key", "host key")) if machine.get(key)]
    if ids:  # which machine answered: a recreated VM or a reused address shows here first
        out.write(s("  " + ", ".join(ids), "dim") + "\n")
    for note in doc.get("notes", []):
        out.write(s(f"warning: {esc(note)}", "yellow") + "\n")
    out.write("\n")
    for res in doc["resources"]:
        status = res["status"]
        # A remote report is checked before it is rendered (doors/remote.py); an unknown status
        # still prints as what it is rather than crash the report.
        sigil, colour = SIGILS.get(status, ("?", "red"))
        status = esc(status)
        head = f"  {s(sigil, colour)} {esc(res['id'])}"
        if status == "ok" and not res["actions"]:
            detail = esc(res.get("summary", "")) if verbose else ""
            out.write(head + s(f"  ok{'  (' + detail + ')' if detail else ''}", "dim") + "\n")
            for note in res.get("caveats", ()):
                out.write(f"      {s('note: ' + esc(note), 'yellow')}\n")
            if res["message"] and verbose:
                out.write(f"      {esc(res['message'], newlines=True)}\n")
            continue
        out.write(head + "  " + s(status, colour) + "\n")
        width = max((len(esc(d["field"])) for d in res["drift"]), default=0)
        for d in res["drift"]:
            have, want = esc(format_value(d["have"])), s(esc(format_value(d["want"])), "bold")
            out.write(f"      {esc(d['field']) + ':':<{width + 1}} {have} -> {want}\n")
        for a in res["actions"]:
            result = a["result"]
            text = esc(a.get("description") or f"{a['action']} {a['target']}")
            line = f"      {s(RESULT_MARK.get(result, '?'), RESULT_COLOUR.get(result, ''))} {text}"
            if result != "planned":
                why = f": {esc(a['message'])}" if a.get("message") and result != "done" else ""
                result = esc(result)
                line += s(f"  ({result}{why})", "dim")
            out.write(line + "\n")
        for line in res["message"].split("\n") if res["message"] else ():
            out.write(f"      {s(esc(line), 'red' if status == 'error' else 'dim')}\n")
        for note in res.get("caveats", ()):
            out.write(f"      {s('note: ' + esc(note), 'yellow')}\n")
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


def render_report(doc: dict[str, Any], out: IO[str], verbose: bool = False) -> None:
    """`--format text` (views.FORMATS): one report."""
    # Paths from the kernel that are not UTF-8 are kept as surrogates (os.fsdecode): on a
    # terminal they go out as the bytes they were, never as a UnicodeEncodeError.
    if getattr(out, "errors", None) == "strict" and hasattr(out, "reconfigure"):
        out.reconfigure(errors="surrogateescape")
    render_text(doc, out, verbose=verbose)


def render_inventory(doc: dict[str, Any], out: IO[str], verbose: bool = False) -> None:
    """`--format text --inventory` (views.FORMATS): each host's report (or why it has none), in
    inventory order, then one table and the summary line, from the inventory's JSON form."""
    from ..pipeline.report import action_count, drifted_count

    style = Style(out)
    hosts = doc["hosts"]
    for entry in hosts:
        out.write(f"=== {esc(entry['host'])} ({esc(entry.get('target', ''))}) ===\n")
        if entry.get("report") is not None:
            render_text(entry["report"], out, verbose=verbose, style=style)
        else:
            error = entry.get("error") or ""
            out.write("".join(f"error: {esc(line)}\n" for line in error.splitlines() or ["(no message)"]))
        out.write("\n")
    rows = [("HOST", "STATUS", "DRIFT", "ACTIONS", "SECONDS", "")]
    for entry in hosts:
        report = entry.get("report")
        error = entry.get("error") or ""
        note = esc(error.splitlines()[0]) if error else ""
        same = entry.get("same_machine_as") or []
        if same:
            more = f" (+{len(same) - 1} more)" if len(same) > 1 else ""
            note = f"same machine as {esc(same[0])}{more} (machine-id)" + (f"; {note}" if note else "")
        rows.append((esc(entry["host"]), esc(entry["status"]), "-" if report is None else str(drifted_count(report)),
                     "-" if report is None else str(action_count(report)), f"{entry['seconds']:.1f}", note))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), *(row[i].rjust(widths[i]) for i in (2, 3, 4))]
        out.write("  ".join(cells) + (f"  {row[5]}" if row[5] else "") + "\n")
    s = doc["summary"]
    counts = ", ".join(f"{s[k]} {k}" for k in ("ok", "changed", "drift", "error") if s[k])
    out.write(f"\n{s['hosts']} host{'s' if s['hosts'] != 1 else ''}: {counts}.\n")
    if s.get("machines", s["hosts"]) != s["hosts"]:
        out.write(f"warning: {s['hosts']} inventory names reached {s['machines']} machines (same machine-id): "
                  "see the notes in the table\n")
