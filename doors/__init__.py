"""The doors: one other machine over SSH or behind a command prefix (remote.py, `--host` /
`--via`), many at once (inventory.py, `--inventory`), Slurm's health check (slurm.py), and what
consumes a finished run (sinks/). No click below the command line (tests/test_runs.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.refusals import Refusal
    from .remote import RemoteOptions


def run_elsewhere(command: str, file: str | None, fmt: str, verbose: bool, opts: RemoteOptions, *,
                  dry_run: bool = False, journal: str | None = None, lock_timeout: str | None = None) -> int:
    """diff / apply with --host, --via or --inventory; returns the exit code. Errors are printed
    without click (doors/ is below the command line: remote.echo_err)."""
    from ..core.refusals import Refusal
    from ..views import render
    from .remote import RemoteError, RemoteFailed, _last_line, duration_option, echo_err, refusal_reason

    try:
        if sum(bool(x) for x in (opts.host, opts.via, opts.inventory)) > 1:
            raise RemoteError("give one of --host, --via and --inventory")
        unsupported = [k for k, v in opts.extra.items() if v]
        if unsupported:
            flags = ", ".join(unsupported)
            raise RemoteError(f"{flags}: not supported with --host/--via/--inventory")
        run_timeout = duration_option(opts.remote_timeout, "--remote-timeout", 3600.0)
        if opts.inventory:
            from .inventory import run_inventory

            if file:
                raise RemoteError("with --inventory the state files come from the inventory; drop FILE")
            return run_inventory(command, opts, fmt, verbose, dry_run=dry_run, journal=journal,
                                 lock_timeout=lock_timeout, run_timeout=run_timeout)
        if opts.limit or opts.report_dir:
            raise RemoteError("--limit and --report-dir need --inventory")
        from .remote import run_on_target

        doc = run_on_target(command, file, opts, run_timeout, dry_run=dry_run, journal=journal,
                            lock_timeout=lock_timeout)
    except RemoteError as exc:
        echo_err(f"reconcile: error: {exc}\n")
        if fmt != "text" and not opts.inventory:
            # A CI audit stores stdout: the host that could not be reached is a report saying so.
            render(_refusal(command, file, opts, Refusal(refusal_reason(str(exc)), str(exc)), dry_run), fmt)
        return 1
    except RemoteFailed as exc:
        echo_err(exc.stderr)
        if fmt != "text":
            report = exc.report
            if report is None:  # an older reconcile there, or a refusal before any report: its last line
                why = _last_line(exc.stderr).removeprefix("reconcile: error: ") or "refused, no report"
                report = _refusal(command, file, opts, Refusal("remote-error", why), dry_run)
            render(report, fmt)
        return 1
    for warning in doc.get("warnings", ()):  # old spellings the target read: said here, as a local run says them
        echo_err(warning + "\n")
    render(doc, fmt, verbose=verbose)
    return int(doc.get("exit_code", 1))


def _refusal(command: str, file: str | None, opts: RemoteOptions, refusal: Refusal, dry_run: bool) -> dict:
    from ..pipeline.report import refusal_doc

    return refusal_doc(refusal, command, file or "", dry_run=dry_run, host=opts.host or opts.via or "")

