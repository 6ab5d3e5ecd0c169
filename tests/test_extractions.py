"""The CLI as a user runs it: real files, a real detached job, a real systemd unit.

The systemd tests run the fake extraction (tests/fake_extract.py) as a unit of the
namespaced systemd, SIGKILL it while a file is half written, and check that reconcile
quarantines that file, starts the unit, and reports progress until the job is done.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
from cli_support import reconcile_json, wait_for
from extraction_support import (
    FAKE_EXTRACT,
    age,
    observe,
    read_record,
    record_path,
    resource,
    state_yaml,
    write_sample,
    write_samples,
)
from reconcile_host.reconcilers.extractions.listing import list_tree, scan
from reconcile_host.reconcilers.extractions.records import STATE_FORMAT

UNIT = "eagle3-extract.service"


def _old(path: Path) -> None:
    """Make a file look written long ago (not "being written")."""
    os.utime(path, (time.time() - 3600, time.time() - 3600))


# --- without root ----------------------------------------------------------------------

def test_allow_missing_and_done_is_ok(tmp_path):
    out = tmp_path / "hs"
    write_samples(out, [i for i in range(30) if i not in (17, 23)])
    spec = {"dir": str(out), "total": 30, "allow_missing": [17]}
    rc, rep, _ = reconcile_json(tmp_path, "diff", str(state_yaml(tmp_path / "s.yaml", spec)))
    r = resource(rep)
    assert rc == 2 and r["status"] == "blocked"  # no job declared
    assert r["drift"] == [{"field": "done", "want": ">= 30", "have": 29}]
    assert r["observed"]["missing_ranges"] == [[23, 23]]
    write_sample(out, 23)
    rc, rep, _ = reconcile_json(tmp_path, "diff", str(tmp_path / "s.yaml"))
    assert rc == 0 and resource(rep)["status"] == "ok"


def test_zero_byte_gz_and_safetensors_quarantined(tmp_path):
    out = tmp_path / "hs"
    write_samples(out, range(10))
    zero = out / "rows_0-10" / "data_3.ckpt"
    zero.write_bytes(b"")
    gz_full = write_sample(out, 4, fmt="ckpt.gz").read_bytes()
    (out / "rows_0-10" / "data_4.ckpt").unlink()
    gz = write_sample(out, 4, fmt="ckpt.gz", cut=len(gz_full) // 2)
    for p in (zero, gz):
        _old(p)
    spec = {"dir": str(out), "total": 10, "min_done": 8, "verify": "at-risk"}
    state = state_yaml(tmp_path / "s.yaml", spec)
    rc, rep, _ = reconcile_json(tmp_path, "diff", str(state))
    r = resource(rep)
    # Under `recent` a .gz is not decompressed: only the zero-byte file is damaged.
    assert [d["path"] for d in r["observed"]["damaged"]] == ["rows_0-10/data_3.ckpt"]
    assert r["observed"]["unverified_gz"] == 1
    state_yaml(state, {**spec, "verify": "content"})
    rc, rep, _ = reconcile_json(tmp_path, "apply", str(state))
    r = resource(rep)
    assert rc == 0 and r["status"] == "ok", rep
    assert [a["action"] for a in r["actions"]] == ["quarantine"]
    assert not zero.exists() and not gz.exists()
    (qdir,) = (out / ".reconcile-quarantine").iterdir()
    manifest = json.loads((qdir / "manifest.json").read_text())
    moved = {f["path"]: f["reason"] for f in manifest["files"]}
    assert moved["rows_0-10/data_3.ckpt"] == "empty file (0 bytes)"
    assert "truncated" in moved["rows_0-10/data_4.ckpt.gz"]
    assert (qdir / "rows_0-10" / "data_4.ckpt.gz").read_bytes() == gz_full[: len(gz_full) // 2]
    journal = [e for x in (tmp_path / "journal.jsonl").read_text().splitlines()
               if (e := json.loads(x)).get("event") == "result"]
    assert [e["action"] for e in journal] == ["quarantine"]

    # Safetensors: a file one byte short is damaged.
    st_out = tmp_path / "st"
    write_samples(st_out, range(4), fmt="safetensors")
    full = (st_out / "rows_0-10" / "data_2.safetensors").read_bytes()
    cut = write_sample(st_out, 2, fmt="safetensors", cut=len(full) - 1)
    _old(cut)
    st_state = state_yaml(tmp_path / "st.yaml", {"dir": str(st_out), "total": 4,
                                                  "pattern": "rows_{group}/data_{index}.safetensors"})
    rc, rep, _ = reconcile_json(tmp_path, "diff", str(st_state))
    r = resource(rep)
    assert rc == 2 and r["observed"]["damaged"][0]["reason"].startswith("truncated")
    assert r["observed"]["done"] == 3


def _kill_started(tmp_path: Path) -> None:
    info = tmp_path / "state" / "extractions" / "eagle3.pid"
    if info.exists():
        pid = json.loads(info.read_text())["pid"]
        try:
            os.kill(pid, signal.SIGKILL)  # the job this test had reconcile start
        except ProcessLookupError:
            pass


def test_resume_command_detached_and_logged(tmp_path):
    out = tmp_path / "hs"
    write_samples(out, range(5))
    argv = [sys.executable, FAKE_EXTRACT, "--out", str(out), "--total", "30", "--rate", "20",
            "--group-size", "10", "--nan", "17"]
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": 30, "allow_missing": [17],
                                              "job": {"command": argv, "cwd": str(tmp_path)}})
    try:
        rc, rep, err = reconcile_json(tmp_path, "apply", str(state))
        r = resource(rep)
        assert rc == 0 and r["status"] in ("converging", "ok"), (rep, err)
        assert [(a["action"], a["result"]) for a in r["actions"]] == [("start", "done")]
        info = json.loads((tmp_path / "state" / "extractions" / "eagle3.pid").read_text())
        pid = info["pid"]
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if stat[0] != "Z":
            # Its own session (setsid), detached from reconcile: led by its reaper, its parent,
            # which records how it ends (local/host.py).
            assert int(stat[3]) == int(stat[1]) != os.getsid(0)
            assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1] == FAKE_EXTRACT.encode()
        # A second apply while it runs does not start another one.
        rc, rep, _ = reconcile_json(tmp_path, "apply", str(state))
        if resource(rep)["status"] == "converging":
            assert resource(rep)["actions"] == []
            assert "running" in resource(rep)["message"]
        seen = []

        def finished():
            rc, rep, _ = reconcile_json(tmp_path, "diff", str(state))
            seen.append(resource(rep)["observed"]["counted"])
            return rc == 0

        wait_for(finished, 60, "the command to finish")
        assert seen[-1] == 30 and seen == sorted(seen)
        log = Path(info["log"]).read_text()
        assert "wrote 5" in log and "finished: wrote 24" in log
    finally:
        _kill_started(tmp_path)


def test_needs_not_ok_holds_start_back(tmp_path):
    out = tmp_path / "hs"
    write_samples(out, range(3))
    argv = [sys.executable, FAKE_EXTRACT, "--out", str(out), "--total", "10", "--group-size", "10"]
    # The need: another extraction that is short and cannot be resumed (blocked).
    state = state_yaml(tmp_path / "s.yaml",
                       {"dir": str(out), "total": 10, "job": {"command": argv}, "needs": ["extraction:base"]},
                       extra={"base": {"dir": str(tmp_path / "base"), "total": 5}})
    try:
        rc, rep, _ = reconcile_json(tmp_path, "diff", str(state))
        assert [a["action"] for a in resource(rep)["actions"]] == ["start"]  # diff lists it as planned
        rc, rep, _ = reconcile_json(tmp_path, "apply", str(state))
        r = resource(rep)
        assert rc == 2 and r["status"] == "blocked"
        assert [(a["action"], a["result"]) for a in r["actions"]] == [("start", "skipped")]
        assert "extraction:base is blocked" in r["message"]
        assert not (tmp_path / "state" / "extractions" / "eagle3.pid").exists()
        assert sorted(p.name for p in (out / "rows_0-10").iterdir()) == [f"data_{i}.ckpt" for i in range(3)]
    finally:
        _kill_started(tmp_path)


# --- in the namespaced systemd ---------------------------------------------------------

def _unit_text(out: Path, log: Path, flag: Path) -> str:
    return (
        "[Unit]\nDescription=fake EAGLE-3 hidden-state extraction\n"
        "[Service]\nType=exec\n"
        f"ExecStart={sys.executable} {FAKE_EXTRACT} --out {out} --total 60 --rate 10 --group-size 20 "
        f"--pause-at 7 --pause-flag {flag}\n"
        f"StandardOutput=append:{log}\n"
    )


def _interrupted_job(nsystemd, tmp_path: Path) -> tuple[Path, Path]:
    """Run the unit until it hangs in the middle of writing sample 7, then SIGKILL it."""
    out, log, flag = tmp_path / "hs", tmp_path / "job.log", tmp_path / "pause.flag"
    flag.write_text("")
    nsystemd.write_unit(UNIT, _unit_text(out, log, flag))
    nsystemd.systemctl("start", UNIT, check=True)
    wait_for(lambda: log.exists() and "paused at 7" in log.read_text(), 30, "the job to pause mid-write")
    nsystemd.systemctl("kill", "--signal=SIGKILL", UNIT, check=True)
    wait_for(lambda: nsystemd.show(UNIT, "ActiveState") in ("failed", "inactive"), 10, "the unit to die")
    half = out / "rows_0-20" / "data_7.ckpt"
    with pytest.raises(zipfile.BadZipFile):
        zipfile.ZipFile(half)  # what torch.load would trip over
    return out, half


def test_needs_unit_not_ok_holds_start_back(nsystemd, tmp_path):
    out, half = _interrupted_job(nsystemd, tmp_path)
    state = state_yaml(tmp_path / "s.yaml",
                       {"dir": str(out), "total": 60, "job": {"unit": UNIT},
                        "needs": ["unit:gpu-free.service"]},
                       units={"gpu-free.service": {"active": True}})  # declared, cannot be started
    rc, rep, _ = reconcile_json(tmp_path, "apply", str(state), runner=nsystemd)
    r = resource(rep)
    assert rc == 2 and r["status"] == "blocked", rep
    assert {a["action"]: a["result"] for a in r["actions"]} == {"quarantine": "skipped", "start": "skipped"}
    assert nsystemd.show(UNIT, "ActiveState") in ("failed", "inactive")
    assert half.exists()


def test_killed_job_quarantined_resumed_and_finished(nsystemd, tmp_path):
    out, half = _interrupted_job(nsystemd, tmp_path)
    half_bytes = half.read_bytes()
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": 60, "verify": "at-risk",
                                              "job": {"unit": UNIT}})
    rc, rep, _ = reconcile_json(tmp_path, "diff", str(state), runner=nsystemd)
    r = resource(rep)
    assert rc == 2 and r["status"] == "drift"
    assert [d["path"] for d in r["observed"]["damaged"]] == ["rows_0-20/data_7.ckpt"]
    assert [a["action"] for a in r["actions"]] == ["quarantine", "start"]

    rc, rep, err = reconcile_json(tmp_path, "apply", str(state), runner=nsystemd)
    r = resource(rep)
    assert rc == 0 and r["status"] in ("converging", "ok"), (rep, err)
    assert [(a["action"], a["result"]) for a in r["actions"]] == [("quarantine", "done"), ("start", "done")]
    assert nsystemd.show(UNIT, "ActiveState") in ("active", "inactive")
    (qdir,) = (out / ".reconcile-quarantine").iterdir()
    assert (qdir / "rows_0-20" / "data_7.ckpt").read_bytes() == half_bytes
    manifest = json.loads((qdir / "manifest.json").read_text())
    assert manifest["files"][0]["path"] == "rows_0-20/data_7.ckpt"
    assert "central directory" in manifest["files"][0]["reason"]

    progress = []

    def finished():
        rc, rep, _ = reconcile_json(tmp_path, "diff", str(state), runner=nsystemd)
        r = resource(rep)
        progress.append((r["observed"]["counted"], r["status"]))
        return rc == 0

    wait_for(finished, 60, "the extraction to reach 60 samples")
    counts = [c for c, _ in progress]
    assert counts == sorted(counts) and counts[-1] == 60 and progress[-1][1] == "ok"
    # Seen on the way: the job running, short of its target (10 samples/s, ~5 s to go).
    assert any(s == "converging" and c < 60 for c, s in progress), progress
    # The job regenerated the quarantined sample, whole this time.
    assert zipfile.ZipFile(half).testzip() is None
    assert nsystemd.show(UNIT, "ActiveState") == "inactive"  # Type=exec job exited 0
    journal = [e for x in (tmp_path / "journal.jsonl").read_text().splitlines()
               if (e := json.loads(x)).get("event") == "result"]
    assert [(e["action"], e["result"]) for e in journal] == [("quarantine", "done"), ("start", "done")]


# --- the check record: directory listings, recent files (in-process, real files) -------

PATTERN = "rows_{group}/data_{index}.ckpt"


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A state directory, and a boot id file standing for /proc/sys/kernel/random/boot_id."""
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(tmp_path / "state"))
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setenv("RECONCILE_BOOT_ID_FILE", str(boot))
    return tmp_path / "state"


