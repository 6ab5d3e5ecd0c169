"""The command line: parse flags, pick the state file and the output, call the engine. Nothing else.

Heavy modules (jsonschema, ruamel.yaml, pynvml, deepdiff) are imported by the code that
needs them, never here, so `reconcile diff` on a validated state file starts fast.
"""

from __future__ import annotations

import os
import sys

import click

from . import FORMAT_VERSION, __version__, views

# The steps the commands share, and `diff` itself, are in commands.py: click-free, so that
# __main__.py runs the plain `reconcile diff FILE` without importing click.
from .commands import (  # noqa: F401  (EXIT_DRIFT, exit_now: the commands' names, kept here)
    EXIT_DRIFT,
    EXIT_ERROR,
    EXIT_OK,
    STATE_LABEL,
    echo_err,
    exit_now,
    fail,
    finish,
    internal_error,
    load_state,
    resolve_state_file,
    run_diff,
)


def parse_duration_option(value: str, flag: str) -> float:
    from .core.values import parse_duration

    try:
        return parse_duration(value)
    except ValueError:
        fail(f"{flag}: invalid duration {value!r} (use e.g. 30s, 5m)")
        raise AssertionError from None


FORMATS = click.Choice(list(views.FORMATS))  # the one table of formats (views/__init__.py)

# A path, for shell completion only (click completes files for a Path): reconcile reads and
# judges the file itself (a FIFO, a directory, an unreadable file: one FILE:LINE:COL line).
STATE_PATH = click.Path(readable=False)

# Which FILE a command reads when none is given (commands.resolve_state_file), for its --help.
WHICH_FILE = ("Without FILE: $RECONCILE_STATE, else states/<short hostname>.yaml, else ./state.yaml "
              "(the first that exists).")


def _names_which_file(fn):
    fn.__doc__ = fn.__doc__.format(which=WHICH_FILE)
    return fn


class ReconcileGroup(click.Group):
    """Exit codes are a contract (0 ok, 1 error, 2 drift): a usage mistake is an error, exit 1 with
    one line, never click's exit 2, which a CI audit would read as drift. Any exception that escapes
    a command is one line `reconcile: internal error: ...` and exit 1; RECONCILE_DEBUG=1 shows the
    traceback."""

    def main(self, args=None, prog_name=None, **extra):  # noqa: D102
        try:
            code = super().main(args, prog_name or "reconcile", standalone_mode=False, **extra)
        except click.UsageError as exc:
            cmd = exc.ctx.command_path if exc.ctx else "reconcile"
            if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:  # bare `reconcile`
                click.echo(exc.ctx.get_help(), err=True)
                sys.exit(EXIT_ERROR)
            echo_err(f"reconcile: error: {exc.format_message()} (see '{cmd} --help')")
            code = EXIT_ERROR
        except click.ClickException as exc:
            echo_err(f"reconcile: error: {exc.format_message()}")
            code = EXIT_ERROR
        except click.Abort:
            click.echo("reconcile: error: interrupted", err=True)
            code = EXIT_ERROR
        except KeyboardInterrupt:
            code = 130
        except Exception as exc:
            if os.environ.get("RECONCILE_DEBUG"):
                raise
            echo_err(internal_error(exc))
            code = EXIT_ERROR
        sys.exit(code if isinstance(code, int) else EXIT_OK)


