"""`reconcile log`: the journal as a timeline a person reads (or JSON a program reads).

Journal lines (pipeline/engine.py, watch.py, doors/slurm.py) are grouped into events, oldest
first: an apply run (its `intent` / `result` / `verified` lines, tied by `run`), a watch pass, a
Slurm health run, a reboot's completion in the next boot (`rebooted`) and a person's `ack`
(pipeline/recoveries.py). An intent without its result is an action that may or may not have happened
(the apply was killed while it ran): said so, in words. Text output is aligned in columns like
`git log --oneline` / `journalctl`, coloured as the text report is (views/text.py colour_wanted).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, Any

from ..core.escape import escape_controls as esc
from .text import Style

UNKNOWN = "may or may not have happened (no result recorded: the run was interrupted while it ran)"
LOG_FORMAT_VERSION = "1"


def timeline(entries: Iterable[dict[str, Any]], resource: str | None = None,
             run: str | None = None) -> list[dict[str, Any]]:
    """Events, oldest first, from journal entries in any order (they are sorted by time)."""
    runs: dict[str, dict[str, Any]] = {}
    events: list[dict[str, Any]] = []
    # Newest first from the reader: reversed, they are (nearly) in order already, as timsort likes.
    # utc_iso's fixed-width form sorts as text (no parsing of a million times).
    ordered = sorted(reversed(list(entries)), key=lambda e: str(e.get("time") or ""))
    for e in ordered:
        kind = e.get("event")
        if kind in ("intent", "result", "verified"):
            rid = str(e.get("run", "?"))
            if run and not rid.startswith(run):
                continue
            if resource and e.get("resource") != resource:
                continue
            r = runs.get(rid)
            if r is None:
                r = runs[rid] = {"event": "run", "run": rid, "pid": e.get("pid"), "time": e.get("time"),
                                 "end": e.get("time"), "actions": [], "observed": {}}
                events.append(r)
            r["end"] = e.get("time")
            if r["pid"] is None:
                r["pid"] = e.get("pid")
            _add_to_run(r, e)
        elif kind == "rebooted":  # pipeline/recoveries.py: a reboot's intent (boot A) completed in boot B
            if run and not str(e.get("intent_run", "")).startswith(run):
                continue
            if resource and e.get("resource") != resource:
                continue
            events.append(dict(e))
        elif kind == "ack":  # `reconcile ack`: a person says a GPU's or the node's fault was serviced
            if run or (resource and resource != "gpus"):
                continue
            events.append(dict(e))
        elif kind in ("watch-pass", "slurm-health"):
            if run:
                continue
            if resource and resource not in (e.get("resources") or {}) and e.get("resource") != resource:
                continue
            events.append(dict(e))
    for r in runs.values():
        r["observed"] = [{"resource": k, **v} for k, v in r["observed"].items()]
        for a in r["actions"]:
            a.setdefault("result", None)
            a["outcome"] = a["result"] or "unknown"
    return events


def _add_to_run(r: dict[str, Any], e: dict[str, Any]) -> None:
    res = e.get("resource")
    seen = r["observed"].setdefault(res, {})
    if e["event"] == "intent":
        r["actions"].append({"resource": res, "action": e.get("action"), "target": e.get("target"),
                             "description": e.get("description"), "time": e.get("time")})
        seen.setdefault("before", e.get("before"))
    elif e["event"] == "result":
        for a in reversed(r["actions"]):
            if (a["resource"], a["action"], a["target"]) == (res, e.get("action"), e.get("target")) \
                    and "result" not in a:
                a.update(result=e.get("result"), finished=e.get("time"), message=e.get("message") or "")
                break
        else:  # a result whose intent is in an older (rotated away) file, or cut by --since
            r["actions"].append({"resource": res, "action": e.get("action"), "target": e.get("target"),
                                 "description": e.get("description"), "time": e.get("started"),
                                 "result": e.get("result"), "finished": e.get("time"),
                                 "message": e.get("message") or ""})
    else:
        seen["after"] = e.get("after")


def changes(before: Any, after: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """The leaves that differ between two observations: (dotted path, before, after)."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for k in list(before) + [k for k in after if k not in before]:
            out.extend(changes(before.get(k), after.get(k), f"{prefix}{k}."))
        return out
    if before != after:
        return [(prefix.rstrip("."), before, after)]
    return []


def _short(value: Any, width: int = 40) -> str:
    import json

    text = esc(value if isinstance(value, str) else json.dumps(value, default=str))
    return text if len(text) <= width else text[:width - 1] + "…"


OUTCOME_STYLE = {"done": "green", "failed": "red", "skipped": "dim", "unknown": "yellow"}
MARK = {"done": "✓", "failed": "✗", "skipped": "-", "unknown": "?"}


