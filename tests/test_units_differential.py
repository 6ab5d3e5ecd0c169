"""Units against the live systemd 252 on every unit-file layout of tests/data/units/layouts.yaml
(systemd's own test-systemctl-enable.sh layouts and classes added here; no answers stored).

Each layout is written into a namespaced systemd whose vendor directories are overlays of its own
(tests/nsystemd.py, vendor_dirs=True), then each of its units is declared, twice (a state that
agrees with what systemd says, one that does not):

- alone (reconcile asks `systemctl show`),
- with a harmless second unit (the batched path: list-units, the in-process reader, `show` only
  for what the reader hands over and for what drifts),
- with all the layout's units in one state file,

and the report must be what systemd's own answer leads to: the unit-file state, active and sub
state, fragment path and load state that `systemctl show` gives (a unit the reader settles
without systemd loading it is reported `loaded`, which `show` would call `bad-setting` for a file
the manager cannot run: the one difference allowed), the reason `systemctl is-enabled` gives for a
`bad` unit, and the drift and status that reconcile's plan makes of systemd's answer. Where the
in-process reader settles a unit, its answer must also equal `systemctl is-enabled`.

Layouts whose units' names do not meet are written together and share one daemon-reload; the
whole group is also declared at once through the real CLI."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv
from nsystemd import NamespacedSystemd
from reconcile_host.common.systemd import UnitObserved
from reconcile_host.core.contract import Context, Resource
from reconcile_host.pipeline.engine import judge
from reconcile_host.reconcilers.units import UnitsReconciler
from ruamel.yaml import YAML

DATA = Path(__file__).parent / "data" / "units" / "layouts.yaml"
LAYOUTS = YAML(typ="safe").load(DATA.read_text(encoding="utf-8"))["layouts"]
# Every path a layout may write, all private to the namespace (tmpfs or overlay).
WRITABLE = ("etc/systemd/system/", "etc/systemd/system.attached/", "etc/systemd/system.control/",
            "run/systemd/", "usr/lib/systemd/system/", "usr/local/lib/systemd/", "srv/linked/")
HARMLESS = "zz-diff-harmless.service"
HARMLESS_TEXT = "[Service]\nType=oneshot\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"
TYPES = "service|socket|target|device|mount|automount|swap|timer|path|slice|scope"
R = UnitsReconciler()
STATS: dict[str, int] = {"layouts": 0, "questions": 0, "settled": 0, "handed": 0, "runs": 0, "disagreements": 0}


# --- grouping: layouts whose names do not meet share one daemon-reload ------------------------

def _family(name: str) -> str:
    """test1a-alias.service -> test1: the names of one layout's units, aliases, drop-ins share it."""
    m = re.match(r"\.?([A-Za-z]+[0-9]*)", name)
    return m.group(1) if m else name


def _names(layout: dict) -> set[str]:
    out = set(layout["units"])
    for f in layout["files"]:
        parts = f["path"].rstrip("/").split("/")
        out.add(parts[-1])
        out.update(p[:-2] for p in parts if p.endswith(".d"))
        if "symlink" in f:
            out.add(os.path.basename(f["symlink"].rstrip("/")))
    return {n for n in out if "." in n and not n.endswith((".wants", ".requires", ".upholds"))}


def _touches_all(layout: dict) -> bool:
    """A drop-in for every unit of a type (service.d/) or of a prefix (foo-.service.d/)."""
    return any(re.fullmatch(rf"({TYPES})\.d", p) or re.search(rf"-\.({TYPES})\.d$", p)
               for f in layout["files"] for p in f["path"].split("/"))


def _paths(layout: dict) -> tuple[set[str], set[str]]:
    """The layout's own entries (files, links, directories it makes) and the directories above
    them: two layouts that would make the same entry, or one an entry where the other needs a
    directory (a link named multi-user.target.wants, say), cannot be written together."""
    leaves, above = set(), set()
    for f in layout["files"]:
        rel = f["path"].rstrip("/")
        if not f.get("dir"):
            leaves.add(rel)
        parts = rel.split("/")
        above.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return leaves, above


def _groups() -> list[list[dict]]:
    groups: list[dict] = []
    for lay in LAYOUTS:
        fams = {_family(n) for n in _names(lay)}
        leaves, above = _paths(lay)
        alone = _touches_all(lay)
        for g in groups:
            if alone or g["closed"] or g["fams"] & fams or g["leaves"] & (leaves | above) or leaves & g["above"]:
                continue
            g["fams"] |= fams
            g["leaves"] |= leaves
            g["above"] |= above
            g["members"].append(lay)
            break
        else:
            groups.append({"fams": fams, "leaves": leaves, "above": above, "members": [lay], "closed": alone})
    return [g["members"] for g in groups]


