"""The CLI as a user runs it: real files, a real detached job, a real systemd unit.

The systemd tests run the fake extraction (tests/fake_extract.py) as a unit of the
namespaced systemd, SIGKILL it while a file is half written, and check that reconcile
quarantines that file, starts the unit, and reports progress until the job is done.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import zipfile
from pathlib import Path

import pytest
from cli_support import wait_for
from extraction_support import FAKE_EXTRACT, cli, resource, state_yaml, write_sample, write_samples

UNIT = "eagle3-extract.service"


def _old(path: Path) -> None:
    """Make a file look written long ago (not "being written")."""
    os.utime(path, (time.time() - 3600, time.time() - 3600))


# --- without root ----------------------------------------------------------------------

def test_allow_missing_and_done_is_ok(tmp_path):
    out = tmp_path / "hs"
    write_samples(out, [i for i in range(30) if i not in (17, 23)])
    spec = {"dir": str(out), "total": 30, "allow_missing": [17]}
    rc, rep, _ = cli(tmp_path, "diff", str(state_yaml(tmp_path / "s.yaml", spec)))
    r = resource(rep)
    assert rc == 2 and r["status"] == "blocked"  # no resume declared
    assert r["drift"] == [{"field": "done", "want": ">= 30", "have": 29}]
    assert r["observed"]["missing_ranges"] == [[23, 23]]
    write_sample(out, 23)
    rc, rep, _ = cli(tmp_path, "diff", str(tmp_path / "s.yaml"))
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
    spec = {"dir": str(out), "total": 10, "min_done": 8, "verify": "recent"}
    state = state_yaml(tmp_path / "s.yaml", spec)
    rc, rep, _ = cli(tmp_path, "diff", str(state))
    r = resource(rep)
    # Under `recent` a .gz is not decompressed: only the zero-byte file is damaged.
    assert [d["path"] for d in r["observed"]["damaged"]] == ["rows_0-10/data_3.ckpt"]
    assert r["observed"]["unverified_gz"] == 1
    state_yaml(state, {**spec, "verify": "all"})
    rc, rep, _ = cli(tmp_path, "apply", str(state))
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
    journal = [json.loads(x) for x in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert [e["action"] for e in journal] == ["quarantine"]

    # Safetensors: a file one byte short is damaged.
    st_out = tmp_path / "st"
    write_samples(st_out, range(4), fmt="safetensors")
    full = (st_out / "rows_0-10" / "data_2.safetensors").read_bytes()
    cut = write_sample(st_out, 2, fmt="safetensors", cut=len(full) - 1)
    _old(cut)
    st_state = state_yaml(tmp_path / "st.yaml", {"dir": str(st_out), "total": 4,
                                                  "pattern": "rows_{group}/data_{index}.safetensors"})
    rc, rep, _ = cli(tmp_path, "diff", str(st_state))
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
                                              "resume": {"command": argv, "cwd": str(tmp_path)}})
    try:
        rc, rep, err = cli(tmp_path, "apply", str(state))
        r = resource(rep)
        assert rc == 0 and r["status"] in ("converging", "ok"), (rep, err)
        assert [(a["action"], a["result"]) for a in r["actions"]] == [("start", "done")]
        info = json.loads((tmp_path / "state" / "extractions" / "eagle3.pid").read_text())
        pid = info["pid"]
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if stat[0] != "Z":
            assert int(stat[3]) == pid  # its own session: setsid, detached from reconcile
            assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1] == FAKE_EXTRACT.encode()
        # A second apply while it runs does not start another one.
        rc, rep, _ = cli(tmp_path, "apply", str(state))
        if resource(rep)["status"] == "converging":
            assert resource(rep)["actions"] == []
            assert "running" in resource(rep)["message"]
        seen = []

        def finished():
            rc, rep, _ = cli(tmp_path, "diff", str(state))
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
                       {"dir": str(out), "total": 10, "resume": {"command": argv}, "needs": ["extraction:base"]},
                       extra={"base": {"dir": str(tmp_path / "base"), "total": 5}})
    try:
        rc, rep, _ = cli(tmp_path, "diff", str(state))
        assert [a["action"] for a in resource(rep)["actions"]] == ["start"]  # diff lists it as planned
        rc, rep, _ = cli(tmp_path, "apply", str(state))
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
                       {"dir": str(out), "total": 60, "resume": {"unit": UNIT},
                        "needs": ["unit:gpu-free.service"]},
                       units={"gpu-free.service": {"active": True}})  # declared, cannot be started
    rc, rep, _ = cli(tmp_path, "apply", str(state), runner=nsystemd)
    r = resource(rep)
    assert rc == 2 and r["status"] == "blocked", rep
    assert {a["action"]: a["result"] for a in r["actions"]} == {"quarantine": "skipped", "start": "skipped"}
    assert nsystemd.show(UNIT, "ActiveState") in ("failed", "inactive")
    assert half.exists()


def test_killed_job_quarantined_resumed_and_finished(nsystemd, tmp_path):
    out, half = _interrupted_job(nsystemd, tmp_path)
    half_bytes = half.read_bytes()
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": 60, "verify": "recent",
                                              "resume": {"unit": UNIT}})
    rc, rep, _ = cli(tmp_path, "diff", str(state), runner=nsystemd)
    r = resource(rep)
    assert rc == 2 and r["status"] == "drift"
    assert [d["path"] for d in r["observed"]["damaged"]] == ["rows_0-20/data_7.ckpt"]
    assert [a["action"] for a in r["actions"]] == ["quarantine", "start"]

    rc, rep, err = cli(tmp_path, "apply", str(state), runner=nsystemd)
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
        rc, rep, _ = cli(tmp_path, "diff", str(state), runner=nsystemd)
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
    journal = [json.loads(x) for x in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert [(e["action"], e["result"]) for e in journal] == [("quarantine", "done"), ("start", "done")]
