"""Mounts compared with what mount(8) itself does: which /etc/fstab line `mount --target PATH`
uses (run in a nested private namespace for each path, so each starts from the same table),
and which device `LABEL=` names, on ext4 filesystems on loop devices with hostile labels,
found by libblkid's scan (no udev) and through udev's /dev/disk/by-label links named the way
udev names them (blkid -o udev's ID_FS_LABEL_ENC). Every "mount it" case is applied twice.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from mounts_support import assert_applied_once, namespaces_missing, rid, run_scenario


@pytest.fixture(scope="module", autouse=True)
def _namespaces():
    why = namespaces_missing()
    if why:
        pytest.skip(why)


FSTAB = r"""# the test's /etc/fstab
   # an indented comment
bug
src-data1 /T//data/ tmpfs size=1m 0 0
src-data2 /T/data tmpfs size=2m 0 0
src-x /T/y/../x tmpfs size=1m 0 0
src-link /T/link tmpfs size=1m 0 0
src-sub /T/sub/./dir tmpfs size=1m 0 0
src-space /T/a\040b tmpfs size=1m 0 0
src-crlf /T/crlf tmpfs size=1m 0 0
src-hash /T/h#x tmpfs size=1m 0 0
src-broken1 /T/broken tmpfs size=1m x 0
src-broken2 /T/broken tmpfs size=1m 0 0
src-only /T/onlybroken tmpfs size=1m 0 y
src-freq /T/cmt tmpfs size=1m # a comment where freq belongs
src-trail /T/trail tmpfs size=1m 0 0 # a comment after passno
src-three /T/three tmpfs
"""
DECLARED = ["data", "x", "y/../x", "real", "link", "sub/dir", "sub/./dir", "a b", "crlf", "h#x", "broken",
            "onlybroken", "cmt", "trail", "three", "nothere"]


def test_fstab_line_is_the_one_mount_target_uses(tmp_path: Path):
    """For each declared path: the fstab line reconcile reports (and would mount) is the one
    `mount --target PATH` mounts, or neither finds one; the lines reconcile calls broken are
    the ones mount(8) says it ignores. Then apply twice: each mounted once."""
    facts = run_scenario(tmp_path, f"""
        fstab = {FSTAB!r}.replace("/T/", T + "/").replace("crlf tmpfs size=1m 0 0", "crlf tmpfs size=1m 0 0\\r")
        Path(T, "fstab").write_bytes(fstab.encode())
        for d in ("data", "x", "y", "real", "sub/dir", "a b", "crlf", "h#x", "broken", "onlybroken", "cmt",
                  "trail", "three", "nothere"):
            mkdir(path(d))
        os.symlink(path("real"), path("link"))
        sh("mount", "--bind", os.path.join(T, "fstab"), "/etc/fstab")
        declared = [path(d) for d in {DECLARED!r}]
        fact("declared", declared)
        fact("mount8", {{p: mount8(p, "--target", p) for p in declared}})
        rc, res, _ = reconcile("diff", state({{p: {{"fstype": "tmpfs"}} for p in declared}}, "diff.yaml"))
        fact("diff", res)
        found = [p for p in declared if res[f"mount:{{p}}"]["observed"]["fstab"]]
        # One resource per mount point: y/../x is x, link is real, sub/./dir is sub/dir.
        todo = [p for p in found if not p.endswith(("y/../x", "/link", "sub/./dir"))]
        apply_twice(state({{p: {{"fstype": "tmpfs"}} for p in todo}}, "todo.yaml"), "todo")
        fact("todo.count", {{p: len(mounts_at(os.path.realpath(p))) for p in todo}})
    """)
    checked = 0
    for p in facts["declared"]:
        m8, r = facts["mount8"][p], facts["diff"][rid(p)]
        entry = r["observed"]["fstab"]
        broken = [int(n) for n in __import__("re").findall(r"parse error at line (\d+)", m8["stderr"])]
        assert r["observed"]["fstab_errors"] == broken, (p, m8["stderr"])
        if m8["rc"] == 0:
            assert entry is not None and entry["source"] == m8["line"]["source"], (p, entry, m8)
            assert m8["line"]["target"] == r["observed"]["resolved"]
            assert r["status"] == "drift" and r["actions"][0]["description"].startswith(f"mount {p} (/etc/fstab line")
        else:
            assert "can't find mount point" in m8["stderr"], (p, m8)
            assert entry is None and r["status"] == "blocked", (p, r)
            if p.endswith("onlybroken"):
                assert "cannot be parsed and mount(8) ignores" in r["message"]
        checked += 1
    assert checked == len(DECLARED)
    assert sum(facts["mount8"][p]["rc"] == 0 for p in facts["declared"]) >= 11
    assert_applied_once(facts, "todo", list(facts["todo.count"]))


def test_the_same_mount_point_declared_twice_is_mounted_once(tmp_path: Path):
    """`/d`, `/d/` and a symlink to it: three resources, one mount point. Once the first is
    mounted the others see it (the engine looks again after a change): one mount action, one
    mount in the kernel's table, and the second apply does nothing."""
    facts = run_scenario(tmp_path, """
        d = mkdir(path("d"))
        os.symlink(d, path("to-d"))
        spec = {"source": "twice", "fstype": "tmpfs"}
        apply_twice(state({d: spec, d + "/": spec, path("to-d"): spec}), "twice")
        fact("paths", [d, d + "/", path("to-d")])
        fact("count", len(mounts_at(d)))
    """)
    first, second = facts["twice.first"], facts["twice.second"]
    assert first["rc"] == 0 and second["rc"] == 0
    results = [a["result"] for p in facts["paths"] for a in first["resources"][rid(p)]["actions"]]
    assert results == ["done"]
    assert all(first["resources"][rid(p)]["status"] == "ok" for p in facts["paths"])
    assert all(second["resources"][rid(p)]["actions"] == [] for p in facts["paths"])
    assert facts["count"] == 1


