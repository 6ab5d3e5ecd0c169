"""The validation gate (`gpus.validate`): an active check that must pass after a boot and after any
recovery action before the GPUs count as healthy again. The passive verdict (health.py) says what
NVML and the kernel log show; it cannot say that a CUDA context, NCCL or DCGM's diagnostics work
(NVSentinel asks for a gate before a repaired node is cleared, #1427/#695; DCGM's diag level 1-2
is the usual epilogue after a failure).

The gate runs the declared command (no shell) with its output streamed to a file in the state
directory, so that the tail survives a command killed at its deadline; the result is a small record
`gpu-validate.json` (core/atomic.py: written whole or not at all) valid for the boot it was written
in. The engine journals the run (intent, result with the output's tail).

When it must run: `boot` in `after` and no result in this boot; `recover` in `after` and a recovery
(a reset in this boot, or the reboot reconcile requested that led to this boot) newer than the
result; a failed result acknowledged by a person since (`reconcile ack`). A failed or timed-out
result is kept for the boot: blocked with its tail, never run again until one of those.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...core.atomic import write_json
from ...core.contract import Action, ApplyError, utc_iso
from ...core.host import CommandTimeout
from ...core.paths import state_dir
from ...core.values import format_duration, parse_duration

if TYPE_CHECKING:
    from ...core.host import Host
    from .recovery import History

RECORD = "gpu-validate.json"
OUTPUT = "gpu-validate.out"
DEFAULT_TIMEOUT = "10m"
DEFAULT_AFTER = ("boot", "recover")
TAIL_LINES = 20
TAIL_BYTES = 4096
FIELD = "validated"


@dataclass(frozen=True)
class GateResult:
    """The gate's last run in this boot."""

    time: float  # epoch seconds it finished
    passed: bool
    returncode: int | None  # None: killed at the deadline
    tail: str  # the last lines of its output (stdout and stderr together)
    command: tuple[str, ...] = ()
    took: float = 0.0

    @property
    def outcome(self) -> str:
        if self.passed:
            return "passed"
        return "timed out" if self.returncode is None else "failed"

    def describe(self) -> str:
        when = utc_iso(self.time)
        how = f"killed after {format_duration(self.took)}" if self.returncode is None else f"exit {self.returncode}"
        return f"{self.outcome} at {when} ({how})" + (f": {self.tail}" if self.tail else ": no output")


def parse_validate(section: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not section:
        return None
    return {"command": tuple(str(a) for a in section["command"]),
            "timeout": parse_duration(section.get("timeout", DEFAULT_TIMEOUT)),
            "after": tuple(section.get("after", DEFAULT_AFTER))}


def _path(name: str) -> str:
    return os.path.join(state_dir(), name)


def read_result(boot: str) -> GateResult | None:
    """This boot's gate result; None when there is none (another boot's does not count)."""
    import json

    try:
        with open(_path(RECORD), encoding="utf-8") as fh:
            data = json.load(fh)
        if not boot or data.get("boot_id") != boot:
            return None
        return GateResult(float(data["time"]), bool(data["passed"]), data.get("returncode"), str(data.get("tail", "")),
                          tuple(data.get("command", ())), float(data.get("took", 0.0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no record, or one not whole: the gate has not run (it runs again)


def need(validate: Mapping[str, Any], result: GateResult | None, history: History | None) -> str:
    """Why the gate must run now ("" when it need not)."""
    after = validate["after"]
    since = result.time if result is not None else None
    if "recover" in after and history is not None:
        for what, when in history.recoveries_this_boot():
            if since is None or when > since:
                return f"after {what}"
    if "boot" in after and result is None:
        return "after this boot"
    if result is not None and not result.passed and history is not None:
        ack = history.node_ack_after(result.time)
        if ack:
            return f"after {ack}"
    return ""


def gate_drift_have(validate: Mapping[str, Any] | None, result: GateResult | None, history: History | None) -> str:
    """What the `validated` drift field has ("" when there is no drift)."""
    if not validate:
        return ""
    why = need(validate, result, history)
    if why:
        return f"not run {why}"
    if result is not None and not result.passed:
        return result.outcome
    return ""


def gate_plan(validate: Mapping[str, Any], result: GateResult | None, history: History | None,
              gpus_ready: bool, recover: Mapping[str, Any] | None = None) -> tuple[list[Action], list[str]]:
    """(actions, blocked): the gate's run once the GPUs' verdicts allow it, or its failure; a failure
    after a reset of this boot, with `recover.reboot`, is the escalation to the reboot (recovery.py)."""
    why = need(validate, result, history)
    argv = " ".join(validate["command"])
    if why:
        if not gpus_ready:
            return [], []  # a GPU is still to be recovered (or blocked): the gate comes after
        return [Action("validate", "gpus", f"run the validation gate `{argv}` ({why})",
                       {"command": list(validate["command"]), "timeout": validate["timeout"], "why": why})], []
    if result is not None and not result.passed:
        from .recovery import gate_escalation

        step = gate_escalation(recover, f"`{argv}` {result.describe()}", result.time, history)
        if step is not None:
            return step
        return [], [f"the validation gate `{argv}` {result.describe()}: the GPUs do not count as healthy in this "
                    "boot (it runs again after a recovery, a reboot, or `reconcile ack` once a person fixed it)"]
    return [], []


def tail_of(data: bytes) -> str:
    lines = data.decode("utf-8", "replace")[-TAIL_BYTES:].strip().splitlines()
    return " | ".join(line.strip() for line in lines[-TAIL_LINES:] if line.strip())


def run_gate(host: Host, params: Mapping[str, Any], boot: str) -> str:
    """Run the gate's command to its deadline, keep its result for the boot, and say what came of it;
    ApplyError (with the output's tail) when it failed or timed out."""
    command = [str(a) for a in params["command"]]
    timeout = float(params["timeout"])
    out = _path(OUTPUT)
    os.makedirs(os.path.dirname(out), mode=0o700, exist_ok=True)
    # Through sh only to send the output to a file: a command killed at its deadline leaves its tail.
    argv = ["sh", "-c", 'exec "$@" >"$0" 2>&1', out, *command]
    t0 = time.monotonic()
    try:
        res = host.run(argv, timeout=timeout)
        code: int | None = res.returncode
    except CommandTimeout:
        code = None
    took = time.monotonic() - t0
    try:
        with open(out, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - TAIL_BYTES))
            tail = tail_of(fh.read())
    except OSError:
        tail = ""
    if code == 127 and not tail:
        tail = f"{command[0]}: command not found"
    result = GateResult(time.time(), code == 0, code, tail, tuple(command), took)
    write_json(_path(RECORD), {"boot_id": boot, "time": result.time, "passed": result.passed, "returncode": code,
                               "tail": tail, "command": command, "took": round(took, 3),
                               "why": str(params.get("why", ""))}, indent=1)
    if not result.passed:
        raise ApplyError(f"the validation gate {result.describe()}")
    return f"the validation gate passed in {format_duration(took)}" + (f": {tail}" if tail else "")


def gate_lines(validate: Mapping[str, Any] | None, result: GateResult | None) -> Sequence[str]:
    if not validate or result is None:
        return ()
    return (f"validation gate `{' '.join(validate['command'])}`: {result.describe()}",)
