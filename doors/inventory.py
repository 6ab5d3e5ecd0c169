"""Many hosts at once: `reconcile diff|apply --inventory hosts.yaml [--limit PATTERN]`.

Each host is one remote run (doors/remote.py: state on stdin, JSON back; an apply that
changes the host asks for the far side's versions first),
in a thread of its own since each is a subprocess; a host that fails is an error for that
host only. Printed at the end, in inventory order: each host's report, then one summary
table. The exit code is the worst host's: 1 (error) over 2 (drift) over 0.
"""

from __future__ import annotations

import fnmatch
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import FORMAT_VERSION, __version__
from ..pipeline.report import action_count, drifted_count
from ..pipeline.statefile import StateFileError
from ..pipeline.statefile.schema import SCHEMA_DIR
from . import remote

SEVERITY = {0: 0, 2: 1, 1: 2}  # exit code -> how bad


@dataclass(frozen=True)
class InventoryHost:
    name: str
    state: str                      # path as seen from here (relative to the cwd when the inventory's was)
    address: str | None = None
    via: str | None = None
    journal: str | None = None
    remote_command: str | None = None
    ssh_options: tuple[str, ...] = ()
    connect_timeout: float | None = None
    groups: tuple[str, ...] = ()

    @property
    def target_text(self) -> str:
        return self.address or f"via {self.via}"


@dataclass(frozen=True)
class Inventory:
    path: str
    hosts: tuple[InventoryHost, ...]
    groups: dict[str, tuple[str, ...]]

    def select(self, limit: str | None) -> list[InventoryHost]:
        """Hosts whose name, or one of whose groups, matches one of the comma-separated patterns."""
        if not limit:
            return list(self.hosts)
        patterns = [p.strip() for p in limit.split(",") if p.strip()]
        chosen = [h for h in self.hosts
                  if any(fnmatch.fnmatchcase(n, p) for p in patterns for n in (h.name, *h.groups))]
        if not chosen:
            raise remote.RemoteError(
                f"--limit {limit!r} matches no host of {self.path} (hosts: {', '.join(h.name for h in self.hosts)}"
                + (f"; groups: {', '.join(self.groups)})" if self.groups else ")"))
        return chosen


def load_inventory(path: str) -> Inventory:
    """Read and validate; problems as `FILE:LINE:COL: message` lines (StateFileError), like state files."""
    import jsonschema

    from ..core.values import parse_duration
    from ..pipeline.statefile.positions import decode, parse_yaml, read_bounded
    from ..pipeline.statefile.schema import format_checker, message_for

    text = decode(read_bounded(path, path, what="an inventory"), path)  # bounded, UTF-8, with positions
    data, pos = parse_yaml(text, path, what="an inventory")
    if not isinstance(data, dict):
        raise StateFileError([f"{path}:1:1: expected a mapping with 'version: 1' and 'hosts'"])
    schema = json.loads(Path(SCHEMA_DIR, "inventory.schema.json").read_text())
    types = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool))
    validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=types)(
        schema, format_checker=format_checker())
    found = sorted({message_for(e, pos) for e in validator.iter_errors(data)})
    problems = [f"{path}:{line}:{col}: {msg}" for (line, col), msg in found]
    if problems:
        raise StateFileError(problems)

    base = Path(path).parent
    defaults = data.get("defaults") or {}
    groups = {g: tuple(members) for g, members in (data.get("groups") or {}).items()}
    for g, members in groups.items():
        for i, member in enumerate(members):
            if member not in data["hosts"]:
                line, col = pos.of_value(("groups", g, i))
                problems.append(f"{path}:{line}:{col}: groups.{g}: unknown host {member!r}")
    hosts = []
    for name, spec in data["hosts"].items():
        if bool(spec.get("address")) == bool(spec.get("via")):
            line, col = pos.of_key(("hosts", name))
            problems.append(f"{path}:{line}:{col}: hosts.{name}: give either address (ssh://[user@]host[:port]) "
                            f"or via (a command prefix){', not both' if spec.get('address') else ''}")
            continue
        if spec.get("address"):
            try:
                remote.parse_address(spec["address"])
            except ValueError as exc:
                line, col = pos.of_value(("hosts", name, "address"))
                problems.append(f"{path}:{line}:{col}: hosts.{name}.address: {exc}")
        timeout = spec.get("connect_timeout", defaults.get("connect_timeout"))
        hosts.append(InventoryHost(
            name=name, state=str(base / spec["state"]), address=spec.get("address"), via=spec.get("via"),
            journal=spec.get("journal"), remote_command=spec.get("remote_command", defaults.get("remote_command")),
            ssh_options=tuple(spec.get("ssh_options", ())) + tuple(defaults.get("ssh_options", ())),
            connect_timeout=parse_duration(timeout) if timeout is not None else None,
            groups=tuple(g for g, members in groups.items() if name in members),
        ))
    if problems:
        raise StateFileError(problems)
    return Inventory(path, tuple(hosts), groups)


