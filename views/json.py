"""The JSON view: the report's `format_version` contract (pipeline/report.py), as it is."""

from __future__ import annotations

import json
from typing import IO, Any


def render_json(doc: dict[str, Any], out: IO[str], verbose: bool = False) -> None:
    """A report, or an inventory run, as its JSON form (`verbose` changes nothing: JSON holds it all)."""
    json.dump(doc, out, indent=2)
    out.write("\n")
