"""The in-namespace half of tests/test_units_differential.py: a long-lived process inside the
namespaced systemd that answers one JSON request a line, so that thousands of questions do not
each pay for a Python start and an nsenter.

Requests (stdin) and answers (stdout), one JSON document a line:

- {"op": "reference", "units": [...]}: what systemd says of each unit, asked one unit a call
  (`systemctl show -p ... -- UNIT` and `systemctl is-enabled -- UNIT`), raw; and what the
  in-process reader (UnitFiles, on the manager's UnitPath) answers for it, or null.
- {"op": "run", "states": [YAML text, ...]}: each state file through the same code as
  `reconcile diff --format json` (statefile.load, Engine.diff, report.to_json); a state file
  reconcile refuses gives {"invalid": [problems]}.

It reports; it judges nothing: the test compares."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SHOW_PROPS = "Id,LoadState,ActiveState,SubState,UnitFileState,FragmentPath,MainPID"
ENV = {**os.environ, "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", "LC_ALL": "C"}


def systemctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", "--no-pager", *args], capture_output=True, text=True, env=ENV, timeout=60)


def reference(units: list[str]) -> dict:
    from reconcile_host.reconcilers.units.unitfiles import UnitFiles

    unit_path = systemctl("show", "-p", "UnitPath", "--value").stdout.split()
    files = UnitFiles(unit_path)
    ref, reader = {}, {}
    for u in units:
        show = systemctl("show", "-p", SHOW_PROPS, "--", u)
        enabled = systemctl("is-enabled", "--", u)
        ref[u] = {"show_rc": show.returncode, "show_err": show.stderr.strip(),
                  "show": dict(line.split("=", 1) for line in show.stdout.splitlines() if "=" in line),
                  "ie_rc": enabled.returncode, "ie_out": enabled.stdout.strip(), "ie_err": enabled.stderr.strip()}
        reader[u] = files.state(u)
    return {"ref": ref, "reader": reader, "unit_path": unit_path}


def run(states: list[str]) -> dict:
    from reconcile_host.pipeline.engine import Engine, Prefetch
    from reconcile_host.pipeline.report import to_json
    from reconcile_host.pipeline.statefile import StateFileError, load

    reports = []
    for text in states:
        prefetch = Prefetch()
        try:
            state = load("differential.yaml", text=text.encode(), on_kind=prefetch)
        except StateFileError as exc:
            reports.append({"invalid": list(exc.problems)})
            continue
        reports.append(to_json(Engine(state, prefetch.host, prefetch=prefetch).diff()))
    return {"reports": reports}


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but answers on the protocol's stream
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "reference":
            answer = reference(req["units"])
        elif req["op"] == "run":
            answer = run(req["states"])
        else:
            return
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
