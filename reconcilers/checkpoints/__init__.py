"""The `checkpoints` kind: a training job's run directory (Hugging Face Trainer, Lightning,
DeepSpeed, torch DCP, Megatron). Which step will the framework resume from by its own rule,
is that step whole, and which is the newest whole one; apply makes the framework resume from
the newest whole step, moving torn checkpoints aside (never deleting) and pointing the
framework's pointer (DeepSpeed `latest`, Megatron's tracker, Lightning's last.ckpt) at it.

Observed in a forked child with a deadline (a hung mount must not hang `diff`); the file
checks (the extraction kind's) are imported there only. No framework, and never torch, is
imported: docs/checkpoints.md says what each layout's "whole" means and what cannot be proven.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...core.host import Host

from ...common.quarantine import QUARANTINE
from ...common.usertree import UnsafeTree
from ...core.contract import Action, ApplyError, Context, Drift, ObserveError, Plan, Reconciler, Resource
from ...core.values import format_duration, parse_duration
from .observed import QUARANTINE_BESIDE, CheckpointsObserved, NotCheckable, StepObserved

DEFAULT_OBSERVE_TIMEOUT = "60s"


class CheckpointsReconciler(Reconciler):
    key = "checkpoints"
    kind = "checkpoint"
    rank = 45  # after mounts (30) and extractions (40): a run directory is usually on a mount
    volatile_drift = ("max_age",)  # the age of the newest whole step grows by itself

    def observe_deadline(self, resources: Sequence[Resource]) -> float | None:
        return max(float(r.spec["observe_timeout"]) for r in resources)

    def resources(self, section: dict[str, Any]) -> list[Resource]:
        out = []
        for name, spec in section.items():
            norm = {
                "dir": spec["dir"].rstrip("/") or "/",
                "layout": spec.get("layout"),
                "resume_from": spec.get("resume_from", "whole"),
                "min_step": spec.get("min_step"),
                "max_age": parse_duration(spec["max_age"]) if spec.get("max_age") is not None else None,
                "verify": spec.get("verify", "at-risk"),
                "model_only": bool(spec.get("model_only", False)),
                "observe_timeout": parse_duration(spec.get("observe_timeout", DEFAULT_OBSERVE_TIMEOUT)),
            }
            if spec.get("layout") == "fabric":  # its rule is declared (the schema requires both)
                norm.update(pattern=spec["pattern"], pick=spec["pick"])
            out.append(Resource(id=f"checkpoint:{name}", kind=self.kind, name=name, spec=norm,
                                needs=tuple(spec.get("needs", ()))))
        return out

    # --- observe ---------------------------------------------------------------------

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        from .survey import survey  # the file checks: in the observer child only

        out: dict[str, Any] = {}
        for r in resources:
            try:
                obs = survey(dict(r.spec), getattr(host, "heartbeat", None))
            except UnsafeTree as exc:  # a link, a special file or an oversized pointer where data was expected
                out[r.id] = ObserveError(str(exc))
                continue
            except OSError as exc:
                out[r.id] = ObserveError(f"cannot read {exc.filename or r.spec['dir']}: {exc.strerror}")
                continue
            except NotCheckable as exc:
                out[r.id] = ObserveError(str(exc))
                continue
            if obs.exists and obs.layout == "unknown":
                out[r.id] = ObserveError(f"{obs.dir}: no checkpoint layout recognised (declare `layout:`)")
                continue
            out[r.id] = obs
        return out

    # --- diff and plan ---------------------------------------------------------------

    def diff(self, resource: Resource, observed: CheckpointsObserved) -> list[Drift]:
        spec, o = resource.spec, observed
        drift = []
        if spec["resume_from"] == "whole" and o.exists:
            if o.resume_path is not None and not o.resume_whole:
                drift.append(Drift("resume_from", "whole", _pick_words(o)))
            elif o.resume_path is None and o.newest_whole_path is not None:
                drift.append(Drift("resume_from", "whole", f"none: {_empty_words(o)} "
                                   f"though {_at(o, o.newest_whole_step)} is whole"))
        if spec["min_step"] is not None and (o.newest_whole_step is None or o.newest_whole_step < spec["min_step"]):
            drift.append(Drift("min_step", f">= {spec['min_step']}", o.newest_whole_step))
        if spec["max_age"] is not None:
            age = None if o.newest_whole_mtime is None else max(0.0, time.time() - o.newest_whole_mtime)
            if age is None or age > spec["max_age"]:
                drift.append(Drift("max_age", f"<= {format_duration(spec['max_age'])}",
                                   None if age is None else format_duration(age)))
        return drift

    def plan(self, resource: Resource, observed: CheckpointsObserved, drift: Sequence[Drift], ctx: Context) -> Plan:
        o = observed
        message = _message(o)
        caveats = _caveats(o)
        if not drift:
            return Plan(message=message, caveats=caveats)
        blocked = []
        for d in drift:
            if d.field == "min_step":
                blocked.append(f"newest whole step {d.have} is below min_step {resource.spec['min_step']}: "
                               "the job must train further")
            elif d.field == "max_age":
                blocked.append(f"newest whole checkpoint is {d.have or 'absent'} old (max_age "
                               f"{format_duration(resource.spec['max_age'])}): the job has stopped saving?")
        actions: list[Action] = []
        if any(d.field == "resume_from" for d in drift):
            stuck = [s for s in _newer_than_whole(o) if s.unreadable]
            if o.blocker:
                blocked.insert(0, o.blocker)
            elif stuck:
                blocked.insert(0, f"{stuck[0].path} cannot be read ({stuck[0].reason}): neither whole nor torn, "
                               "not moved; repair or move it by hand")
            elif o.newest_whole_path is None:
                blocked.insert(0, "no whole checkpoint to resume from")
            else:
                actions = fix_actions(o)
                message += (f"; after apply it will resume from {_at(o, o.newest_whole_step)} "
                            f"({o.newest_whole_path}), the newest whole one")
        return Plan(actions=tuple(actions), blocked="; ".join(blocked) or None, message=message, caveats=caveats)

    # --- apply -----------------------------------------------------------------------

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        from . import fix  # (it imports the file checks: only to act)

        if action.action == "quarantine":
            return fix.quarantine(dict(resource.spec), resource.name, action.params["steps"])
        if action.action == "point":
            return fix.point(dict(resource.spec), resource.name, action.params)
        if action.action == "last":
            return fix.last(dict(resource.spec), resource.name, action.params)
        raise ApplyError(f"unknown checkpoints action {action.action!r}")

    def summary(self, resource: Resource, observed: CheckpointsObserved) -> str:
        o = observed
        if not o.exists:
            return f"{o.dir} does not exist"
        torn = sum(1 for s in o.steps if not s.whole)
        parts = [o.layout + (" (detected)" if o.detected else ""), f"{len(o.steps)} checkpoints"]
        if torn:
            parts.append(f"{torn} not whole")
        parts.append(_resume_words(o))
        if o.newest_whole_path is not None:
            parts.append(f"newest whole {_at(o, o.newest_whole_step)} ({o.newest_whole_path})")
        else:
            parts.append(f"no whole {_noun(o)}")
        return ", ".join(parts)


def _noun(o: CheckpointsObserved) -> str:
    """What a checkpoint's number is: Accelerate's checkpoint_N counts saves, not steps; a Fabric
    checkpoint's is its place in the declared pick order."""
    return "checkpoint" if o.layout in ("accelerate", "fabric") else "step"