# --- LABEL= on loop devices -------------------------------------------------------------------

LABELS = ["data(1)", "a b", "x/y", "back\\slash", "café", "tab\tx", "#+-.:=@_", "q\"u'o"]


def _loop_missing() -> str | None:
    for tool in ("mkfs.ext4", "losetup", "blkid"):
        if not shutil.which(tool):
            return f"{tool} not installed (e2fsprogs, mount, util-linux)"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control: loop devices unavailable"
    return None


@pytest.fixture
def loop_images(tmp_path: Path):
    """ext4 images in temp files with hostile labels (a per-test tag keeps them apart from any
    other filesystem on the machine), attached to loop devices; detached whatever happens."""
    why = _loop_missing()
    if why:
        pytest.skip(why)
    tag = hashlib.sha1(str(tmp_path).encode()).hexdigest()[:3]
    labels = [f"{label}{tag}" for label in LABELS] + [f"other{tag}"]
    devices: list[str] = []
    try:
        for i, label in enumerate(labels):
            img = tmp_path / f"img{i}"
            with open(img, "wb") as fh:
                fh.truncate(8 << 20)
            subprocess.run(["mkfs.ext4", "-q", "-F", "-L", label, str(img)], check=True, capture_output=True)
            dev = subprocess.run(["losetup", "--show", "-f", str(img)], check=True, capture_output=True,
                                 text=True).stdout.strip()
            devices.append(dev)
        yield dict(zip(labels, devices, strict=True))
    finally:
        for dev in devices:
            subprocess.run(["losetup", "-d", dev], capture_output=True)


def test_labels_resolved_as_mount_finds_them(tmp_path: Path, loop_images: dict[str, str]):
    """Without udev's links libblkid scans the devices; with them, it takes the link named by
    blkid_encode_string. In both, reconcile's device for LABEL=... is the one mount(8) mounts,
    and declaring the label mounts it once. One link is made to point at another device: mount(8)
    follows it, and so must reconcile (a wrong link name would have sent it scanning instead)."""
    labels = {k: v for k, v in loop_images.items() if not k.startswith("other")}
    other = next(v for k, v in loop_images.items() if k.startswith("other"))
    facts = run_scenario(tmp_path, f"""
        labels, other = {labels!r}, {other!r}
        points = {{label: mkdir(path("L", str(i))) for i, label in enumerate(labels)}}
        fact("points", points)
        fact("blkid", {{label: sh("blkid", "-c", "/dev/null", "-l", "-o", "device", "-t", "LABEL=" + label).stdout
                        .decode().strip() for label in labels}})
        fact("mount8_scan", {{label: mount8(points[label], "LABEL=" + label, points[label]) for label in labels}})
        spec = {{points[label]: {{"source": "LABEL=" + label, "fstype": "ext4"}} for label in labels}}
        rc, res, _ = reconcile("diff", state(spec, "scan.yaml"))
        fact("diff_scan", res)
        apply_twice(state(spec, "scan.yaml"), "scan")
        fact("scan.count", {{p: len(mounts_at(p)) for p in points.values()}})
        for p in points.values():
            sh("umount", p)

        # A private /dev with udev's links: names from blkid -o udev (ID_FS_LABEL_ENC).
        olddev = mkdir(path("olddev"))
        sh("mount", "--rbind", "/dev", olddev)
        sh("mount", "--make-rprivate", olddev)
        sh("mount", "-t", "tmpfs", "-o", "mode=755", "privdev", "/dev")
        for dev in ["null", "zero", "full", "random", "urandom", "loop-control"] + [d[5:] for d in labels.values()] \\
                + [other[5:]]:
            Path("/dev", dev).touch()
            sh("mount", "--bind", os.path.join(olddev, dev), "/dev/" + dev)
        os.makedirs("/dev/disk/by-label")
        names = {{}}
        for label, dev in labels.items():
            udev = dict(kv.split("=", 1) for kv in sh("blkid", "-p", "-o", "udev", dev).stdout.decode().split())
            names[label] = udev["ID_FS_LABEL_ENC"]
        stale = list(labels)[0]  # its link points at another device, as a stale link would
        for label, dev in labels.items():
            os.symlink("../../" + (other if label == stale else dev)[5:], "/dev/disk/by-label/" + names[label])
        fact("names", names)
        fact("stale", stale)
        fact("mount8_udev", {{label: mount8(points[label], "LABEL=" + label, points[label]) for label in labels}})
        rc, res, _ = reconcile("diff", state(spec, "udev.yaml"))
        fact("diff_udev", res)
    """)
    points = facts["points"]
    for label, dev in labels.items():
        p = points[label]
        assert facts["blkid"][label] == dev
        scan = facts["mount8_scan"][label]
        assert scan["rc"] == 0 and scan["line"]["source"] == dev, scan
        src = facts["diff_scan"][rid(p)]["observed"]["sources"][0]
        assert src["given"] == f"LABEL={label}" and src["path"] == dev and "found by blkid" in src["note"], src
        udev = facts["mount8_udev"][label]
        assert udev["rc"] == 0, udev
        src = facts["diff_udev"][rid(p)]["observed"]["sources"][0]
        assert src["path"] == udev["line"]["source"] and src["note"] == "", (label, src, udev)
        if label == facts["stale"]:
            assert udev["line"]["source"] == other
    assert_applied_once(facts, "scan", list(facts["scan.count"]))
    assert facts["names"]["data(1)" + next(iter(labels))[-3:]].startswith("data\\x281\\x29")