GROUPS = _groups()


# --- the namespace -------------------------------------------------------------------------------

class Lab:
    def __init__(self, nsd: NamespacedSystemd, tmp: Path):
        self.nsd, self.tmp = nsd, tmp
        self.root = nsd.root
        driver = Path(__file__).with_name("units_diff_driver.py")
        env = cli_env(tmp)
        self.proc = nsd.popen([sys.executable, str(driver)], env=env, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)

    def ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the driver died; systemd log:\n{self.nsd.log_tail()}"
        return json.loads(line)

    def write(self, layouts: list[dict], created: list[Path]) -> None:
        """Write the layouts (recording in `created` what to remove, as it goes), daemon-reload."""
        for lay in layouts:
            for f in lay["files"]:
                rel = f["path"].rstrip("/")
                assert (rel + "/").startswith(WRITABLE) and ".." not in rel.split("/"), rel
                path = self.root / rel
                top = path
                while not os.path.lexists(top.parent):
                    top = top.parent
                if top != path:
                    created.append(top)
                path.parent.mkdir(parents=True, exist_ok=True)
                if f.get("dir"):
                    if not path.is_dir():
                        path.mkdir(parents=True)
                        created.append(path)
                elif "symlink" in f:
                    os.symlink(f["symlink"], path)
                    created.append(path)
                else:
                    data = base64.b64decode(f["content_b64"]) if "content_b64" in f else f["content"].encode("utf-8")
                    path.write_bytes(data)
                    created.append(path)
        self.nsd.systemctl("daemon-reload", check=True)

    @staticmethod
    def clean(created: list[Path]) -> None:
        for p in sorted(set(created), key=lambda p: len(str(p)), reverse=True):
            if p.is_symlink() or p.is_file():
                p.unlink()
            elif p.is_dir():
                shutil.rmtree(p)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    why = NamespacedSystemd.missing_prerequisites()
    if why:
        pytest.skip(f"namespaced systemd unavailable: {why}")
    tmp = tmp_path_factory.mktemp("units-diff")
    with NamespacedSystemd("reconcile-units-diff", vendor_dirs=True) as nsd:
        (nsd.unit_dir / HARMLESS).write_text(HARMLESS_TEXT)
        nsd.systemctl("daemon-reload", check=True)
        lab = Lab(nsd, tmp)
        try:
            yield lab
        finally:
            lab.proc.stdin.close()
            lab.proc.wait(timeout=30)


# --- what systemd's answer leads to ---------------------------------------------------------------

def from_systemd(name: str, ref: dict) -> UnitObserved | None:
    """systemd's answer as an observation; None where `show` fails for the name."""
    if ref["show_rc"] != 0:
        return None
    p = ref["show"]
    why = ref["ie_err"].rsplit(": ", 1)[-1] if p["UnitFileState"] == "bad" and ref["ie_rc"] else ""
    return UnitObserved(name, p["LoadState"], p["ActiveState"], p["SubState"], p["UnitFileState"],
                        int(p.get("MainPID") or 0), p.get("FragmentPath", ""), p.get("Id", ""), why)


def declared(seen: UnitObserved | None, agree: bool) -> dict:
    """A declaration that agrees with systemd's answer (enabled left out where it is no value one
    can declare: static, indirect, bad, ...), or one that disagrees in every field."""
    if seen is None:
        return {"active": not agree}
    if agree:
        spec: dict = {"active": seen.active}
        if seen.enabled in (True, False, "masked"):
            spec["enabled"] = seen.enabled
        return spec
    return {"active": not seen.active, "enabled": {True: False, False: True, "masked": False}.get(seen.enabled, True)}


def expected(name: str, spec: dict, seen: UnitObserved | None) -> tuple[str, list]:
    if seen is None:
        return "error", []
    res = Resource(id=f"unit:{name}", kind="unit", name=name, spec=spec)
    drift = R.diff(res, seen)
    status = judge(drift, R.plan(res, seen, drift, Context())).value
    return status, [[d.field, d.want, d.have] for d in drift]


