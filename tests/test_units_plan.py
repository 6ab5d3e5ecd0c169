"""Units, pure layer: observed facts in, drift and plan out. No host touched."""

from __future__ import annotations

import pytest
from reconcile_host.pipeline.contract import Context, ObserveError, Resource
from reconcile_host.pipeline.engine import judge
from reconcile_host.reconcilers.units import UnitsReconciler
from reconcile_host.reconcilers.units.systemctl import UnitObserved, parse_list_units, parse_show
from reconcile_host.reconcilers.units.unitfiles import UnitFiles, parse_install

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


SVC = "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/sleep infinity\n"
# [Install] sections and what `systemctl is-enabled` says on systemd 252 of a unit with no links.
INSTALL_CASES = [
    ("wanted", SVC + "[Install]\nWantedBy=multi-user.target\n", "disabled"),
    ("required", SVC + "[Install]\nRequiredBy=multi-user.target\n", "disabled"),
    ("no install section", SVC, "static"),
    ("alias only", SVC + "[Install]\nAlias=other.service\n", "disabled"),
    ("also only", SVC + "[Install]\nAlso=other.service\n", "indirect"),
    ("empty assignment resets", SVC + "[Install]\nWantedBy=multi-user.target\nWantedBy=\n", "static"),
    ("comments", SVC + "[Install]\n#WantedBy=multi-user.target\n; WantedBy=x.target\n", "static"),
    ("section names are case-sensitive", SVC + "[install]\nWantedBy=multi-user.target\n", "static"),
    ("install keys elsewhere are ignored", SVC + "WantedBy=multi-user.target\n", "static"),
    ("spaces around", SVC + "  [Install]  \n  WantedBy = multi-user.target  \n", "disabled"),
    ("continued ExecStart", "[Service]\nExecStart=/bin/echo a \\\n  b\n[Install]\nWantedBy=a.target\n", "disabled"),
    # Where a simple reading could differ from systemd's: not decided here.
    ("continued line swallows the header", "[Service]\nExecStart=/bin/echo a \\\n[Install]\nWantedBy=a.target\n", None),
    ("continuation in [Install]", SVC + "[Install]\nWantedBy=multi-user.target \\\n  default.target\n", None),
    ("specifier", SVC + "[Install]\nWantedBy=%i.target\n", None),
    ("quotes", SVC + '[Install]\nWantedBy="a.target"\n', None),
    ("UpheldBy", SVC + "[Install]\nUpheldBy=multi-user.target\n", None),
    ("no =", SVC + "[Install]\nWantedBy\n", None),
]


@pytest.mark.parametrize("text,state", [c[1:] for c in INSTALL_CASES], ids=[c[0] for c in INSTALL_CASES])
def test_parse_install(text, state):
    rules = parse_install(text)
    if state is None:
        assert rules is None
    else:
        has_rules, has_also = rules
        assert ("disabled" if has_rules else "indirect" if has_also else "static") == state


@pytest.fixture
def tree(tmp_path):
    """A unit search path under tmp_path, read by UnitFiles with root=tmp_path."""
    dirs = {"etc": "/etc/systemd/system", "run": "/run/systemd/system", "lib": "/lib/systemd/system"}
    for d in dirs.values():
        (tmp_path / d.lstrip("/")).mkdir(parents=True)

    def write(where: str, rel: str, text: str | None = None, link: str | None = None):
        path = tmp_path / dirs[where].lstrip("/") / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if link is not None:
            path.symlink_to(link)
        else:
            path.write_text(text)

    def files():
        return UnitFiles(["/etc/systemd/system.control", *dirs.values(), "/run/systemd/generator.late"],
                         root=str(tmp_path))

    return write, files


WANTED = SVC + "[Install]\nWantedBy=multi-user.target\n"