def _at(o: CheckpointsObserved, n: int | None) -> str:
    return f"{_noun(o)} {n}" if n is not None else f"an unknown {_noun(o)}"


def _pick_words(o: CheckpointsObserved) -> str:
    s = o.step_at(o.resume_path)
    why = o.resume_problem or (s.reason if s else "missing")
    if not o.resume_path:  # its rule fails before naming a checkpoint (an empty `latest`, an entry without a number)
        return why
    return f"{_at(o, o.resume_step)} ({o.resume_path}): {why}"


def _empty_words(o: CheckpointsObserved) -> str:
    """What the framework does when its rule picks nothing, in its own terms (docs/checkpoints.md)."""
    return o.empty_pick or "the framework would start from scratch"


def _resume_words(o: CheckpointsObserved) -> str:
    if o.resume_path is None:
        return ("no checkpoint: " if not o.steps else "its rule picks none: ") + _empty_words(o)
    if not o.resume_path:
        return "its resume fails before picking a checkpoint"
    state = "whole" if o.resume_whole else "NOT whole"
    return f"will resume from {_at(o, o.resume_step)} ({o.resume_path}, {state})"


def _message(o: CheckpointsObserved) -> str:
    if not o.exists:
        return f"{o.dir} does not exist yet"
    text = _resume_words(o) + f" by {o.resume_rule}"
    if o.layout and o.detected:
        text = f"layout {o.layout} (detected); " + text
    return text


