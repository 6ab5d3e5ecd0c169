"""Why a run produced no report: one closed set of reasons, and the refusal that carries one.

A run is either a report (pipeline/report.py RunReport) or a `Refusal`: the lock is held,
the state file is for another machine, the host cannot be reached. pipeline/runs.py is where
the run steps turn an exception into one; every format renders it as an error report whose
`error.reason` is one of REASONS (schema/report.schema.json holds the same list as its enum;
docs/json-report.md says when each is given).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The closed set, in the order docs/json-report.md lists them.
REASONS = (
    "state-file",        # the state file does not validate (with `problems`), or cannot be read
    "lock-held",         # another apply holds the apply lock
    "journal",           # the journal's directory or its lock file cannot be used
    "host-mismatch",     # the state file's (or the saved plan's) host is another hostname
    "machine-mismatch",  # ... another /etc/machine-id
    "plan-stale",        # a saved plan no longer matches the state file or the host
    "plan-invalid",      # a saved plan that cannot be read, or does not match itself
    "unreachable",       # --host / --inventory: no connection, or it was lost
    "remote-error",      # the target answered but cannot run the request
    "internal-error",    # a bug: an exception escaped the run (`reconcile watch` keeps going)
)


@dataclass(frozen=True)
class Refusal:
    """A run refused before it could report: `reason` (one of REASONS) for a program, `message`
    (the one line printed on stderr, without `reconcile: error: `) for a person, and the machine
    that refused when it was read (engine.machine_of)."""

    reason: str
    message: str
    machine: dict[str, Any] | None = None
    problems: tuple[str, ...] = ()  # state-file: each `FILE:LINE:COL: message`

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"refusal reason {self.reason!r} is not one of {', '.join(REASONS)}")
