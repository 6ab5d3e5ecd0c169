"""Helpers shared by the GitOps tests (junit, report schema, saved plans, watch): the CLI run
inside the namespaced systemd, as tests/test_units.py does it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import NsCli, is_active, is_enabled, service, wait_for  # noqa: F401  (re-exported)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cli(nsystemd, tmp_path):
    return NsCli(nsystemd, tmp_path)


def report_schema() -> dict:
    return json.loads((REPO / "schema" / "report.schema.json").read_text())


def strict(schema: dict) -> dict:
    """The report schema with additionalProperties false wherever it lists properties (except the
    kind-specific `observed` and `params`), so a test also catches fields the contract does not describe."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and out.get("type") == "object":
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def validate_report(doc: dict) -> None:
    """Validate against the published schema and its strict form (no undocumented fields)."""
    import jsonschema

    for schema in (report_schema(), strict(report_schema())):
        jsonschema.Draft202012Validator(schema).validate(doc)
