"""The fuzzer on the other files reconcile reads (tests/fuzz_support.py): inventories, and saved
plans. Same rules as for state files: never a traceback, a hang or a crash; an inventory's
problems are `file:line:col: message` lines; a plan is applied whole or refused whole (PlanError)
before anything is done. A plan whose actions were edited — retargeted, added, reordered, given
another verb — while its fingerprints were left alone is always refused."""

from __future__ import annotations

import copy
import json
import os
import random
import re
import tempfile

from cli_support import run_cli
from fuzz_support import EDGE_VALUES, run_all, seed_texts, state_inputs
from reconcile_host.pipeline.plans import PlanError, load_plan, make_plan
from reconcile_host.pipeline.statefile import StateFileError

SEED = int(os.environ.get("RECONCILE_FUZZ_SEED", "13"))
INVENTORY_INPUTS = 600
PLAN_INPUTS = 600


def inventory_seeds() -> list[str]:
    return [t for t in seed_texts() if "hosts:" in t] + [
        "version: 1\nhosts:\n  a:\n    address: ssh://root@127.0.0.1:2222\n    state: a.yaml\n"
        "    connect_timeout: 5s\n  b:\n    via: nsenter -t 1 -m -p --\n    state: b.yaml\n"
        "groups:\n  all: [a, b]\ndefaults:\n  ssh_options: [BatchMode=yes]\n"]


def check_inventory(data: bytes) -> str:
    from reconcile_host.doors.inventory import load_inventory

    with tempfile.NamedTemporaryFile(suffix=".yaml") as fh:
        fh.write(data)
        fh.flush()
        try:
            load_inventory(fh.name)
        except StateFileError as exc:
            for p in exc.problems:
                if not re.fullmatch(re.escape(fh.name) + r":\d+:\d+: \S[^\n\r]*", p):
                    return f"not one file:line:col: message line: {p!r}"
    return ""


def test_fuzz_inventories():
    seeds = inventory_seeds()
    assert len(seeds) >= 2
    inputs = list(state_inputs(SEED, INVENTORY_INPUTS, seeds))
    bad = run_all(inputs, check_inventory)
    assert not bad, "\n".join(f"input {i}: {why}" for i, why in sorted(bad.items())[:10])


# --- saved plans -------------------------------------------------------------------------

def _resource(name: str, actions: list[tuple[str, str]]) -> dict:
    return {"id": f"unit:{name}", "kind": "unit", "status": "drift" if actions else "ok",
            "drift": [{"field": "active", "want": False, "have": True}] if actions else [],
            "actions": [{"action": a, "target": t, "description": f"{a} {t}", "params": {}, "result": "planned"}
                        for a, t in actions], "message": ""}


def a_plan(tmp: str) -> dict:
    state = os.path.join(tmp, "state.yaml")
    with open(state, "w") as fh:
        fh.write("version: 1\nunits:\n  a.service: {active: false, enabled: false}\n  b.service: {active: false}\n"
                 "  c.service: {active: true}\n")
    resources = [_resource("a.service", [("disable", "a.service"), ("stop", "a.service")]),
                 _resource("b.service", [("stop", "b.service")]), _resource("c.service", [])]
    report = {"format_version": "1", "command": "diff", "host": "h", "state_file": state, "exit_code": 2,
              "resources": resources, "summary": {"ok": 1, "drift": 2, "converging": 0, "blocked": 0, "error": 0,
                                                  "actions_planned": 3, "actions_done": 0, "actions_failed": 0}}
    return make_plan(report, state)


def edit_actions(rng: random.Random, plan: dict) -> dict:
    """An edit of the actions only: the fingerprints are left as they were."""
    plan = copy.deepcopy(plan)
    res = rng.choice([r for r in plan["report"]["resources"] if r["actions"]])
    acts = res["actions"]
    how = rng.choice(["retarget", "add", "reorder", "verb", "params", "move"])
    if how == "retarget":
        rng.choice(acts)["target"] = rng.choice(["sshd.service", "c.service", "", "/"])
    elif how == "add":
        acts.append({**rng.choice(acts), "target": rng.choice(["sshd.service", "a.service"])})
        plan["report"]["summary"]["actions_planned"] += 1
    elif how == "reorder":
        if len(acts) > 1:
            acts.reverse()
        else:
            acts.append(copy.deepcopy(acts[0]))
    elif how == "verb":
        rng.choice(acts)["action"] = rng.choice(["mask", "start", "terminate", "quarantine"])
    elif how == "params":
        rng.choice(acts)["params"] = {"pid": 1}
    else:  # an action moved to another resource
        other = next(r for r in plan["report"]["resources"] if r is not res)
        other["actions"].append(acts.pop())
    return plan