@click.group(cls=ReconcileGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", message=f"reconcile %(version)s (report format {FORMAT_VERSION})")
def main() -> None:
    """Declarative state reconciliation for GPU / ML hosts.

    Describe the host in a YAML state file; `diff` shows what differs and what would be
    done, `apply` does it and verifies the result by observing again.
    """


@main.command()
@click.argument("files", nargs=-1, required=True, type=STATE_PATH)
def validate(files: tuple[str, ...]) -> None:
    """Check state FILES (`-`: the state on standard input); print FILE:LINE:COL: message for
    each problem."""
    from .pipeline.statefile import StateFileError, load
    from .pipeline.statefile.text import LIMITS

    bad = 0
    for f in files:
        try:
            # `-`: as diff reads it, at most one byte past the limit
            state = load("<stdin>", text=sys.stdin.buffer.read(LIMITS.max_bytes + 1)) if f == "-" else load(f)
        except StateFileError as exc:
            bad += 1
            for line in exc.lines():  # problems, and the old spellings' warnings among them
                echo_err(line)
            continue
        for warning in state.warnings:  # old spellings: valid, said (exit 0)
            echo_err(warning)
    if bad:
        sys.exit(EXIT_ERROR)
    click.echo(f"{len(files)} state file{'s' if len(files) != 1 else ''} valid")


def _output_options(fn):
    fn = click.option("--format", "fmt", type=FORMATS, default="text", show_default=True,
                      help="Output format; json follows the format_version contract.")(fn)
    fn = click.option("-v", "--verbose", is_flag=True, help="Also show what is already right.")(fn)
    return fn


def _sink_options(command: str):
    """The options of the sinks that serve COMMAND (doors/sinks/: `--textfile DIR` ...), as each
    sink declares them; the command gets their values as `sink_options` (sink name -> flag ->
    value) and makes the sinks asked for with _sinks."""
    import functools

    from .doors.sinks import options_for

    offered = [(name, opt, f"sink_{name}_{opt.flag.lstrip('-')}".replace("-", "_"))
               for name, opt in options_for(command)]

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(**kw):
            values: dict[str, dict[str, object]] = {}
            for name, opt, param in offered:
                values.setdefault(name, {})[opt.flag] = kw.pop(param)
            return fn(**kw, sink_options=values)

        for _name, opt, param in reversed(offered):
            wrapper = click.option(opt.flag, param, metavar=opt.metavar, help=opt.help,
                                   type=click.Path(file_okay=False) if opt.directory else None)(wrapper)
        return wrapper

    return decorate


def _sinks(command: str, sink_options: dict, **context) -> list:
    """The sinks the command line asked for; a bad combination of their options is one line, exit 1."""
    from .doors.sinks import SinkError, build

    try:
        return build(command, sink_options, **context)
    except SinkError as exc:
        fail(str(exc))
        raise AssertionError from None  # unreachable


RECHECK_HELP = ("Read every checkpoint step again, whatever its check record says (docs/checkpoints.md, "
                "\"Check records\"); the records are rewritten from what is read.")


def _recheck(on: bool) -> None:
    """--recheck: the observers (forked children) see it as $RECONCILE_RECHECK
    (reconcilers/checkpoints/records.py RECHECK_ENV), set before any observation starts."""
    if on:
        os.environ["RECONCILE_RECHECK"] = "1"


REMOTE_KEYS = ("host", "via", "remote_command", "ssh_options", "connect_timeout", "remote_timeout",
               "inventory", "limit", "parallel", "report_dir")
LOCAL_KEYS = ("file", "fmt", "verbose", "dry_run", "journal_path", "lock_timeout")


def _remote_options(fn):
    """Run on other machines instead (doors/remote.py, doors/inventory.py): --host, --via,
    --inventory and their settings; also --state-label, which the far side is called with."""
    import functools

    @functools.wraps(fn)
    def wrapper(**kw):
        ctx = click.get_current_context()
        label = kw.pop("state_label")
        if label:
            ctx.meta[STATE_LABEL] = label
        picked = {k: kw.pop(k) for k in REMOTE_KEYS}
        if not (picked["host"] or picked["via"] or picked["inventory"]):
            if picked["limit"] or picked["report_dir"]:
                fail("--limit and --report-dir need --inventory")
            return fn(**kw)
        from click.core import ParameterSource

        from . import doors
        from .doors import remote

        given = {k for k in kw if ctx.get_parameter_source(k) in (ParameterSource.COMMANDLINE,
                                                                 ParameterSource.ENVIRONMENT)}
        # Options of diff/apply that have no meaning on a target are refused, not silently dropped.
        opts = remote.RemoteOptions(**{**picked, "ssh_options": tuple(picked["ssh_options"])},
                                    extra={p.opts[0]: kw[p.name] for p in ctx.command.params
                                           if p.name in given and p.name not in LOCAL_KEYS})
        sys.exit(doors.run_elsewhere(fn.__name__, kw.get("file"), kw["fmt"], kw["verbose"], opts,
                             dry_run=kw.get("dry_run", False), journal=kw.get("journal_path"),
                             lock_timeout=kw.get("lock_timeout") if "lock_timeout" in given else None))

    for decorator in reversed([
        click.option("--host", metavar="ssh://[USER@]HOST[:PORT]",
                     help="Run on this host over SSH (the OpenSSH client): the state file goes there, "
                          "its reconcile observes and acts, the report comes back."),
        click.option("--via", metavar="'CMD ...'",
                     help="Run on a target reached through this command prefix, e.g. "
                          "'ssh root@pve pct exec 129 --' or 'nsenter -t PID -m -p'."),
        click.option("--inventory", type=click.Path(dir_okay=False), metavar="HOSTS.yaml",
                     help="Run on every host of this inventory, in parallel, with a summary table."),
        click.option("--limit", metavar="PATTERN[,PATTERN]",
                     help="Only inventory hosts whose name or group matches a pattern (fnmatch)."),
        click.option("--parallel", type=click.IntRange(1, 256), default=10, show_default=True,
                     help="Inventory hosts worked on at once."),
        click.option("--report-dir", type=click.Path(file_okay=False),
                     help="Also write each inventory host's JSON report to DIR/HOST.json."),
        click.option("--remote-command", metavar="'CMD ...'",
                     help="How to start reconcile on the target [default: reconcile], e.g. "
                          "'python3 -m reconcile_host'."),
        click.option("--ssh-option", "ssh_options", multiple=True, metavar="KEY=VALUE",
                     help="Extra ssh -o option, repeatable; taken before reconcile's own defaults. "
                          "$RECONCILE_SSH_OPTS adds raw ssh arguments (e.g. '-F FILE -i KEY')."),
        click.option("--connect-timeout", metavar="DURATION",
                     help="Give up on a target that does not answer within this [default: 10s]."),
        click.option("--remote-timeout", metavar="DURATION",
                     help="Give up on a run on the target after this [default: 1h]."),
        click.option("--state-label", metavar="NAME",
                     help="With FILE '-' (state on stdin): the file name shown in messages and the report."),
    ]):
        wrapper = decorator(wrapper)
    return wrapper


@main.command()
@click.argument("file", required=False, type=STATE_PATH)
@_output_options
@_remote_options
@_sink_options("diff")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="Also save the plan to this file; `reconcile apply PLAN` carries out exactly its actions, "
                   "and refuses when the host no longer matches it.")
