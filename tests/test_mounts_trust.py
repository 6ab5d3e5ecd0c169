"""What a mount may be trusted for, held against the kernel in private mount namespaces:

- an option whose value holds a space (an overlay's `lowerdir=/a b`, which the kernel writes as
  `\\040`) declared both ways holds, and reconcile mounts it so that the kernel shows the value
  the user meant (findmnt's FS-OPTIONS, decoded by util-linux);
- a tmpfs with no size limit (size=0: statfs reports 0 blocks, df 0) is not full: `min_free`
  holds and the report says it has no limit; a sized tmpfs filled up still drifts; a filesystem
  that reports no size at all (proc) is `blocked` as unknown, never "0B free".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mounts_support import namespaces_missing, rid, run_scenario


@pytest.fixture(scope="module", autouse=True)
def _namespaces():
    why = namespaces_missing()
    if why:
        pytest.skip(why)


def test_an_option_value_with_a_space_holds_on_a_real_overlay(tmp_path: Path):
    facts = run_scenario(tmp_path, """
        base = path("ov")
        for d in ("lower dir", "upper", "work", "merged", "upper2", "work2", "merged2"):
            mkdir(path("ov", d))
        lower = path("ov", "lower dir")
        opts = f"lowerdir={lower},upperdir={path('ov', 'upper')},workdir={path('ov', 'work')}"
        sh("mount", "-t", "overlay", "ovl", "-o", opts, path("ov", "merged"))
        raw = [ln for ln in open("/proc/self/mountinfo").read().splitlines() if " - overlay ovl " in ln][0]
        escaped = [o for o in raw.split(" - ")[1].split()[2].split(",") if o.startswith("lowerdir=")][0]
        fact("escaped", escaped)  # the kernel's own form, as /proc/self/mountinfo writes it
        fact("kernel_fs_options", sh("findmnt", "-no", "FS-OPTIONS", path("ov", "merged")).stdout.decode().strip())
        merged = path("ov", "merged")
        import os
        os.symlink(merged, path("ov", "to-merged"))  # the same mount point under a second name
        rc, res, _ = reconcile("diff", state({
            merged: {"fstype": "overlay", "options": [f"lowerdir={lower}"]},
            path("ov", "to-merged"): {"fstype": "overlay", "options": [escaped]},
        }, "have.yaml"))
        fact("diff", {"rc": rc, "resources": res})
        rc, res, _ = reconcile("diff", state({merged: {"options": [f"lowerdir={lower}x"]}}, "wrong.yaml"))
        fact("wrong", {"rc": rc, "resources": res})
        # reconcile mounts one whose options carry the space, then finds it holds.
        target = path("ov", "merged2")
        want = [f"lowerdir={lower}", f"upperdir={path('ov', 'upper2')}", f"workdir={path('ov', 'work2')}"]
        todo = state({target: {"source": "ovl2", "fstype": "overlay", "options": want}}, "todo.yaml")
        apply_twice(todo, "todo")
        fact("todo.fs_options", sh("findmnt", "-no", "FS-OPTIONS", target).stdout.decode().strip())
        fact("todo.count", len(mounts_at(target)))
    """)
    lower = str(tmp_path / "ov" / "lower dir")
    assert facts["escaped"] == "lowerdir=" + lower.replace(" ", "\\040")  # what the kernel wrote
    assert f"lowerdir={lower}," in facts["kernel_fs_options"] + ","  # findmnt decodes it
    diff = facts["diff"]
    assert diff["rc"] == 0, diff
    for r in diff["resources"].values():
        assert r["status"] == "ok" and r["drift"] == [], r
    wrong = facts["wrong"]["resources"][rid(str(tmp_path / "ov" / "merged"))]
    assert wrong["status"] == "blocked" and [d["field"] for d in wrong["drift"]] == ["options"], wrong
    first, second = facts["todo.first"], facts["todo.second"]
    [r1] = first["resources"].values()
    [r2] = second["resources"].values()
    assert (first["rc"], r1["status"], [a["result"] for a in r1["actions"]]) == (0, "ok", ["done"]), first
    assert (second["rc"], r2["status"], r2["actions"]) == (0, "ok", []), second
    assert f"lowerdir={lower}," in facts["todo.fs_options"] + ","  # the kernel has the path the user meant
    assert facts["todo.count"] == 1


def test_an_unlimited_tmpfs_is_not_full_and_no_size_is_unknown(tmp_path: Path):
    facts = run_scenario(tmp_path, """
        import os
        unlimited, small, proc = mkdir(path("unlimited")), mkdir(path("small")), mkdir(path("proc"))
        os.symlink(unlimited, path("to-unlimited"))  # the same mount point under a second name
        tmpfs(unlimited, "unl", "size=0")
        tmpfs(small, "sml", "size=64k")
        sh("dd", "if=/dev/zero", "of=" + os.path.join(small, "fill"), "bs=4k", "count=16", check=False)
        sh("mount", "-t", "proc", "proc", proc)
        st = {p: os.statvfs(p) for p in (unlimited, small, proc)}
        fact("statfs", {p: [s.f_blocks, s.f_bavail * s.f_frsize] for p, s in st.items()})
        fact("df", {p: sh("df", "-B1", "--output=size,avail", p).stdout.decode().split()[2:] for p in st})
        fact("kernel_options", line(mnt_id(unlimited))["fs-options"])
        rc, res, _ = reconcile("diff", state({
            unlimited: {"fstype": "tmpfs", "min_free": "10GiB"},
            path("to-unlimited"): {"min_free": "50%", "options": ["size=0"]},
            small: {"min_free": "16KiB"},
            proc: {"min_free": "1KiB"},
        }))
        fact("diff", {"rc": rc, "resources": res})
    """)
    unl, small, proc = (str(tmp_path / n) for n in ("unlimited", "small", "proc"))
    # The kernel's word: 0 blocks for the unlimited tmpfs and for proc; df shows 0 size for both.
    assert facts["statfs"][unl][0] == 0 and facts["df"][unl] == ["0", "0"]
    assert facts["statfs"][proc][0] == 0
    assert "size=0k" in facts["kernel_options"]
    assert facts["statfs"][small][0] > 0 and facts["statfs"][small][1] < 16 * 1024  # really full
    res = facts["diff"]["resources"]
    for key in (unl, str(tmp_path / "to-unlimited")):
        assert rid(key) in res, (list(res), facts["diff"])
        r = res[rid(key)]
        assert r["status"] == "ok" and r["drift"] == [], r
        assert "no size limit" in r["summary"], r["summary"]
    r = res[rid(small)]
    assert r["status"] == "blocked" and [d["field"] for d in r["drift"]] == ["min_free"], r
    r = res[rid(proc)]
    assert r["status"] == "blocked", r
    [d] = r["drift"]
    assert d["field"] == "min_free" and d["have"].startswith("unknown"), d
    assert "0B free" not in r["message"] and "reports no size" in r["message"], r