def problems_of(name: str, got: dict, spec: dict, seen: UnitObserved | None) -> list[str]:
    status, drift = expected(name, spec, seen)
    out = []
    if got["status"] != status:
        out.append(f"status {got['status']!r}, systemd's answer leads to {status!r} ({got.get('message', '')})")
    if [[d["field"], d["want"], d["have"]] for d in got["drift"]] != drift:
        out.append(f"drift {got['drift']}, expected {drift}")
    mine = got.get("observed")
    if seen is None or mine is None:
        if (seen is None) != (mine is None):
            out.append(f"observed {mine}, systemd {seen}")
        return out
    for f in ("unit_file_state", "active_state", "sub_state", "fragment_path"):
        if mine[f] != getattr(seen, f):
            out.append(f"{f} {mine[f]!r}, systemd {getattr(seen, f)!r}")
    if mine["load_state"] != seen.load_state and not (
            mine["load_state"] == "loaded" and seen.load_state == "bad-setting" and mine["main_pid"] == 0):
        out.append(f"load_state {mine['load_state']!r}, systemd {seen.load_state!r}")
    if seen.unit_file_state == "bad" and mine["unit_file_error"] != seen.unit_file_error:
        out.append(f"unit_file_error {mine['unit_file_error']!r}, is-enabled {seen.unit_file_error!r}")
    return out


def state_text(specs: dict[str, dict]) -> str:
    return "version: 1\nunits:\n" + "".join(f"  {json.dumps(n)}: {json.dumps(s)}\n" for n, s in specs.items())


# --- the suite ------------------------------------------------------------------------------------

@pytest.mark.parametrize("group", range(len(GROUPS)),
                         ids=[f"{i}-{g[0]['id']}+{len(g) - 1}" for i, g in enumerate(GROUPS)])
def test_reports_equal_what_systemd_says(lab, group):
    layouts = GROUPS[group]
    created: list[Path] = []
    try:
        lab.write(layouts, created)
        units = sorted({u for lay in layouts for u in lay["units"]} | {HARMLESS})
        answer = lab.ask({"op": "reference", "units": units})
        seen = {u: from_systemd(u, answer["ref"][u]) for u in units}
        wrong: list[str] = []
        for lay in layouts:
            STATS["layouts"] += 1
            for u in lay["units"]:
                STATS["questions"] += 1
                reader = answer["reader"][u]
                STATS["settled" if reader else "handed"] += 1
                ref = answer["ref"][u]
                if reader and (seen[u] is None or reader != [seen[u].unit_file_state, seen[u].fragment_path]
                               or ref["ie_out"] != reader[0]):
                    wrong.append(f"{lay['id']}: {u}: reader says {reader}, systemd show "
                                 f"{ref['show']}, is-enabled {ref['ie_out'] or ref['ie_err']!r}")
        runs: list[tuple[str, dict[str, dict]]] = []
        for agree in (True, False):
            tag = "agree" if agree else "disagree"
            harmless = {HARMLESS: declared(seen[HARMLESS], True)}
            for lay in layouts:
                for u in dict.fromkeys(lay["units"]):
                    runs.append((f"{lay['id']}: {u} alone, {tag}", {u: declared(seen[u], agree)}))
                    runs.append((f"{lay['id']}: {u} with {HARMLESS}, {tag}", {u: declared(seen[u], agree), **harmless}))
                if len(set(lay["units"])) > 1:
                    runs.append((f"{lay['id']}: all its units, {tag}",
                                 {u: declared(seen[u], agree) for u in lay["units"]}))
            runs.append((f"group {group}: all units, {tag}", {u: declared(seen[u], agree) for u in units}))
        reports = lab.ask({"op": "run", "states": [state_text(specs) for _, specs in runs]})["reports"]
        # The whole group once more through the real CLI.
        every = {u: declared(seen[u], True) for u in units}
        state = lab.tmp / f"group-{group}.yaml"
        state.write_text(state_text(every))
        proc = lab.nsd.run(reconcile_argv("diff", "--format", "json", str(state)), env=cli_env(lab.tmp))
        assert proc.stdout, proc.stderr
        runs.append((f"group {group}: all units, agree, through the CLI", every))
        reports.append(json.loads(proc.stdout))
        STATS["runs"] += len(runs)
        for (label, specs), report in zip(runs, reports, strict=True):
            if "invalid" in report:
                wrong.append(f"{label}: reconcile refused the state file: {report['invalid']}")
                continue
            by_name = {r["id"].removeprefix("unit:"): r for r in report["resources"]}
            for name, spec in specs.items():
                for p in problems_of(name, by_name[name], spec, seen[name]):
                    wrong.append(f"{label}: {name} {spec}: {p}")
        STATS["disagreements"] += len(wrong)
        assert not wrong, f"{len(wrong)} disagreements with systemd:\n" + "\n".join(wrong[:40])
    finally:
        lab.clean(created)


# --- no daemon-reload: the disk wins --------------------------------------------------------------

ONESHOT = "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"


def cli_diff(lab: Lab, specs: dict[str, dict], name: str) -> dict[str, dict]:
    state = lab.tmp / name
    state.write_text(state_text(specs))
    proc = lab.nsd.run(reconcile_argv("diff", "--format", "json", str(state)), env=cli_env(lab.tmp))
    assert proc.stdout, proc.stderr
    return {r["id"].removeprefix("unit:"): r for r in json.loads(proc.stdout)["resources"]}


