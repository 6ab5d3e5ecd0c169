"""The doors to machines: the local host (host.py), one other machine over SSH or behind a
command prefix (remote.py, `--host` / `--via`), and many at once (inventory.py, `--inventory`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .remote import RemoteOptions


def run_elsewhere(command: str, file: str | None, fmt: str, verbose: bool, opts: RemoteOptions, *,
                  dry_run: bool = False, journal: str | None = None, lock_timeout: str | None = None) -> int:
    """diff / apply with --host, --via or --inventory; returns the exit code."""
    import click

    from ..views import render
    from .remote import RemoteError, RemoteFailed, _last_line, duration_option, refusal_reason

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
        click.echo(f"reconcile: error: {exc}", err=True)
        if fmt != "text" and not opts.inventory:
            # A CI audit stores stdout: the host that could not be reached is a report saying so.
            render(_refusal(command, file, opts, refusal_reason(str(exc)), str(exc), dry_run), fmt)
        return 1
    except RemoteFailed as exc:
        click.echo(exc.stderr, err=True, nl=False)
        if fmt != "text":
            report = exc.report
            if report is None:  # an older reconcile there, or a refusal before any report: its last line
                why = _last_line(exc.stderr).removeprefix("reconcile: error: ") or "refused, no report"
                report = _refusal(command, file, opts, "remote-error", why, dry_run)
            render(report, fmt)
        return 1
    render(doc, fmt, verbose=verbose)
    return int(doc.get("exit_code", 1))


def _refusal(command: str, file: str | None, opts: RemoteOptions, reason: str, message: str,
             dry_run: bool) -> dict:
    from ..pipeline.report import refusal_report

    return refusal_report(command, file or "", reason, message, dry_run=dry_run, host=opts.host or opts.via or "")