@click.option("--recheck", is_flag=True, help=RECHECK_HELP)
@_names_which_file
def diff(file: str | None, fmt: str, verbose: bool, out_path: str | None, recheck: bool,
         sink_options: dict) -> None:
    """Show drift and the planned actions; change nothing.

    FILE is the state file (`-`: standard input). {which}

    Exit 0: no drift; 2: drift; 1: error.
    """
    _recheck(recheck)
    sinks = _sinks("diff", sink_options)
    # commands.py: the same call as __main__.py's, without click
    run_diff(file, fmt, verbose, out_path, sinks=sinks)


@main.command()
@click.argument("file", required=False, type=STATE_PATH)
@_output_options
@_remote_options
@_sink_options("apply")
@click.option("--dry-run", is_flag=True, help="Plan only, as diff does; take no lock, change nothing.")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False),
              help="Journal file (default /var/lib/reconcile/journal.jsonl as root, "
                   "$XDG_STATE_HOME/reconcile/journal.jsonl otherwise). The lock file sits beside it.")
@click.option("--lock-timeout", default="0s", show_default=True, metavar="DURATION",
              help="Wait this long for another apply to finish instead of failing at once.")
@click.option("--recheck", is_flag=True, help=RECHECK_HELP)
@_names_which_file
def apply(file: str | None, fmt: str, verbose: bool, dry_run: bool, journal_path: str | None,
          lock_timeout: str, recheck: bool, sink_options: dict) -> None:
    """Act until the host matches the state file, then verify by observing again.

    FILE is the state file (`-`: standard input). {which} It may also be a plan saved by
    `diff --out`: its actions are carried out and nothing else, or none at all (exit 1) when the
    state file or the host changed since.

    Exit 0: every resource ok (or converging as intended); 2: drift remains;
    1: an error (bad input, lock held, wrong host, a resource that cannot be observed).
    """
    from .pipeline import runs

    _recheck(recheck)
    sinks = _sinks("apply", sink_options)
    wait = parse_duration_option(lock_timeout, "--lock-timeout")
    path = resolve_state_file(file)
    from .pipeline.plans import is_saved_plan

    if is_saved_plan(path):  # `reconcile diff --out PLAN` wrote it: its actions and nothing else
        from .pipeline.plans import apply_saved_plan

        result = apply_saved_plan(path, dry_run=dry_run, journal_path=journal_path, lock_wait=wait)
        sys.exit(finish(result, fmt, verbose, "apply", path, dry_run=dry_run, sinks=sinks))
    from .local.host import LocalHost
    from .views.progress import attach

    host = attach(LocalHost(), fmt)  # the progress line on a terminal (views/progress.py)
    if dry_run:
        # Observing may start while the state is built only when nothing will be changed: apply
        # proper observes after taking its lock, so it never acts on what another apply changed.
        from .pipeline.engine import Prefetch

        prefetch = Prefetch(host)
        state = load_state(path, prefetch, fmt, "apply", dry_run, sinks=sinks)
        from .pipeline.journal import Journal

        result = runs.diff(state, prefetch.host, command="apply", prefetch=prefetch,
                           history_path=Journal.at(journal_path).path)
    else:
        from .pipeline.journal import Journal

        state = load_state(path, None, fmt, "apply", dry_run, sinks=sinks)
        result = runs.apply(state, host, Journal.at(journal_path), wait)  # runs.py takes the lock
    sys.exit(finish(result, fmt, verbose, "apply", state.path, dry_run=dry_run, sinks=sinks))


