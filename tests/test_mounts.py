"""Mounts against real mounts: each test runs the CLI inside a private mount namespace
(unshare --mount --propagation private) where it mounts tmpfs, binds a test fstab over
/etc/fstab or mounts a FUSE filesystem whose server stops answering. The namespace dies
with the scenario's process group, so no mount is left on the host, even on failure.

Results are checked with the system's own tools run in the same namespace (findmnt, df).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_support import cli_env
from mounts_support import HERE, fuse_missing, in_namespace, namespaces_missing

# A shell function for the scenarios: `cli NAME ARGS...` runs reconcile with --format json,
# keeping stdout, stderr and the exit code as $T/NAME.{json,err,rc}. stdout goes through a
# pipe on purpose: a probe child left holding it would keep `cat` (and the test) waiting.
PRELUDE = r"""
cli() {
    name=$1; shift
    { rc=0; "$PY" -m reconcile_host "$@" --format json 2>"$T/$name.err" || rc=$?; echo $rc > "$T/$name.rc"; } \
        | cat > "$T/$name.json"
}
"""

# A tmpfs at $T/fine and a FUSE filesystem at $T/hung whose server answers INIT and then never
# again; `reconcile diff STATE` runs against them, timed into $T/elapsed, then the server is killed.
HUNG_FUSE_DIFF = r"""
    mkdir -p $T/hung $T/fine
    mount -t tmpfs -o size=8m scratch-fine $T/fine
    "$PY" "$SUPPORT" fuse-hang $T/hung $T/ready > $T/server.log 2>&1 &
    for i in $(seq 200); do [ -e $T/ready ] && break; sleep 0.05; done
    [ -e $T/ready ] || { cat $T/server.log >&2; exit 1; }
    findmnt -n -o FSTYPE $T/hung > $T/hung.findmnt
    start=$(date +%s.%N)
    cli diff diff STATE
    end=$(date +%s.%N)
    echo "$start $end" > $T/elapsed
    kill -9 $(cat $T/ready)
"""

@pytest.fixture(scope="module", autouse=True)
def _namespaces():
    why = namespaces_missing()
    if why:
        pytest.skip(why)


class Scenario:
    def __init__(self, tmp: Path):
        self.tmp = tmp

    def state(self, body: str, name: str = "state.yaml") -> Path:
        path = self.tmp / name
        path.write_text("version: 1\n" + body.replace("$T", str(self.tmp)))
        return path

    def run(self, script: str, timeout: float = 90):
        env = cli_env(self.tmp, T=str(self.tmp), PY=sys.executable, SUPPORT=str(HERE / "mounts_support.py"))
        proc = in_namespace(PRELUDE + script, env, timeout=timeout)
        assert proc.returncode == 0, f"scenario failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr}"
        return proc

    def report(self, name: str) -> tuple[int, dict]:
        rc = int((self.tmp / f"{name}.rc").read_text())
        text = (self.tmp / f"{name}.json").read_text()
        assert text, f"{name}: no output; stderr: {(self.tmp / f'{name}.err').read_text()}"
        report = json.loads(text)
        return rc, {r["id"]: r for r in report["resources"]}

    def text(self, name: str) -> str:
        return (self.tmp / name).read_text()


@pytest.fixture
def sc(tmp_path: Path) -> Scenario:
    return Scenario(tmp_path)


def test_tmpfs_mounted_and_not(sc: Scenario):
    state = sc.state("""
mounts:
  $T/a:
    mounted: true
    source: scratch
    fstype: tmpfs
    options: [rw, nosuid]
    min_free: 32MiB
    min_free_inodes: "1%"
    writable: true
  $T/b:
    mounted: true
  $T/c:
    mounted: false
