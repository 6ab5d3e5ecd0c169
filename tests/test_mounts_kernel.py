"""Mounts held against the kernel in private mount namespaces: hostile mount points, stacked,
moved, moved-beneath, bind, read-only bind and overmounted mounts, a symlinked declared path,
an empty source, tmpfs options as the kernel renders them. Each scenario (tests/mounts_ns.py)
runs inside the namespace and records what reconcile reported next to what the kernel says
(the mount id of the path from /proc/self/fdinfo, the table from findmnt); the assertions here
hold the one against the other. Every "mount it" case is applied twice: the second apply takes
no action and the kernel lists one mount at the path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mounts_support import assert_applied_once, namespaces_missing, rid, run_scenario


@pytest.fixture(scope="module", autouse=True)
def _namespaces():
    why = namespaces_missing()
    if why:
        pytest.skip(why)


# --- hostile mount points ---------------------------------------------------------------------

NAMES = {"space": "a b", "tab": "a\tb", "newline": "a\nb", "backslash": "a\\b", "cr": "a\rb", "vt": "a\x0bb",
         "ff": "a\x0cb", "fs": "a\x1cb", "gs": "a\x1db", "rs": "a\x1eb", "us": "a\x1fb", "nel": "a\u0085b",
         "ls": "a\u2028b", "ps": "a\u2029b", "nbsp": "a\u00a0b", "ideographic": "a\u3000b", "hash": "a#b",
         "comma": "a,b", "literal-escape": "a\\040b", "separator": "a - b", "octal": "x\\777",
         "trailing-space": "a ", "long": "/".join(["L" * 250] * 15)}


def test_hostile_mount_points(tmp_path: Path):
    """Each name mounted by hand and declared (diff: ok, the mount the kernel names), and each
    declared unmounted and applied twice; a non-UTF-8 sibling and a mount point 4.5 KB long
    (beyond PATH_MAX, listed in mountinfo all the same) sit in the same table."""
    facts = run_scenario(tmp_path, f"""
        names = {NAMES!r}
        declared, todo = {{}}, {{}}
        for key, name in names.items():
            here = mkdir(path("have", name))
            tmpfs(here, "src-" + key)
            declared[here] = {{"source": "src-" + key, "fstype": "tmpfs", "writable": True}}
            todo[mkdir(path("todo", name))] = {{"source": "new-" + key, "fstype": "tmpfs", "options": ["size=1m"]}}
        # A sibling whose name and source are not UTF-8; a mount point deeper than PATH_MAX.
        tmpfs(mkdir(path(b"bad\\xffname")), b"src\\xff")
        os.chdir(mkdir(path("deep")))
        for _ in range(18):
            os.mkdir("d" * 250)
            os.chdir("d" * 250)
        os.mkdir("mnt")
        sh("mount", "-t", "tmpfs", "deepfs", "mnt")
        os.chdir("/")
        bad = mkdir(path("declared-bad-source"))
        tmpfs(bad, b"s\\xffrc")
        declared[bad] = {{"fstype": "tmpfs"}}
        rc, res, err = reconcile("diff", state(declared, "have.yaml"))
        fact("diff", {{"rc": rc, "resources": res}})
        fact("kernel", {{p: {{"id": mnt_id(p), "source": line(mnt_id(p))["source"]}} for p in declared}})
        text = sh(sys.executable, "-m", "reconcile_host", "diff", "-v", os.path.join(T, "have.yaml"),
                  check=False, env={{**os.environ, "PYTHONIOENCODING": "utf-8:strict"}}).stdout
        fact("text_raw_escaped", [b"s\\xffrc" in text, b"s\\\\xffrc" in text])
        todo_state = state(todo, "todo.yaml")
        apply_twice(todo_state, "todo")
        fact("todo.count", {{p: len(mounts_at(p)) for p in todo}})
        fact("todo.kernel", {{p: mnt_id(p) for p in todo}})
        fact("deep_listed", any(len(os.fsencode(e["target"])) > 4096 for e in table()))
    """)
    assert facts["deep_listed"]  # the table really held a mount point longer than PATH_MAX
    diff = facts["diff"]
    for p, kernel in facts["kernel"].items():
        r = diff["resources"][rid(p)]
        assert r["status"] == "ok", r
        mount = r["observed"]["mount"]
        assert mount["mount_id"] == kernel["id"] and mount["mount_point"] == p
        assert mount["source"] == kernel["source"], (p, mount["source"], kernel["source"])
    bad = [p for p in facts["kernel"] if p.endswith("declared-bad-source")][0]
    assert os.fsencode(diff["resources"][rid(bad)]["observed"]["mount"]["source"]) == b"s\xffrc"
    # The text report shows the byte escaped, as every name from the host is before a terminal
    # (core/escape.py: a byte that is not UTF-8 as \xHH, like `ls -b`); the JSON keeps it exact.
    assert facts["text_raw_escaped"] == [False, True]
    assert_applied_once(facts, "todo", list(facts["todo.count"]))
    for p, mid in facts["todo.kernel"].items():
        assert facts["todo.second"]["resources"][rid(p)]["observed"]["mount"]["mount_id"] == mid


# --- which mount is visible ---------------------------------------------------------------------

def test_stacked_moved_and_moved_beneath(tmp_path: Path):
    """The kernel, not the last line, says which mount is visible: three tmpfs stacked; an older
    mount moved onto a newer one's point (mount --move); a mount put beneath the top one
    (move_mount MOVE_MOUNT_BENEATH, Linux 6.5)."""
    facts = run_scenario(tmp_path, """
        stack = mkdir(path("stack"))
        for i in range(3):
            tmpfs(stack, f"stack{i}")
        p, q = mkdir(path("mvP")), mkdir(path("mvQ"))
        tmpfs(q, "moved-older")
        tmpfs(p, "under-newer")
        sh("mount", "--move", q, p)
        b, src = mkdir(path("beneath")), mkdir(path("beneath-src"))
        tmpfs(b, "top-first")
        tmpfs(src, "put-beneath")
        fact("beneath_errno", mount_beneath(src, b))
        sh("umount", src)
        points = {"stack": stack, "moved": p, "beneath": b}
        fact("points", points)
        fact("kernel", {k: line(mnt_id(v)) for k, v in points.items()})
        fact("last_line", {k: [e for e in table() if e["target"] == v][-1] for k, v in points.items()})
        fact("count", {k: len(mounts_at(v)) for k, v in points.items()})
        # Declared with the source of a mount that is there but not visible: must be blocked.
        rc, res, _ = reconcile("diff", state({stack: {"source": "stack0"}, p: {"source": "under-newer"},
                                              b: {"source": "put-beneath"}}))
        fact("diff", {"rc": rc, "resources": res})
    """)
    if facts["beneath_errno"]:
        pytest.skip(f"this kernel ({os.uname().release}) has no move_mount(MOVE_MOUNT_BENEATH): "
                    f"{os.strerror(facts['beneath_errno'])} [ci-ok]")
    for key, p in facts["points"].items():
        kernel, last = facts["kernel"][key], facts["last_line"][key]
        r = facts["diff"]["resources"][rid(p)]
        mount = r["observed"]["mount"]
        assert mount["mount_id"] == kernel["id"] and mount["source"] == kernel["source"], (key, mount, kernel)
        assert r["status"] == "blocked" and r["drift"][0]["field"] == "source", r
        assert len(r["observed"]["hidden"]) == facts["count"][key] - 1
        if key != "stack":  # a case where the last line of the table is not the visible mount
            assert last["id"] != kernel["id"], (key, last, kernel)


def test_overmounted_parent_is_not_mounted(tmp_path: Path):
    """A/data mounted, then A mounted over: A/data's line stays in the table and findmnt -M
    still finds it, but the path reaches A's new top. reconcile says not mounted, names what
    hides it, and does not mount a second copy; statvfs never judged the cover."""
    facts = run_scenario(tmp_path, """
        a = mkdir(path("A"))
        tmpfs(a, "ov-lower")
        data = mkdir(path("A", "data"))
        tmpfs(data, "ov-data")
        tmpfs(a, "ov-top")
        mkdir(data)
        fact("data", data)
        fact("kernel_id", mnt_id(data))
        fact("kernel_line", line(mnt_id(data)))
        r = sh("findmnt", "-n", "-o", "SOURCE", "-M", data, check=False)
        fact("findmnt_M", r.stdout.decode().strip())
        spec = {data: {"source": "ov-data", "fstype": "tmpfs", "min_free": "1KiB"}}
        rc, res, _ = reconcile("apply", state(spec))
        fact("apply", {"rc": rc, "resources": res})
        fact("count", len(mounts_at(data)))
    """)
    assert facts["findmnt_M"] == "ov-data"  # string-based tools think it is mounted
    assert facts["kernel_line"]["source"] == "ov-top"  # the kernel: the path reaches the cover
    r = facts["apply"]["resources"][rid(facts["data"])]
    assert facts["apply"]["rc"] == 2 and r["status"] == "blocked" and r["actions"] == [], r
    obs = r["observed"]
    assert obs["mount"] is None and obs["space"] is None
    assert obs["on"]["mount_id"] == facts["kernel_id"] and obs["on"]["source"] == "ov-top"
    assert [h["source"] for h in obs["hidden"]] == ["ov-data"]
    assert "hidden" in r["message"] and "does not mount" in r["message"]
    assert facts["count"] == 1  # still only the hidden one: nothing mounted on top


def test_bind_and_read_only_bind(tmp_path: Path):
    facts = run_scenario(tmp_path, """
        real = mkdir(path("real"))
        tmpfs(real, "realfs")
        sub = mkdir(path("real", "sub"))
        bind, rbind = mkdir(path("bind")), mkdir(path("rbind"))
        sh("mount", "--bind", sub, bind)
        sh("mount", "--bind", "-o", "ro", sub, rbind)
        fact("paths", [bind, rbind])
        fact("kernel", {p: line(mnt_id(p)) for p in (bind, rbind)})
        rc, res, _ = reconcile("diff", state({bind: {"writable": True, "fstype": "tmpfs"},
                                              rbind: {"writable": True}}))
        fact("diff", res)
        # A bind mount from fstab, applied twice.
        todo = mkdir(path("bind-todo"))
        Path(T, "fstab").write_text(f"{sub} {todo} none bind 0 0\\n")
        sh("mount", "--bind", os.path.join(T, "fstab"), "/etc/fstab")
        apply_twice(state({todo: {"writable": True}}, "todo.yaml"), "todo")
        fact("todo.count", {todo: len(mounts_at(todo))})
        fact("todo.root", line(mnt_id(todo))["fsroot"])
    """)
    bind, rbind = facts["paths"]
    for p in (bind, rbind):
        mount = facts["diff"][rid(p)]["observed"]["mount"]
        assert (mount["mount_id"], mount["root"]) == (facts["kernel"][p]["id"], facts["kernel"][p]["fsroot"])
    assert facts["diff"][rid(bind)]["status"] == "ok"
    ro = facts["diff"][rid(rbind)]
    assert ro["status"] == "blocked" and ro["drift"] == [{"field": "writable", "want": True, "have": False}]
    kernel = facts["kernel"][rbind]  # read-only per mount, the superblock read-write
    assert kernel["vfs-options"].startswith("ro") and kernel["fs-options"].startswith("rw")
    assert_applied_once(facts, "todo", list(facts["todo.count"]))
    todo = facts["todo.second"]["resources"][rid(list(facts["todo.count"])[0])]
    assert todo["observed"]["mount"]["root"] == facts["todo.root"] == "/sub"


def test_symlinked_declared_path(tmp_path: Path):
    """A declared symlink means its target, as for mount(8): a link to a mount point is
    mounted; a link to an unmounted directory is mounted there (once: the second apply finds
    it through the link); a dangling link is blocked, not mounted."""
    facts = run_scenario(tmp_path, """
        real = mkdir(path("real"))
        tmpfs(real, "realfs")
        link = path("link")
        os.symlink(real, link)
        real2 = mkdir(path(b"real2-\\xff"))
        link2 = path("link2")
        os.symlink(os.fsencode(real2), os.fsencode(link2))
        dangling = path("dangling")
        os.symlink(path("nowhere"), dangling)
        fact("paths", {"link": link, "real": real, "link2": link2, "real2": real2, "dangling": dangling})
        fact("kernel_link", mnt_id(link))
        rc, res, _ = reconcile("diff", state({link: {"source": "realfs"}}, "have.yaml"))
        fact("diff", res)
        spec = {link2: {"source": "vialink", "fstype": "tmpfs"}, dangling: {"source": "x", "fstype": "tmpfs"}}
        apply_twice(state(spec, "todo.yaml"), "todo")
        fact("count", {"real2": len(mounts_at(real2)), "link2": len(mounts_at(link2)),
                       "dangling": len(mounts_at(dangling))})
        fact("kernel_real2", line(mnt_id(link2)))
    """)
    p = facts["paths"]
    r = facts["diff"][rid(p["link"])]
    assert r["status"] == "ok" and r["observed"]["resolved"] == p["real"]
    assert r["observed"]["mount"]["mount_id"] == facts["kernel_link"]
    first, second = facts["todo.first"]["resources"], facts["todo.second"]["resources"]
    assert [a["result"] for a in first[rid(p["link2"])]["actions"]] == ["done"]
    assert second[rid(p["link2"])]["actions"] == [] and second[rid(p["link2"])]["status"] == "ok"
    assert os.fsencode(second[rid(p["link2"])]["observed"]["resolved"]) == os.fsencode(p["real2"])
    assert facts["kernel_real2"]["target"] == p["real2"] and facts["kernel_real2"]["source"] == "vialink"
    assert facts["count"] == {"real2": 1, "link2": 0, "dangling": 0}
    for report in (first, second):
        d = report[rid(p["dangling"])]
        assert d["status"] == "blocked" and d["actions"] == [] and "does not exist" in d["message"], d


def test_empty_source(tmp_path: Path):
    """`mount -t tmpfs "" DIR` (mount(8) accepts it) is listed as `- tmpfs  rw,...`."""
    facts = run_scenario(tmp_path, """
        e = mkdir(path("empty"))
        tmpfs(e, "", "size=8m")
        fact("path", e)
        fact("kernel", line(mnt_id(e)))
        rc, res, _ = reconcile("diff", state({e: {"fstype": "tmpfs", "options": ["size=8m"]}}, "a.yaml"))
        fact("ok", res)
        rc, res, _ = reconcile("diff", state({e: {"source": "tmpfs"}}, "b.yaml"))
        fact("other", res)
    """)
    assert facts["kernel"]["source"] is None  # findmnt's null: no source at all
    ok = facts["ok"][rid(facts["path"])]
    assert ok["status"] == "ok" and ok["observed"]["mount"]["source"] == ""
    assert "size=8192k" in ok["observed"]["mount"]["super_options"]
    other = facts["other"][rid(facts["path"])]
    assert other["status"] == "blocked" and "mounted from an empty source" in other["message"]


# --- options as the kernel renders them -------------------------------------------------------

TMPFS_GROUPS = {
    "size": ["size=16m", "size=16M", "size=16384k", "size=16385k", "size=17m", "size=1g", "size=12345", "size=16k",
             "size=4096", "size=0", "size=0x1000000", "size=010m", "size=50%", "size=33%", "size=1%",
             "nr_blocks=4096", "size=DEFAULT"],
    "nr_inodes": ["nr_inodes=1k", "nr_inodes=1024", "nr_inodes=1000", "nr_inodes=0", "nr_inodes=0x400",
                  "nr_inodes=1025"],
    "mode": ["mode=755", "mode=0755", "mode=7", "mode=007", "mode=1777", "mode=01777", "mode=700"],
    "uid": ["uid=1000", "uid=0", "uid=010", "uid=8", "uid=0x10", "uid=16", "uid=1001"],
    "gid": ["gid=5", "gid=0", "gid=6"],
    "other": ["huge=within_size", "inode64", "noswap", "nosuid", "noatime", "strictatime", "nodiratime",
              "sync", "dirsync", "lazytime", "ro"],
}


def test_tmpfs_options_judged_as_the_kernel_renders_them(tmp_path: Path):
    """For every pair of option values in a group: a tmpfs mounted with one and declared with
    the other is ok exactly when the kernel renders both the same way (two scratch mounts, their
    options as findmnt shows them). So a declared option is never "missing" right after
    mounting with it, and a different value is never taken for the same."""
    facts = run_scenario(tmp_path, f"""
        groups = {TMPFS_GROUPS!r}
        probe = mkdir(path("default"))
        tmpfs(probe, "probe")
        st = os.statvfs(probe)  # a tmpfs's default size, from the kernel (f_blocks of an unsized one)
        default = f"size={{st.f_blocks * st.f_frsize // 1024}}k"
        mounted, declared_by = {{}}, {{}}
        for group, values in groups.items():
            for i, value in enumerate(values):
                value = default if value == "size=DEFAULT" else value
                d = mkdir(path("m", group, str(i)))
                if sh("mount", "-t", "tmpfs", "-o", value, "t", d, check=False).returncode == 0:
                    mounted[d] = {{"group": group, "value": value, "kernel": line(mnt_id(d))}}
        fact("mounted", mounted)
        fact("default", line(mnt_id(probe)))
        verdicts = {{}}
        for group in groups:
            here = {{d: m for d, m in mounted.items() if m["group"] == group}}
            for n, declared in enumerate(sorted({{m["value"] for m in here.values()}})):
                spec = {{d: {{"options": [declared]}} for d in here}}
                rc, res, _ = reconcile("diff", state(spec, f"{{group}}-{{n}}.yaml"))
                for d in here:
                    verdicts[f"{{d}}|{{declared}}"] = res[f"mount:{{d}}"]["status"]
        fact("verdicts", verdicts)
        todo = mkdir(path("todo"))
        opts = ["mode=1777", "uid=0", "nr_inodes=1k", "nosuid", "noatime", "exec", "rw", "defaults",
                "nofail", "x-reconcile.test", default]
        sized = mkdir(path("todo-16m"))  # the issue's case: the kernel shows size=16384k
        apply_twice(state({{todo: {{"source": "opts", "fstype": "tmpfs", "options": opts}},
                           sized: {{"source": "sized", "fstype": "tmpfs", "options": ["size=16m"]}}}}, "todo.yaml"),
                    "todo")
        fact("todo.count", {{todo: len(mounts_at(todo)), sized: len(mounts_at(sized))}})
        fact("sized", line(mnt_id(sized))["fs-options"])
    """)
    mounted, verdicts = facts["mounted"], facts["verdicts"]
    assert len(mounted) >= sum(len(v) for v in TMPFS_GROUPS.values()) - 3  # all but options an old kernel lacks

    def shown(m: dict) -> set[str]:
        return set(m["kernel"]["vfs-options"].split(",") + m["kernel"]["fs-options"].split(","))

    default = shown({"kernel": facts["default"]})
    checked = 0
    for key, status in verdicts.items():
        d, declared = key.split("|", 1)
        m = mounted[d]
        twin = next(x for x in mounted.values() if x["group"] == m["group"] and x["value"] == declared)
        if m["group"] == "other":  # one flag or option each, each rendered its own way
            same = shown(m) == shown(twin)
            assert shown(twin) != default, declared  # the option changes what the kernel shows
        else:
            key_ = m["group"]
            same = [o for o in shown(m) if o.partition("=")[0] == key_] == \
                [o for o in shown(twin) if o.partition("=")[0] == key_]
        assert status == ("ok" if same else "blocked"), (m["value"], declared, m["kernel"], twin["kernel"], status)
        checked += 1
    assert checked > 150
    assert_applied_once(facts, "todo", list(facts["todo.count"]))
    assert "size=16384k" in facts["sized"].split(",")
