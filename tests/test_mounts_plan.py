"""Mounts without a host: parsing mountinfo and fstab, and planning from data.

The planning cases are in tests/data/mounts/cases.yaml (declared spec + what the host shows
-> drift, status, actions, message); sample mountinfo/fstab files sit beside them.
The observe step's child handling is tested with a fake Host whose probe never answers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from reconcile_host.core.contract import ApplyError, Context, Drift, ObserveError
from reconcile_host.local.host import LocalHost
from reconcile_host.pipeline.engine import judge
from reconcile_host.pipeline.statefile import StateFileError, validate_text
from reconcile_host.reconcilers.mounts import MountsReconciler, parse_count_or_percent
from reconcile_host.reconcilers.mounts.observed import FstabEntry, MountObserved, ResolvedSource, Space
from reconcile_host.reconcilers.mounts.tables import (
    by_id,
    find_fstab,
    mounts_at,
    parse_fstab,
    parse_mountinfo,
    top_of_stack,
    unescape,
)

DATA = Path(__file__).resolve().parent / "data" / "mounts"
REC = MountsReconciler()


def _cases() -> list[dict]:
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load((DATA / "cases.yaml").read_text())


def _observed(case: dict, path: str) -> MountObserved:
    """What the probe child would answer for the case: the mount the kernel's mount id names
    (`mount_id`; else the top of the stack at the path, right when nothing is overmounted)."""
    mi = case.get("mountinfo", "kpro6.mountinfo")
    mounts = [] if mi == "none" else parse_mountinfo((DATA / mi).read_bytes())
    bad: list[int] = []
    fstab = parse_fstab((DATA / case["fstab"]).read_bytes(), bad) if case.get("fstab") else []
    resolved = case.get("resolved", path)
    line = by_id(mounts, case["mount_id"]) if "mount_id" in case else top_of_stack(mounts, resolved)
    m = line if line is not None and line.mount_point == resolved else None
    space = case.get("space")
    if m is not None and space is None:
        space = {"total_bytes": 10**12, "free_bytes": 10**11, "total_inodes": 0, "free_inodes": 0}
    return MountObserved(
        path, m, find_fstab(fstab, path, resolved),
        space=Space(**space) if m is not None else None,
        writable=case.get("writable", True if m is not None and case["spec"].get("writable") else None),
        write_error=case.get("write_error", ""),
        sources=tuple(ResolvedSource(**s) for s in case.get("sources", ())),
        resolved=resolved, exists=case.get("exists", True), on=None if m else line,
        hidden=tuple(e for e in mounts_at(mounts, resolved) if e is not m),
        ram_pages=case.get("ram_pages", 0), page_size=case.get("page_size", 0), fstab_errors=tuple(bad),
    )


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_plan_case(case: dict):
    (res,) = REC.resources({case["path"]: case["spec"]})
    obs = _observed(case, res.spec["path"])
    drift = REC.diff(res, obs)
    plan = REC.plan(res, obs, drift, Context())
    assert judge(drift, plan).value == case["status"], (drift, plan)
    if "drift" in case:
        assert {d.field: [d.want, d.have] for d in drift} == case["drift"]
    assert [a.description for a in plan.actions] == case.get("actions", [])
    if "params" in case:
        assert [dict(a.params) for a in plan.actions] == case["params"]
    text = " ".join(m for m in (plan.blocked, plan.message) if m)
    for part in case.get("message", []):
        assert part in text
    # Whatever was planned prints and serialises to the JSON contract.
    json.dumps([a.to_json() for a in plan.actions] + [d.to_json() for d in drift])


def test_parse_mountinfo_fields_and_escapes():
    bad: list[int] = []
    entries = parse_mountinfo((DATA / "kpro6.mountinfo").read_bytes(), bad)
    assert len(entries) == 10 and bad == [11]  # the line that is not mountinfo is skipped
    data = top_of_stack(entries, "/data")
    assert (data.mount_id, data.parent_id, data.devno, data.fstype, data.source) == (41, 40, "259:5", "xfs",
                                                                                   "/dev/nvme1n1")
    assert data.options == ("rw", "noatime")  # the optional fields (shared:31 master:7) are not options
    assert "inode64" in data.all_options and not data.read_only
    disk = top_of_stack(entries, "/mnt/my disk")
    assert disk.read_only and disk.options[0] == "rw"  # read-only at the superblock
    models = top_of_stack(entries, "/srv/models")
    assert models.root == "/exports/models" and models.read_only
    tab = top_of_stack(entries, "/mnt/tab\tand\\back")
    assert tab.source == "tmp fs"
    assert top_of_stack(entries, "/mnt/ceph").source == "10.1.2.6:6789,10.1.2.7:6789:/"
    assert top_of_stack(entries, "/nope") is None


def test_unescape():
    assert unescape(r"/a\040b\011c\012d\134e") == "/a b\tc\nd\\e"
    assert unescape("/plain") == "/plain"


def test_parse_fstab_first_line_wins():
    entries = parse_fstab((DATA / "fstab").read_bytes())
    assert find_fstab(entries, "/data") == FstabEntry("UUID=0f3c7a52-1b1e-4a3d-9d8e-6a1f0b9e2c11", "/data", "xfs",
                                                      ("defaults", "noatime"), 0, 2, 2, "defaults,noatime")
    assert find_fstab(entries, "/mnt/my disk").source == "/dev/nvme2n1p1"
    assert find_fstab(entries, "/run/ram").options == ("size=1g",)
    assert find_fstab(entries, "/nope") is None


def test_resources_normalise_the_spec():
    (r,) = REC.resources({"/data/": {"min_free": "4TiB", "min_free_inodes": "1%", "needs": ["unit:a.service"]}})
    # one mount point with or without the slash (tests/test_mounts.py asks findmnt and systemd-escape)
    assert r.id == "mount:/data" and r.kind == "mount" and r.needs == ("unit:a.service",)
    assert r.spec["path"] == "/data" and r.spec["mounted"] is True
    assert r.spec["min_free"] == ("bytes", 4 * 2**40)
    assert r.spec["min_free_inodes"] == ("percent", 1.0)
    assert r.spec["probe_timeout"] == 5.0
    (r,) = REC.resources({"/x": {"probe_timeout": "1m30s", "min_free": "15%", "min_free_inodes": 100}})
    assert (r.spec["probe_timeout"], r.spec["min_free"], r.spec["min_free_inodes"]) == (
        90.0, ("percent", 15.0), ("count", 100))
    with pytest.raises(ValueError):
        parse_count_or_percent(-1)


@pytest.mark.parametrize("body, expected", [
    ("mounts:\n  data:\n    mounted: true\n", "'data' is not an absolute path"),
    ("mounts:\n  /data:\n    min_free: lots\n", "s.yaml:4:15: mounts.\"/data\".min_free: invalid size 'lots'"),
    ("mounts:\n  /data:\n    min_free_inodes: 4TiB\n", "invalid inode count '4TiB'"),
    ("mounts:\n  /data:\n    probe_timeout: soon\n", "invalid duration 'soon'"),
    ("mounts:\n  /data:\n    options: [\"rw,noatime\"]\n", "invalid mount option 'rw,noatime'"),
    ("mounts:\n  /data:\n    writeable: true\n", "unknown key 'writeable' (did you mean 'writable'?)"),
])
def test_schema_errors(body: str, expected: str):
    with pytest.raises(StateFileError) as err:
        validate_text("version: 1\n" + body, "s.yaml")
    assert expected in str(err.value)


def test_schema_accepts_the_issue_example():
    validate_text("""version: 1