""")
    sc.run(f"""
        mkdir -p $T/a $T/b $T/c
        mount -t tmpfs -o size=64m,nosuid scratch $T/a
        cli diff diff {state}
        ls -A $T/a > $T/a.ls
        df -B1 --output=avail,size $T/a | tail -1 > $T/a.df
    """)
    rc, res = sc.report("diff")
    assert rc == 2
    a = res[f"mount:{sc.tmp}/a"]
    assert a["status"] == "ok", a
    assert a["observed"]["mount"]["fstype"] == "tmpfs" and a["observed"]["writable"] is True
    avail, size = (int(x) for x in sc.text("a.df").split())
    assert (a["observed"]["space"]["free_bytes"], a["observed"]["space"]["total_bytes"]) == (avail, size)
    assert sc.text("a.ls") == "", "the write probe left a file behind"
    b = res[f"mount:{sc.tmp}/b"]
    assert b["status"] == "blocked"
    assert b["drift"] == [{"field": "mounted", "want": True, "have": False}]
    assert "no /etc/fstab entry" in b["message"]
    assert res[f"mount:{sc.tmp}/c"]["status"] == "ok"


def test_a_path_with_a_trailing_slash_is_the_same_mount_point(sc: Scenario):
    # Declared `$T/a/`, needed as `mount:$T/a`, and `$T/b` declared twice, once as `$T/b//`: one
    # mount point each, as findmnt and systemd (systemd-escape --path: one unit name) say.
    state = sc.state("""
mounts:
  $T/a/:
    mounted: true
    fstype: tmpfs
extractions:
  x:
    dir: $T/a/x
    total: 1
    needs: [mount:$T/a]
""")
    twice = sc.state("mounts:\n  $T/b:\n    mounted: true\n  $T/b//:\n    mounted: false\n", "twice.yaml")
    sc.run(f"""
        mkdir -p $T/a $T/b
        mount -t tmpfs -o size=8m scratch-slash $T/a
        findmnt -n -o TARGET --mountpoint $T/a/ > $T/a.findmnt
        systemd-escape --path $T/a/ > $T/a.escaped
        systemd-escape --path $T/a > $T/a.escaped-plain
        systemd-escape --path $T/b// > $T/b.escaped
        systemd-escape --path $T/b > $T/b.escaped-plain
        cli diff diff {state}
        cli twice diff {twice}
    """)
    assert sc.text("a.escaped") == sc.text("a.escaped-plain") and sc.text("b.escaped") == sc.text("b.escaped-plain")
    target = sc.text("a.findmnt").strip()
    assert target == f"{sc.tmp}/a", target  # findmnt: the mount point named with its slash is this one
    rc, res = sc.report("diff")
    assert rc != 1 and list(res)[0] == f"mount:{target}", res  # validated; the mount comes first
    assert res[f"mount:{target}"]["status"] == "ok", res[f"mount:{target}"]
    twice_report = json.loads(sc.text("twice.json"))
    assert (int(sc.text("twice.rc")), twice_report["resources"]) == (1, []), twice_report
    assert [p["text"] for p in twice_report["problems"]] == [
        f'{twice}:5:3: mounts."{sc.tmp}/b//": the same mount point as "{sc.tmp}/b" above (a path with trailing '
        f"or repeated slashes is one mount point: mount:{sc.tmp}/b); declare it once"]


def test_mount_from_fstab_and_from_source(sc: Scenario):
    (sc.tmp / "fstab").write_text(f"# test fstab\ntmpfs {sc.tmp}/f tmpfs size=16m,noexec 0 0\n")
    state = sc.state("""
mounts:
  $T/f:
    fstype: tmpfs
    options: [noexec]
    writable: true
  $T/g:
    source: scratch-g
    fstype: tmpfs
    options: [nodev]
    min_free: 1MiB
