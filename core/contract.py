"""The reconciler contract and the plain data that flows through the pipeline.

Everything here is a frozen dataclass or an enum: a drift, a plan and a result
print, serialise to the JSON contract and are tested without touching a host.
Only `Reconciler.observe` and `Reconciler.apply` reach the host, and only
through the `Host` object they are handed.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .host import CommandTimeout

if TYPE_CHECKING:  # the interface kinds are handed; they never import the local host or a door
    from .host import Host


class Status(str, enum.Enum):
    OK = "ok"
    DRIFT = "drift"
    CONVERGING = "converging"  # drift that is being worked off as intended (a long job running)
    BLOCKED = "blocked"  # drift that reconcile must not or cannot fix on its own
    ERROR = "error"  # the resource could not be observed or acted on


class Result(str, enum.Enum):
    PLANNED = "planned"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Resource:
    """One declared item of the state file, e.g. one unit or the `gpus` block."""

    id: str  # "unit:vllm.service", "gpus", "mount:/data", "extraction:eagle3"
    kind: str  # "unit", "gpus", "mount", "extraction"
    name: str  # the key under the kind's section ("gpus" for the singleton)
    spec: Mapping[str, Any]  # the declared fields, normalised (sizes in bytes, durations in seconds)
    needs: tuple[str, ...] = ()
    # How long verification may poll for the host to settle after acting (GPU memory release).
    settle: float = 0.0


@dataclass(frozen=True)
class Drift:
    """One field that differs: what the state file wants, what the host has."""

    field: str
    want: Any
    have: Any

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "want": self.want, "have": self.have}


@dataclass(frozen=True)
class Action:
    """One corrective step a plan proposes and apply carries out."""

    action: str  # verb: "stop", "disable", "terminate", "mount", "quarantine", "start"
    target: str  # what it acts on: a unit name, "pid 1234", a path
    description: str = ""  # one human line, e.g. "terminate 4242 (python) holding 75800 MiB on GPU 0"
    params: Mapping[str, Any] = field(default_factory=dict)  # what apply needs; saved with a plan
    # Carried out at most once per resource in one apply, whatever a later pass plans: an action
    # whose effect the next observation may not show (a job started that exited at once: starting
    # it again would make two writers on one tree, or a crash loop). Not part of a saved plan.
    once: bool = False
    # Carried out last in its run: once it is done nothing more is observed or acted on (a reboot
    # was requested: the host is going down). The other resources are reported as not acted on.
    ends_run: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action, "target": self.target}
        if self.description:
            out["description"] = self.description
        if self.params:
            out["params"] = dict(self.params)
        return out


@dataclass(frozen=True)
class Plan:
    """What a reconciler would do about one resource's drift."""

    actions: tuple[Action, ...] = ()
    # Set when (part of) the drift cannot be fixed by reconcile: a person must act.
    blocked: str | None = None
    # Set when the drift is being worked off already (a job running towards its target).
    converging: str | None = None
    # Free-form detail for the report (progress, per-GPU memory lines, ...).
    message: str = ""
    # What the observation could not prove, whatever the status (files not read whole, ...):
    # views show these even for an `ok` resource.
    caveats: tuple[str, ...] = ()


@dataclass(frozen=True)
class ActionResult:
    """An action and what came of it (planned, done, failed, skipped), with its times."""

    action: Action
    result: Result
    message: str = ""
    started: float = 0.0  # epoch seconds
    finished: float = 0.0


class ObserveError(Exception):
    """The host could not tell us the state of a resource: never read as 'absent' or 'inactive'."""


class ApplyError(Exception):
    """An action could not be carried out.

    `independent=True`: the failure concerns this action's own target only (one GPU's setting
    among several GPUs'), so the engine goes on with the resource's other actions of this pass
    instead of skipping them; it still stops after the pass."""

    def __init__(self, message: str = "", independent: bool = False):
        super().__init__(message)
        self.independent = independent


def run_action(host: Host, argv: Sequence[str], timeout: float) -> str:
    """Run the command that carries out an action (`systemctl stop`, `mount`): its output on
    one line, or ApplyError when it misses its deadline or exits non-zero."""
    try:
        res = host.run(list(argv), timeout=timeout)
    except CommandTimeout as exc:
        raise ApplyError(str(exc)) from None
    if not res.ok:
        raise ApplyError(res.brief())
    return (res.stderr.strip() or res.stdout.strip()).replace("\n", "; ")


def utc_iso(t: float | None = None, millis: bool = False) -> str:
    """An epoch time (default: now) as ISO 8601 UTC, `2026-11-29T16:40:01Z` or, with millis,
    `2026-11-29T16:40:01.120Z`: the one timestamp format of journals, plans and manifests."""
    if t is None:
        t = time.time()
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
    return text + (f".{int((t % 1) * 1000):03d}Z" if millis else "Z")


_PLAIN = frozenset({str, int, float, bool, type(None)})  # exactly these types: an Enum of str is not one
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass's fields, asked once per class and run


