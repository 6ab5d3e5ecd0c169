"""Saved plans: `diff --out plan.json`, then `apply plan.json` does exactly those actions, or refuses."""

from __future__ import annotations

import json

from gitops_support import cli, is_active, is_enabled, service, validate_report  # noqa: F401  (cli: fixture)
from reconcile_host.pipeline.plans import changes, fingerprint, fingerprints, is_saved_plan

UNIT = "t-plan.service"
STATE = f"version: 1\nunits:\n  {UNIT}:\n    active: false\n    enabled: false\n"


def res(status="drift", drift=None, actions=None, kind="unit", rid="unit:x.service"):
    return {"id": rid, "kind": kind, "status": status, "drift": drift or [], "actions": actions or [],
            "message": ""}


# --- pure --------------------------------------------------------------------------------

def test_fingerprint_is_the_decision_not_the_wording():
    stop = {"action": "stop", "target": "x.service", "description": "stop x.service", "result": "planned"}
    a = res(drift=[{"field": "active", "want": False, "have": True}], actions=[stop])
    reworded = res(drift=a["drift"], actions=[{**stop, "description": "stop it now"}])
    assert fingerprint(a, ()) == fingerprint(reworded, ())
    assert fingerprint(a, ()) != fingerprint(res(drift=a["drift"]), ())  # no action any more
    assert fingerprint(a, ()) != fingerprint(res("ok"), ())
    other_pid = res(actions=[{"action": "terminate", "target": "pid 2", "params": {"pid": 2}, "result": "planned"}])
    same_pid = res(actions=[{"action": "terminate", "target": "pid 2", "params": {"pid": 3}, "result": "planned"}])
    assert fingerprint(other_pid, ()) != fingerprint(same_pid, ())  # params count: a different process


def test_volatile_drift_fields_hash_field_and_want_only():
    def gpu(have, want="<= 1024 MiB"):
        return res(kind="gpus", rid="gpus", drift=[{"field": "gpu0.memory_used", "want": want, "have": have}])

    volatile = ("gpu*.memory_used",)
    assert fingerprint(gpu("75800 MiB"), volatile) == fingerprint(gpu("75812 MiB"), volatile)
    assert fingerprint(gpu("75800 MiB"), volatile) != fingerprint(gpu("75800 MiB", "<= 2048 MiB"), volatile)
    assert fingerprint(gpu("75800 MiB"), ()) != fingerprint(gpu("75812 MiB"), ())


def test_changes_names_each_resource_and_how():
    planned = {"resources": [res(drift=[{"field": "active", "want": False, "have": True}],
                                 actions=[{"action": "stop", "target": "x.service", "result": "planned"}]),
                             res("ok", rid="unit:y.service")]}
    plan = {"fingerprints": fingerprints(planned), "report": planned}
    assert changes(plan, planned) == []
    now = {"resources": [res("ok"), res("ok", rid="unit:y.service")]}
    [line] = changes(plan, now)
    assert line == ("unit:x.service: planned drift; active: true -> false; actions: stop x.service; "
                    "now ok; actions: none")


def test_plan_detected_by_content(tmp_path):
    yaml_state = tmp_path / "s.yaml"
    yaml_state.write_text(STATE)
    json_state = tmp_path / "s.json"
    json_state.write_text(json.dumps({"version": 1, "units": {}}))
    plan = tmp_path / "plan.yaml"  # the name does not matter
    plan.write_text(json.dumps({"plan_format": "1"}))
    assert not is_saved_plan(yaml_state) and not is_saved_plan(json_state) and is_saved_plan(plan)
    assert not is_saved_plan(tmp_path / "missing.json")


# --- on a real systemd -----------------------------------------------------------------------

def start_unit(nsd, name=UNIT):
    nsd.write_unit(name, service(name), enable=True)
    nsd.systemctl("start", name, check=True)


def test_saved_plan_applies_exactly_its_actions(nsystemd, cli):  # noqa: F811
    start_unit(nsystemd)
    state = cli.state(STATE)
    plan_file = cli.tmp / "plan.json"
    proc = cli("diff", str(state), "--out", str(plan_file))
    assert proc.returncode == 2, proc.stderr
    assert f"Saved the plan to {plan_file}" in proc.stderr
    plan = json.loads(plan_file.read_text())
    assert plan["plan_format"] == "1" and plan["format_version"] == "1"
    assert plan["state_file"]["path"] == str(state)
    assert set(plan["fingerprints"]) == {f"unit:{UNIT}"} and plan["created"].endswith("Z")
    validate_report(plan["report"])
    assert [a["action"] for a in plan["report"]["resources"][0]["actions"]] == ["disable", "stop"]
    # diff --out changed nothing
    assert is_active(nsystemd, UNIT) == "active"

    code, report = cli.json("apply", str(plan_file))
    assert code == 0, report
    validate_report(report)
    assert [(a["action"], a["result"]) for a in report["resources"][0]["actions"]] == [
        ("disable", "done"), ("stop", "done")]
    assert is_active(nsystemd, UNIT) == "inactive" and is_enabled(nsystemd, UNIT) == "disabled"
    results = [e for e in cli.journal_lines() if e["event"] == "result"]
    assert [(e["action"], e["result"]) for e in results] == [("disable", "done"), ("stop", "done")]

    # Applied once; now the host no longer matches the plan: refused, nothing done.
    again = cli("apply", str(plan_file))
    assert again.returncode == 1
    assert "the host no longer matches it" in again.stderr and "now ok" in again.stderr
    assert len([e for e in cli.journal_lines() if e["event"] == "result"]) == 2


