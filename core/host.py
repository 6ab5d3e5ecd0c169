"""The one interface to a machine that kinds are handed (`Host`), and what its commands return.

A Protocol: the local host (local/host.py) implements it, and so does every test double; kinds
and the engine name only this, so local, `--via` and SSH differ in one place and the foundation
imports nothing above it (the shape of pyinfra's connectors, Terraform's small required surface).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol, TypeVar, runtime_checkable

K = TypeVar("K")
# (what, done, total, unit): where progress goes; done None: that work is over.
ProgressSink = Callable[[str | None, "float | None", "float | None", str], None]


@dataclass(frozen=True)
class CommandResult:
    """What a command run through Host.run gave."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def brief(self) -> str:
        """The command and its first error line, for messages."""
        err = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return f"`{' '.join(self.argv)}` exited {self.returncode}" + (f": {err[0]}" if err else "")


class CommandTimeout(Exception):
    """A command run through Host.run missed its deadline (it was killed)."""


class Child(Protocol):
    """A forked observer child (Host.fork_call): the parts of Popen's interface a poller needs."""

    pid: int
    stdout: IO[bytes]
    returncode: int | None

    def poll(self) -> int | None: ...
    def kill(self) -> None: ...


@runtime_checkable
class Host(Protocol):
    """What observe() and apply() may do to a machine. Every method is required; a double that
    has no use for one raises (tests/test_layers.py holds each double's signatures to these)."""

    # Set by the engine in a child that observes with a deadline; set by the command line when
    # it shows a progress line (views/progress.py).
    heartbeat_to: IO[bytes] | None
    on_progress: ProgressSink | None

    def run(self, argv: list[str] | tuple[str, ...], timeout: float = 30.0, env: dict | None = None,
            input: str | None = None) -> CommandResult:
        """Run a command to completion, or kill it at the deadline (CommandTimeout)."""
        ...

    def fork_call(self, fn: Callable[..., None], *args: Any) -> Child:
        """Run `fn(*args, out)` in a forked child and return at once."""
        ...

    def collect(self, children: Mapping[K, tuple[Child, float]],
                idle: Mapping[K, float] | None = None) -> dict[K, tuple[bytes, bool]]:
        """What forked children wrote, each read to its own deadline."""
        ...

    def spawn_detached(self, argv: list[str] | tuple[str, ...], log_path: str, cwd: str | None = None,
                       status_path: str | None = None) -> int:
        """Start a long-running command that outlives us; its pid."""
        ...

    def heartbeat(self) -> None:
        """Say "still making progress" from a long observation."""
        ...

    def progress(self, what: str, done: float, total: float | None = None, unit: str = "") -> None:
        """Say how far a long piece of work has come."""
        ...

    def which(self, name: str) -> str | None: ...
    def read_text(self, path: str) -> str: ...
    def hostname(self) -> str: ...

    def machine(self) -> dict[str, str | None]:
        """hostname, machine_id, boot_id; what cannot be read is None."""
        ...

    def signal(self, pid: int, sig: int, starttime: int | None = None) -> None:
        """Signal a process; refuses PID 1 and reconcile itself. With STARTTIME (/proc/PID/stat
        field 22), only the process that started then (else ProcessLookupError)."""
        ...

    def pid_alive(self, pid: int) -> bool: ...
    def sleep(self, seconds: float) -> None: ...