@main.command("log")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False),
              help="Journal file, as for apply (its rotated files journal.jsonl.1, .2 ... are read too).")
@click.option("--since", metavar="2h|TIME", help="Only from then: a duration back from now, or a time (UTC).")
@click.option("--until", metavar="2h|TIME", help="Only until then.")
@click.option("--resource", metavar="ID", help="Only this resource's actions (e.g. unit:vllm.service).")
@click.option("--run", "run_id", metavar="ID", help="Only this apply run (its id, or the start of it).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Every observed change, not only the first few.")
@click.option("--host", metavar="ssh://[USER@]HOST[:PORT]", help="Read this host's journal, over SSH.")
@click.option("--via", metavar="'CMD ...'", help="Read the journal of the target reached through this prefix.")
@click.option("--inventory", type=click.Path(dir_okay=False), metavar="HOSTS.yaml",
              help="Read the journal of every host of this inventory (each host's `journal:` if it names one).")
@click.option("--limit", metavar="PATTERN[,PATTERN]", help="Only inventory hosts whose name or group matches.")
@click.option("--remote-command", metavar="'CMD ...'", help="How to start reconcile on the target.")
@click.option("--ssh-option", "ssh_options", multiple=True, metavar="KEY=VALUE", help="Extra ssh -o option.")
@click.option("--connect-timeout", metavar="DURATION", help="Give up on a target that does not answer within this.")
def log_command(journal_path: str | None, since: str | None, until: str | None, resource: str | None,
                run_id: str | None, fmt: str, verbose: bool, host: str | None, via: str | None,
                inventory: str | None, limit: str | None, remote_command: str | None,
                ssh_options: tuple[str, ...], connect_timeout: str | None) -> None:
    """Show the journal as a timeline: apply runs and their actions, watch passes, Slurm health runs.

    An action whose intent was recorded but not its result (the run was killed while it ran) is
    shown as one that may or may not have happened."""
    from .commands import run_log

    if host or via or inventory:
        from .commands import run_log_elsewhere
        from .doors.remote import RemoteOptions

        opts = RemoteOptions(host=host, via=via, inventory=inventory, limit=limit, remote_command=remote_command,
                             ssh_options=ssh_options, connect_timeout=connect_timeout)
        sys.exit(run_log_elsewhere(opts, journal_path, since, until, resource, run_id, fmt, verbose))
    if limit:
        fail("--limit needs --inventory")
    sys.exit(run_log(journal_path, since, until, resource, run_id, fmt, verbose))