def to_plain(value: Any) -> Any:
    """Dataclasses, enums, tuples and mappings to JSON-ready values."""
    cls = type(value)
    if cls in _PLAIN:  # most of a report's values: returned before the checks below
        return value
    names = _FIELD_NAMES.get(cls)
    if names is None and dataclasses.is_dataclass(cls) and not isinstance(value, type):
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {name: to_plain(getattr(value, name)) for name in names}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Sample:
    """One sample of a kind's metric: its labels and value. None: not known, and so not written
    (views/prometheus.py: unknown is never 0)."""

    value: float | int | bool | None
    labels: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Metric:
    """One metric family a kind contributes to the Prometheus view: name, help text, type and the
    samples of one resource. Families are written in the order the kind gives them."""

    name: str  # reconcile_<kind>_..., with its base unit (Prometheus' naming conventions)
    help: str
    samples: tuple[Sample, ...] = ()
    type: str = "gauge"


@dataclass(frozen=True)
class Context:
    """What a reconciler may know about the rest of the declared state while planning.

    Kept deliberately small: the ids of all declared resources and their specs by id,
    so that, e.g., the GPU reconciler can defer to a declared unit instead of acting twice.
    """

    resources: Mapping[str, Resource] = field(default_factory=dict)
    dry_run: bool = True
    # The journal's entries since an epoch time, newest first (what this host's applies did: the
    # GPU recovery caps count from it); None: no journal to read.
    history: Callable[[float], Sequence[Mapping[str, Any]]] | None = None


class Reconciler:
    """One resource kind: observe -> diff -> plan -> apply.

    Verification is not a separate code path: the engine observes and diffs again
    after applying, so it can never disagree with `diff`.
    """

    key: ClassVar[str]  # top-level key in the state file: "units"
    kind: ClassVar[str]  # id prefix and report kind: "unit"
    rank: ClassVar[int]  # default order when `needs` is silent (lower first)
    # Drift fields (fnmatch patterns) whose observed value moves by itself (memory in use, free
    # space, a progress counter): a saved plan's fingerprint keeps their field and want, not the have.
    volatile_drift: ClassVar[tuple[str, ...]] = ()
    # True when observe() forks (Host.fork_call): the engine then observes this kind before
    # starting the threads that observe the others.
    forks_to_observe: ClassVar[bool] = False

    def observe_deadline(self, resources: Sequence[Resource]) -> float | None:
        """Seconds observe() may take, run in a forked child; None: observe in this process.

        A kind whose observation can block in the kernel for good (NVML on a wedged driver, a
        listing on a hung filesystem) gives a deadline: the engine then observes it in a child
        it can abandon and report, and the child runs beside the other kinds on another CPU.
        A kind that calls `host.heartbeat()` as it makes progress says so with `observe_idle`."""
        return None

    # The run's context, set by the engine when it takes the reconciler: `diff` has no parameter for
    # it, and a drift may depend on what the journal says (gpus: the validation gate after a recovery).
    context: Context | None = None

    # True: the deadline is for a stretch WITHOUT progress (host.heartbeat()), not the whole
    # observation (a first integrity check of a million files takes minutes, a hung mount forever).
    observe_idle: ClassVar[bool] = False

    def resources(self, section: Any) -> list[Resource]:
        raise NotImplementedError

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        """Observed state by resource id. Batched: one host call for all resources of the kind
        where the host allows it. An id may map to an ObserveError instance for a resource
        that could not be observed while the others could."""
        raise NotImplementedError

    def diff(self, resource: Resource, observed: Any) -> list[Drift]:
        raise NotImplementedError

    def plan(self, resource: Resource, observed: Any, drift: Sequence[Drift], ctx: Context) -> Plan:
        raise NotImplementedError

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        """Carry out one planned action; return a short message. Raise ApplyError on failure."""
        raise NotImplementedError

    def summary(self, resource: Resource, observed: Any) -> str:
        """One line for the report describing the observed state (optional)."""
        return ""

    def canonical_name(self, name: str) -> str:
        """The NAME of the id `KIND:NAME` a declared name stands for; two spellings of one thing
        (a mount point with and without its trailing slash) are one resource. Ids in `needs` are
        read through it too. The name as written, by default."""
        return name

    def problems(self, section: Any) -> list[tuple[tuple, str]]:
        """What the schema cannot check in this kind's section (a minimum above a maximum): (the path
        inside the section, message) each, reported as `FILE:LINE:COL: message` (optional). A path
        that names a resource itself, `(NAME,)`, is reported at its key; any other at its value."""
        return []

    def metrics(self, resource: Mapping[str, Any], report: Mapping[str, Any]) -> list[Metric]:
        """The kind's own metrics of one resource (optional), read from the report's JSON form
        (pipeline/report.py), since a report from a remote host arrives as JSON: `resource` is
        one entry of its `resources`, whose `observed` is a mapping; `report` the whole report
        (its `machine`). views/prometheus.py writes them after the metrics every kind has."""
        return []

    def settles(self, drift: Sequence[Drift]) -> bool:
        """Whether waiting may still clear this drift, so verification keeps polling up to the
        resource's `settle`: by default, when some of it is volatile (it moves by itself)."""
        import fnmatch

        return any(fnmatch.fnmatchcase(d.field, p) for d in drift for p in self.volatile_drift)
