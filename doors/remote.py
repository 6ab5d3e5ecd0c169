"""Running reconcile on another machine: over SSH (`--host ssh://...`) or behind any exec prefix
(`--via "pct exec 129 --"`, `--via "nsenter -t PID -m -p"`).

The target runs its own reconcile: everything (systemd, NVML, mounts) is observed where it
lives, by the same code as a local run, and the target's own lock and journal guard and
record its apply. Here we only carry bytes: the state file goes to the far side's stdin
(`reconcile diff --format json --state-label FILE -`), the JSON report comes back and is
rendered here by the same renderer as a local report, so output and exit codes match.

A read-only request (`diff`, `apply --dry-run`) is one round trip: the report names the far
side's versions, and a target without reconcile, with an older one or with an incompatible
report format is recognised from that one answer and gets one clear line instead of a
far-side traceback. An `apply` that changes the host asks first (`reconcile version --json`,
the handshake): nothing is changed on a target whose reconcile this one cannot read, and the
target names its journal for the message should the connection drop mid-apply.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .. import FORMAT_VERSION, __version__
from ..local.host import kill_group

# The errors live apart (remote_errors.py); named here too, where every caller looks for them.
from .remote_errors import RemoteError, RemoteFailed, echo_err, refusal_reason  # noqa: F401

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_REMOTE_COMMAND = "reconcile"
# The far side starts Python and imports reconcile after connecting: allow for a slow host.
HANDSHAKE_GRACE = 30.0
# A dead peer is noticed after SERVER_ALIVE_INTERVAL * SERVER_ALIVE_COUNT seconds of silence.
SERVER_ALIVE_INTERVAL, SERVER_ALIVE_COUNT = 15, 3
CONTROL_PERSIST = 60
SSH_OPTS_ENV = "RECONCILE_SSH_OPTS"
# reconcile-host is not on PyPI: the hint names what works, a wheel of this very version or a git URL.
INSTALL_HINT = (f"install it there: build a wheel of this reconcile ({__version__}) with `python3 -m pip wheel "
                "--no-deps -w dist /path/to/your/reconcile/checkout`, copy dist/reconcile_host-*.whl there and "
                "`python3 -m pip install` it (or `python3 -m pip install 'reconcile-host @ git+URL-OF-YOUR-CLONE'`), "
                "or name it with --remote-command, e.g. --remote-command 'python3 -m reconcile_host'")


# --- targets -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """How to start a command on the target: `prefix + remote command + args`."""

    name: str                       # for messages: root@kpro6:22, or the via prefix
    prefix: tuple[str, ...]
    remote_command: tuple[str, ...] = (DEFAULT_REMOTE_COMMAND,)
    shells: int = 0                 # remote shells the command line passes through (remote_shells())
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    short_host: str = ""            # host part, for the default state file name (before the handshake)
    host_key_file: str | None = None  # where ssh's KnownHostsCommand leaves the key it verified

    def argv(self, args: Sequence[str]) -> list[str]:
        words = [*self.remote_command, *args]
        if not self.shells:
            return [*self.prefix, *words]
        # ssh hands its command words to the remote shell joined by spaces: quoted once for each
        # shell that parses them (`ssh jump ssh inner`: the jump host's, then the inner one's).
        line = shlex.join(words)
        for _ in range(self.shells - 1):
            line = shlex.quote(line)
        return [*self.prefix, line]


# Clients that hand their command words to a shell on the far side, joined by spaces (ssh(1):
# "command ... is executed on the remote host instead of a login shell"; autossh passes its
# arguments to ssh; rsh/slogin are the same contract). docs/remote.md, `--via`, says so.
REMOTE_SHELL_CLIENTS = frozenset({"ssh", "autossh", "rsh", "slogin"})


def remote_shells(prefix: Sequence[str]) -> int:
    """How many remote shells a --via prefix's appended words pass through: one per word of the
    prefix that names a remote-shell client (by its file name: `/usr/bin/ssh` too), wherever it
    stands, so `timeout 30 ssh HOST`, `sshpass -p X ssh HOST`, `autossh -M 0 HOST` and
    `ssh root@pve pct exec 129 --` are all quoted for the far side's shell. A word that names one
    and is not one (a user or container called `ssh`) quotes the words once too many: the target
    then fails to find the command, it never runs words split apart."""
    return sum(1 for word in prefix if Path(word).name in REMOTE_SHELL_CLIENTS)


def parse_address(address: str) -> tuple[str | None, str, int | None]:
    """ssh://[user@]host[:port] -> (user, host, port). Raises ValueError with a readable reason."""
    if not address.startswith("ssh://"):
        raise ValueError(f"invalid host {address!r}: expected ssh://[user@]host[:port]")
    parts = urlsplit(address)
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.password:
        raise ValueError(f"invalid host {address!r}: expected ssh://[user@]host[:port], nothing more")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"invalid host {address!r}: the port must be a number from 1 to 65535") from None
    if not parts.hostname:
        raise ValueError(f"invalid host {address!r}: no host name")
    return parts.username or None, parts.hostname, port


