"""Units, pure layer: observed facts in, drift and plan out. No host touched."""

from __future__ import annotations

import pytest
from host_doubles import ScriptedHost
from reconcile_host.common.systemd import (
    MASK_PENDING,
    UnitObserved,
    is_enabled_error,
    parse_list_unit_files,
    parse_list_units,
    parse_show,
)
from reconcile_host.core.contract import Context, ObserveError, Resource
from reconcile_host.pipeline.engine import judge
from reconcile_host.reconcilers.units import UnitsReconciler

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
    # masked on disk by hand, still loaded in memory (no daemon-reload): not masked yet
    ("mask not in force is not masked", {"enabled": "masked"}, unit(file_state="masked", load="loaded"),
     ["enabled"], ["mask"], "drift"),
    ("mask not in force, wanted disabled", {"enabled": False}, unit(file_state="masked", load="loaded"),
     ["enabled"], ["unmask"], "drift"),
    ("bad cannot be disabled", {"enabled": False}, unit(file_state="bad"), ["enabled"], [], "blocked"),
    ("bad, only active declared", {"active": False}, unit(file_state="bad"), [], [], "ok"),
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


def test_mask_pending_and_bad_say_why():
    drift, plan, _ = plan_for({"enabled": "masked"}, unit(file_state="masked", load="loaded"))
    assert drift[0].have == MASK_PENDING and "daemon-reload" in MASK_PENDING
    bad = UnitObserved("u.service", "loaded", "inactive", "dead", "bad", 0, unit_file_error="Invalid argument")
    _, plan, _ = plan_for({"enabled": True}, bad)
    assert "bad" in plan.blocked and "(Invalid argument)" in plan.blocked and "enable would fail" in plan.blocked


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


# --- observing without `systemctl show`: listings and unit files -------------------------------

# `systemctl list-units --all --full --plain --no-legend -- NAMES` on systemd 252, while one of the
# listed units had a start job: the JOB column appears for every row, empty where there is no job.
LISTING_252 = """\
systemd-journald.service masked    inactive   dead          systemd-journald.service
t-fail.service           loaded    failed     failed        fails
t-missing.service        not-found inactive   dead          t-missing.service
t-mrun.service           masked    active     running       t-mrun.service
t-run.service            loaded    active     running       test service run  with   spaces
t-slowstart.service      loaded    activating start   start slow start job
t-tpl@a.service          loaded    active     running       tpl a
"""
# The same without --plain (the marker column), and with LC_ALL=C, where the marker is "*".
LISTING_MARKED = """\
● t-fail.service           loaded    failed     failed        fails
  t-run.service            loaded    active     running       test service run  with   spaces
* t-missing.service        not-found inactive   dead          t-missing.service
"""


def test_parse_list_units_first_four_columns():
    rows = parse_list_units(LISTING_252)
    assert rows["t-run.service"] == ("loaded", "active", "running")  # description with spaces
    assert rows["t-slowstart.service"] == ("loaded", "activating", "start")  # JOB column
    assert rows["t-mrun.service"] == ("masked", "active", "running")
    assert rows["t-missing.service"] == ("not-found", "inactive", "dead")
    assert rows["t-tpl@a.service"] == ("loaded", "active", "running")
    assert len(rows) == 7


def test_parse_list_units_skips_the_marker_column():
    rows = parse_list_units(LISTING_MARKED)
    assert rows == {"t-fail.service": ("loaded", "failed", "failed"),
                    "t-run.service": ("loaded", "active", "running"),
                    "t-missing.service": ("not-found", "inactive", "dead")}
    assert parse_list_units("") == {}


def test_parse_list_units_unexpected_line_is_an_error():
    with pytest.raises(ObserveError, match="unexpected line"):
        parse_list_units("t-run.service loaded active\n")


LISTED = {"a.service": ("loaded", "active", "running"), "m.service": ("masked", "inactive", "dead"),
          "nf.service": ("not-found", "inactive", "dead")}


class FakeFiles:
    def __init__(self, states):
        self.states = states

    def state(self, name):
        return self.states.get(name)


