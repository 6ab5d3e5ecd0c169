"""The steps the commands share, without click, and `reconcile diff` itself.

`reconcile diff FILE` is the audit a CI job, a post-merge hook or an operator runs again and
again, where start-up is most of its time: click's import is a tenth of it. So __main__.py
reads the plain forms of `diff` itself (`read_plain_diff`: FILE, --format, -v, nothing else)
and calls `run_diff` here without importing click; every other command line goes to click
(cli.py), whose `diff` calls the same `run_diff`. tests/test_fast_diff.py holds the reader
equal to click's parser, and both doors' output, exit code and errors equal.

Messages go out through click.echo, imported when there is one to print (an error), so they
leave as they did when everything went through click.
"""

from __future__ import annotations

import errno
import gc
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

EXIT_OK, EXIT_ERROR, EXIT_DRIFT = 0, 1, 2
STATE_LABEL = "reconcile.state_label"  # click context meta key, set by --state-label
# click's shell completion is asked for through this variable (click's `_{PROG}_COMPLETE`).
COMPLETE_VAR = "_RECONCILE_COMPLETE"


def publish(run, sinks: Sequence[Any]) -> bool:
    """Hand a finished run (pipeline/runs.py Finished) to the sinks the command line asked for
    (doors/sinks/: `--textfile DIR` ...), whatever its outcome. False when one could not take it;
    it said why on stderr, and the run exits 1."""
    if not sinks:
        return True
    from .doors.sinks import deliver

    return deliver(run, sinks, lambda message: echo_err(f"reconcile: error: {message}"))


def echo_err(message: str) -> None:
    """A message for stderr, a terminal as often as not: the names and text in it (a file's,
    a unit's, another host's words) have their control characters escaped (core/escape.py); its
    own line breaks stay."""
    import click  # only where there is something to say: the hot path says nothing on stderr

    from .core.escape import escape_controls

    click.echo(escape_controls(message, newlines=True), err=True)


def fail(message: str) -> None:
    echo_err(f"reconcile: error: {message}")
    sys.exit(EXIT_ERROR)


def refuse(refusal, fmt: str, command: str, state_file: str, dry_run: bool = False,
           sinks: Sequence[Any] = (), said: Sequence[str] | None = None) -> None:
    """A run refused before it could report (core/refusals.py: a bad state file, lock held,
    another machine, journal unreadable): its line(s) on stderr, and for --format
    json/junit/prometheus an error report on stdout saying the same (pipeline/report.py
    refusal_doc), so a consumer never gets nothing; the sinks get it too. Exit 1. `said`: the
    lines for stderr, when they are not the refusal's own."""
    if said is None:
        said = list(refusal.problems) or [f"reconcile: error: {refusal.message}"]
    for line in said:
        echo_err(line)
    if fmt != "text" or sinks:
        from .pipeline.runs import finished
        from .views import render

        run = finished(refusal, command, state_file, dry_run=dry_run)
        publish(run, sinks)
        if fmt != "text":
            render(dict(run.doc), fmt)
    exit_now(EXIT_ERROR)


def finish(result, fmt: str, verbose: bool, command: str, state_file: str, dry_run: bool = False,
           sinks: Sequence[Any] = (), out_path: str | None = None) -> int:
    """What a run (pipeline/runs.py) ended with: a refusal is refused (exit 1, here); a report is
    rendered, handed to the sinks, saved as a plan with --out; returns the exit code."""
    from .core.refusals import Refusal
    from .views import render

    if isinstance(result, Refusal):
        refuse(result, fmt, command, state_file, dry_run=dry_run, sinks=sinks)
    render(result, fmt, verbose=verbose)
    ok = True
    if sinks:
        from .pipeline.runs import finished

        ok = publish(finished(result, command, state_file, dry_run=dry_run), sinks)
    if out_path:
        save_plan(result, out_path)
    return result.exit_code if ok else EXIT_ERROR


