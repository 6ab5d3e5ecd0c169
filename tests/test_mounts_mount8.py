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
    """`/d` and a symlink to it: two resources, one mount point (`/d/` is `/d` itself, one id:
    docs/mounts.md "The path"). Once the first is mounted the other sees it (the engine looks
    again after a change): one mount action, one mount in the kernel's table, and the second
    apply does nothing."""
    facts = run_scenario(tmp_path, """
        d = mkdir(path("d"))
        os.symlink(d, path("to-d"))
        spec = {"source": "twice", "fstype": "tmpfs"}
        apply_twice(state({d: spec, path("to-d"): spec}), "twice")
        fact("paths", [d, path("to-d")])
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


def test_tags_resolved_as_mount_finds_them(tmp_path: Path, loop_images: dict[str, str]):
    """Without udev's links libblkid scans the devices; with them, it takes the link named by
    blkid_encode_string. Either way, reconcile's device for LABEL=/UUID=/PARTLABEL=/PARTUUID=
    is the one mount(8) mounts, and declaring it mounts it once. One LABEL link points at
    another device, as a stale link would: mount(8) follows it, and so must reconcile (a wrong
    link name would have sent it scanning instead). PARTLABEL and PARTUUID are tried through
    links only: loop devices here get no partitions to scan."""
    labels = {k: v for k, v in loop_images.items() if not k.startswith("other")}
    other = next(v for k, v in loop_images.items() if k.startswith("other"))
    tag = next(iter(labels))[-3:]
    facts = run_scenario(tmp_path, f"""
        import ctypes
        labels, other, tag = {labels!r}, {other!r}, {tag!r}
        devs = list(labels.values())

        def udev_props(dev):
            return dict(kv.split("=", 1) for kv in sh("blkid", "-p", "-o", "udev", dev).stdout.decode().split())

        # libblkid's scan (no /dev/disk here): LABEL= for every device, UUID= for the first.
        scan = {{"LABEL=" + label: dev for label, dev in labels.items()}}
        scan["UUID=" + udev_props(devs[0])["ID_FS_UUID"]] = devs[0]
        points = {{src: mkdir(path("scan", str(i))) for i, src in enumerate(scan)}}
        fact("scan", scan)
        fact("scan.points", points)
        fact("blkid", {{src: sh("blkid", "-c", "/dev/null", "-l", "-o", "device", "-t", src).stdout.decode().strip()
                        for src in scan}})
        fact("scan.mount8", {{src: mount8(points[src], src, points[src]) for src in scan}})
        spec = {{points[src]: {{"source": src, "fstype": "ext4"}} for src in scan}}
        rc, res, _ = reconcile("diff", state(spec, "scan.yaml"))
        fact("scan.diff", res)
        apply_twice(state(spec, "scan.yaml"), "scan")
        fact("scan.count", {{p: len(mounts_at(p)) for p in points.values()}})
        for p in points.values():
            sh("umount", p)

        # A private /dev with udev's links, named as udev names them.
        olddev = mkdir(path("olddev"))
        sh("mount", "--rbind", "/dev", olddev)
        sh("mount", "--make-rprivate", olddev)
        sh("mount", "-t", "tmpfs", "-o", "mode=755", "privdev", "/dev")
        for dev in ["null", "zero", "full", "random", "urandom", "loop-control"] + [d[5:] for d in devs + [other]]:
            Path("/dev", dev).touch()
            sh("mount", "--bind", os.path.join(olddev, dev), "/dev/" + dev)
        lib = ctypes.CDLL("libblkid.so.1")

        def encode(value):
            buf = ctypes.create_string_buffer(4 * len(value.encode()) + 8)
            lib.blkid_encode_string(value.encode(), buf, len(buf))
            return buf.value.decode()

        links = {{}}  # source -> (link, device it points to)
        stale = "LABEL=" + list(labels)[0]
        for label, dev in labels.items():
            name = udev_props(dev)["ID_FS_LABEL_ENC"]  # udev's own name for the link
            links["LABEL=" + label] = ("by-label/" + name, other if "LABEL=" + label == stale else dev)
        props = udev_props(devs[1])
        links["UUID=" + props["ID_FS_UUID"]] = ("by-uuid/" + props["ID_FS_UUID_ENC"], devs[1])
        links["PARTLABEL=p (1)/x" + tag] = ("by-partlabel/" + encode("p (1)/x" + tag), devs[2])
        links["PARTUUID=0f3c7a52-01"] = ("by-partuuid/" + encode("0f3c7a52-01"), devs[3])
        for src, (link, dev) in links.items():
            os.makedirs(os.path.dirname("/dev/disk/" + link), exist_ok=True)
            os.symlink("../../" + dev[5:], "/dev/disk/" + link)
        points = {{src: mkdir(path("udev", str(i))) for i, src in enumerate(links)}}
        fact("udev", {{src: [link, dev] for src, (link, dev) in links.items()}})
        fact("udev.points", points)
        fact("stale", stale)
        fact("udev.mount8", {{src: mount8(points[src], src, points[src]) for src in links}})
        spec = {{points[src]: {{"source": src, "fstype": "ext4"}} for src in links}}
        rc, res, _ = reconcile("diff", state(spec, "udev.yaml"))
        fact("udev.diff", res)
        apply_twice(state(spec, "udev.yaml"), "udev")
        fact("udev.count", {{p: len(mounts_at(p)) for p in points.values()}})
    """)
    for src, dev in facts["scan"].items():
        p = facts["scan.points"][src]
        assert facts["blkid"][src] == dev
        m8 = facts["scan.mount8"][src]
        assert m8["rc"] == 0 and m8["line"]["source"] == dev, m8
        found = facts["scan.diff"][rid(p)]["observed"]["sources"][0]
        assert found["given"] == src and found["path"] == dev and "found by blkid" in found["note"], found
    for src, (_link, dev) in facts["udev"].items():
        p = facts["udev.points"][src]
        m8 = facts["udev.mount8"][src]
        assert m8["rc"] == 0 and m8["line"]["source"] == dev, (src, m8)
        found = facts["udev.diff"][rid(p)]["observed"]["sources"][0]
        assert found["path"] == dev and found["note"] == "", (src, found)
    assert facts["udev"][facts["stale"]][1] == other
    assert_applied_once(facts, "scan", list(facts["scan.count"]))
    assert_applied_once(facts, "udev", list(facts["udev.count"]))
    assert facts["udev"][f"LABEL=data(1){tag}"][0] == f"by-label/data\\x281\\x29{tag}"
