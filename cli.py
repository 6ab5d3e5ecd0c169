"""The command line: parse flags, pick the state file and the output, call the engine. Nothing else.

Heavy modules (jsonschema, ruamel.yaml, pynvml, deepdiff) are imported by the code that
needs them, never here, so `reconcile diff` on a validated state file starts fast.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import click

from . import FORMAT_VERSION, __version__

EXIT_OK, EXIT_ERROR, EXIT_DRIFT = 0, 1, 2


def fail(message: str) -> None:
    click.echo(f"reconcile: error: {message}", err=True)
    sys.exit(EXIT_ERROR)


def resolve_state_file(given: str | None) -> str:
    """FILE, else $RECONCILE_STATE, else states/<short hostname>.yaml, else ./state.yaml."""
    if given:
        return given
    tried = []
    env = os.environ.get("RECONCILE_STATE")
    if env:
        return env
    tried.append("$RECONCILE_STATE (unset)")
    short = socket.gethostname().split(".", 1)[0]
    for candidate in (f"states/{short}.yaml", "state.yaml"):
        if Path(candidate).is_file():
            return candidate
        tried.append(candidate)
    fail(f"no state file given and none found; tried {', '.join(tried)}")
    raise AssertionError  # unreachable


def load_state(path: str):
    from .reconcilers.statefile import StateFileError, load

    try:
        return load(path)
    except StateFileError as exc:
        for problem in exc.problems:
            click.echo(problem, err=True)
        sys.exit(EXIT_ERROR)


def parse_duration_option(value: str, flag: str) -> float:
    from .reconcilers.statefile import parse_duration

    try:
        return parse_duration(value)
    except ValueError:
        fail(f"{flag}: invalid duration {value!r} (use e.g. 30s, 5m)")
        raise AssertionError from None


FORMATS = click.Choice(["text", "json", "junit"])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", message=f"reconcile %(version)s (report format {FORMAT_VERSION})")
def main() -> None:
    """Declarative state reconciliation for GPU / ML hosts.

    Describe the host in a YAML state file; `diff` shows what differs and what would be
    done, `apply` does it and verifies the result by observing again.
    """


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate(files: tuple[str, ...]) -> None:
    """Check state FILES; print FILE:LINE:COL: message for each problem."""
    from .reconcilers.statefile import StateFileError, load

    bad = 0
    for f in files:
        try:
            load(f)
        except StateFileError as exc:
            bad += 1
            for problem in exc.problems:
                click.echo(problem, err=True)
    if bad:
        sys.exit(EXIT_ERROR)
    click.echo(f"{len(files)} state file{'s' if len(files) != 1 else ''} valid")


def _output_options(fn):
    fn = click.option("--format", "fmt", type=FORMATS, default="text", show_default=True,
                      help="Output format; json follows the format_version contract.")(fn)
    fn = click.option("-v", "--verbose", is_flag=True, help="Also show what is already right.")(fn)
    return fn


@main.command()
@click.argument("file", required=False)
@_output_options
def diff(file: str | None, fmt: str, verbose: bool) -> None:
    """Show drift and the planned actions; change nothing.

    Exit 0: no drift; 2: drift; 1: error.
    """
    from .reconcilers.engine import Engine
    from .reconcilers.report import render

    state = load_state(resolve_state_file(file))
    report = Engine(state).diff()
    render(report, fmt, verbose=verbose)
    sys.exit(report.exit_code)


@main.command()
@click.argument("file", required=False)
@_output_options
@click.option("--dry-run", is_flag=True, help="Plan only, as diff does; take no lock, change nothing.")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False),
              help="Journal file (default /var/lib/reconcile/journal.jsonl as root, "
                   "$XDG_STATE_HOME/reconcile/journal.jsonl otherwise). The lock file sits beside it.")
@click.option("--lock-timeout", default="0s", show_default=True,
              help="Wait this long for another apply to finish instead of failing at once.")
def apply(file: str | None, fmt: str, verbose: bool, dry_run: bool, journal_path: str | None,
          lock_timeout: str) -> None:
    """Act until the host matches the state file, then verify by observing again.

    Exit 0: every resource ok (or converging as intended); 2: drift remains;
    1: an error (bad input, lock held, wrong host, a resource that cannot be observed).
    """
    from .reconcilers.engine import Engine, HostMismatch
    from .reconcilers.journal import Journal, Lock, LockHeld, default_journal_path
    from .reconcilers.report import render

    wait = parse_duration_option(lock_timeout, "--lock-timeout")
    state = load_state(resolve_state_file(file))
    if dry_run:
        report = Engine(state).diff(command="apply")
        render(report, fmt, verbose=verbose)
        sys.exit(report.exit_code)

    journal = Journal(Path(journal_path) if journal_path else default_journal_path())
    lock = Lock(journal.path.parent / "lock")
    try:
        lock.acquire(timeout=wait)
    except LockHeld as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot take the lock {lock.path}: {exc.strerror}")
    try:
        report = Engine(state, journal=journal).apply()
    except HostMismatch as exc:
        fail(str(exc))
    finally:
        lock.release()
    render(report, fmt, verbose=verbose)
    sys.exit(report.exit_code)


@main.command()
def schema() -> None:
    """Print the JSON Schema of the state file (for editors and CI)."""
    import json

    from .reconcilers.statefile import bundled_schema

    click.echo(json.dumps(bundled_schema(), indent=2))


if __name__ == "__main__":
    main()