def both_answers(lab: Lab, name: str) -> tuple[str, str]:
    show = lab.nsd.systemctl("show", "-p", "UnitFileState", "--value", "--", name).stdout.strip()
    return show, lab.nsd.systemctl("is-enabled", "--", name).stdout.strip()


def test_enabled_on_disk_without_daemon_reload_is_enabled(lab):
    """A unit systemd holds in memory, linked into multi-user.target.wants by hand: `show` still
    says what it worked out when first asked, `is-enabled` reads the disk. reconcile reports
    the disk's answer, alone and batched: it is what the next boot and `systemctl disable` act on."""
    nsd, name = lab.nsd, "zz-stale.service"
    unit, link = nsd.unit_dir / name, nsd.unit_dir / "multi-user.target.wants" / name
    unit.write_text(ONESHOT)
    try:
        nsd.systemctl("daemon-reload", check=True)
        nsd.systemctl("start", name, check=True)
        # systemd works the state out when first asked, and keeps it while it holds the unit
        assert both_answers(lab, name) == ("disabled", "disabled")
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(f"/etc/systemd/system/{name}")
        assert both_answers(lab, name) == ("disabled", "enabled")  # systemd contradicts itself
        for enabled in (True, False):
            spec = {"active": True, "enabled": enabled}
            for specs in ({name: spec}, {name: spec, HARMLESS: {"active": False, "enabled": False}}):
                got = cli_diff(lab, specs, "stale.yaml")[name]
                assert got["observed"]["unit_file_state"] == "enabled", got
                assert got["status"] == ("ok" if enabled else "drift"), got
        nsd.systemctl("daemon-reload", check=True)
        assert both_answers(lab, name) == ("enabled", "enabled")
    finally:
        nsd.systemctl("stop", name)
        link.unlink(missing_ok=True)
        unit.unlink(missing_ok=True)
        nsd.systemctl("daemon-reload")


def test_masked_on_disk_without_daemon_reload_is_not_masked_yet(lab):
    """Masked by hand (a /dev/null link in /etc over a vendor unit) while systemd holds the unit
    loaded: is-enabled says masked, but the manager would still start it. `enabled: masked` is
    drift until systemd has loaded the mask; `apply` masks (and so reloads), then it is ok."""
    nsd, name = lab.nsd, "zz-vmask.service"
    vendor, mask = nsd.root / "usr/lib/systemd/system" / name, nsd.unit_dir / name
    vendor.write_text(ONESHOT)
    try:
        nsd.systemctl("daemon-reload", check=True)
        nsd.systemctl("start", name, check=True)
        mask.symlink_to("/dev/null")
        assert nsd.systemctl("is-enabled", "--", name).stdout.strip() == "masked"
        assert nsd.systemctl("show", "-p", "LoadState", "--value", "--", name).stdout.strip() == "loaded"
        spec = {"enabled": "masked"}
        for specs in ({name: spec}, {name: spec, HARMLESS: {"active": False, "enabled": False}}):
            got = cli_diff(lab, specs, "vmask.yaml")[name]
            assert got["status"] == "drift" and [a["action"] for a in got["actions"]] == ["mask"], got
            assert "daemon-reload" in got["drift"][0]["have"]
        state = lab.tmp / "vmask.yaml"
        state.write_text(state_text({name: spec}))
        proc = nsd.run(reconcile_argv("apply", "--journal", str(lab.tmp / "j.jsonl"), str(state)),
                       env=cli_env(lab.tmp))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert nsd.systemctl("show", "-p", "LoadState", "--value", "--", name).stdout.strip() == "masked"
        assert cli_diff(lab, {name: spec}, "vmask.yaml")[name]["status"] == "ok"
    finally:
        nsd.systemctl("stop", name)
        mask.unlink(missing_ok=True)
        vendor.unlink(missing_ok=True)
        nsd.systemctl("daemon-reload")


def test_summary(lab):
    """Runs last (file order): the figures of the suite, for the record (pytest -s shows them)."""
    if STATS["layouts"] != len(LAYOUTS):
        pytest.skip("only part of the differential suite ran [ci-ok]")
    print(f"\nunits differential: {STATS['layouts']} layouts in {len(GROUPS)} daemon-reloads, "
          f"{STATS['questions']} unit questions: {STATS['settled']} settled by the in-process reader, "
          f"{STATS['handed']} handed to systemctl show; {STATS['runs']} reconcile runs, "
          f"{STATS['disagreements']} disagreements")
    assert STATS["disagreements"] == 0
    assert STATS["layouts"] >= 150 and STATS["settled"] > 0 and STATS["handed"] > 0