def mutate_json(rng: random.Random, node):
    """Somewhere in the document, a value of another type or a key removed."""
    node = copy.deepcopy(node)
    spots = []

    def collect(n):
        if isinstance(n, dict):
            for k in list(n):
                spots.append((n, k))
                collect(n[k])
        elif isinstance(n, list):
            for i in range(len(n)):
                spots.append((n, i))
                collect(n[i])

    collect(node)
    for _ in range(rng.randint(1, 3)):
        parent, key = rng.choice(spots)
        if isinstance(parent, dict) and rng.random() < 0.3:
            parent.pop(key, None)
            continue
        try:
            parent[key] = rng.choice([None, True, 0, -1, 1.5, "", "x" * 100, [], {}, [1, [2]], {"a": None},
                                      2**70, "unit:a.service"])
        except (IndexError, KeyError):
            pass
    return node


def plan_inputs(tmp: str, seed: int, count: int) -> tuple[list[bytes], set[int]]:
    rng = random.Random(seed)
    plan = a_plan(tmp)
    inputs, must_refuse = [], set()
    for i in range(count):
        kind = rng.random()
        if kind < 0.35:
            doc = edit_actions(rng, plan)
            must_refuse.add(i)
            data = json.dumps(doc).encode()
        elif kind < 0.8:
            data = json.dumps(mutate_json(rng, plan)).encode()
        else:
            text = json.dumps(plan, indent=2)
            data = bytearray(text.encode())
            for _ in range(rng.randint(1, 4)):
                j = rng.randrange(len(data))
                if rng.random() < 0.5:
                    data[j] ^= 1 << rng.randrange(8)
                else:
                    del data[j:j + rng.randint(1, 30)]
            data = bytes(data) if rng.random() < 0.9 else text.encode()[: rng.randrange(len(text))]
        inputs.append(data)
    return inputs, must_refuse


def test_fuzz_saved_plans(tmp_path):
    inputs, must_refuse = plan_inputs(str(tmp_path), SEED, PLAN_INPUTS)
    assert len(must_refuse) > 100
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(a_plan(str(tmp_path))))
    load_plan(path)  # the untouched plan holds

    def check(data: bytes) -> str:
        index = inputs.index(data)
        with tempfile.NamedTemporaryFile(suffix=".json") as fh:
            fh.write(data)
            fh.flush()
            try:
                load_plan(fh.name)
            except PlanError:
                return ""
        return "an edited plan was not refused" if index in must_refuse else ""

    bad = run_all(inputs, check)
    assert not bad, "\n".join(f"input {i}: {why}" for i, why in sorted(bad.items())[:10])


def test_edited_plans_through_the_cli_are_refused_before_anything_is_done(tmp_path):
    rng = random.Random(SEED)
    plan = a_plan(str(tmp_path))
    journal = tmp_path / "j" / "journal.jsonl"
    for n in range(6):
        path = tmp_path / f"plan{n}.json"
        path.write_text(json.dumps(edit_actions(rng, plan), indent=2))
        proc = run_cli(tmp_path, "apply", str(path), "--journal", str(journal))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.startswith(f"reconcile: error: refusing the saved plan {path}: it does not match itself")
        assert "Traceback" not in proc.stderr
        assert not journal.parent.exists()  # no lock taken, no journal line: nothing was done


def test_wrong_types_in_a_plan_are_refused_not_a_traceback(tmp_path):
    rng = random.Random(SEED + 1)
    plan = a_plan(str(tmp_path))
    for n in range(6):
        path = tmp_path / f"plan{n}.json"
        path.write_text(json.dumps(mutate_json(rng, plan)))
        proc = run_cli(tmp_path, "apply", str(path), "--dry-run")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("reconcile: error: "), proc.stderr


assert EDGE_VALUES  # the generator's table is shared with the state-file fuzzer
