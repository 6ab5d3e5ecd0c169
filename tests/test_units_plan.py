"""Units, pure layer: observed facts in, drift and plan out. No host touched."""

from __future__ import annotations

import pytest
from reconcile.reconcilers.base import Context, ObserveError, Resource
from reconcile.reconcilers.engine import judge
from reconcile.reconcilers.units import UnitObserved, UnitsReconciler, parse_show

R = UnitsReconciler()


def unit(active_state="inactive", sub="dead", file_state="disabled", load="loaded", pid=0, name="u.service"):
    return UnitObserved(name, load, active_state, sub, file_state, pid)


def plan_for(spec, observed):
    res = Resource(id="unit:u.service", kind="unit", name="u.service", spec=spec)
    drift = R.diff(res, observed)
    plan = R.plan(res, observed, drift, Context())
    return drift, plan, judge(drift, plan).value


CASES = [
    # (name, declared, observed, drift fields, actions, status)
    ("seed: running+enabled -> stop+disable", {"active": False, "enabled": False},
     unit("active", "running", "enabled", pid=42), ["active", "enabled"], ["disable", "stop"], "drift"),
    ("already right", {"active": False, "enabled": False}, unit(), [], [], "ok"),
    ("only enabled differs", {"active": False, "enabled": False}, unit(file_state="enabled"),
     ["enabled"], ["disable"], "drift"),
    ("start and enable", {"active": True, "enabled": True}, unit(), ["active", "enabled"], ["enable", "start"],
     "drift"),
    ("auto-restart is not inactive", {"active": False}, unit("activating", "auto-restart", "enabled"),
     ["active"], ["stop"], "drift"),
    ("failed counts as stopped", {"active": False}, unit("failed", "failed"), [], [], "ok"),
    ("failed wanted running -> start", {"active": True}, unit("failed", "failed"), ["active"], ["start"], "drift"),
    ("mask a running unit", {"active": False, "enabled": "masked"}, unit("active", "running", "enabled"),
     ["active", "enabled"], ["mask", "stop"], "drift"),
    ("masked wanted disabled -> unmask", {"enabled": False}, unit(file_state="masked", load="masked"),
     ["enabled"], ["unmask"], "drift"),
    ("masked and masked", {"enabled": "masked", "active": False}, unit(file_state="masked", load="masked"),
     [], [], "ok"),
    ("masked cannot start", {"active": True}, unit(file_state="masked", load="masked"), ["active"], [],
     "blocked"),
    ("static cannot be disabled", {"enabled": False}, unit(file_state="static"), ["enabled"], [], "blocked"),
    ("static running, stop still done", {"active": False, "enabled": False},
     unit("active", "running", "static"), ["active", "enabled"], ["stop"], "blocked"),
    ("indirect cannot be enabled", {"enabled": True}, unit(file_state="indirect"), ["enabled"], [], "blocked"),
    ("generated cannot be enabled", {"enabled": True}, unit(file_state="generated"), ["enabled"], [], "blocked"),
    ("not-found wanted stopped is fine", {"active": False, "enabled": False},
     unit(file_state="", load="not-found"), [], [], "ok"),
    ("not-found wanted running", {"active": True}, unit(file_state="", load="not-found"), ["active"], [],
     "blocked"),
    ("not-found can be masked", {"enabled": "masked"}, unit(file_state="", load="not-found"), ["enabled"],
     ["mask"], "drift"),
    ("enabled-runtime is enabled", {"enabled": True}, unit(file_state="enabled-runtime"), [], [], "ok"),
    ("only active declared ignores enabled", {"active": True}, unit("active", "running", "disabled"), [], [],
     "ok"),
]


@pytest.mark.parametrize("name,spec,observed,fields,actions,status", CASES, ids=[c[0] for c in CASES])
def test_units_plan(name, spec, observed, fields, actions, status):
    drift, plan, got_status = plan_for(spec, observed)
    assert [d.field for d in drift] == fields
    assert [a.action for a in plan.actions] == actions
    assert all(a.target == "u.service" for a in plan.actions)
    assert got_status == status
    if status == "blocked":
        assert plan.blocked


def test_static_blocked_message_suggests_mask():
    _, plan, _ = plan_for({"enabled": False}, unit(file_state="static"))
    assert "static" in plan.blocked and "enabled: masked" in plan.blocked


def test_drift_carries_want_and_have():
    drift, _, _ = plan_for({"active": False, "enabled": False}, unit("active", "running", "enabled"))
    assert [d.to_json() for d in drift] == [
        {"field": "active", "want": False, "have": True},
        {"field": "enabled", "want": False, "have": True},
    ]


SHOW = """Id=a.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled
MainPID=123

Id=b.service
LoadState=not-found
ActiveState=inactive
SubState=dead
UnitFileState=
MainPID=0
"""


def test_parse_show_by_key_in_argument_order():
    got = parse_show(SHOW, ["a.service", "b.service"])
    assert got["a.service"].active and got["a.service"].enabled is True and got["a.service"].main_pid == 123
    assert not got["b.service"].exists and got["b.service"].enabled is False


def test_parse_show_block_count_mismatch_is_an_error():
    with pytest.raises(ObserveError):
        parse_show(SHOW, ["a.service", "b.service", "c.service"])