def resolve_state_file(given: str | None) -> str:
    """FILE, else $RECONCILE_STATE, else states/<short hostname>.yaml, else ./state.yaml."""
    if given:
        return given
    tried = []
    env = os.environ.get("RECONCILE_STATE")
    if env:
        return env
    tried.append("$RECONCILE_STATE (unset)")
    short = os.uname().nodename.split(".", 1)[0]
    for candidate in (f"states/{short}.yaml", "state.yaml"):
        if os.path.isfile(candidate):
            return candidate
        tried.append(candidate)
    fail(f"no state file given and none found; tried {', '.join(tried)}")
    raise AssertionError  # unreachable


def load_state(path: str, prefetch=None, fmt: str = "text", command: str = "diff", dry_run: bool = False,
               state_label: str | None = None, sinks: Sequence[Any] = ()):
    """Load and validate FILE; `-` reads the state from stdin (as a remote target does), shown in
    messages as --state-label NAME (default `<stdin>`), so errors point into the user's own file.
    `prefetch` (engine.Prefetch) starts observing kinds as they are built. A bad state file is one
    line per problem on stderr, and for --format json/junit also an error report on stdout (CI
    stores it: never a 0-byte report)."""
    from .pipeline.statefile import StateFileError, load
    from .pipeline.statefile.text import LIMITS

    label = path
    try:
        if path == "-":
            if state_label is None and "click" in sys.modules:  # click's door: --state-label is in its context
                import click

                ctx = click.get_current_context(silent=True)
                state_label = ctx.meta.get(STATE_LABEL) if ctx else None
            label = state_label or "<stdin>"
            # One byte past the limit at most: `reconcile diff - < /dev/zero` is an error, not a MemoryError.
            state = load(label, text=sys.stdin.buffer.read(LIMITS.max_bytes + 1), on_kind=prefetch)
        else:
            state = load(path, on_kind=prefetch)
        for warning in state.warnings:  # old spellings: stderr only, so stdout stays the report
            echo_err(warning)
        return state
    except StateFileError as exc:
        from .core.refusals import Refusal

        first = exc.problems[0] if exc.problems else "invalid state file"
        refuse(Refusal("state-file", first, problems=tuple(exc.problems)), fmt, command, label, dry_run=dry_run,
               sinks=sinks, said=exc.lines())  # the old spellings' warnings among the problems


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown, which frees every object of every module one by
    one: about 20 ms of a `diff`. Nothing is lost by it here: our own files are written whole and
    closed (atomic writes), observer children are reaped or abandoned on purpose, and only the
    standard streams may hold buffered output."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing more can reach it
            pass
    os._exit(code)


def run_diff(file: str | None, fmt: str, verbose: bool, out_path: str | None, state_label: str | None = None,
             sinks: Sequence[Any] = ()) -> None:
    """`reconcile diff`, once its flags are known; leaves through exit_now."""
    # One short run that leaves through os._exit: the cyclic collector would only walk every
    # module's objects again and again while they are imported (and the forked observers'
    # copies of the pages they sit on). Reference counting still frees what is dropped.
    gc.disable()
    from .local.host import LocalHost
    from .pipeline import runs
    from .pipeline.engine import Prefetch
    from .views.progress import attach

    # Kinds observed in children start while the state is being built; the host carries the
    # progress line when stderr is a terminal (views/progress.py).
    prefetch = Prefetch(attach(LocalHost(), fmt))
    state = load_state(resolve_state_file(file), prefetch, fmt, state_label=state_label, sinks=sinks)
    result = runs.diff(state, prefetch.host, prefetch=prefetch)
    exit_now(finish(result, fmt, verbose, "diff", state.path, sinks=sinks, out_path=out_path))


def save_plan(report, out_path: str) -> None:
    from .core.contract import Status
    from .pipeline.plans import write_plan
    from .pipeline.report import to_json

    if report.count(Status.ERROR):
        # As Terraform: a plan made while part of the host could not be seen is not saved.
        fail(f"no plan saved to {out_path}: {report.count(Status.ERROR)} resource(s) could not be observed")
    try:
        write_plan(to_json(report), report.state_file, out_path)
    except OSError as exc:
        fail(f"cannot write the plan {out_path}: {exc.strerror}")
    echo_err(f"Saved the plan to {out_path}: `reconcile apply {out_path}` carries out exactly these actions.")