# --- running --------------------------------------------------------------------------

@dataclass(frozen=True)
class HostResult:
    host: InventoryHost
    exit_code: int
    seconds: float
    report: dict[str, Any] | None = None
    error: str = ""
    reason: str = ""  # the error report's reason (report.schema.json error.reason) when there is an error
    same_machine_as: tuple[str, ...] = ()  # other inventory names whose report has this machine-id

    @property
    def status(self) -> str:
        if self.report is None or self.exit_code == 1:
            return "error"
        if self.exit_code == 2:
            return "drift"
        done = self.report["summary"].get("actions_done", 0)
        return "changed" if self.report["command"] == "apply" and done else "ok"

    @property
    def drift_count(self) -> int | None:
        return None if self.report is None else drifted_count(self.report)

    @property
    def action_count(self) -> int | None:
        return None if self.report is None else action_count(self.report)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host.name, "target": self.host.target_text, "state_file": self.host.state,
                               "status": self.status, "exit_code": self.exit_code, "seconds": round(self.seconds, 3)}
        if self.report is not None:
            out["report"] = self.report
        if self.error or self.report is None:
            out["error"] = self.error
            out["reason"] = self.reason or "remote-error"
        if self.same_machine_as:
            out["same_machine_as"] = list(self.same_machine_as)
        return out


def run_host(h: InventoryHost, command: str, opts: remote.RemoteOptions, *, dry_run: bool,
             journal: str | None, lock_timeout: str | None, run_timeout: float) -> HostResult:
    t0 = time.monotonic()
    try:
        cli_timeout = remote.duration_option(opts.connect_timeout, "--connect-timeout", remote.DEFAULT_CONNECT_TIMEOUT)
        # The command line wins over the inventory, which wins over the built-in defaults.
        timeout = cli_timeout if opts.connect_timeout else (h.connect_timeout or remote.DEFAULT_CONNECT_TIMEOUT)
        rcmd = opts.remote_command or h.remote_command
        try:
            if h.address:
                target = remote.ssh_target(h.address, (*opts.ssh_options, *h.ssh_options), timeout, rcmd)
            else:
                target = remote.via_target(h.via or "", timeout, rcmd)
        except ValueError as exc:
            raise remote.RemoteError(str(exc)) from None
        state = remote.read_state(h.state)
        info = remote.handshake(target) if remote.needs_handshake(command, dry_run) else None
        where = journal.replace("{host}", h.name) if journal else h.journal
        if command != "apply":
            where = None  # a host's journal is apply's; diff has no --journal to pass it to
        request = remote.Request(command, state, h.state, dry_run, where, lock_timeout, run_timeout)
        doc = remote.execute(target, request, info)
        return HostResult(h, int(doc.get("exit_code", 1)), time.monotonic() - t0, report=doc)
    except remote.RemoteError as exc:
        return HostResult(h, 1, time.monotonic() - t0, error=str(exc), reason=remote.refusal_reason(str(exc)))
    except remote.RemoteFailed as exc:
        # The far side refused (its error report says why: lock-held, machine-mismatch, state-file...).
        why = ((exc.report or {}).get("error") or {}).get("reason") or "remote-error"
        return HostResult(h, 1, time.monotonic() - t0, report=exc.report, error=exc.stderr.strip(), reason=why)
    except Exception as exc:  # one host's surprise must not take the others' results with it
        return HostResult(h, 1, time.monotonic() - t0, error=f"internal error: {type(exc).__name__}: {exc}",
                          reason="internal-error")