def test_unit_files_plain_states(tree):
    write, files = tree
    write("etc", "dis.service", WANTED)
    write("etc", "static.service", SVC)
    write("lib", "vendor.service", WANTED)
    write("etc", "en.service", WANTED)
    write("etc", "multi-user.target.wants/en.service", link="/etc/systemd/system/en.service")
    write("etc", "req.service", WANTED)
    write("etc", "foo.target.requires/req.service", link="../req.service")
    write("etc", "masked.service", link="/dev/null")
    write("run", "rtmasked.service", link="/dev/null")
    write("run", "rt.service", WANTED)
    write("etc", "shadow.service", SVC)  # /etc comes first: the /run file does not count
    write("run", "shadow.service", WANTED)
    f = files()
    assert f.state("dis.service") == ("disabled", "/etc/systemd/system/dis.service")
    assert f.state("static.service") == ("static", "/etc/systemd/system/static.service")
    assert f.state("vendor.service") == ("disabled", "/lib/systemd/system/vendor.service")
    assert f.state("en.service") == ("enabled", "/etc/systemd/system/en.service")
    assert f.state("req.service") == ("enabled", "/etc/systemd/system/req.service")
    assert f.state("masked.service") == ("masked", "/etc/systemd/system/masked.service")
    assert f.state("rtmasked.service") == ("masked-runtime", "/run/systemd/system/rtmasked.service")
    assert f.state("rt.service") == ("disabled", "/run/systemd/system/rt.service")
    assert f.state("shadow.service") == ("static", "/etc/systemd/system/shadow.service")


def test_unit_files_leave_the_rest_to_systemd(tree):
    write, files = tree
    write("etc", "rtwant.service", WANTED)  # wanted from /run: enabled-runtime
    write("run", "multi-user.target.wants/rtwant.service", link="/etc/systemd/system/rtwant.service")
    write("lib", "vend.service", WANTED)  # wanted from a vendor directory
    write("lib", "multi-user.target.wants/vend.service", link="../vend.service")
    write("etc", "real.service", WANTED)  # has an alias link: indirect, or enabled through it
    write("etc", "alias.service", link="/etc/systemd/system/real.service")
    write("etc", "realer.service", WANTED)  # wanted through an alias of an alias
    write("etc", "alias2.service", link="/etc/systemd/system/alias3.service")
    write("etc", "alias3.service", link="/etc/systemd/system/realer.service")
    write("etc", "a.target.wants/alias2.service", link="/etc/systemd/system/alias2.service")
    write("etc", "linked.service", link="/opt/units/linked.service")
    write("etc", "empty.service", "")  # an empty unit file masks the unit
    write("etc", "cont.service", SVC + "[Install]\nWantedBy=a.target \\\n b.target\n")
    write("etc", "drop.service", SVC)
    write("etc", "drop.service.d/install.conf", "[Install]\nWantedBy=multi-user.target\n")
    write("lib", "x-y-z.service", WANTED)
    write("etc", "x-y-.service.d/install.conf", "[Install]\nWantedBy=\n")
    write("etc", "typed.socket", "[Socket]\nListenStream=1\n[Install]\nWantedBy=sockets.target\n")
    write("run", "socket.d/all.conf", "[Install]\nWantedBy=\n")
    write("etc", "env.service", WANTED)
    write("etc", "env.service.d/env.conf", "[Service]\nEnvironment=A=1\n")
    f = files()
    for name in ("rtwant.service", "vend.service", "real.service", "alias.service", "realer.service",
                 "linked.service", "empty.service", "cont.service", "drop.service", "x-y-z.service",
                 "typed.socket", "ghost.service", "t@a.service"):
        assert f.state(name) is None, name
    # a drop-in without an [Install] section changes nothing
    assert f.state("env.service") == ("disabled", "/etc/systemd/system/env.service")


def test_unit_files_only_in_install_dirs(tmp_path):
    (tmp_path / "run/systemd/transient").mkdir(parents=True)
    (tmp_path / "run/systemd/transient/tr.service").write_text(SVC)
    f = UnitFiles(["/run/systemd/transient", "/etc/systemd/system"], root=str(tmp_path))
    assert "tr.service" in f.first and f.state("tr.service") is None  # transient: systemd says so


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