def control_dir() -> str | None:
    """A private directory for ssh's connection-sharing sockets, or None (no sharing) when none can
    be had safely: owned by us, mode 0700, a real directory, and short enough for a socket path."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(runtime) / "reconcile-ssh" if runtime else Path(tempfile.gettempdir()) / f"reconcile-ssh-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    # %C expands to 40 hex digits; sun_path holds 108 bytes.
    return str(path) if len(str(path)) + 41 < 100 else None


# OpenSSH 9.9 added mlkem768x25519-sha256, post-quantum like sntrup761x25519 and far cheaper to
# compute (sntrup761's key generation is most of the client's CPU for a connection, about 100 ms
# a host on the fleet benchmark: docs/benchmark.md); 10.0 makes it the default. On 9.9 we put it
# first. On 9.0-9.8 the client's own default (sntrup761x25519) stands: trading the post-quantum
# protection of every connection for controller CPU is the user's call, made with
# `--ssh-option KexAlgorithms=^curve25519-sha256` (docs/remote.md). `^` (ssh_config(5)
# KexAlgorithms) keeps the rest of the default list after it.
FAST_KEX = {(9, 9): "^mlkem768x25519-sha256"}


@functools.cache
def ssh_client_version() -> tuple[int, int] | None:
    """The local OpenSSH client's (major, minor), from `ssh -V` (once per process), or None."""
    try:
        out = subprocess.run(["ssh", "-V"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(rb"OpenSSH_(\d+)\.(\d+)", out.stderr + out.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def fast_kex(version: tuple[int, int] | None) -> str | None:
    """The KexAlgorithms to ask for a cheap post-quantum key exchange with this client, or None
    (its default stands)."""
    if version is None or not (9, 9) <= version < (10, 0):
        return None  # before 9.9 mlkem768x25519 is not there; from 10.0 it is the default
    return FAST_KEX[(9, 9)]


def ssh_target(address: str, ssh_options: Sequence[str] = (), connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
               remote_command: str | None = None) -> Target:
    user, host, port = parse_address(address)
    # ssh takes the first value it sees for an option: the user's go before our defaults.
    argv = ["ssh", *shlex.split(os.environ.get(SSH_OPTS_ENV, ""))]
    for opt in ssh_options:
        argv += ["-o", opt]
    defaults = {
        "BatchMode": "yes",  # never prompt: a password or host-key question would hang a parallel run
        "ConnectTimeout": str(max(1, int(-(-connect_timeout // 1)))),
        "ServerAliveInterval": str(SERVER_ALIVE_INTERVAL),
        "ServerAliveCountMax": str(SERVER_ALIVE_COUNT),
        "LogLevel": "ERROR",
    }
    kex = fast_kex(ssh_client_version())
    if kex:
        defaults["KexAlgorithms"] = kex  # the user's -o KexAlgorithms, given before, wins
    cdir = control_dir()
    key_file = None
    if cdir:
        defaults.update(ControlMaster="auto", ControlPath=f"{cdir}/%C", ControlPersist=str(CONTROL_PERSIST))
        # Which host key this connection was verified with (the report names it): ssh runs
        # KnownHostsCommand with the key it is verifying (%t type, %f SHA256 fingerprint; ssh_config(5)),
        # and takes what it prints as extra known_hosts lines: it prints nothing, only leaves the key
        # in a file of ours. A shared connection is verified once, by its master: the file is named
        # after this target's ssh command line, so a later run sharing the connection finds it.
        digest = hashlib.sha256("\0".join(argv + [str(port), user or "", host]).encode()).hexdigest()[:20]
        key_file = f"{cdir}/{digest}.hostkey"
        defaults["KnownHostsCommand"] = f"/bin/sh -c 'echo \"$1 $2\" > \"$3\"' reconcile-hostkey %t %f {key_file}"
    else:
        defaults["ControlMaster"] = "no"
    for key, value in defaults.items():
        argv += ["-o", f"{key}={value}"]
    if port:
        argv += ["-p", str(port)]
    # IPv6 literals go to ssh without brackets.
    argv += ["--", f"{user}@{host}" if user else host]
    name = f"{user + '@' if user else ''}{host}{f':{port}' if port else ''}"
    return Target(name, tuple(argv), _split_remote(remote_command), shells=1,
                  connect_timeout=connect_timeout, short_host=host.split(".", 1)[0], host_key_file=key_file)


def host_key(target: Target) -> str | None:
    """The host key ssh verified for this target (`ssh-ed25519 SHA256:...`), or None: not ssh,
    not known (the user's own KnownHostsCommand, no private directory for the file)."""
    if not target.host_key_file:
        return None
    try:
        with open(target.host_key_file, encoding="utf-8") as f:
            return f.readline().strip() or None
    except OSError:
        return None


def name_machine(doc: dict[str, Any], target: Target) -> dict[str, Any]:
    """The report with the host key this side connected to added to its `machine`."""
    key = host_key(target)
    if key:
        machine = doc.get("machine")
        if not isinstance(machine, dict):
            machine = doc["machine"] = {"hostname": doc.get("host"), "machine_id": None, "boot_id": None}
        machine["ssh_host_key"] = key
    return doc


def via_target(via: str, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
               remote_command: str | None = None) -> Target:
    try:
        prefix = tuple(shlex.split(via))
    except ValueError as exc:
        raise ValueError(f"--via {via!r}: {exc}") from None
    if not prefix:
        raise ValueError("--via: empty command prefix")
    return Target(via, prefix, _split_remote(remote_command), shells=remote_shells(prefix),
                  connect_timeout=connect_timeout)


def _split_remote(command: str | None) -> tuple[str, ...]:
    words = tuple(shlex.split(command or DEFAULT_REMOTE_COMMAND))
    if not words:
        raise ValueError("--remote-command: empty command")
    return words


# --- running a command on the target ---------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class Deadline(Exception):
    pass


def _run(argv: list[str], stdin: bytes | None, timeout: float) -> Outcome:
    """Run to completion or kill the whole process group at the deadline."""
    if not shutil.which(argv[0]):
        raise RemoteError(f"{argv[0]}: command not found here (needed to reach the target)")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise Deadline from None
    except BaseException:  # Ctrl-C: do not leave the client running on its own
        kill_group(proc)
        raise
    return Outcome(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                   time.monotonic() - t0)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _json_object(text: str) -> dict[str, Any] | None:
    """The JSON object on stdout; a login script's chatter before it (a banner, a `echo` in
    .bashrc) is skipped: the object starts at the first line that opens with `{`."""
    start = 0 if text.startswith("{") else text.find("\n{") + 1
    if not text or (start == 0 and not text.startswith("{")):
        return None
    try:
        doc, _ = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


# --- the handshake ----------------------------------------------------------------------

@dataclass(frozen=True)
class RemoteInfo:
    reconcile_version: str
    format_version: str
    hostname: str = ""
    journal: str = ""  # the target's default journal path


def _not_installed(target: Target, out: Outcome) -> bool:
    err = out.stderr
    cmd = target.remote_command[0]
    if out.returncode == 127 or "No module named reconcile" in err or "No module named 'reconcile'" in err:
        return True
    return cmd in err and any(s in err for s in ("not found", "No such file or directory", "failed to execute"))


# What ssh's last line says when an established connection went away (as opposed to one
# never made: "connect to host ...", "kex_exchange_identification: ...", "Permission denied",
# all printed at LogLevel ERROR). With our LogLevel=ERROR a closed connection prints nothing:
# an exit 255 with an empty stderr is a connection lost, too.
SSH_LOST = re.compile(r"^(Connection to \S+ closed|Timeout, server \S+ not responding"
                      r"|client_loop: |packet_write_wait: )")


def needs_handshake(command: str, dry_run: bool) -> bool:
    """Only a run that changes the target asks first; a read-only one learns the far side's
    versions from its report (see the module's docstring)."""
    return command == "apply" and not dry_run


def _first_contact_error(target: Target, out: Outcome, asked: str) -> RemoteError | None:
    """Why the first command sent to the target got no report: unreachable, no reconcile there, or
    one too old to know the request. None: it reached a reconcile (or the connection dropped
    after it was made), and the caller words the failure."""
    last = _last_line(out.stderr)
    if out.returncode == 255 and target.shells \
            and not (asked != "version" and (not last or SSH_LOST.match(last))):
        return RemoteError(f"cannot reach {target.name}: {last or 'ssh exited 255'}")
    if _not_installed(target, out):
        return RemoteError(f"reconcile is not installed on {target.name} "
                           f"(`{shlex.join(target.remote_command)}`: {last or 'not found'}); " + INSTALL_HINT)
    newer = INSTALL_HINT.replace("install it there", "install this version there")
    if "No such command 'version'" in out.stderr:
        return RemoteError(f"{target.name} runs a reconcile older than the handshake (no `version` command); "
                           + newer)
    if asked != "version" and out.returncode == 2 and ("No such option" in out.stderr
                                                       or "No such command" in out.stderr):
        return RemoteError(f"{target.name} runs a reconcile older than this one, which cannot take `{asked}` "
                           f"from another host ({last}); " + newer)
    return None


@functools.cache
def _report_validator() -> Any:
    import jsonschema

    from ..pipeline.statefile.schema import SCHEMA_DIR

    schema = json.loads(Path(SCHEMA_DIR, "report.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def check_report(target: Target, doc: dict[str, Any]) -> None:
    """The far side's report against the report contract (schema/report.schema.json) before
    anything here renders or counts it: a status, a result or a field this side does not know
    (another reconcile, a broken or hostile target) is one error line for that target
    (RemoteError), never a crash of the renderer or of the other hosts' summary."""
    from jsonschema.exceptions import best_match

    error = best_match(_report_validator().iter_errors(doc))
    if error is None:
        return
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    raise RemoteError(f"{target.name}: its report does not follow the report format "
                      f"{FORMAT_VERSION} ({where or 'the document'}: {error.message[:200]}); "
                      "is the same reconcile installed there?")


def _check_format(target: Target, reconcile_version: str, format_version: str) -> None:
    if format_version.split(".")[0] != FORMAT_VERSION.split(".")[0]:
        raise RemoteError(f"{target.name} runs reconcile {reconcile_version} (report format "
                          f"{format_version}); this reconcile {__version__} reads format {FORMAT_VERSION}: "
                          + INSTALL_HINT.replace("install it there", "install the same version there"))


def handshake(target: Target) -> RemoteInfo:
    """`reconcile version --json` on the target; raises RemoteError with one clear line."""
    argv = target.argv(["version", "--json"])
    try:
        out = _run(argv, None, target.connect_timeout + HANDSHAKE_GRACE)
    except Deadline:
        raise RemoteError(f"{target.name}: no answer within {target.connect_timeout + HANDSHAKE_GRACE:g}s "
                          "(connecting and starting reconcile there)") from None
    doc = _json_object(out.stdout) if out.returncode == 0 else None
    if doc is None:
        raise _first_contact_error(target, out, "version") or RemoteError(
            f"{target.name}: `{shlex.join(target.remote_command)} version --json` failed "
            f"(exit {out.returncode}): {_last_line(out.stderr) or _last_line(out.stdout) or 'no output'}")
    info = RemoteInfo(str(doc.get("reconcile_version", "?")), str(doc.get("format_version", "?")),
                      str(doc.get("hostname", "")), str(doc.get("journal", "")))
    _check_format(target, info.reconcile_version, info.format_version)
    return info


# --- a diff or apply on the target ---------------------------------------------------------

@dataclass(frozen=True)
class Request:
    command: str                      # diff | apply
    state: bytes
    state_label: str
    dry_run: bool = False
    journal: str | None = None        # a path on the target
    lock_timeout: str | None = None
    timeout: float = 3600.0

    def args(self) -> list[str]:
        args = [self.command, "--format", "json", "--state-label", self.state_label]
        if self.dry_run:
            args.append("--dry-run")
        if self.journal:
            args += ["--journal", self.journal]
        if self.lock_timeout:
            args += ["--lock-timeout", self.lock_timeout]
        return [*args, "-"]


def execute(target: Target, request: Request, info: RemoteInfo | None = None) -> dict[str, Any]:
    """Run the request on the target; the report's JSON form, or RemoteError / RemoteFailed.
    Without `info` (no handshake before: a read-only request) this is the first contact, and
    its failures are worded as the handshake's would be."""
    mutating = request.command == "apply" and not request.dry_run
    journal = request.journal or (info.journal if info and info.journal else "its default journal path")
    try:
        out = _run(target.argv(request.args()), request.state, request.timeout)
    except Deadline:
        if mutating:
            raise RemoteError(f"{target.name}: apply did not finish within {request.timeout:g}s and the connection "
                              f"was closed; the target's journal at {journal} holds what was done; run again to "
                              "reconverge (--lock-timeout waits for an apply still running there)") from None
        raise RemoteError(f"{target.name}: {request.command} did not finish within {request.timeout:g}s") from None
    doc = _json_object(out.stdout)
    if doc is not None and "format_version" in doc:
        _check_format(target, str(doc.get("reconcile_version", "?")), str(doc["format_version"]))
        check_report(target, doc)
    if doc is not None and (doc.get("problems") or doc.get("error")):
        # The state file is bad, or the far side refused (lock held, another machine): its lines,
        # as a local run prints them, and its error report for --format json/junit/prometheus.
        raise RemoteFailed(out.stderr, report=name_machine(doc, target))
    if doc is not None and "exit_code" in doc and "resources" in doc:
        said = state_warnings(out.stderr, request.state_label)
        if said:
            doc["warnings"] = said
        return name_machine(doc, target)
    first = _first_contact_error(target, out, request.command) if info is None else None
    if first is not None:
        raise first
    if out.returncode == 1 and not out.stdout.strip():
        raise RemoteFailed(out.stderr)
    why = _last_line(out.stderr) or f"exit {out.returncode}, no report"
    if mutating:
        raise RemoteError(f"connection lost during apply on {target.name} ({why}); the target's journal at "
                          f"{journal} holds what was done; run again to reconverge "
                          "(--lock-timeout waits for an apply still running there)")
    raise RemoteError(f"connection lost during {request.command} on {target.name}: {why}")


def state_warnings(stderr: str, label: str) -> list[str]:
    """The far side's old-spelling warnings: the `LABEL:LINE:COL: warning: ...` lines it printed on
    stderr (commands.load_state), the label being the --state-label sent with the state."""
    pattern = re.compile(re.escape(label) + r":\d+:\d+: warning: ")
    return [line for line in stderr.splitlines() if pattern.match(line)]


def read_state(path: str) -> bytes:
    """The state file's bytes, read here; the target validates them. Errors as the loader words them."""

    from ..pipeline.statefile import StateFileError
    from ..pipeline.statefile.positions import LIMITS, check_size, read_bounded

    try:
        if path == "-":  # at most one byte past the limit: /dev/zero is an error, not a MemoryError
            raw = sys.stdin.buffer.read(LIMITS.max_bytes + 1)
            check_size(raw, path)
            return raw
        return read_bounded(path, path)
    except StateFileError as exc:
        raise RemoteFailed("".join(p + "\n" for p in exc.problems)) from None


def resolve_state_file(given: str | None, info: RemoteInfo | None, target: Target) -> str:
    """FILE, else $RECONCILE_STATE, else states/<target's short hostname>.yaml, else ./state.yaml."""
    if given:
        return given
    if os.environ.get("RECONCILE_STATE"):
        return os.environ["RECONCILE_STATE"]
    short = ((info.hostname if info else "") or target.short_host).split(".", 1)[0]
    tried = ["$RECONCILE_STATE (unset)"]
    for candidate in ([f"states/{short}.yaml"] if short else []) + ["state.yaml"]:
        if Path(candidate).is_file():
            return candidate
        tried.append(candidate)
    raise RemoteError(f"no state file given and none found for {target.name}; tried {', '.join(tried)}")


# --- the command line's entry point --------------------------------------------------------

@dataclass
class RemoteOptions:
    host: str | None = None
    via: str | None = None
    remote_command: str | None = None
    ssh_options: tuple[str, ...] = ()
    connect_timeout: str | None = None
    remote_timeout: str | None = None
    inventory: str | None = None
    limit: str | None = None
    parallel: int = 10
    report_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # other options given: flag -> value

    @property
    def wanted(self) -> bool:
        return bool(self.host or self.via or self.inventory)


def duration_option(value: str | None, flag: str, default: float) -> float:
    from ..core.values import parse_duration

    if value is None:
        return default
    try:
        return parse_duration(value)
    except ValueError:
        raise RemoteError(f"{flag}: invalid duration {value!r} (use e.g. 10s, 5m)") from None


def make_target(opts: RemoteOptions) -> Target:
    timeout = duration_option(opts.connect_timeout, "--connect-timeout", DEFAULT_CONNECT_TIMEOUT)
    try:
        if opts.host:
            return ssh_target(opts.host, opts.ssh_options, timeout, opts.remote_command)
        return via_target(opts.via or "", timeout, opts.remote_command)
    except ValueError as exc:
        raise RemoteError(str(exc)) from None


def _is_saved_plan(path: str) -> bool:
    try:
        from ..pipeline.plans import is_saved_plan
    except ImportError:
        return False
    return is_saved_plan(path)


def run_on_target(command: str, file: str | None, opts: RemoteOptions, run_timeout: float, *,
                  dry_run: bool = False, journal: str | None = None,
                  lock_timeout: str | None = None) -> dict[str, Any]:
    """diff / apply on the one target of --host or --via: the far side's JSON report."""
    if command == "apply" and file and file != "-" and _is_saved_plan(file):
        raise RemoteError(f"{file} is a saved plan: it applies on the host it was made on; "
                          "give the state file with --host/--via")
    target = make_target(opts)
    # Without FILE the state file may be named after the target's host name: ask for it first.
    unnamed = not file and not os.environ.get("RECONCILE_STATE")
    info = handshake(target) if needs_handshake(command, dry_run) or unnamed else None
    path = resolve_state_file(file, info, target)
    label = "<stdin>" if path == "-" else path
    request = Request(command, read_state(path), label, dry_run, journal, lock_timeout, run_timeout)
    return execute(target, request, info)