@main.command("ack")
@click.option("--gpu", metavar="UUID|BUS_ID", help="The GPU that was serviced (its UUID, or its PCI bus id) "
                                                    "[default: the node].")
@click.option("--reason", required=True, metavar="WHY", help="What was done (reseated, RMA, firmware updated).")
@click.option("--by", metavar="WHO", help="Who did it [default: $SUDO_USER, else $USER].")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False), help="Journal file, as for apply.")
def ack_command(gpu: str | None, reason: str, by: str | None, journal_path: str | None) -> None:
    """Say that a GPU fault was serviced: journaled with who and why; the recovery caps and latched
    faults of that GPU (or, without --gpu, of the node and every GPU, and a failed validation gate)
    start again (docs/gpus.md#recovery)."""
    from .local.host import LocalHost
    from .pipeline.journal import Journal
    from .pipeline.recoveries import GPU_ID_RE, ack, default_by

    if gpu is not None and not GPU_ID_RE.match(gpu.strip()):
        fail(f"--gpu: {gpu!r} is neither a GPU UUID (GPU-...) nor a PCI bus id (00000000:41:00.0)")
    if not reason.strip():
        fail("--reason: say what was done")
    journal = Journal.at(journal_path)
    try:
        line = ack(journal, reason.strip(), (by or default_by()).strip(), gpu.strip() if gpu else None,
                   LocalHost().machine())
    except OSError as exc:
        fail(f"cannot write the journal {journal.path}: {exc.strerror or exc}")
        return
    what = f"GPU {line['gpu']}" if line["gpu"] else "the node and its GPUs"
    from .core.escape import escape_controls

    click.echo(escape_controls(f"acknowledged by {line['by']} at {line['time']}: {what}: {line['reason']} "
                               "(the recovery caps and latched faults start again)"))


@main.command("version")
@click.option("--json", "as_json", is_flag=True, help="As JSON (the handshake of --host and --via).")
def version_command(as_json: bool) -> None:
    """Print reconcile's version and its report format version."""
    if not as_json:
        click.echo(f"reconcile {__version__} (report format {FORMAT_VERSION})")
        return
    import json

    from . import version_document

    click.echo(json.dumps(version_document()))  # __main__.py prints the same without click


@main.command()
def schema() -> None:
    """Print the JSON Schema of the state file (for editors and CI); old spellings are marked deprecated."""
    import json

    from .pipeline.statefile import editor_schema

    click.echo(json.dumps(editor_schema(), indent=2))