def render_text(events: list[dict[str, Any]], out: IO[str], style: Style, verbose: bool = False) -> None:
    """One header line per event, its actions indented beneath in aligned columns. Every value
    from the journal is escaped for the terminal (core/escape.py): the journal holds unit, file and
    process names and commands' messages."""
    width = max([len(esc(a["resource"])) for e in events if e["event"] == "run" for a in e["actions"]] or [0])
    for e in events:
        when = style(esc(e.get("time", "?")), "dim")
        if e["event"] == "run":
            done = sum(a["outcome"] == "done" for a in e["actions"])
            failed = sum(a["outcome"] == "failed" for a in e["actions"])
            unknown = sum(a["outcome"] == "unknown" for a in e["actions"])
            counts = ", ".join(p for p in (f"{done} done" if done else "", f"{failed} failed" if failed else "",
                                           style(f"{unknown} unknown", "yellow") if unknown else "") if p)
            out.write(f"{when}  {style('apply', 'bold')} run {style(esc(e['run']), 'cyan')}  pid {esc(e.get('pid'))}"
                      f"  {len(e['actions'])} action{'s' if len(e['actions']) != 1 else ''}"
                      f"{': ' + counts if counts else ''}\n")
            for a in e["actions"]:
                outcome = a["outcome"]
                mark = style(MARK.get(outcome, "?"), OUTCOME_STYLE.get(outcome, ""))
                what = esc(a.get("description") or f"{a.get('action')} {a.get('target')}")
                said = UNKNOWN if outcome == "unknown" else esc(outcome) + (f": {esc(a['message'])}"
                                                                             if a.get("message") else "")
                out.write(f"  {style(esc(str(a.get('time', '?'))[11:23]), 'dim')}  {mark} "
                          f"{esc(a['resource']).ljust(width)}  {what}  → "
                          f"{style(said, OUTCOME_STYLE.get(outcome, ''))}\n")
            for o in e["observed"]:
                if "after" not in o:
                    continue
                diffs = changes(o.get("before"), o.get("after"))
                shown = diffs if verbose else diffs[:6]
                for path, b, a in shown:
                    out.write(f"      {esc(o['resource']).ljust(width)}  {esc(path)}: {_short(b)} -> {_short(a)}\n")
                if len(diffs) > len(shown):
                    out.write(f"      {esc(o['resource']).ljust(width)}  ... {len(diffs) - len(shown)} more "
                              "changes (-v shows all)\n")
        elif e["event"] == "watch-pass":
            bad = e.get("actions_failed") or 0
            res = ", ".join(f"{esc(k)} {esc(v)}" for k, v in (e.get("resources") or {}).items())
            out.write(f"{when}  {style('watch', 'bold')} pass {esc(e.get('pass'))}  pid {esc(e.get('pid'))}  "
                      f"{esc(e.get('actions_done', 0))} done, "
                      f"{style(esc(bad) + ' failed', 'red') if bad else '0 failed'}"
                      f"{'  (interrupted)' if e.get('interrupted') else ''}: {res}\n")
        elif e["event"] == "slurm-health":
            verdict = esc(e.get("verdict", "?"))
            colour = "green" if verdict in ("healthy", "ok") else "red"
            detail = esc(e.get("reason") or e.get("why") or "")
            out.write(f"{when}  {style('slurm-health', 'bold')} node {esc(e.get('node'))}  {esc(e.get('command'))}  "
                      f"{style(verdict, colour)}{'  action ' + esc(e['action']) if e.get('action') else ''}"
                      f"  exit {esc(e.get('exit_code'))}{': ' + detail if detail else ''}\n")
        elif e["event"] == "rebooted":
            out.write(f"{when}  {style('rebooted', 'bold')} up in boot {esc(str(e.get('boot', '?'))[:8])}  the "
                      f"reboot requested at {esc(e.get('requested', '?'))} in boot "
                      f"{esc(str(e.get('from_boot', '?'))[:8])} by run "
                      f"{style(esc(e.get('intent_run', '?')), 'cyan')}: {esc(e.get('message', ''))}\n")
        elif e["event"] == "ack":
            what = esc(f"GPU {e['gpu']}" if e.get("gpu") else f"node {e.get('node') or '?'}")
            out.write(f"{when}  {style('ack', 'bold')} {what} serviced, by {esc(e.get('by', '?'))}: "
                      f"{esc(e.get('reason', ''))}"
                      " (its recovery caps and latched faults start again)\n")
    if not events:
        out.write("No journal entries in this window.\n")


def render_json(events: list[dict[str, Any]], journal: str, warnings: list[str]) -> dict[str, Any]:
    return {"format_version": LOG_FORMAT_VERSION, "journal": journal, "warnings": warnings, "events": events}
