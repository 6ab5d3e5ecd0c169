"""The test doubles of the one Host interface (core/host.py): a double implements every member
with the interface's own signature (tests/test_host_doubles.py holds them to it); what a test
does not script fails loudly instead of passing by accident."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import IO, Any

from reconcile_host.core.host import Child, CommandResult, K, ProgressSink


class ScriptedHost:
    """Answers commands through `answer(argv) -> CommandResult` and records them in `calls`;
    refuses to fork, spawn or signal (a plan test must not touch the machine)."""

    heartbeat_to: IO[bytes] | None = None
    on_progress: ProgressSink | None = None

    def __init__(self, answer: Callable[[list[str]], CommandResult] | None = None, name: str = "test-host"):
        self.answer, self.name, self.calls = answer, name, []

    def run(self, argv: list[str] | tuple[str, ...], timeout: float = 30.0, env: dict | None = None,
            input: str | None = None) -> CommandResult:
        self.calls.append(list(argv))
        if self.answer is None:
            raise AssertionError(f"not scripted: {list(argv)}")
        return self.answer(list(argv))

    def fork_call(self, fn: Callable[..., None], *args: Any) -> Child:
        raise AssertionError("a scripted host does not fork")

    def collect(self, children: Mapping[K, tuple[Child, float]],
                idle: Mapping[K, float] | None = None) -> dict[K, tuple[bytes, bool]]:
        raise AssertionError("a scripted host has no children")

    def spawn_detached(self, argv: list[str] | tuple[str, ...], log_path: str, cwd: str | None = None,
                       status_path: str | None = None) -> int:
        raise AssertionError(f"a scripted host starts nothing: {list(argv)}")

    def heartbeat(self) -> None:
        pass

    def progress(self, what: str, done: float, total: float | None = None, unit: str = "") -> None:
        pass

    def which(self, name: str) -> str | None:
        return None

    def read_text(self, path: str) -> str:
        raise AssertionError(f"a scripted host reads no file: {path}")

    def hostname(self) -> str:
        return self.name

    def machine(self) -> dict[str, str | None]:
        return {"hostname": self.name, "machine_id": None, "boot_id": None}

    def signal(self, pid: int, sig: int, starttime: int | None = None) -> None:
        raise AssertionError(f"a scripted host signals nothing (pid {pid}, signal {sig})")

    def pid_alive(self, pid: int) -> bool:
        return os.path.exists(f"/proc/{pid}")

    def sleep(self, seconds: float) -> None:
        pass
