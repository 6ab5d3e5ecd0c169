"""Each kind contributes its own Prometheus metrics (Reconciler.metrics, docs/design.md "A kind's
own metrics"), read from the report's JSON form; views/prometheus.py names no kind.

The silent drop this guards against: a kind's metrics read its observed JSON by key, so a field
renamed in the observed dataclass would make `.get()` answer None, and None is "unknown": the
metric would vanish without an error. Here every key a kind's metrics read is checked against the
fields of the dataclass the value came from (followed through the type hints: GpusObserved.gpus
holds Gpu's), on an observation the kind itself made through the real CLI (the GPUs from the fake
libnvidia-ml through the real pynvml, the extraction from files this test wrote)."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli
from extraction_support import write_sample
from gpu_support import FakeConfig, nvml_env, seed_gpus
from reconcile_host.reconcilers import KINDS, reconciler_class
from reconcile_host.reconcilers.extractions import ExtractionObserved
from reconcile_host.reconcilers.gpus.observed import GpusObserved
from reconcile_host.reconcilers.pools.observed import PoolObserved

ROOT = Path(__file__).resolve().parent.parent

# The observed dataclass of every kind that has metrics of its own. A kind that adds metrics
# adds its row here, and to the real run of `observed_docs` below.
OBSERVED: dict[str, type] = {"gpus": GpusObserved, "extractions": ExtractionObserved, "pools": PoolObserved}
# Kinds whose real observation needs a daemon this file does not start: checked with the same
# `check_metrics_reads` where that daemon runs.
ELSEWHERE = {"pools": "tests/test_pools_ceph.py (a real Ceph)"}


def dataclass_in(hint: Any) -> type | None:
    """The dataclass a field's value holds: itself, or the items of a tuple, or an Optional's."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        found = dataclass_in(arg)
        if found is not None:
            return found
    return None


class Reads(Mapping):
    """A dataclass's JSON form that notes every key read from it which is no field of the class."""

    def __init__(self, plain: Mapping[str, Any], cls: type, path: str, misses: list[str], reads: list[str]):
        self.plain, self.cls, self.path, self.misses, self.reads = plain, cls, path, misses, reads
        self.hints = typing.get_type_hints(cls)
        self.fields = {f.name for f in dataclasses.fields(cls)}

    def __getitem__(self, key: str) -> Any:
        where = f"{self.path}.{key}"
        self.reads.append(where)
        if key not in self.fields:
            self.misses.append(f"{where} ({self.cls.__name__} has no field {key!r})")
        value = self.plain[key]
        inner = dataclass_in(self.hints.get(key))
        if inner is None:
            return value
        if isinstance(value, Mapping):
            return Reads(value, inner, where, self.misses, self.reads)
        if isinstance(value, list):
            return [Reads(v, inner, f"{where}[{i}]", self.misses, self.reads) if isinstance(v, Mapping) else v
                    for i, v in enumerate(value)]
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.plain)

    def __len__(self) -> int:
        return len(self.plain)


def kinds_with_metrics() -> set[str]:
    from reconcile_host.core.contract import Reconciler

    return {key for key in KINDS if reconciler_class(key).metrics is not Reconciler.metrics}


def test_every_kind_with_metrics_is_checked_here():
    assert kinds_with_metrics() == set(OBSERVED)


@pytest.fixture(scope="module")
def observed_docs(tmp_path_factory, fake_lib) -> dict[str, Any]:
    """One real `diff --format json` of a host with two GPUs and an extraction whose job is declared."""
    tmp = tmp_path_factory.mktemp("kind-metrics")
    gpus = seed_gpus(2)
    gpus[0].used_mib = 1234
    config = tmp / "gpus.conf"
    FakeConfig(gpus=gpus).write(config)
    out = tmp / "samples"
    for i in range(4):
        write_sample(out, i)
    write_sample(out, 4, cut=100)
    state = tmp / "state.yaml"
    state.write_text(f"version: 1\ngpus:\n  count: 2\nextractions:\n  eagle3:\n    dir: {out}\n    total: 10\n"
                     f"    verify: content\n    job:\n      command: [sleep, '600']\n      cwd: {tmp}\n")
    proc = run_cli(tmp, "diff", str(state), "--format", "json",
                   **{**nvml_env(fake_lib, config), "RECONCILE_STATE_DIR": str(tmp / "rstate")})
    return json.loads(proc.stdout)


@pytest.mark.parametrize("key", sorted(set(OBSERVED) - set(ELSEWHERE)))
def test_a_kinds_metrics_read_only_fields_of_what_it_observed(observed_docs, key):
    check_metrics_reads(observed_docs, key)


def check_metrics_reads(observed_docs: dict[str, Any], key: str) -> None:
    """KEY's metrics, on the kind's resources of a real report, read only fields of its observed
    dataclass, and give values."""
    reconciler = reconciler_class(key)()
    resources = [r for r in observed_docs["resources"] if r["kind"] == KINDS[key].prefix]
    assert resources and all(isinstance(r.get("observed"), Mapping) for r in resources), observed_docs
    for res in resources:
        misses: list[str] = []
        reads: list[str] = []
        wrapped = {**res, "observed": Reads(res["observed"], OBSERVED[key], res["id"], misses, reads)}
        metrics = reconciler.metrics(wrapped, observed_docs)
        assert misses == [], misses
        assert reads, "the kind's metrics read nothing of what it observed"
        samples = [s for m in metrics for s in m.samples if s.value is not None]
        assert samples, f"{res['id']}: no metric has a value"
        assert all(m.name.startswith(f"reconcile_{KINDS[key].prefix.rstrip('s')}") for m in metrics), \
            [m.name for m in metrics]
        # The same samples as from the plain JSON: the check changed nothing it read.
        assert [(m.name, m.samples) for m in reconciler.metrics(res, observed_docs)] == \
            [(m.name, m.samples) for m in metrics]


def test_the_check_catches_a_key_that_is_no_field(observed_docs):
    """A metrics function still reading a renamed field (`memory_used_bytes` for Gpu.memory_used)."""
    res = next(r for r in observed_docs["resources"] if r["kind"] == "gpus")
    misses: list[str] = []
    observed = Reads(res["observed"], GpusObserved, "gpus", misses, [])
    assert observed["gpus"][0].get("memory_used_bytes") is None  # what the metric would silently become
    assert misses == ["gpus.gpus[0].memory_used_bytes (Gpu has no field 'memory_used_bytes')"]


def test_the_prometheus_view_names_no_kind():
    """views/prometheus.py asks each kind for its metrics: no kind's key, id prefix or metric stem
    appears in its names or strings (its docstrings aside)."""
    words = {w for key, kind in KINDS.items() for w in (key, kind.prefix, kind.prefix.rstrip("s"))}
    path = ROOT / "views" / "prometheus.py"
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            text = node.name
        elif isinstance(node, ast.arg):
            text = node.arg
        else:
            continue
        hits = set(re.findall(r"[a-z]+", text.lower())) & words
        if hits:
            found.append(f"{path.name}:{node.lineno}: {sorted(hits)} in {text!r}")
    assert found == []
