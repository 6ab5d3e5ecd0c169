"""The registry: state-file key -> reconciler class, imported only when a state uses it.

Adding a resource kind touches its module, its schema fragment in schema/kinds/ and
one line here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Reconciler

# key -> "module:Class"; the key is also the name of schema/kinds/<key>.schema.json
REGISTRY: dict[str, str] = {
    "units": "reconcile.reconcilers.units:UnitsReconciler",
    "gpus": "reconcile.reconcilers.gpus:GpusReconciler",
    "mounts": "reconcile.reconcilers.mounts:MountsReconciler",
    "extractions": "reconcile.reconcilers.extractions:ExtractionsReconciler",
}

# id prefix -> key, for `needs` ids such as "unit:NAME" or the singleton "gpus"
ID_PREFIXES: dict[str, str] = {
    "unit": "units",
    "gpus": "gpus",
    "mount": "mounts",
    "extraction": "extractions",
}


def reconciler_for(key: str) -> Reconciler:
    module_name, _, class_name = REGISTRY[key].partition(":")
    return getattr(importlib.import_module(module_name), class_name)()
