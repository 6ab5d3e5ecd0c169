"""The views of a report: text (text.py), JSON (json.py), JUnit XML (junit.py), Prometheus
(prometheus.py, node_exporter's textfile format).

Every view renders the report's JSON form (pipeline/report.py), so a report received from a
remote host renders exactly like a local one.
"""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..pipeline.report import RunReport

FORMATS = ("text", "json", "junit", "prometheus")


def render(report: RunReport | dict[str, Any], fmt: str, out: IO[str] | None = None, verbose: bool = False) -> None:
    """Render a report (or its JSON form, e.g. received from a remote host) in `fmt`."""
    from ..pipeline.report import to_json

    out = out or sys.stdout
    doc = report if isinstance(report, dict) else to_json(report)
    if fmt == "json":
        from .json import render_json

        render_json(doc, out)
    elif fmt == "junit":
        from .junit import render_junit

        render_junit(doc, out)
    elif fmt == "prometheus":
        from .prometheus import render_prometheus

        render_prometheus(doc, out)
    else:
        from .text import render_text

        # Paths from the kernel that are not UTF-8 are kept as surrogates (os.fsdecode): on a
        # terminal they go out as the bytes they were, never as a UnicodeEncodeError.
        if getattr(out, "errors", None) == "strict" and hasattr(out, "reconfigure"):
            out.reconfigure(errors="surrogateescape")
        render_text(doc, out, verbose=verbose)
