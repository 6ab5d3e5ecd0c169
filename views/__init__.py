"""The views of a report, and the one table of output formats (FORMATS): text (text.py), JSON
(json.py), JUnit XML (junit.py), Prometheus (prometheus.py, node_exporter's textfile format).

Every view renders the report's JSON form (pipeline/report.py), so a report received from a
remote host renders exactly like a local one; error reports (a bad state file) and refusals
(lock held, another machine) are reports too, and every format renders them.

A format is one module here and one line of FORMATS: click's `--format` choice (cli.py), the
fast `diff` path without click (commands.read_plain_diff) and `--inventory` (doors/inventory.py)
read this table. Its views are named as strings and imported when used, so `reconcile diff`'s
start-up imports only the one it prints (tests/test_fast_diff.py).
"""

from __future__ import annotations

import importlib
import sys
from typing import IO, TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ..pipeline.report import RunReport


class Format(NamedTuple):
    # "module:function" (a module starting with "." is in this package): function(doc, out,
    # verbose) writes one report's JSON form to out.
    report: str
    # The same for an inventory run's JSON form (doors/inventory.py: each host's entry, then the
    # summary); None: the format is per host, and `--inventory` refuses it before any host is touched.
    inventory: str | None = None
    # With no inventory view: what to do instead, for the refusal's message.
    per_host: str = "use --report-dir with --format json"


FORMATS: dict[str, Format] = {
    "text": Format(".text:render_report", ".text:render_inventory"),
    "json": Format(".json:render_json", ".json:render_json"),
    "junit": Format(".junit:render_junit", ".junit:render_inventory_junit"),
    "prometheus": Format(".prometheus:render_prometheus", per_host="run it on each host (node_exporter's "
                                                                   "textfile collector), or use --report-dir "
                                                                   "with --format json"),
}


def view(target: str) -> Any:
    """The function a FORMATS entry names ("module:function")."""
    module_name, _, function = target.partition(":")
    module = importlib.import_module(module_name, __name__ if module_name.startswith(".") else None)
    return getattr(module, function)


def render(report: RunReport | dict[str, Any], fmt: str, out: IO[str] | None = None, verbose: bool = False) -> None:
    """Render a report (or its JSON form, e.g. received from a remote host) in `fmt`."""
    from ..pipeline.report import to_json

    doc = report if isinstance(report, dict) else to_json(report)
    view(FORMATS[fmt].report)(doc, out or sys.stdout, verbose=verbose)


def inventory_refusal(fmt: str) -> str | None:
    """Why `--inventory` cannot print `fmt` (None: it can)."""
    entry = FORMATS[fmt]
    return None if entry.inventory else f"--format {fmt} is per host: {entry.per_host}"


def render_inventory(doc: dict[str, Any], fmt: str, out: IO[str] | None = None, verbose: bool = False) -> None:
    """Render an inventory run's JSON form (doors/inventory.py) in `fmt`."""
    target = FORMATS[fmt].inventory
    if target is None:
        raise ValueError(inventory_refusal(fmt))
    view(target)(doc, out or sys.stdout, verbose=verbose)
