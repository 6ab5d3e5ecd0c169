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
from reconcile_host.machines.host import Host
from reconcile_host.pipeline.contract import Context, ObserveError
from reconcile_host.pipeline.engine import judge
from reconcile_host.pipeline.statefile import StateFileError, validate_text
from reconcile_host.reconcilers.mounts import MountsReconciler, parse_count_or_percent
from reconcile_host.reconcilers.mounts.observed import FstabEntry, MountObserved, ResolvedSource, Space
from reconcile_host.reconcilers.mounts.tables import find_fstab, find_mount, parse_fstab, parse_mountinfo, unescape

DATA = Path(__file__).resolve().parent / "data" / "mounts"
REC = MountsReconciler()


def _cases() -> list[dict]:
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load((DATA / "cases.yaml").read_text())


def _observed(case: dict, path: str) -> MountObserved:
    mi = case.get("mountinfo", "kpro6.mountinfo")
    mounts = [] if mi == "none" else parse_mountinfo((DATA / mi).read_text())
    fstab = parse_fstab((DATA / case["fstab"]).read_text()) if case.get("fstab") else []
    m = find_mount(mounts, path)
    space = case.get("space")
    if m is not None and space is None:
        space = {"total_bytes": 10**12, "free_bytes": 10**11, "total_inodes": 0, "free_inodes": 0}
    return MountObserved(
        path, m, find_fstab(fstab, path),
        space=Space(**space) if m is not None else None,
        writable=case.get("writable", True if m is not None and case["spec"].get("writable") else None),
        write_error=case.get("write_error", ""),
        sources=tuple(ResolvedSource(**s) for s in case.get("sources", ())),
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
    entries = parse_mountinfo((DATA / "kpro6.mountinfo").read_text())
    assert len(entries) == 10  # the line that is not mountinfo is skipped
    data = find_mount(entries, "/data")
    assert (data.mount_id, data.parent_id, data.devno, data.fstype, data.source) == (41, 40, "259:5", "xfs",
                                                                                   "/dev/nvme1n1")
    assert data.options == ("rw", "noatime")  # the optional fields (shared:31 master:7) are not options
    assert "inode64" in data.all_options and not data.read_only
    disk = find_mount(entries, "/mnt/my disk")
    assert disk.read_only and disk.options[0] == "rw"  # read-only at the superblock
    models = find_mount(entries, "/srv/models")
    assert models.root == "/exports/models" and models.read_only
    tab = find_mount(entries, "/mnt/tab\tand\\back")
    assert tab.source == "tmp fs"
    assert find_mount(entries, "/mnt/ceph").source == "10.1.2.6:6789,10.1.2.7:6789:/"
    assert find_mount(entries, "/nope") is None


def test_unescape():
    assert unescape(r"/a\040b\011c\012d\134e") == "/a b\tc\nd\\e"
    assert unescape("/plain") == "/plain"


def test_parse_fstab_first_line_wins():
    entries = parse_fstab((DATA / "fstab").read_text())
    assert find_fstab(entries, "/data") == FstabEntry("UUID=0f3c7a52-1b1e-4a3d-9d8e-6a1f0b9e2c11", "/data", "xfs",
                                                      ("defaults", "noatime"))
    assert find_fstab(entries, "/mnt/my disk").source == "/dev/nvme2n1p1"
    assert find_fstab(entries, "/run/ram").options == ("size=1g",)
    assert find_fstab(entries, "/nope") is None


def test_resources_normalise_the_spec():
    (r,) = REC.resources({"/data/": {"min_free": "4TiB", "min_free_inodes": "1%", "needs": ["unit:a.service"]}})
    assert r.id == "mount:/data/" and r.kind == "mount" and r.needs == ("unit:a.service",)
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


class SilentProbeHost(Host):
    """The host of kpro6.mountinfo, whose probe children never answer (or answer `reply`)."""

    def __init__(self, reply: dict | None = None, hang_after_statvfs: bool = False):
        super().__init__()
        self.reply, self.hang_after_statvfs = reply, hang_after_statvfs
        self.children: list = []

    def read_text(self, path: str) -> str:
        if path == "/proc/self/mountinfo":
            return (DATA / "kpro6.mountinfo").read_text()
        raise FileNotFoundError(path)

    def fork_call(self, fn, *args):
        # The real fork, with a stand-in for the probe: it answers `reply`, or hangs as a
        # statvfs (or a write probe) on a dead filesystem would.
        def stand_in(req, out):
            if self.hang_after_statvfs:
                out.write(b"statvfs done\n")
            if self.reply is None or self.hang_after_statvfs:
                time.sleep(60)
            out.write(json.dumps(self.reply).encode() + b"\n")

        child = super().fork_call(stand_in, *args)
        self.children.append(child)
        return child


def test_observe_abandons_a_probe_that_never_answers():
    host = SilentProbeHost()
    res = REC.resources({"/data": {"probe_timeout": "200ms"}, "/mnt/gone": {"mounted": True}})
    try:
        found = REC.observe(host, res)
    finally:
        for p in host.children:
            p.kill()
            p.wait()
    err = found["mount:/data"]
    assert isinstance(err, ObserveError) and str(err).startswith("stuck: statvfs on /data did not return within")
    # Nothing mounted there: no child asked, nothing to be stuck on.
    assert found["mount:/mnt/gone"].mount is None
    assert len(host.children) == 1


def test_observe_says_when_the_write_probe_is_what_hangs():
    host = SilentProbeHost(hang_after_statvfs=True)
    (r,) = REC.resources({"/data": {"writable": True, "probe_timeout": "500ms"}})
    try:
        err = REC.observe(host, [r])[r.id]
    finally:
        for p in host.children:
            p.kill()
            p.wait()
    assert isinstance(err, ObserveError) and str(err).startswith("stuck: the write probe on /data did not return")


def test_observe_reads_the_probe_answer():
    reply = {"sources": [], "space": {"total_bytes": 100, "free_bytes": 40, "total_inodes": 10, "free_inodes": 5},
             "writable": False, "write_error": "Read-only file system (/data/.reconcile-probe.1)"}
    host = SilentProbeHost(reply)
    (r,) = REC.resources({"/data": {"writable": True}})
    obs = REC.observe(host, [r])[r.id]
    for p in host.children:
        p.wait()
    assert obs.space == Space(100, 40, 10, 5) and obs.writable is False
    assert [d.field for d in REC.diff(r, obs)] == ["writable"]
    assert "write probe failed: Read-only" in REC.plan(r, obs, REC.diff(r, obs), Context()).blocked


def test_observe_reports_a_statvfs_error():
    host = SilentProbeHost({"sources": [], "error": "statvfs /data: Transport endpoint is not connected"})
    (r,) = REC.resources({"/data": {}})
    obs = REC.observe(host, [r])[r.id]
    for p in host.children:
        p.wait()
    assert isinstance(obs, ObserveError) and "Transport endpoint is not connected" in str(obs)