def _caveats(o: CheckpointsObserved) -> tuple[str, ...]:
    out = []
    for path in dict.fromkeys((o.resume_path, o.newest_whole_path)):
        s = o.step_at(path)
        if s is not None and s.whole and s.unproven:
            out.append(f"{s.path}: {s.unproven}")
    return tuple(out)


def _is_newer(o: CheckpointsObserved, s: StepObserved) -> bool:
    newest = o.step_at(o.newest_whole_path)
    if newest is None:
        return True
    if s.step is not None and newest.step is not None:
        return s.step > newest.step
    return s.mtime >= newest.mtime


def _newer_than_whole(o: CheckpointsObserved) -> list[StepObserved]:
    return [s for s in o.steps if not s.whole and (_is_newer(o, s) or s.path == o.resume_path)]


def to_quarantine(o: CheckpointsObserved) -> list[StepObserved]:
    """The torn checkpoints newer than the newest whole one (and the framework's torn pick): the
    ones the framework's rule would pick before the newest whole one."""
    out = []
    for s in _newer_than_whole(o):
        if o.layout == "deepspeed" and not _is_newer(o, s):
            continue  # DeepSpeed reads only what `latest` names: pointing it elsewhere is enough
        out.append(s)
    return out


def fix_actions(o: CheckpointsObserved) -> list[Action]:
    """Apply's actions for a pick that is not whole: move aside, then point (docs/checkpoints.md)."""
    actions = []
    torn = to_quarantine(o)
    if torn:
        first = torn[0]
        where = (os.path.join(os.path.dirname(o.dir.rstrip("/")), QUARANTINE) if o.layout in QUARANTINE_BESIDE
                 else f"{o.dir}/{QUARANTINE}")
        actions.append(Action(
            "quarantine", o.dir,
            f"move {len(torn)} torn checkpoint{'s' if len(torn) != 1 else ''} to {where}/ "
            f"({first.path}: {first.reason}" + (f", +{len(torn) - 1} more" if len(torn) > 1 else "") + ")",
            {"steps": [{"path": s.path, "reason": s.reason} for s in torn]}))
    target = o.newest_whole_path
    if o.layout == "deepspeed" and (o.pointer_text or "").strip() != target:
        actions.append(Action("point", os.path.join(o.dir, "latest"),
                              f"point latest at {target} (step {o.newest_whole_step})",
                              {"file": "latest", "text": target, "step_path": target}))
    elif o.layout == "megatron" and o.resume_path != target:
        text = "release" if target == "release" else str(o.newest_whole_step)
        actions.append(Action("point", os.path.join(o.dir, "latest_checkpointed_iteration.txt"),
                              f"point latest_checkpointed_iteration.txt at {text}",
                              {"file": "latest_checkpointed_iteration.txt", "text": text, "step_path": target}))
    elif o.layout == "lightning":
        moved = {s.path for s in torn}
        left = [s for s in o.steps if s.pointer and s.path not in moved]
        after = max(left, key=lambda s: s.mtime, default=None)
        if after is None or not after.whole or after.step != o.newest_whole_step:
            old = o.step_at("last.ckpt")
            actions.append(Action("last", os.path.join(o.dir, "last.ckpt"),
                                  f"make last.ckpt the newest whole step file {target} (step {o.newest_whole_step})",
                                  {"source": target, "link": bool(old and old.link)}))
    return actions