def internal_error(exc: BaseException) -> str:
    """The one line for an exception that escaped a command (a bug)."""
    text = str(exc).replace("\n", " ")[:500]
    return (f"reconcile: internal error: {type(exc).__name__}: {text} "
            "(set RECONCILE_DEBUG=1 for the traceback)")


# --- `diff` without click ----------------------------------------------------------------


def read_plain_diff(args: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The arguments after `diff`, when they are only a FILE (`-`: stdin), `--format FORMAT` (or
    `--format=FORMAT`), `-v`/`--verbose` and `--state-label NAME`, in any order, each option at
    most once: run_diff's arguments, as click's parser gives them for the same words. None for
    anything else (`--`, --help, --out, remote options, a mistake): click reads those.

    `--state-label NAME -` is what a remote diff runs on every target (doors/remote.py,
    Request.args): a hundred hosts each save click's import."""
    if COMPLETE_VAR in environ:
        return None
    from .views import FORMATS  # the one table of formats (click's --format choice reads it too)

    file: str | None = None
    fmt: str | None = None
    verbose = False
    label: str | None = None
    words = iter(args)
    for word in words:
        if word in ("-v", "--verbose") and not verbose:
            verbose = True
        elif word == "--state-label" and label is None:
            label = next(words, None)
            if not label or label.startswith("-"):  # click's own reading of these is left to click
                return None
        elif word == "--format" and fmt is None:
            fmt = next(words, None)
            if fmt not in FORMATS:
                return None
        elif word.startswith("--format=") and fmt is None:
            fmt = word[len("--format="):]
            if fmt not in FORMATS:
                return None
        elif word and (word == "-" or not word.startswith("-")) and file is None:
            file = word
        else:
            return None
    return {"file": file, "fmt": fmt or "text", "verbose": verbose, "out_path": None, "state_label": label}


class _QuietOnBrokenPipe:
    """A standard stream whose flush ignores a reader that went away (click's _PacifyFlushWrapper)."""

    def __init__(self, stream: Any):
        self.wrapped = stream

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def diff_without_click(args: dict[str, Any]) -> None:
    """run_diff with what escapes it handled as cli.ReconcileGroup.main (through click's own
    main) handles it: an interrupt is `error: interrupted`, a reader that closed the pipe exits
    1 quietly, a bug is one line (RECONCILE_DEBUG=1: the traceback)."""
    try:
        run_diff(**args)
    except (EOFError, KeyboardInterrupt):
        echo_err("")  # click ends the terminal's ^C line first
        echo_err("reconcile: error: interrupted")
        sys.exit(EXIT_ERROR)
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
            sys.stdout = _QuietOnBrokenPipe(sys.stdout)
            sys.stderr = _QuietOnBrokenPipe(sys.stderr)
            sys.exit(EXIT_ERROR)
        if os.environ.get("RECONCILE_DEBUG"):
            raise
        echo_err(internal_error(exc))
        sys.exit(EXIT_ERROR)


def parse_when(value: str | None, flag: str, now: float) -> float | None:
    """--since/--until: a duration back from now (`2h`, `30m`) or a time (`2026-12-01T09:00:00Z`,
    `2026-12-01 09:00`, read as UTC unless it names its offset)."""
    if value is None:
        return None
    from datetime import datetime, timezone

    from .core.values import parse_duration

    try:
        return now - parse_duration(value)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        fail(f"{flag} {value!r}: give a duration back from now (2h, 30m, 7d) or a time (2026-12-01T09:00:00Z)")
        raise AssertionError from None  # unreachable
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def run_log(journal_path: str | None, since: str | None, until: str | None, resource: str | None,
            run: str | None, fmt: str, verbose: bool = False) -> int:
    """`reconcile log`: the journal (and its rotated files) as a timeline, newest lines read first
    so that --since stops early. A `| head` that closes the pipe ends it quietly."""
    import json
    import time

    from .pipeline.journal import Journal
    from .pipeline.journal_read import Skipped, parse_time, read_newest_first, rotated_files
    from .views import log as logview
    from .views.text import Style

    now = time.time()
    start, end = parse_when(since, "--since", now), parse_when(until, "--until", now)
    path = Journal.at(journal_path).path
    skipped = Skipped()
    try:
        if not any(p.exists() for p in rotated_files(path)):
            echo_err(f"reconcile: warning: no journal at {path} (nothing applied here yet?)")
        picked = []
        for e in read_newest_first(path, since=start, skipped=skipped):
            if start is not None or end is not None:
                t = parse_time(e.get("time"))
                if t is not None and ((start is not None and t < start) or (end is not None and t > end)):
                    continue
            picked.append(e)
    except OSError as exc:
        fail(f"cannot read the journal {getattr(exc, 'filename', None) or path}: {exc.strerror or exc}")
    warnings = skipped.warnings()
    for w in warnings:
        echo_err(f"reconcile: warning: {w}")
    events = logview.timeline(picked, resource=resource, run=run)
    return _show_log(lambda: (json.dumps(logview.render_json(events, str(path), warnings), indent=2) + "\n")
                     if fmt == "json" else logview.render_text(events, sys.stdout, Style(sys.stdout), verbose=verbose))


def _show_log(write) -> int:
    """Run WRITE (it prints, or returns the text to print); a reader that went away (`| head`)
    ends it quietly: nothing more to say, and no traceback at exit either (Python's documented
    recipe: point stdout at /dev/null before the final flush)."""
    try:
        text = write()
        if text:
            sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_OK


def run_log_elsewhere(opts, journal_path: str | None, since: str | None, until: str | None,
                      resource: str | None, run: str | None, fmt: str, verbose: bool) -> int:
    """`reconcile log --host/--via/--inventory`: the targets' own `reconcile log --format json`,
    rendered here. --since and --until are passed on as given (a duration counts back from the
    target's clock). Every host of an inventory has an entry, the unreachable ones with their
    error; exit 1 when any host's journal could not be read."""
    import json

    from .doors import remote, remote_log
    from .pipeline.statefile import StateFileError
    from .views import log as logview
    from .views.text import Style

    args = [a for flag, value in (("--since", since), ("--until", until), ("--resource", resource), ("--run", run))
            if value for a in (flag, value)]
    if opts.inventory:
        try:
            hosts = remote_log.fetch_inventory(opts.inventory, opts.limit, opts, args)
        except remote.RemoteError as exc:
            fail(str(exc))
        except StateFileError as exc:  # the inventory itself: FILE:LINE:COL lines
            echo_err(str(exc))
            return EXIT_ERROR
        for name, _doc, warnings, error in hosts:
            for w in warnings:
                echo_err(f"{name}: {w}")
            if error:
                echo_err(f"reconcile: error: {name}: {error}")

        def write():
            if fmt == "json":
                entries = [{"name": n, "error": err} if err else
                           {"name": n, "journal": d.get("journal"), "warnings": d.get("warnings", []),
                            "events": d.get("events", [])} for n, d, _w, err in hosts]
                return json.dumps({"format_version": logview.LOG_FORMAT_VERSION, "hosts": entries}, indent=2) + "\n"
            from .core.escape import escape_controls as esc

            style = Style(sys.stdout)
            for n, d, _w, err in hosts:
                sys.stdout.write(style(f"== {esc(n)}", "bold") + (f"  {esc(d.get('journal'))}" if d else "") + "\n")
                if err:
                    sys.stdout.write(style(f"cannot read its journal: {esc(err)}", "red") + "\n")
                else:
                    logview.render_text(d["events"], sys.stdout, style, verbose=verbose)
            return ""
        _show_log(write)
        return EXIT_ERROR if any(err for *_x, err in hosts) else EXIT_OK
    try:
        target = remote.make_target(opts)
        doc, warnings = remote_log.fetch(target, args, journal=journal_path)
    except remote.RemoteError as exc:
        fail(str(exc))
        raise AssertionError from None  # unreachable
    for w in warnings:
        echo_err(w)
    return _show_log(lambda: (json.dumps({**doc, "host": target.name}, indent=2) + "\n") if fmt == "json"
                     else logview.render_text(doc["events"], sys.stdout, Style(sys.stdout), verbose=verbose))
