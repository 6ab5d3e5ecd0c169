"""What consumes a finished run: one protocol, one registration table.

A sink gets every run of the commands it serves as a `pipeline.runs.Finished` (the report's
JSON form, or a refusal's error report and the Refusal), once the run has reported: the
Prometheus textfile (`--textfile DIR`, textfile.py), Slurm's drain and resume
(`reconcile slurm-health`, slurm_node.py), and any consumer to come (a Kubernetes node
condition). Each is one module here and one line of SINKS below, nothing else: a sink declares
its own command-line options (OPTIONS), which cli.py adds to the commands they name, and it is
made from their values (`from_options`) when one of them is given. tests/test_add_a_sink.py
adds one so, to a copy of the package, and runs the real command line.

No click here (doors/ is below the command line): options are plain data, turned into click
options by cli.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from ...pipeline.runs import Finished

# name -> "module:Class", the module relative to this package. Imported only when a command
# that a sink serves is set up (never on `reconcile diff`'s fast path).
SINKS: dict[str, str] = {
    "textfile": ".textfile:Textfile",
    "slurm-node": ".slurm_node:SlurmNode",
}


@dataclass(frozen=True)
class SinkOption:
    """A command-line option of a sink: `--flag VALUE` on each command of `commands` (a value
    given without it is None); `directory`: the value names a directory (shell completion)."""

    flag: str
    metavar: str
    help: str
    commands: tuple[str, ...] = ("diff", "apply")
    directory: bool = False


class SinkError(Exception):
    """A sink could not take a run (a file it cannot write, a command that failed): the message,
    one line, is printed as `reconcile: error: MESSAGE` (exit 1) or logged by the watch."""


class Sink(Protocol):
    """What consumes a finished run. OPTIONS: the options that switch it on, per command;
    from_options: the sink those values ask for, or None (SinkError for a bad combination)."""

    OPTIONS: ClassVar[tuple[SinkOption, ...]]

    @classmethod
    def from_options(cls, command: str, values: Mapping[str, Any], **context: Any) -> Sink | None: ...

    def take(self, run: Finished) -> None: ...


def sink_class(name: str) -> type[Sink]:
    module, _, attr = SINKS[name].partition(":")
    return getattr(importlib.import_module(module, __name__), attr)


def options_for(command: str) -> list[tuple[str, SinkOption]]:
    """(sink name, option) for every option a registered sink offers on `command`."""
    return [(name, opt) for name in SINKS for opt in sink_class(name).OPTIONS if command in opt.commands]


def build(command: str, values: Mapping[str, Mapping[str, Any]], **context: Any) -> list[Sink]:
    """The sinks asked for: `values` maps each sink's name to its options' values by flag (those
    of options_for(command)); `context`, what the command knows that a sink may need (the
    watch's interval). A sink none of whose options is given is not made."""
    made = []
    for name, given in values.items():
        if any(v not in (None, (), False) for v in given.values()):
            sink = sink_class(name).from_options(command, given, **context)
            if sink is not None:
                made.append(sink)
    return made


def deliver(run: Finished, sinks: Sequence[Sink], say: Callable[[str], None]) -> bool:
    """Hand the run to every sink, each whatever the others did; a sink that cannot take it
    says why through `say`. False when one could not."""
    ok = True
    for sink in sinks:
        try:
            sink.take(run)
        except SinkError as exc:
            say(str(exc))
            ok = False
    return ok


def fan_out(sinks: Sequence[Sink]) -> Callable[[Finished], None]:
    """One hook for a loop's runs (the watch's `on_pass`): every sink gets each run; what any
    could not do is raised after all were tried, as one SinkError (the watch logs it, and goes on)."""
    def hook(run: Finished) -> None:
        said: list[str] = []
        if not deliver(run, sinks, said.append):
            raise SinkError("; ".join(said))

    return hook