""")
    sc.run(f"""
        mkdir -p $T/f $T/g
        mount --bind $T/fstab /etc/fstab
        cli before diff {state}
        cli apply apply --journal $T/journal.jsonl {state}
        findmnt -J -o TARGET,SOURCE,FSTYPE,OPTIONS $T/f > $T/f.findmnt
        findmnt -J -o TARGET,SOURCE,FSTYPE,OPTIONS $T/g > $T/g.findmnt
        cli after diff {state}
    """)
    rc, res = sc.report("before")
    assert rc == 2
    f, g = res[f"mount:{sc.tmp}/f"], res[f"mount:{sc.tmp}/g"]
    assert [a["action"] for a in f["actions"]] == ["mount"] and "/etc/fstab" in f["actions"][0]["description"]
    assert g["actions"][0]["description"] == f"mount -t tmpfs -o nodev scratch-g {sc.tmp}/g"

    rc, res = sc.report("apply")
    assert rc == 0, res
    for p in ("f", "g"):
        r = res[f"mount:{sc.tmp}/{p}"]
        assert r["status"] == "ok" and [a["result"] for a in r["actions"]] == ["done"], r
    fm = json.loads(sc.text("f.findmnt"))["filesystems"][0]
    assert fm["fstype"] == "tmpfs" and "noexec" in fm["options"].split(",")
    gm = json.loads(sc.text("g.findmnt"))["filesystems"][0]
    assert (gm["source"], gm["fstype"]) == ("scratch-g", "tmpfs") and "nodev" in gm["options"].split(",")
    journal = [e for line in sc.text("journal.jsonl").splitlines() if (e := json.loads(line)).get("event") == "result"]
    assert {(e["resource"], e["action"], e["result"]) for e in journal} == {
        (f"mount:{sc.tmp}/f", "mount", "done"), (f"mount:{sc.tmp}/g", "mount", "done")}

    rc, res = sc.report("after")
    assert rc == 0 and all(r["status"] == "ok" for r in res.values())


def test_wrong_fstype_and_source_are_blocked_never_unmounted(sc: Scenario):
    state = sc.state("""
mounts:
  $T/w:
    source: other-disk
    fstype: ext4
""")
    sc.run(f"""
        mkdir -p $T/w
        mount -t tmpfs -o size=8m scratch-w $T/w
        cli apply apply --journal $T/journal.jsonl {state}
        findmnt -n -o SOURCE,FSTYPE $T/w > $T/w.findmnt
    """)
    rc, res = sc.report("apply")
    assert rc == 2
    w = res[f"mount:{sc.tmp}/w"]
    assert w["status"] == "blocked" and w["actions"] == []
    assert {d["field"]: (d["want"], d["have"]) for d in w["drift"]} == {
        "source": ("other-disk", "scratch-w"), "fstype": ("ext4", "tmpfs")}
    assert "never unmounts" in w["message"]
    assert sc.text("w.findmnt").split() == ["scratch-w", "tmpfs"]  # still mounted, untouched


def test_min_free_in_bytes_and_percent(sc: Scenario):
    state = sc.state("""
mounts:
  $T/s:
    min_free: 100MiB
  $T/p:
    min_free: "50%"
""")
    sc.run(f"""
        mkdir -p $T/s $T/p
        mount -t tmpfs -o size=64m scratch-s $T/s
        mount -t tmpfs -o size=64m scratch-p $T/p
        cli empty diff {state}
        dd if=/dev/zero of=$T/p/fill bs=1M count=40 status=none
        df -B1 --output=avail $T/p | tail -1 > $T/p.df
        cli full diff {state}
    """)
    rc, res = sc.report("empty")
    assert rc == 2
    s = res[f"mount:{sc.tmp}/s"]
    assert s["status"] == "blocked" and s["drift"][0]["field"] == "min_free"
    assert s["drift"][0]["want"] == "≥ 100.0MiB" and s["drift"][0]["have"].startswith("64.0MiB free")
    assert "free at least 36.0MiB" in s["message"]
    assert res[f"mount:{sc.tmp}/p"]["status"] == "ok"

    rc, res = sc.report("full")
    p = res[f"mount:{sc.tmp}/p"]
    assert p["status"] == "blocked", p
    assert p["observed"]["space"]["free_bytes"] == int(sc.text("p.df"))
    assert p["drift"][0]["want"] == "≥ 50% (32.0MiB)" and p["drift"][0]["have"].startswith("24.0MiB free")
    assert "free at least 8.0MiB" in p["message"]


def test_read_only_against_writable(sc: Scenario):
    state = sc.state("""
mounts:
  $T/ro:
    writable: true
  $T/bind:
    writable: true
  $T/rw:
    writable: false
