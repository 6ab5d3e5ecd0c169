"""The schema and the conversions agree: every field of the bundled schema (walked from the
schema itself, so a new field is covered without an edit here) gets each edge value — numbers
at and past the 64-bit and float limits, infinities, negative and fractional numbers where
counts are meant, sizes and durations of hundreds of digits, percentages past 100 %, names with
newlines and path separators, collections where scalars are meant. Each result is either a
state that builds (every value the schema admits converts) or one `file:line:col: message` line
per problem: never an exception from a conversion."""

from __future__ import annotations

import copy
import json
import re

import pytest
from reconcile_host.pipeline.statefile import StateFileError, bundled_schema, load, validate_text

# Every field of every kind, valid. The walk below fails if the schema gains a field this lacks.
BASE = {
    "version": 1,
    "host": {"name": "*", "machine_id": "0123456789abcdef0123456789abcdef"},  # the string form: its edge values
    "units": {"a.service": {"active": False, "enabled": False, "needs": ["mount:/data"]}},
    "containers": {"vllm": {"engine": "docker", "running": False, "restart": "no", "image": "vllm/vllm-openai:v0.6",
                            "stop_timeout": "30s", "unit": "vllm-container.service", "needs": ["unit:a.service"],
                            "compose": {"project": "serve", "service": "vllm"}}},
    "gpus": {"count": 0, "max_memory_used": "1GiB", "allow": ["unit:a.service"], "healthy": True,
             "free_with": {"stop_units": True, "stop_containers": True, "kill": ["python*"], "grace": "10s"},
             "observe_timeout": "60s", "settle": "5s", "needs": ["unit:a.service"],
             "checks": {"driver": ">=590", "cuda": ">=12.8", "max_temperature": 85, "no_slowdown": True,
                        "pcie": {"min_gen": "max", "min_width": 16}, "max_nvlink_down": 0, "max_ecc_corrected": 0,
                        "same_vbios": True, "persistence_mode": "enabled"},
             "settings": {"persistence_mode": True, "power_limit": "450W", "compute_mode": "default",
                          "application_clocks": {"memory": "9501MHz", "graphics": "1980MHz"},
                          "locked_clocks": {"min": "1500MHz", "max": "1980MHz"}, "mig": "disabled",
                          "ecc": "enabled",
                          "per_gpu": {"3": {"persistence_mode": True, "power_limit": "default",
                                            "compute_mode": "exclusive_process", "application_clocks": "default",
                                            "locked_clocks": "none", "mig": "enabled", "ecc": "disabled"}}},
             "recover": {"reset": True, "reboot": False, "reboot_with": "systemctl", "max_resets": 2, "max_reboots": 2,
                         "window": "24h"},
             "validate": {"command": ["/bin/true"], "timeout": "10m", "after": ["boot", "recover"]}},
    "mounts": {"/data": {"mounted": True, "source": "tmpfs", "fstype": "tmpfs", "options": ["rw"],
                         "min_free": "1%", "min_free_inodes": "1%", "writable": True, "probe_timeout": "5s",
                         "needs": []}},
    "extractions": {"x": {"dir": "/data/x", "pattern": "rows_{group}/data_{index}.ckpt", "total": 10, "min_done": 5,
                          "allow_missing": [1], "verify": "at-risk", "observe_timeout": "60s",
                          "job": {"unit": "x.service"}, "needs": []},
                    "y": {"dir": "/data/y", "total": 10, "job": {"command": ["/bin/true"], "cwd": "/"}}},
    "checkpoints": {"run": {"dir": "/data/run", "layout": "hf-trainer", "resume_from": "whole", "min_step": 100,
                            "max_age": "6h", "verify": "at-risk", "model_only": False, "observe_timeout": "60s",
                            "pattern": "epoch-*.ckpt", "pick": "lexicographic", "needs": ["mount:/data"]}},
    "pools": {"vm": {"pool": "vm-disks", "cluster": {"conf": "/etc/ceph/ceph.conf", "id": "reconcile", "keyring": None},
                     "observe_timeout": "15s", "healthy": True, "min_free": "10%",
                     "quota": {"max_bytes": "8TiB", "min_free": "500GiB"}, "max_overcommit": 1.5,
                     "min_days_to_full": "5d", "ratios": {"nearfull": 0.85, "backfillfull": 0.9, "full": 0.95},
                     "needs": []}},
}

EDGES = [
    "0", "-1", "1", "8.0", "0.5", "-0.5", "1e308", "1e999", "9223372036854775807", "9223372036854775808",
    "-9223372036854775809", "9" * 25, "9" * 5000, ".inf", "-.inf", ".nan", "true", "null", '""',
    '"-1s"', '"1e400s"', '"0s"', '"99999999999999999999d"', '"3651d"', '"' + "9" * 400 + 's"',
    '"' + "9" * 400 + 'GiB"', '"9999999PiB"', '"8EiB"', '"1.5"', '"-5%"', '"0%"', '"100%"', '"100.5%"',
    '"101%"', '"1e3%"', '"a\\nb.service"', '"a/b.service"', '"a\\u0000b"', '"/"', '"relative/path"',
    "[]", "{}", "[1]", '["a\\nb"]', "[-1]", "[1e999]", '"' + "x" * 300 + '"',
]


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:  # a JSON pointer into the bundle, e.g. #/$defs/gpus/$defs/power
        target = schema
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def field_paths(schema: dict) -> list[tuple]:
    """(path in BASE) of every property the schema declares, found by walking it."""
    paths: list[tuple] = []

    declared: set[tuple] = set()
    found: set[tuple] = set()

    def walk(node: dict, path: tuple, doc, shape: tuple) -> None:
        node = _resolve(schema, node)
        for key, sub in node.get("properties", {}).items():
            declared.add((*shape, key))
            if isinstance(doc, dict) and key in doc:
                found.add((*shape, key))
                paths.append((*path, key))
                walk(sub, (*path, key), doc[key], (*shape, key))
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and isinstance(doc, dict):
            for name in doc:
                if name not in node.get("properties", {}):
                    walk(extra, (*path, name), doc[name], (*shape, "*"))
        if isinstance(node.get("items"), dict) and isinstance(doc, list) and doc:
            paths.append((*path, 0))

    walk(schema, (), BASE, ())
    lacking = sorted(".".join(k) for k in declared - found)
    assert not lacking, f"BASE lacks these fields of the schema: add them: {lacking}"
    return paths


PLACE = "\u0001EDGE\u0001"


def text_with(path: tuple, token: str) -> str:
    doc = copy.deepcopy(BASE)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = PLACE
    return json.dumps(doc, indent=1).replace(json.dumps(PLACE), token)


def test_base_state_uses_every_field_and_is_valid():
    assert validate_text(json.dumps(BASE), "base.json")
    assert len(field_paths(bundled_schema())) >= 30


PATHS = field_paths(bundled_schema())


@pytest.mark.parametrize("path", PATHS, ids=[".".join(map(str, p)) for p in PATHS])
def test_every_field_with_edge_values(path):
    for token in EDGES:
        text = text_with(path, token)
        try:
            load("edge.json", text=text, use_cache=False)  # validated, then every resource built
        except StateFileError as exc:
            for line in exc.problems:
                assert re.fullmatch(r"edge\.json:\d+:\d+: \S[^\n]*", line), (token, line)
        # anything else (ValueError, OverflowError, TypeError from a conversion) fails the test