def _no_resume_running(out: Path, total: int, **spec) -> dict:
    # A resume command that is not running: an incomplete file is damaged whatever its age.
    return {"dir": str(out), "total": total, "job": {"command": ["true"]}, **spec}


def test_cached_listing_is_used_until_the_directory_changes(tmp_path, state):
    out = tmp_path / "hs"
    write_samples(out, range(20))
    for d in ("rows_0-10", "rows_10-20"):
        age(out / d)
    spec = {"dir": str(out), "total": 20}
    assert observe(spec).done == 20
    dirs = read_record(state)["dirs"]
    assert {k: v["r"] for k, v in dirs.items()} == {"rows_0-10/": [[0, 9]], "rows_10-20/": [[10, 19]]}
    again = list_tree(str(out), PATTERN, dirs)
    assert (again.listed, again.reused) == (0, 2)
    # Make the kept listing lie: data_3.ckpt is still on disk, but the observation follows
    # the cached listing, so the directory was not listed again.
    rec = read_record(state)
    rec["dirs"]["rows_0-10/"]["r"] = [[0, 2], [4, 9]]
    record_path(state).write_text(json.dumps(rec))
    obs = observe(spec)
    assert obs.done == 19 and obs.missing_ranges == ((3, 3),)
    # Any entry created in the directory changes its mtime: listed again, the truth is back.
    (out / "rows_0-10" / "notes.txt").write_text("x")
    obs = observe(spec)
    assert obs.done == 20 and obs.missing_ranges == ()