def test_from_listings_matches_what_show_would_say():
    files = FakeFiles({"a.service": ("enabled", "/etc/systemd/system/a.service"),
                       "cold.service": ("disabled", "/etc/systemd/system/cold.service"),
                       "coldmask.service": ("masked", "/etc/systemd/system/coldmask.service"),
                       "m.service": ("masked", "/etc/systemd/system/m.service"),
                       "nf.service": ("static", "/etc/systemd/system/nf.service"),
                       "stale.service": ("masked", "/etc/systemd/system/stale.service"),
                       "i@x.service": ("disabled", "/etc/systemd/system/i@.service"),
                       "x\\x2dy.service": ("disabled", "/etc/systemd/system/x\\x2dy.service")})
    listed = {**LISTED, "stale.service": ("loaded", "inactive", "dead")}

    def seen(name):
        return R._from_listings(name, listed.get(name), files)

    a = seen("a.service")
    assert (a.load_state, a.active_state, a.sub_state, a.unit_file_state) == ("loaded", "active", "running", "enabled")
    assert a.active and a.enabled is True and a.main_pid == 0  # MainPID not read
    cold = seen("cold.service")  # not in memory: what show says after loading it
    assert (cold.load_state, cold.active_state, cold.sub_state, cold.unit_file_state) == (
        "loaded", "inactive", "dead", "disabled")
    assert cold.exists and not cold.active and cold.enabled is False
    assert cold.fragment_path == "/etc/systemd/system/cold.service"
    coldmask = seen("coldmask.service")
    assert coldmask.load_state == "masked" and coldmask.enabled == "masked"
    assert seen("m.service").enabled == "masked"
    assert seen("nf.service") is None  # not-found in memory: systemd's word
    assert seen("stale.service") is None  # memory and disk disagree
    assert seen("i@x.service") is None  # an instance
    assert seen("x\\x2dy.service") is None  # a pattern character: absence from list-units proves nothing
    assert seen("unknown.service") is None
    assert R._from_listings("a.service", LISTED["a.service"], None) is None  # no scan of the unit files


def test_parse_list_unit_files_and_is_enabled_errors():
    assert parse_list_unit_files("a.service enabled enabled\nb.service bad -\nc.socket static\n\n") == {
        "a.service": "enabled", "b.service": "bad", "c.socket": "static"}
    assert is_enabled_error("Failed to get unit file state for a.service: Invalid argument\n") == "Invalid argument"
    assert is_enabled_error("Failed to look up unit file state: Is a directory\n") == "Is a directory"
    assert is_enabled_error("") == ""


class ShowHost(ScriptedHost):
    """A host whose systemctl answers `show` as systemd 252 does when one name cannot be resolved:
    the blocks before it, then exit 1 (`Failed to get properties: Unknown object`)."""

    def __init__(self, broken):
        super().__init__()
        self.broken = broken

    def run(self, argv, timeout=30.0, env=None, input=None):
        from reconcile_host.core.host import CommandResult

        self.calls.append(list(argv))
        names = argv[argv.index("--") + 1:]
        if argv[1] != "show":
            return CommandResult(tuple(argv), 0, "", "")
        out = []
        for n in names:
            if n in self.broken:
                return CommandResult(tuple(argv), 1, "".join(out), "Failed to get properties: Unknown object")
            out.append(f"Id={n}\nLoadState=loaded\nActiveState=inactive\nSubState=dead\nUnitFileState=disabled\n"
                       f"MainPID=0\nFragmentPath=/etc/systemd/system/{n}\n\n")
        return CommandResult(tuple(argv), 0, "".join(out), "")


def test_batched_show_falls_back_to_one_call_a_unit():
    host = ShowHost({"b.service"})
    got = R._show(host, ["a.service", "b.service", "c.service"], set())
    assert got["a.service"].unit_file_state == got["c.service"].unit_file_state == "disabled"
    assert isinstance(got["b.service"], ObserveError) and "Unknown object" in str(got["b.service"])
    shows = [c for c in host.calls if c[1] == "show"]
    assert len(shows) == 4  # the batch, then one each


def test_names_systemd_refuses_never_reach_systemctl():
    host = ShowHost(set())
    res = [Resource(id=f"unit:{n}", kind="unit", name=n, spec={"active": False})
           for n in ("m@x.scope", "m@x.mount", "t@.service", "ok.service")]
    got = R.observe(host, res)
    assert "cannot template .scope" in str(got["unit:m@x.scope"])
    assert "cannot template .mount" in str(got["unit:m@x.mount"])
    assert "template" in str(got["unit:t@.service"])
    assert got["unit:ok.service"].unit_file_state == "disabled"
    assert all("m@x.scope" not in c and "m@x.mount" not in c for c in host.calls)