mounts:
  /data:
    mounted: true
    source: /dev/nvme1n1
    fstype: xfs
    options: [rw]
    min_free: 4TiB
    min_free_inodes: "1%"
    writable: true
    probe_timeout: 5s
    needs: [mount:/]
  /:
    min_free: 1%
""", "s.yaml")


DATA_MOUNT = {"mount_id": 41, "parent_id": 40, "devno": "259:5", "root": "/", "mount_point": "/data",
              "options": ["rw", "noatime"], "fstype": "xfs", "source": "/dev/nvme1n1", "super_options": ["rw"],
              "optional_fields": []}


class SilentProbeHost(LocalHost):
    """A host whose probe children (the real fork) write the steps they begin, as probe_mount
    does, and then hang at `hang_at` as a call on a dead filesystem would, or answer `reply`."""

    def __init__(self, reply: dict | None = None, steps: tuple[str, ...] = ("resolving PATH (realpath, mount id)",),
                 hang: bool = True):
        super().__init__()
        self.reply, self.steps, self.hang = reply, steps, hang
        self.children: list = []

    def fork_call(self, fn, *args):
        def stand_in(req, out):
            for step in self.steps:
                out.write(json.dumps({"step": step.replace("PATH", req["path"])}).encode() + b"\n")
            if self.hang:
                time.sleep(60)
            out.write(json.dumps({"answer": self.reply}).encode() + b"\n")

        child = super().fork_call(stand_in, *args)
        self.children.append(child)
        return child

    def reap(self):
        for p in self.children:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_observe_abandons_a_probe_that_never_answers():
    host = SilentProbeHost()
    res = REC.resources({"/data": {"probe_timeout": "200ms"}, "/mnt/gone": {"probe_timeout": "300ms"}})
    try:
        found = REC.observe(host, res)
    finally:
        host.reap()
    err = found["mount:/data"]
    assert isinstance(err, ObserveError)
    assert str(err).startswith("stuck: resolving /data (realpath, mount id) did not return within 200ms"), err
    # Every declared mount is asked about in a child of its own: even whether it is mounted
    # needs the path resolved and its mount id, which can hang.
    assert str(found["mount:/mnt/gone"]).startswith("stuck: resolving /mnt/gone")
    assert len(host.children) == 2


def test_observe_says_which_step_hangs():
    host = SilentProbeHost(steps=("resolving PATH (realpath, mount id)", "reading /etc/fstab", "statvfs on PATH",
                                  "the write probe on PATH"))
    (r,) = REC.resources({"/data": {"writable": True, "probe_timeout": "500ms"}})
    try:
        err = REC.observe(host, [r])[r.id]
    finally:
        host.reap()
    assert isinstance(err, ObserveError) and str(err).startswith("stuck: the write probe on /data did not return")


def test_observe_reads_the_probe_answer():
    reply = {"resolved": "/data", "exists": True, "mount": DATA_MOUNT, "hidden": [], "fstab": None,
             "space": {"total_bytes": 100, "free_bytes": 40, "total_inodes": 10, "free_inodes": 5},
             "writable": False, "write_error": "Read-only file system (/data/.reconcile-probe.1)"}
    host = SilentProbeHost(reply, hang=False)
    (r,) = REC.resources({"/data": {"writable": True}})
    obs = REC.observe(host, [r])[r.id]
    host.reap()
    assert obs.space == Space(100, 40, 10, 5) and obs.writable is False
    assert obs.mount.options == ("rw", "noatime") and obs.mount.mount_id == 41
    assert [d.field for d in REC.diff(r, obs)] == ["writable"]
    assert "write probe failed: Read-only" in REC.plan(r, obs, REC.diff(r, obs), Context()).blocked


def test_observe_reports_a_statvfs_error():
    host = SilentProbeHost({"error": "statvfs /data: Transport endpoint is not connected"}, hang=False)
    (r,) = REC.resources({"/data": {}})
    obs = REC.observe(host, [r])[r.id]
    host.reap()
    assert isinstance(obs, ObserveError) and "Transport endpoint is not connected" in str(obs)


def test_observe_reports_a_child_that_died_without_an_answer():
    host = SilentProbeHost(steps=(), hang=False)
    host.reply = None
    (r,) = REC.resources({"/data": {}})
    obs = REC.observe(host, [r])[r.id]
    host.reap()
    assert isinstance(obs, ObserveError) and str(obs).startswith("the probe of /data failed")


def test_apply_looks_again_and_does_not_mount_on_a_mount():
    """Mounted by someone else between observe and apply: the mount action sees it in a fresh
    probe and runs no mount(8), which would stack a second mount on top."""
    reply = {"resolved": "/data", "exists": True, "mount": DATA_MOUNT, "hidden": [], "fstab": None}

    class Host(SilentProbeHost):
        ran: list = []

        def run(self, argv, timeout=30.0, env=None, input=None):
            self.ran.append(argv)
            raise AssertionError(f"ran {argv}")

    host = Host(reply, hang=False)
    (r,) = REC.resources({"/data": {"source": "/dev/nvme1n1", "fstype": "xfs"}})
    plan = REC.plan(r, MountObserved("/data", None, None), [Drift("mounted", True, False)], Context())
    msg = REC.apply(host, r, plan.actions[0])
    host.reap()
    assert msg.startswith("/data is already mounted (xfs from /dev/nvme1n1, mount 41)") and host.ran == []


def test_apply_refuses_to_mount_on_a_path_that_hangs():
    host = SilentProbeHost()
    (r,) = REC.resources({"/data": {"source": "/dev/nvme1n1", "fstype": "xfs", "probe_timeout": "200ms"}})
    plan = REC.plan(r, MountObserved("/data", None, None), [Drift("mounted", True, False)], Context())
    try:
        with pytest.raises(ApplyError, match="not mounted: stuck: resolving /data"):
            REC.apply(host, r, plan.actions[0])
    finally:
        host.reap()


def test_resolve_is_realpath_without_stat(tmp_path: Path):
    """The probe resolves a declared path with readlink alone (no stat reaches the filesystem
    mounted there); it must give what realpath(3) gives, errors included."""
    import errno
    import os

    from reconcile_host.reconcilers.mounts.probe import resolve

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "file").write_text("")
    os.symlink(tmp_path / "a", tmp_path / "abs")
    os.symlink("b/../b", tmp_path / "a" / "rel")
    os.symlink("loop", tmp_path / "loop")
    os.symlink("nowhere", tmp_path / "dangling")
    t = str(tmp_path)
    for p in [f"{t}/abs/b", f"{t}/abs/rel", f"{t}/abs/rel/..", f"{t}//a/./b/", f"{t}/abs/../a", "/",
              f"{t}/a/b/../../abs/rel", f"{t}/abs"]:
        assert resolve(p) == os.path.realpath(p, strict=True), p
    for p in [f"{t}/nope", f"{t}/loop", f"{t}/file/x", f"{t}/abs/nope/x", f"{t}/dangling"]:
        with pytest.raises(OSError) as ours:
            resolve(p)
        with pytest.raises(OSError) as theirs:
            os.path.realpath(p, strict=True)
        assert errno.errorcode[ours.value.errno] == errno.errorcode[theirs.value.errno], p