def test_stale_plan_is_refused_and_says_what_changed(nsystemd, cli):  # noqa: F811
    start_unit(nsystemd)
    nsystemd.write_unit("t-plan-other.service", service("other"))
    state = cli.state(STATE + "  t-plan-other.service:\n    active: false\n")
    plan_file = cli.tmp / "plan.json"
    assert cli("diff", str(state), "--out", str(plan_file)).returncode == 2
    # Between plan and apply someone stops our unit and starts another one.
    nsystemd.systemctl("stop", UNIT, check=True)
    nsystemd.systemctl("start", "t-plan-other.service", check=True)

    proc = cli("apply", str(plan_file))
    assert proc.returncode == 1
    err = proc.stderr
    assert "Traceback" not in err and "refusing the saved plan" in err
    assert (f"unit:{UNIT}: planned drift; active: true -> false, enabled: true -> false; "
            f"actions: disable {UNIT}, stop {UNIT}; now drift; enabled: true -> false; "
            f"actions: disable {UNIT}") in err
    assert ("unit:t-plan-other.service: planned ok; actions: none; now drift; active: true -> false; "
            "actions: stop t-plan-other.service") in err
    # and what changed on the host, field by field (deepdiff of the observations)
    assert "observed since the plan: active_state: active -> inactive, sub_state: running -> dead" in err
    assert "observed since the plan: active_state: inactive -> active" in err
    # Nothing was acted on.
    assert cli.journal_lines() == []
    assert is_enabled(nsystemd, UNIT) == "enabled" and is_active(nsystemd, "t-plan-other.service") == "active"


def test_plan_refused_when_state_file_changed(nsystemd, cli):  # noqa: F811
    start_unit(nsystemd)
    state = cli.state(STATE)
    plan_file = cli.tmp / "plan.json"
    assert cli("diff", str(state), "--out", str(plan_file)).returncode == 2
    state.write_text(STATE + "# reviewed\n")
    proc = cli("apply", str(plan_file))
    assert proc.returncode == 1
    assert f"the state file {state} changed since" in proc.stderr
    assert is_active(nsystemd, UNIT) == "active"


def test_plan_refused_on_another_host(nsystemd, cli):  # noqa: F811
    start_unit(nsystemd)
    state = cli.state(STATE)
    plan_file = cli.tmp / "plan.json"
    assert cli("diff", str(state), "--out", str(plan_file)).returncode == 2
    nsystemd.set_hostname("gpu-node-7")
    proc = cli("apply", str(plan_file))
    assert proc.returncode == 1 and "this host is 'gpu-node-7'" in proc.stderr
    assert is_active(nsystemd, UNIT) == "active"


def test_step_revealed_after_the_plan_is_not_carried_out(nsystemd, cli):  # noqa: F811
    # Masked while enabled: the plan is "unmask"; unmasking reveals "enabled", and a plain apply
    # would disable too. The saved plan did not say so: reported as skipped, not done.
    name = "t-plan-um.service"
    path = nsystemd.root / "run/systemd/system" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(service(name))
    nsystemd.systemctl("daemon-reload", check=True)
    try:
        nsystemd.systemctl("enable", name, check=True)
        nsystemd.systemctl("mask", name, check=True)
        state = cli.state(f"version: 1\nunits:\n  {name}:\n    enabled: false\n")
        plan_file = cli.tmp / "plan.json"
        assert cli("diff", str(state), "--out", str(plan_file)).returncode == 2
        code, report = cli.json("apply", str(plan_file))
        validate_report(report)
        assert code == 2
        res = report["resources"][0]
        assert [(a["action"], a["result"]) for a in res["actions"]] == [("unmask", "done"), ("disable", "skipped")]
        assert res["actions"][1]["message"] == "not in the saved plan"
        assert "not in the saved plan" in res["message"]
        assert is_enabled(nsystemd, name) == "enabled"
        assert [e["action"] for e in cli.journal_lines() if e["event"] == "result"] == ["unmask"]
    finally:
        nsystemd.systemctl("unmask", name)
        nsystemd.systemctl("disable", name)
        path.unlink()
        nsystemd.systemctl("daemon-reload")