def same_machines(results: list[HostResult]) -> list[HostResult]:
    """Two inventory names that reached one machine (the same /etc/machine-id: an alias, a
    reused address, a cloned VM that kept its id) are said so on both, not counted as two."""
    import dataclasses

    by_id: dict[str, list[str]] = {}
    for r in results:
        mid = ((r.report or {}).get("machine") or {}).get("machine_id")
        if mid:
            by_id.setdefault(mid, []).append(r.host.name)
    out = []
    for r in results:
        mid = ((r.report or {}).get("machine") or {}).get("machine_id")
        others = tuple(n for n in by_id.get(mid, ()) if n != r.host.name) if mid else ()
        out.append(dataclasses.replace(r, same_machine_as=others) if others else r)
    return out


def run_inventory(command: str, opts: remote.RemoteOptions, fmt: str, verbose: bool, *, dry_run: bool = False,
                  journal: str | None = None, lock_timeout: str | None = None, run_timeout: float = 3600.0) -> int:
    from ..views import inventory_refusal, render_inventory

    refusal = inventory_refusal(fmt)
    if refusal:  # refused before any host is touched
        raise remote.RemoteError(refusal)
    try:
        inv = load_inventory(opts.inventory or "")
    except StateFileError as exc:
        for problem in exc.problems:
            remote.echo_err(problem + "\n")
        return 1
    hosts = inv.select(opts.limit)
    if journal and len(hosts) > 1 and "{host}" not in journal:
        raise remote.RemoteError("--journal with --inventory must contain {host}, e.g. "
                                 "/var/lib/reconcile/{host}/journal.jsonl (one journal per host; the lock sits in "
                                 "the journal's directory), or set journal: per host in the inventory")
    with ThreadPoolExecutor(max_workers=min(opts.parallel, len(hosts))) as pool:
        results = list(pool.map(lambda h: run_host(h, command, opts, dry_run=dry_run, journal=journal,
                                                   lock_timeout=lock_timeout, run_timeout=run_timeout), hosts))
    results = same_machines(results)
    worst = max((r.exit_code for r in results), key=SEVERITY.__getitem__, default=0)
    doc = {
        "format_version": FORMAT_VERSION,
        "reconcile_version": __version__,
        "command": command,
        "dry_run": dry_run,
        "inventory": inv.path,
        "limit": opts.limit,
        "exit_code": worst,
        "hosts": [r.to_json() for r in results],
        "summary": summary(results),
    }
    if opts.report_dir:
        out_dir = Path(opts.report_dir)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            for entry in doc["hosts"]:
                (out_dir / f"{entry['host']}.json").write_text(json.dumps(entry, indent=2) + "\n")
        except OSError as exc:
            raise remote.RemoteError(f"--report-dir {out_dir}: {exc.strerror}") from None
    render_inventory(doc, fmt, verbose=verbose)
    return worst


def summary(results: list[HostResult]) -> dict[str, Any]:
    out: dict[str, Any] = {"hosts": len(results)}
    for status in ("ok", "changed", "drift", "error"):
        out[status] = sum(1 for r in results if r.status == status)
    # Distinct machines: hosts whose reports share a machine-id count once (same_machine_as).
    out["machines"] = len(results) - sum(1 for r in results if r.same_machine_as) + len(
        {((r.report or {}).get("machine") or {}).get("machine_id") for r in results if r.same_machine_as})
    out["resources_drifted"] = sum(r.drift_count or 0 for r in results)
    out["actions"] = sum(r.action_count or 0 for r in results)
    return out
