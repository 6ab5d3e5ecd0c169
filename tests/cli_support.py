"""Running the CLI the way a user does: a real subprocess, real exit codes, real stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def reconcile_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "reconcile", *args]


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["RECONCILE_CACHE_DIR"] = str(tmp / "cache")
    env.pop("RECONCILE_STATE", None)
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


def run_cli(tmp: Path, *args: str, cwd: Path | None = None, timeout: float = 60, **env: str):
    return subprocess.run(reconcile_argv(*args), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or tmp, env=cli_env(tmp, **env))


def report_of(proc) -> dict:
    return json.loads(proc.stdout)