""")
    sc.run(f"""
        mkdir -p $T/ro $T/src $T/bind $T/rw
        mount -t tmpfs -o ro,size=8m scratch-ro $T/ro
        mount --bind $T/src $T/bind
        mount -o remount,bind,ro $T/bind
        mount -t tmpfs -o size=8m scratch-rw $T/rw
        cli diff diff {state}
    """)
    rc, res = sc.report("diff")
    assert rc == 2
    for p in ("ro", "bind"):
        r = res[f"mount:{sc.tmp}/{p}"]
        assert r["status"] == "blocked" and r["drift"] == [{"field": "writable", "want": True, "have": False}], r
        assert "read-only" in r["message"]
    rw = res[f"mount:{sc.tmp}/rw"]
    assert rw["status"] == "blocked" and rw["drift"] == [{"field": "writable", "want": False, "have": True}]


def test_hung_fuse_mount_is_reported_stuck_within_the_deadline(sc: Scenario):
    why = fuse_missing()
    if why:
        pytest.skip(why)
    probe_timeout = 1.0
    state = sc.state(f"""
mounts:
  $T/hung:
    writable: true
    probe_timeout: {probe_timeout}s
  $T/fine:
    fstype: tmpfs
""")
    sc.run(HUNG_FUSE_DIFF.replace("STATE", str(state)))
    assert sc.text("hung.findmnt").strip() == "fuse.hang"
    rc, res = sc.report("diff")
    assert rc == 1
    hung = res[f"mount:{sc.tmp}/hung"]
    assert hung["status"] == "error" and "stuck" in hung["message"], hung
    assert "did not return within 1s" in hung["message"], hung  # the deadline that was applied
    # Finding the mount (path, mount id, table) asks the hung filesystem nothing: statvfs hangs.
    assert hung["message"].startswith(f"stuck: statvfs on {sc.tmp}/hung "), hung
    assert res[f"mount:{sc.tmp}/fine"]["status"] == "ok"
    # The server is killed only after diff returned, so diff came back while the mount was still
    # hung: it did not wait for it. The bound below is a guard against "never", not a stopwatch.
    start, end = (float(x) for x in sc.text("elapsed").split())
    assert end - start < 30, f"diff took {end - start:.2f}s"


def test_hung_fuse_mount_is_seen_without_asking_it(sc: Scenario):
    """Whether something is mounted is the kernel's answer (the path's mount id and the table):
    a hung filesystem declared `mounted: false` is reported mounted, not stuck."""
    why = fuse_missing()
    if why:
        pytest.skip(why)
    state = sc.state("""
mounts:
  $T/hung:
    mounted: false
    probe_timeout: 1s
""")
    sc.run(HUNG_FUSE_DIFF.replace("STATE", str(state)))
    rc, res = sc.report("diff")
    hung = res[f"mount:{sc.tmp}/hung"]
    assert rc == 2 and hung["status"] == "blocked", hung
    assert hung["observed"]["mount"]["fstype"] == "fuse.hang" and "declared `mounted: false`" in hung["message"]


def test_extraction_on_a_hung_mount_is_reported_not_waited_on(sc: Scenario):
    """Listing a directory on a filesystem that stopped answering blocks for good: the extraction
    is observed in a child abandoned after `observe_timeout` without progress."""
    why = fuse_missing()
    if why:
        pytest.skip(why)
    state = sc.state("""
extractions:
  stuck:
    dir: $T/hung/hidden_states
    total: 100
    observe_timeout: 1s
mounts:
  $T/fine:
    fstype: tmpfs
""")
    sc.run(HUNG_FUSE_DIFF.replace("STATE", str(state)))
    rc, res = sc.report("diff")
    assert rc == 1
    stuck = res["extraction:stuck"]
    assert stuck["status"] == "error", stuck
    assert stuck["message"].startswith("observing extraction made no progress for 1s: "), stuck["message"]
    assert res[f"mount:{sc.tmp}/fine"]["status"] == "ok"
    # As above: diff came back while the mount was still hung; a guard against "never".
    start, end = (float(x) for x in sc.text("elapsed").split())
    assert end - start < 30, f"diff took {end - start:.2f}s"
