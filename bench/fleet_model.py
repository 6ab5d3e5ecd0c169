"""The fleet's wall time projected from one host's latency (placeholder: filled after the run)."""

from __future__ import annotations

import json


def report(meta: dict, res: dict) -> str:
    return "# netfleet (raw)\n\n```\n" + json.dumps(res.get("summary"), indent=1, default=str) + "\n```\n"