def test_files_added_and_removed_in_cached_directories(tmp_path, state):
    out = tmp_path / "hs"
    write_samples(out, range(25))
    for d in ("rows_0-10", "rows_10-20", "rows_20-30"):
        age(out / d)
    spec = {"dir": str(out), "total": 30}
    obs = observe(spec)
    assert obs.done == 25 and obs.missing_ranges == ((25, 29),)
    assert set(read_record(state)["dirs"]) == {"rows_0-10/", "rows_10-20/", "rows_20-30/"}
    write_sample(out, 25)
    (out / "rows_0-10" / "data_5.ckpt").unlink()
    obs = observe(spec)
    assert obs.done == 25 and obs.files == 25
    assert obs.missing_ranges == ((5, 5), (26, 29))


def test_listing_made_within_the_racy_window_is_not_trusted(tmp_path, state):
    out = tmp_path / "hs"
    write_samples(out, range(10), group=20)
    d = out / "rows_0-20"
    spec = {"dir": str(out), "total": 12}
    os.utime(d)  # modified "now", right before the listing
    assert observe(spec).done == 10
    assert "rows_0-20/" not in read_record(state)["dirs"]  # too young to be kept
    before = os.stat(d)
    # A file added within the same timestamp tick leaves the directory's mtime as it was.
    write_sample(out, 10, group=20)
    os.utime(d, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(d).st_mtime_ns == before.st_mtime_ns
    listing = list_tree(str(out), PATTERN, read_record(state)["dirs"])
    assert (listing.listed, listing.reused) == (1, 0)
    assert listing.paths(10) == ["rows_0-20/data_10.ckpt"]
    assert observe(spec).done == 11
    # Once the mtime is safely in the past, the listing is kept.
    age(d)
    observe(spec)
    assert read_record(state)["dirs"]["rows_0-20/"]["r"] == [[0, 10]]


def test_unchanged_tree_does_not_rewrite_the_record(tmp_path, state):
    out = tmp_path / "hs"
    write_samples(out, range(10))
    age(out / "rows_0-10")
    spec = {"dir": str(out), "total": 10}
    observe(spec)
    first = os.stat(record_path(state))
    for _ in range(2):
        obs = observe(spec)
        assert obs.done == 10 and obs.checked == 0
        now = os.stat(record_path(state))
        assert (now.st_ino, now.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    write_sample(out, 3, fmt="ckpt.gz")
    obs = observe(spec)
    assert obs.files == 11 and obs.checked == 2  # both files of index 3: the new one and its twin
    assert os.stat(record_path(state)).st_ino != first.st_ino


def test_truncated_recent_file_found_when_its_stat_changes(tmp_path, state):
    out = tmp_path / "hs"
    write_samples(out, range(10))
    spec = _no_resume_running(out, 10)
    assert observe(spec).checked == 10  # no record yet: every file once
    obs = observe(spec)
    assert obs.checked == 0 and obs.damaged == ()  # same boot, same stat: not read again
    assert {f[0] for f in read_record(state)["recent"]} == {f"rows_0-10/data_{i}.ckpt" for i in range(10)}
    path = out / "rows_0-10" / "data_9.ckpt"
    st = os.stat(path)
    full = path.read_bytes()
    with open(path, "r+b") as fh:  # cut off in place: same inode, same mtime, new size and ctime
        fh.truncate(len(full) // 2)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    obs = observe(spec)
    assert obs.checked == 1
    assert [(d.path, d.size) for d in obs.damaged] == [("rows_0-10/data_9.ckpt", len(full) // 2)]
    assert obs.done == 9


def test_recent_files_reread_after_the_boot_id_changes(tmp_path):
    out = tmp_path / "hs"
    write_samples(out, range(20))
    for i in range(10, 20):  # written a day before the rest: not recent
        os.utime(out / "rows_10-20" / f"data_{i}.ckpt", (time.time() - 86400, time.time() - 86400))
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    env = {"RECONCILE_BOOT_ID_FILE": str(boot)}
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": 20})

    def checked() -> int:
        rc, rep, err = reconcile_json(tmp_path, "diff", str(state), **env)
        assert rc == 0 and resource(rep)["status"] == "ok", (rep, err)
        return resource(rep)["observed"]["checked"]

    assert checked() == 20
    assert checked() == 0
    boot.write_text("boot-2\n")  # a reboot: the page cache that served the last reads is gone
    assert checked() == 10  # the recent files only
    assert checked() == 0


def _names(d: Path, names) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        idx = int(n.split("_")[1].split(".")[0])
        src = write_sample(d.parent / "src", idx, fmt="ckpt.gz" if n.endswith(".gz") else "ckpt")
        (d / n).write_bytes(src.read_bytes())


def test_gz_padded_and_duplicate_names_round_trip_through_the_cache(tmp_path, state):
    out = tmp_path / "hs"
    _names(out / "rows_0-10", ["data_0.ckpt", "data_1.ckpt.gz", "data_2.ckpt", "data_2.ckpt.gz", "data_007.ckpt",
                               "data_3.ckpt", "data_03.ckpt", "data_5.ckpt", "data_12.ckpt"])
    (out / "rows_0-10" / "notes.txt").write_text("x")
    _names(out / "rows_10-20", [f"data_{i}.ckpt.gz" for i in range(10, 15)] + ["data_5.ckpt"])
    for d in ("rows_0-10", "rows_10-20"):
        age(out / d)
    cold = list_tree(str(out), PATTERN)
    dirs = cold.cache
    assert dirs["rows_0-10/"]["r"] == [[0, 0], [2, 3], [5, 5], [12, 12]]
    assert dirs["rows_0-10/"]["z"] == [[1, 2]]
    assert sorted(map(tuple, dirs["rows_0-10/"]["x"])) == [(3, "data_03.ckpt"), (7, "data_007.ckpt")]
    assert dirs["rows_10-20/"] == {**dirs["rows_10-20/"], "r": [[5, 5]], "z": [[10, 14]]}
    warm = list_tree(str(out), PATTERN, json.loads(json.dumps(dirs)))  # as read back from the file
    assert (warm.listed, warm.reused) == (0, 2)
    for i in range(20):
        assert warm.paths(i) == cold.paths(i)
    assert cold.paths(2) == ["rows_0-10/data_2.ckpt", "rows_0-10/data_2.ckpt.gz"]
    assert sorted(cold.paths(5)) == ["rows_0-10/data_5.ckpt", "rows_10-20/data_5.ckpt"]
    assert warm.counts(10) == cold.counts(10) == (9, 6)
    found, extra, stray = scan(str(out), PATTERN, 10)
    assert {i: sorted([p, *extra.get(i, [])]) for i, p in found.items()} == {
        i: sorted(cold.paths(i)) for i in range(10) if cold.paths(i)}
    assert stray == 6
    spec = _no_resume_running(out, 10)
    first = observe(spec)  # lists, checks every file
    assert first.files == 9 and first.out_of_range == 6 and first.done == 6 and first.checked == 9
    again = observe(spec)  # from the cache
    assert again.files == 9 and again.out_of_range == 6 and again.done == 6 and again.checked == 0
    assert again.missing_ranges == ((4, 4), (6, 6), (8, 9))


@pytest.fixture
def big_dir(tmp_path):
    """A directory for 200,000 files: on tmpfs where there is one (creating them on a disk takes
    seconds to a minute depending on its load), removed afterwards."""
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(prefix="reconcile-test-", dir=shm)) if os.access(shm, os.W_OK) else tmp_path
    yield base
    if base != tmp_path:
        shutil.rmtree(base)


def test_large_tree_same_observation_from_cache_as_from_a_cold_listing(big_dir, state):
    out = big_dir / "hs"
    total, group = 200_000, 2000
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
    dirs = []
    for g in range(0, total, group):
        d = out / f"rows_{g}-{g + group}"
        d.mkdir(parents=True)
        dirs.append(d)
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = [f"data_{i}.ckpt" for i in range(g, g + group) if not 51_000 <= i < 51_700]
            if g == 100_000:
                names += ["data_100001.ckpt.gz", "data_0100002.ckpt", "data_250000.ckpt", "notes.txt"]
            if g == 150_000:
                names += ["data_1.ckpt"]  # an index also in another directory
            for n in names:
                os.close(os.open(n, flags, 0o644, dir_fd=dfd))
        finally:
            os.close(dfd)
    for d in dirs[:-1]:  # the last one stays young: listed every time
        age(d)
    spec = {"dir": str(out), "total": total, "verify": "none", "allow_missing": [51_000, 7]}
    first = observe(spec)
    assert first.done == total - 700 and first.files == total - 700 + 3 and first.out_of_range == 1
    assert first.missing == 699 and first.missing_ranges == ((51_001, 51_699),)
    assert len(read_record(state)["dirs"]) == len(dirs) - 1
    from_cache = observe(spec)
    listing = list_tree(str(out), PATTERN, read_record(state)["dirs"])
    assert (listing.listed, listing.reused) == (1, len(dirs) - 1)
    rec = read_record(state)
    rec["dirs"] = {}
    record_path(state).write_text(json.dumps(rec))
    cold = observe(spec)
    assert cold == from_cache
    found, extra, stray = scan(str(out), PATTERN, total)
    assert (len(found), len(found) + sum(map(len, extra.values())), stray) == (cold.done, cold.files, 1)


def test_check_record_of_the_earlier_format_or_damaged_is_not_fatal(tmp_path, state):
    out = tmp_path / "hs"
    write_samples(out, range(10))
    age(out / "rows_0-10")
    spec = _no_resume_running(out, 10)
    path = record_path(state)
    path.parent.mkdir(parents=True)
    newest = os.stat(out / "rows_0-10" / "data_9.ckpt").st_mtime
    # Formats 1 to 3 were written by earlier rules (before torch.save archives were read as
    # torch.load reads them, before safetensors zero tails were judged): every file is checked
    # once more by the current rules, then kept.
    path.write_text(json.dumps({"dir": str(out), "pattern": PATTERN, "verified": [[0, 9]], "seen": [[0, 9]],
                                "recent": {"9": newest}, "newest": newest, "checked_at": 1.0}))
    obs = observe(spec)
    assert obs.done == 10 and obs.checked == 10
    rec = read_record(state)
    assert rec["format"] == STATE_FORMAT and rec["verified"] == [[0, 9]] and "rows_0-10/" in rec["dirs"]
    assert observe(spec).checked == 0
    for earlier in range(2, STATE_FORMAT):
        path.write_text(json.dumps({**rec, "format": earlier}))
        assert observe(spec).checked == 10
        assert observe(spec).checked == 0
    good = read_record(state)
    for damaged in ({**good, "verified": "0-9"}, {**good, "recent": [["x"]]}, {**good, "dirs": []},
                    {**good, "dirs": {"rows_0-10/": {**good["dirs"]["rows_0-10/"], "r": [[5, 2]]}}},
                    {**good, "dirs": {"rows_0-10/": {**good["dirs"]["rows_0-10/"], "x": [[1]]}}}):
        path.write_text(json.dumps(damaged))
        obs = observe(spec)
        assert obs.done == 10 and obs.damaged == () and obs.missing == 0
    path.write_text("{not json")
    assert observe(spec).done == 10


def test_long_first_check_making_progress_is_not_cut_short(tmp_path):
    """`observe_timeout` bounds a stretch without progress, not the observation: a first check of
    every file that takes several times the timeout still finishes (heartbeats move the deadline).

    The test is meaningful only if the check outlasts the timeout several times over. How long a
    check of N files takes is the machine's business, so the test controls the work instead of
    trusting a clock: it doubles the tree until the check has outlasted 3 x the timeout (a slow
    machine gets there sooner, which only makes the test stronger), and every round must end
    ok with every file checked."""
    out = tmp_path / "hs"
    # Well above the heartbeats' pace (20 a second at most), so that a busy machine that keeps
    # the child off a CPU for a moment does not read as "no progress": 1 s was not, on a 2-core
    # machine at load 10, nor 2 s at load 20 (a stall of seconds is then the scheduler's, not the
    # check's).
    timeout = 5.0
    n, written = 30_000, 0
    for _ in range(6):  # up to 960,000 files: far more than any machine checks in 15 s
        write_samples(out, range(written, n), group=1000)
        written = n
        state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": n, "verify": "content",
                                                 "observe_timeout": timeout})
        t0 = time.monotonic()
        rc, report, err = reconcile_json(tmp_path, "diff", str(state), timeout=600)
        took = time.monotonic() - t0
        res = resource(report)
        assert rc == 0 and res["status"] == "ok", (n, res, err)
        assert res["observed"]["checked"] == n and res["observed"]["done"] == n
        if took > 3 * timeout:
            return
        n *= 2
    pytest.fail(f"a check of {n // 2:,} files took only {took:.2f}s: this machine outran the test")
