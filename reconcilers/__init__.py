"""The registry of resource kinds: state-file key -> the kind's id prefix and its reconciler.

Adding a kind touches three places: its module (or small package) in this folder, its
schema fragment `schema/kinds/<key>.schema.json`, and one line of KINDS. Everything else
is derived from here: the bundled schema and the ids `needs` accepts (statefile.schema), the
default order (the reconciler's `rank`), the kind of a resource id (engine, saved plans).
A reconciler module is imported only when a state file declares its kind.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..core.contract import Reconciler


class Kind(NamedTuple):
    prefix: str  # resource ids are PREFIX:NAME ("unit:vllm.service"); a singleton's id is PREFIX ("gpus")
    target: str  # "module:Class"; a module starting with "." is relative to this package
    singleton: bool = False  # one resource for the whole section (the host's GPUs)
    name_word: str = "NAME"  # how docs and messages name the NAME part: mount:PATH


KINDS: dict[str, Kind] = {
    "units": Kind("unit", ".units:UnitsReconciler"),
    "containers": Kind("container", ".containers:ContainersReconciler"),
    "gpus": Kind("gpus", ".gpus:GpusReconciler", singleton=True),
    "mounts": Kind("mount", ".mounts:MountsReconciler", name_word="PATH"),
    "extractions": Kind("extraction", ".extractions:ExtractionsReconciler"),
    "checkpoints": Kind("checkpoint", ".checkpoints:CheckpointsReconciler"),
    "pools": Kind("pool", ".pools:PoolsReconciler"),
}


def key_of(kind: str) -> str | None:
    """The state-file key of a resource kind ("unit" -> "units"), None for one not registered."""
    for key, entry in KINDS.items():
        if entry.prefix == kind:
            return key
    return None


def reconciler_class(key: str) -> type[Reconciler]:
    module_name, _, class_name = KINDS[key].target.partition(":")
    module = importlib.import_module(module_name, __name__ if module_name.startswith(".") else None)
    return getattr(module, class_name)


def reconciler_for(key: str) -> Reconciler:
    return reconciler_class(key)()
