"""Running the CLI the way a user does: a real subprocess, real exit codes, real stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple


def reconcile_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "reconcile_host", *args]


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["RECONCILE_CACHE_DIR"] = str(tmp / "cache")
    env.setdefault("RECONCILE_STATE_DIR", str(tmp / "state"))  # records (the kernel log's...), never /var/lib
    env.pop("RECONCILE_STATE", None)
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


def run_cli(tmp: Path, *args: str, cwd: Path | None = None, timeout: float = 60, **env: str):
    return subprocess.run(reconcile_argv(*args), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or tmp, env=cli_env(tmp, **env))


def report_of(proc) -> dict:
    return json.loads(proc.stdout)


class JsonRun(NamedTuple):
    code: int  # the exit status
    doc: dict | None  # the JSON report; None when stdout is not one
    stderr: str


def reconcile_json(tmp: Path, *args: str, runner=None, cwd: Path | str | None = None, timeout: float = 120,
                   input: str | None = None, **env: str) -> JsonRun:
    """`reconcile ARGS --format json` as a user runs it, with its files in TMP: an apply gets the
    journal TMP/journal.jsonl (unless ARGS name one), the cache and the kinds' state directory
    are TMP/cache and TMP/state (unless ENV names them). RUNNER: a NamespacedSystemd to run it in
    (tests/nsystemd.py). A traceback on stderr fails the test: reconcile never prints one."""
    argv = list(args)
    if not any(a == "--format" or a.startswith("--format=") for a in argv):
        argv += ["--format", "json"]
    if argv[0] == "apply" and not any(a == "--journal" or a.startswith("--journal=") for a in argv):
        argv += ["--journal", str(Path(tmp) / "journal.jsonl")]
    full_env = cli_env(Path(tmp), **{"RECONCILE_STATE_DIR": str(Path(tmp) / "state"), **env})
    if runner is not None:
        proc = runner.run(reconcile_argv(*argv), env=full_env, timeout=timeout, input=input,
                          cwd=None if cwd is None else str(cwd))
        stdout, stderr = proc.stdout, proc.stderr
    else:  # bytes: a report or a message may carry any byte a path holds
        proc = subprocess.run(reconcile_argv(*argv), capture_output=True, timeout=timeout, cwd=cwd or tmp,
                              env=full_env, input=None if input is None else input.encode(),
                              stdin=subprocess.DEVNULL if input is None else None)
        stdout, stderr = proc.stdout, proc.stderr.decode(errors="replace")
    assert "Traceback" not in stderr, stderr
    try:
        doc = json.loads(stdout)
    except ValueError:
        doc = None
    return JsonRun(proc.returncode, doc, stderr)


# --- the CLI inside the namespaced systemd (tests/nsystemd.py) ---------------------------

SERVICE = """[Unit]
Description=test service {name}
[Service]
ExecStart=/bin/sleep infinity
{extra}
[Install]
WantedBy=multi-user.target
"""


def service(name: str, extra: str = "") -> str:
    """A long-running test service that can be enabled (WantedBy=multi-user.target)."""
    return SERVICE.format(name=name, extra=extra)


class NsCli:
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
        code, doc, stderr = reconcile_json(self.tmp, *args, runner=self.nsd)  # the journal: self.journal
        assert doc is not None, stderr
        return code, doc

    def journal_lines(self) -> list[dict]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]


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


def read_terminal(leader: int) -> bytes:
    """Everything a child wrote to the pseudo-terminal whose leader end is LEADER, until it closed
    its end (then read(2) says EIO, or nothing); the leader is closed."""
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO once the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return b"".join(chunks)
