"""JUnit XML of a report, so CI systems show drift the way they show failing tests.

One <testcase> per resource (classname = kind, name = id):
  ok          passed
  converging  passed, with the progress in <system-out>
  drift       <failure type="drift">, the want/have of each field and the actions
  blocked     <failure type="blocked">: a person must act
  error       <error>: the resource could not be observed or acted on
No resource is reported as skipped: every declared resource was looked at.

It renders the JSON form of the report, so a report received from another host renders
exactly like a local one. The document is built with ElementTree, which escapes markup;
characters XML 1.0 cannot carry at all (terminal escapes in a command's output) are
replaced first, or CI parsers reject the whole file.
"""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from typing import IO, Any

from ..core.values import format_value

# Not allowed anywhere in an XML 1.0 document, not even as character references (surrogates:
# bytes that were not UTF-8 in a path, kept by os.fsdecode).
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _clean(text: Any) -> str:
    return _INVALID_XML.sub("\ufffd", "" if text is None else str(text))


def _drift_line(d: dict[str, Any]) -> str:
    return f"{d['field']}: want {format_value(d['want'])}, have {format_value(d['have'])}"


def _action_line(a: dict[str, Any]) -> str:
    text = a.get("description") or f"{a['action']} {a['target']}"
    why = f": {a['message']}" if a.get("message") else ""
    return f"{a['result']}: {text}{why}"


def _detail(res: dict[str, Any]) -> str:
    lines = [_drift_line(d) for d in res.get("drift", [])]
    lines += [_action_line(a) for a in res.get("actions", [])]
    if res.get("message"):
        lines.append(res["message"])
    return "\n".join(lines)


def _short(res: dict[str, Any]) -> str:
    """The one-line `message` attribute CI systems show in their test list."""
    status = res["status"]
    if res.get("drift"):
        fields = ", ".join(f"{d['field']}: {format_value(d['have'])} -> {format_value(d['want'])}"
                           for d in res["drift"])
        text = f"{status}: {fields}"
    else:
        text = status
    first = (res.get("message") or "").split("\n", 1)[0]
    if status in ("blocked", "error") and first:
        text += f": {first}"
    return text


def _testcase(res: dict[str, Any]) -> ET.Element:
    case = ET.Element("testcase", {"classname": _clean(res["kind"]), "name": _clean(res["id"])})
    status = res["status"]
    detail = _clean(_detail(res))
    if status in ("drift", "blocked"):
        el = ET.SubElement(case, "failure", {"type": status, "message": _clean(_short(res))})
        el.text = detail
    elif status == "error":
        el = ET.SubElement(case, "error", {"type": status, "message": _clean(_short(res))})
        el.text = detail
    elif detail:  # ok with a note, or converging: passed, and the progress is kept
        ET.SubElement(case, "system-out").text = detail
    return case


def _problems_case(doc: dict[str, Any]) -> ET.Element:
    """An error report (a bad state file): one test case with one <error>, every problem in it."""
    problems = doc["problems"]
    case = ET.Element("testcase", {"classname": "state-file", "name": _clean(doc["state_file"])})
    el = ET.SubElement(case, "error", {"type": "state-file", "message": _clean(problems[0]["text"])})
    el.text = _clean("\n".join(p["text"] for p in problems))
    return case


def _refusal_case(doc: dict[str, Any]) -> ET.Element:
    """A refused run (lock held, another machine, unreachable host): one test case, one <error>
    whose type is the reason, so a CI job that stores the file records the host that needs attention."""
    error = doc["error"]
    case = ET.Element("testcase", {"classname": "reconcile", "name": _clean(error.get("reason", "error"))})
    el = ET.SubElement(case, "error", {"type": _clean(error.get("reason", "error")),
                                       "message": _clean(error.get("message", ""))})
    el.text = _clean(error.get("message", ""))
    return case


def to_junit(doc: dict[str, Any]) -> ET.Element:
    resources = doc.get("resources", [])
    problems = bool(doc.get("problems") or doc.get("error"))
    counts = {
        "tests": len(resources) + problems,
        "failures": sum(1 for r in resources if r["status"] in ("drift", "blocked")),
        "errors": sum(1 for r in resources if r["status"] == "error") + problems,
        "skipped": 0,
    }
    title = f"reconcile {doc['command']}{' --dry-run' if doc.get('dry_run') else ''}"
    attrs = {k: str(v) for k, v in counts.items()}
    duration = f"{float(doc.get('duration_s') or 0):.3f}"
    root = ET.Element("testsuites", {"name": title, **attrs, "time": duration})
    started = doc.get("started") or 0
    suite = ET.SubElement(root, "testsuite", {
        "name": _clean(f"{title}: {doc['state_file']} on {doc['host']}"),
        **attrs,
        "time": duration,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started)),
        "hostname": _clean(doc["host"]),
    })
    props = ET.SubElement(suite, "properties")
    for name in ("format_version", "reconcile_version", "command", "state_file", "host_pattern", "host_matches",
                 "exit_code"):
        if doc.get(name) is not None:
            ET.SubElement(props, "property", {"name": name, "value": _clean(format_value(doc[name]))})
    for key, value in (doc.get("machine") or {}).items():  # which machine answered (hostname, machine-id, ...)
        if value is not None:
            ET.SubElement(props, "property", {"name": f"machine.{key}", "value": _clean(value)})
    if doc.get("problems"):
        suite.append(_problems_case(doc))
    elif problems:
        suite.append(_refusal_case(doc))
    for res in resources:
        suite.append(_testcase(res))
    if doc.get("notes"):
        ET.SubElement(suite, "system-out").text = _clean("\n".join(doc["notes"]))
    return root


def render_junit(doc: dict[str, Any], out: IO[str], verbose: bool = False) -> None:
    root = to_junit(doc)
    ET.indent(root)
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(ET.tostring(root, encoding="unicode"))
    out.write("\n")


def render_inventory_junit(doc: dict[str, Any], out: IO[str], verbose: bool = False) -> None:
    """An inventory run: one <testsuite> per host (its report's, as above), and for a host with no
    report (unreachable, refused) a suite of one <error> whose type is the reason."""
    title = f"reconcile {doc['command']}{' --dry-run' if doc.get('dry_run') else ''} --inventory"
    root = ET.Element("testsuites", {"name": _clean(f"{title} {doc['inventory']}")})
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for entry in doc["hosts"]:
        report = entry.get("report")
        if report is None:
            from ..pipeline.report import refusal_report

            report = refusal_report(doc["command"], entry.get("state_file", ""), entry.get("reason") or "remote-error",
                                    entry.get("error") or "no report", dry_run=bool(doc.get("dry_run")),
                                    host=entry["host"])
        suite = to_junit(report).find("testsuite")
        assert suite is not None
        suite.set("name", _clean(f"{entry['host']} ({entry.get('target', '')})"))
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
        root.append(suite)
    for key, n in totals.items():
        root.set(key, str(n))
    ET.indent(root)
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(ET.tostring(root, encoding="unicode"))
    out.write("\n")