@main.command()
@click.argument("file", required=False, type=STATE_PATH)
@click.option("--interval", default="60s", show_default=True, metavar="DURATION",
              help="Time between passes (e.g. 30s, 5m).")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False),
              help="Journal file, as for apply; the lock file sits beside it.")
@click.option("--lock-timeout", default="30s", show_default=True, metavar="DURATION",
              help="How long a pass waits for another apply to finish before skipping this pass.")
@click.option("-v", "--verbose", is_flag=True, help="Log every pass, not only those whose outcome changed.")
@_sink_options("watch")
@_names_which_file
def watch(file: str | None, interval: str, journal_path: str | None, lock_timeout: str, verbose: bool,
          sink_options: dict) -> None:
    """Keep the host converged: observe, apply, verify every INTERVAL.

    FILE is the state file. {which} Re-reads it when it changes; backs off after errors (up
    to 10 minutes); on SIGTERM or SIGINT stops after the current step and exits 0.
    """
    from .doors.sinks import fan_out
    from .pipeline.journal import Journal
    from .pipeline.watch import Watcher

    every = parse_duration_option(interval, "--interval")
    if every <= 0:
        fail("--interval must be more than 0s")
    wait = parse_duration_option(lock_timeout, "--lock-timeout")
    journal = Journal.at(journal_path)
    sinks = _sinks("watch", sink_options, interval=every)
    watcher = Watcher(resolve_state_file(file), every, journal, lock_wait=wait, verbose=verbose,
                      on_pass=fan_out(sinks) if sinks else None)
    sys.exit(watcher.run())


@main.command("slurm-health")
@click.argument("file", required=False, type=STATE_PATH)
@click.option("--node", metavar="NAME", help="The Slurm node [default: $SLURMD_NODENAME, else the short host name].")
@click.option("--apply", "do_apply", is_flag=True, help="Apply the state first (under the apply lock), then judge.")
@click.option("--deadline", default="45s", show_default=True, metavar="DURATION",
              help="Whole-run limit, below Slurm's 60 s and the HealthCheckInterval; no verdict by then drains.")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False),
              help="Journal file, as for apply: one line per run goes there; the run's lock sits beside it.")
@click.option("--scontrol", default="/usr/bin/scontrol", show_default=True, metavar="PATH",
              help="The scontrol to call.")
@click.option("--max-drained", default="50%", show_default=True, metavar="N|P%",
              help="Fleet guard: never drain while this many (or this share) of a partition of the node is "
                   "already drained or down; 100% turns it off.")
@click.option("--textfile", metavar="DIR", type=click.Path(file_okay=False),
              help="Also write DIR/reconcile-slurm-health.prom for node_exporter's textfile collector.")
@_names_which_file
def slurm_health(file: str | None, node: str | None, do_apply: bool, deadline: str, journal_path: str | None,
                 scontrol: str, max_drained: str, textfile: str | None) -> None:
    """Slurm's HealthCheckProgram: drain the node when a resource is blocked or cannot be
    observed, resume it once converged if reconcile drained it (doors/slurm.py).

    FILE is the state file. {which}

    Exit 0: healthy (or another run in progress); 1: not healthy, or Slurm could not be told.
    """
    from .doors import slurm

    slurm.prepare_environment()
    limit = parse_duration_option(deadline, "--deadline")
    if not 1 <= limit < 60:
        fail("--deadline must be at least 1s and below 60s (slurmd kills a health check after 60 s)")
    try:
        guard = slurm.parse_max_drained(max_drained)
    except ValueError as exc:
        fail(f"--max-drained: {exc}")
    if textfile and not os.path.isdir(textfile):
        fail(f"--textfile {textfile}: no such directory (node_exporter's --collector.textfile.directory)")
    sys.exit(slurm.health_check(slurm.Settings(resolve_state_file(file), slurm.node_name(node), journal_path,
                                               limit, do_apply, scontrol, max_drained=guard, textfile=textfile)))


if __name__ == "__main__":
    main()
