"""Helpers shared by the GitOps tests (junit, report schema, saved plans, watch): the CLI run
inside the namespaced systemd, as tests/test_units.py does it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv

SERVICE = """[Unit]
Description=test service {name}
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
"""
REPO = Path(__file__).resolve().parent.parent


def service(name: str) -> str:
    return SERVICE.format(name=name)


class Cli:
    """Runs reconcile inside the namespace with a per-test cache and journal."""

    def __init__(self, nsd, tmp: Path):
        self.nsd, self.tmp = nsd, tmp
        self.journal = tmp / "journal.jsonl"

    def state(self, text: str, name: str = "state.yaml") -> Path:
        path = self.tmp / name
        path.write_text(text)
        return path

    def __call__(self, *args: str, timeout: float = 120, **env: str):
        if args and args[0] == "apply" and "--dry-run" not in args and "--journal" not in args:
            args = (*args, "--journal", str(self.journal))
        return self.nsd.run(reconcile_argv(*args), env=cli_env(self.tmp, **env), timeout=timeout)

    def json(self, *args: str):
        proc = self(*args, "--format", "json")
        assert proc.stdout, proc.stderr
        return proc.returncode, json.loads(proc.stdout)

    def journal_lines(self) -> list[dict]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]


@pytest.fixture
def cli(nsystemd, tmp_path):
    return Cli(nsystemd, tmp_path)


def is_active(nsd, unit: str) -> str:
    return nsd.systemctl("is-active", unit).stdout.strip()


def is_enabled(nsd, unit: str) -> str:
    return nsd.systemctl("is-enabled", unit).stdout.strip()


def wait_for(predicate, timeout: float = 30, what: str = "condition"):
    """Poll until predicate() is truthy; its last value, or AssertionError with `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


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
