"""The integrity check inside an observation, on real files: which files the recent rule reads
whole, a file that breaks a parser, files that cannot be read, and what the text report says
about what was not proven. (The verdicts themselves are held against torch.load in
tests/test_extractions_torch.py.)"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
from cli_support import reconcile_json
from extraction_support import observe, resource, state_yaml, write_sample, write_samples


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(tmp_path / "state"))
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setenv("RECONCILE_BOOT_ID_FILE", str(boot))
    return boot


def _zero_a_page(path: Path) -> None:
    """A page of the tensor data reads back as zeros, the size kept (a crash's delayed allocation)."""
    data = bytearray(path.read_bytes())
    info = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo(f"{path.name.split('.')[0]}/data/0")
    page = (info.header_offset + 4096 * 2) // 4096 * 4096
    data[page:page + 4096] = bytes(4096)
    path.write_bytes(bytes(data))


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_recent_rule_reads_whole_the_files_a_crash_can_have_damaged(tmp_path, state):
    out = tmp_path / "hs"
    write_samples(out, range(30), size=20000)
    for i in range(30):  # 0-19 written a day ago; 20-29 in the last minutes, up to the crash
        _age(out / f"rows_{i // 10 * 10}-{i // 10 * 10 + 10}" / f"data_{i}.ckpt", 86400 if i < 20 else 30 - i)
    old, recent = out / "rows_0-10" / "data_5.ckpt", out / "rows_20-30" / "data_25.ckpt"
    for p in (old, recent):
        st = p.stat()
        _zero_a_page(p)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    spec = {"dir": str(out), "total": 30, "job": {"command": ["true"]}}

    # First check: every file's structure, and the recent ones read whole (CRC-32s).
    obs = observe(spec)
    assert (obs.checked, obs.content_checked) == (30, 10)
    assert [d.path for d in obs.damaged] == ["rows_20-30/data_25.ckpt"] and "CRC-32" in obs.damaged[0].reason
    # Same boot, nothing changed: nothing read; the damaged one is checked again (not verified).
    obs = observe(spec)
    assert (obs.checked, obs.content_checked) == (1, 1) and len(obs.damaged) == 1
    write_sample(out, 25, size=20000)  # the job regenerated it
    assert observe(spec).damaged == ()
    # After a reboot the recent files are read whole again: the page cache that served the
    # last reads is gone.
    state.write_text("boot-2\n")
    obs = observe(spec)
    assert (obs.checked, obs.content_checked) == (10, 10) and obs.damaged == ()
    # A file written long before the crash had its pages on disk: `recent` trusts its last
    # check; `all` reads every file whole every time.
    obs = observe({**spec, "verify": "content"})
    assert (obs.checked, obs.content_checked) == (30, 30)
    assert [d.path for d in obs.damaged] == ["rows_0-10/data_5.ckpt"]


def test_a_file_that_breaks_a_zip_reader_is_one_damaged_file(tmp_path):
    """zipfile raised NotImplementedError on this file, which made the whole extraction an error."""
    out = tmp_path / "hs"
    write_samples(out, range(20))
    bad = out / "rows_10-20" / "data_12.ckpt"
    data = bytearray(bad.read_bytes())
    data[zipfile.ZipFile(bad).start_dir + 10] = 99  # the central directory's method of data.pkl
    bad.write_bytes(bytes(data))
    _age(bad, 3600)
    with pytest.raises(NotImplementedError):
        zipfile.ZipFile(bad).read("data_12/data.pkl")
    for verify in ("at-risk", "content"):
        state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": 20, "verify": verify})
        rc, rep, err = reconcile_json(tmp_path, "diff", str(state))
        r = resource(rep)
        assert rc == 2 and r["status"] == "blocked", (rep, err)  # no job declared
        assert r["observed"]["done"] == 19
        assert [(d["path"], "method 99" in d["reason"]) for d in r["observed"]["damaged"]] == [
            ("rows_10-20/data_12.ckpt", True)]


def _world_readable_tmp() -> Path:
    d = Path(tempfile.mkdtemp(prefix="reconcile-i17-"))
    d.chmod(0o755)
    return d


def test_unreadable_file_is_reported_neither_done_nor_moved(tmp_path):
    """EACCES for real: reconcile run as an unprivileged user on a file it may not read."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run reconcile as another user")
    base = _world_readable_tmp()
    try:
        out = base / "hs"
        write_samples(out, range(10))
        locked = out / "rows_0-10" / "data_4.ckpt"
        locked.chmod(0)
        for p in [out, *out.rglob("*")]:
            os.chown(p, 65534, 65534)
        state = state_yaml(base / "s.yaml", {"dir": str(out), "total": 10, "verify": "content"})
        os.chmod(state, 0o644)
        env = {**os.environ, "RECONCILE_STATE_DIR": str(out / ".state"), "RECONCILE_CACHE_DIR": str(out / ".cache")}
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "reconcile_host"]
        probe = subprocess.run(argv[:4] + ["cat", str(locked)], capture_output=True, text=True)
        if probe.returncode == 0:
            pytest.skip("an unprivileged user can read a mode-000 file here [ci-ok]")
        for command in (["diff"], ["apply", "--journal", str(out / "journal.jsonl")]):
            proc = subprocess.run([*argv, *command, str(state)], capture_output=True, text=True, env=env,
                                  timeout=120, cwd=base)
            assert "Traceback" not in proc.stderr, proc.stderr
            assert proc.returncode == 2, (proc.stdout, proc.stderr)
            assert "unreadable: 1 -> 0" in proc.stdout and "done:       9 -> >= 10" in proc.stdout, proc.stdout
            assert ("1 file cannot be read (rows_0-10/data_4.ckpt: unreadable: Permission denied (EACCES)): "
                    "not counted done and not moved") in proc.stdout, proc.stdout
            assert locked.exists() and not (out / ".reconcile-quarantine").exists()
    finally:
        shutil.rmtree(base)


def test_gz_not_decompressed_is_said_in_the_text_report(tmp_path):
    out = tmp_path / "hs"
    write_samples(out, range(12), fmt="ckpt.gz")
    for i in range(11):  # all but the newest written long before it: outside the recent window
        _age(out / f"rows_{i // 10 * 10}-{i // 10 * 10 + 10}" / f"data_{i}.ckpt.gz", 3600)
    spec = {"dir": str(out), "total": 12}
    state = state_yaml(tmp_path / "s.yaml", spec)

    def text(*extra: str) -> str:
        argv = [sys.executable, "-m", "reconcile_host", "diff", str(state), *extra]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={**os.environ, "RECONCILE_STATE_DIR": str(tmp_path / "state"),
                                   "RECONCILE_CACHE_DIR": str(tmp_path / "cache")})
        assert proc.returncode in (0, 2), proc.stderr
        return proc.stdout

    for _ in range(2):  # said every time, not only when they were looked at
        report = text()
        assert "✓ extraction:eagle3  ok" in report
        assert "note: 11 .gz samples not decompressed" in report, report
    rc, rep, _ = reconcile_json(tmp_path, "diff", str(state))
    assert resource(rep)["caveats"] and resource(rep)["observed"]["unverified_gz"] == 11
    state_yaml(state, {**spec, "verify": "content"})
    assert "not decompressed" not in text()


def test_eio_while_reading_is_unreadable_not_damaged(tmp_path):
    """EIO for real: the leaf directory is a FUSE filesystem (tests/fuse_eio.py) whose
    data_4.ckpt opens and stats fine but answers every read with EIO, as a bad sector would."""
    import json

    import mounts_support as ms

    why = ms.namespaces_missing() or ms.fuse_missing()
    if why:
        pytest.skip(why)
    src = tmp_path / "src"
    write_samples(src, range(10))
    out = tmp_path / "hs"
    (out / "rows_0-10").mkdir(parents=True)
    pairs = " ".join(f"data_{i}.ckpt={src / 'rows_0-10' / f'data_{i}.ckpt'}" for i in range(10))
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": 10, "verify": "content"})
    env = {**os.environ, "RECONCILE_STATE_DIR": str(tmp_path / "state"), "RECONCILE_CACHE_DIR": str(tmp_path / "c")}
    py, fuse = sys.executable, Path(__file__).with_name("fuse_eio.py")
    proc = ms.in_namespace(f"""
        {py} {fuse} {out / 'rows_0-10'} {tmp_path / 'ready'} data_4.ckpt {pairs} &
        server=$!
        for i in $(seq 200); do [ -e {tmp_path / 'ready'} ] && break; sleep 0.05; done
        cat {out / 'rows_0-10' / 'data_3.ckpt'} > /dev/null
        ! cat {out / 'rows_0-10' / 'data_4.ckpt'} > /dev/null 2> {tmp_path / 'cat.err'}
        {py} -m reconcile_host diff {state} --format json > {tmp_path / 'diff.json'} || true
        {py} -m reconcile_host apply {state} --format json --journal {tmp_path / 'j'} \
            > {tmp_path / 'apply.json'} || true
        ls {out / 'rows_0-10'} > {tmp_path / 'after.txt'}
        kill $server
    """, env)
    assert proc.returncode == 0, proc.stderr
    assert "Input/output error" in (tmp_path / "cat.err").read_text()  # the kernel's own word
    for name in ("diff.json", "apply.json"):
        r = resource(json.loads((tmp_path / name).read_text()))
        assert r["status"] == "blocked", r
        assert r["observed"]["done"] == 9 and r["observed"]["damaged"] == []
        assert [(u["path"], u["reason"]) for u in r["observed"]["unreadable"]] == [
            ("rows_0-10/data_4.ckpt", "unreadable: Input/output error (EIO)")]
        assert {"field": "unreadable", "want": 0, "have": 1} in r["drift"]
    assert "data_4.ckpt" in (tmp_path / "after.txt").read_text() and not (out / ".reconcile-quarantine").exists()


def _pickle_at(data: bytes) -> int:
    """Where data.pkl's bytes start in a ZIP made by zipfile (tests/fake_extract.py)."""
    info = next(i for i in zipfile.ZipFile(io.BytesIO(data)).infolist() if i.filename.endswith("/data.pkl"))
    n_name, n_extra = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    return info.header_offset + 30 + n_name + n_extra


def _without_crcs(data: bytes) -> bytes:
    """The archive as torch.save writes it with CRCs off (set_crc32_options(False)): every CRC 0,
    in the local headers and the central directory."""
    out = bytearray(data)
    for info in zipfile.ZipFile(io.BytesIO(data)).infolist():
        out[info.header_offset + 14:info.header_offset + 18] = bytes(4)
    cd = data.find(b"PK\x01\x02")
    while cd >= 0:
        out[cd + 16:cd + 20] = bytes(4)
        cd = data.find(b"PK\x01\x02", cd + 46)
    return bytes(out)


def test_at_risk_proves_recent_files_by_their_crcs_and_walks_the_pickle_without_them(tmp_path, state, monkeypatch):
    """verify: at-risk reads the recent files whole for what a crash tore: where the archive has
    CRCs, every entry's CRC shows a changed byte of data.pkl (the pickle is not walked); where it
    has none, the pickle walk still runs and sees what it can."""
    from reconcile_host.common.filechecks import torchzip
    from reconcile_host.common.filechecks.integrity import CONTENT, check_path

    out = tmp_path / "hs"
    write_samples(out, range(4), size=2000)
    crc, plain = out / "rows_0-10" / "data_2.ckpt", out / "rows_0-10" / "data_3.ckpt"
    plain.write_bytes(_without_crcs(plain.read_bytes()))
    for p in (crc, plain):  # an opcode no pickle has, where data.pkl starts
        data = bytearray(p.read_bytes())
        data[_pickle_at(bytes(data))] = 0xFF
        p.write_bytes(bytes(data))
    obs = observe({"dir": str(out), "total": 4, "job": {"command": ["true"]}})  # (a job not running)
    assert (obs.checked, obs.content_checked, obs.no_crc) == (4, 4, 0)
    reasons = {d.path: d.reason for d in obs.damaged}
    assert sorted(reasons) == ["rows_0-10/data_2.ckpt", "rows_0-10/data_3.ckpt"], reasons
    assert "data.pkl: CRC-32" in reasons["rows_0-10/data_2.ckpt"], reasons
    assert "CRC" not in reasons["rows_0-10/data_3.ckpt"] and "opcode" in reasons["rows_0-10/data_3.ckpt"], reasons

    walked = []
    real = torchzip.read_pickle
    monkeypatch.setattr(torchzip, "read_pickle", lambda raw: walked.append(1) or real(raw))
    whole = out / "rows_0-10" / "data_1.ckpt"
    assert check_path(str(whole), CONTENT, walk=False).whole and walked == []  # the CRCs prove it
    assert check_path(str(whole), CONTENT).whole and walked == [1]  # verify: content walks it anyway
    plain.write_bytes(_without_crcs(whole.read_bytes()))
    v = check_path(str(plain), CONTENT, walk=False)
    assert v.whole and v.no_crc and walked == [1, 1]  # no CRC: the pickle walked
    # A storage renamed in the central directory, which no CRC covers: torch would not find the
    # storage data.pkl names. Storages not named data/0..n-1 as torch.save names them get the walk.
    data = bytearray(whole.read_bytes())
    at = data.find(b"/data/0", data.find(b"PK\x01\x02"))
    data[at + 6:at + 7] = b"4"
    plain.write_bytes(bytes(data))
    v = check_path(str(plain), CONTENT, walk=False)
    assert not v.whole and "named in data.pkl is not in the archive" in v.reason and walked == [1, 1, 1], v
