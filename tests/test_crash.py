"""kill -9 at any moment of `apply`, and two applies at once, on the namespaced systemd.

Crash trials (seeded, RECONCILE_CRASH_SEED): an apply of a state with five units (eight actions)
is killed with SIGKILL — the whole process group, so a systemctl it is running dies too — at a
point reached in its work, observed through its lock file and its journal (after its Nth line),
never after a sleep. After each kill:
  - the journal parses line by line (a torn line is skipped with a warning, never a crash);
  - every unit change systemd shows is recorded in the journal, at least as an intent;
  - no lock is left that blocks the next run (it runs with --lock-timeout 0);
  - the next apply converges (exit 0) and diff then exits 0.
Some trials also append a torn line to the journal (a crash in the middle of a write).

Concurrency trials: two applies are started together; the one that gets the lock blocks in a
unit's ExecStop until the test writes into a FIFO, so the other meets the lock held, for sure.
Exactly one acts; the other is refused naming the holder's PID (as the holder's journal lines
give it), or waits (--lock-timeout) and then finds nothing to do.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
from cli_support import cli_env, reconcile_argv, service
from reconcile_host.pipeline.journal import Journal

SEED = int(os.environ.get("RECONCILE_CRASH_SEED", "13"))
CRASH_TRIALS = 50
CONCURRENT_TRIALS = 20

STOP = ("k-a.service", "k-b.service", "k-c.service")   # active+enabled, declared stopped+disabled
START = ("k-d.service", "k-e.service")                  # stopped+disabled, declared running+enabled
UNITS = STOP + START
STATE = "version: 1\nunits:\n" + "".join(
    f"  {u}:\n    active: false\n    enabled: false\n" for u in STOP) + \
    "  k-d.service:\n    active: true\n    enabled: true\n" \
    "  k-e.service:\n    active: true\n    enabled: true\n    needs: [unit:k-d.service]\n"


def unit_states(nsd) -> dict[str, tuple[str, str]]:
    active = nsd.systemctl("is-active", *UNITS).stdout.split()
    enabled = nsd.systemctl("is-enabled", *UNITS).stdout.split()
    return {u: (a, e) for u, a, e in zip(UNITS, active, enabled, strict=True)}


def settle(nsd, timeout: float = 60) -> None:
    """Until systemd has no job left (one a killed systemctl queued goes on without it)."""
    deadline = time.monotonic() + timeout
    while "No jobs running." not in nsd.systemctl("list-jobs").stdout:
        assert time.monotonic() < deadline, nsd.systemctl("list-jobs").stdout
        time.sleep(0.02)


def lines_of(path) -> int:
    try:
        with open(path, "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.fixture
def crash_units(nsystemd):
    for u in UNITS:
        nsystemd.write_unit(u, service(u))
    yield nsystemd


def reset(nsd) -> dict[str, tuple[str, str]]:
    nsd.systemctl("enable", "--now", *STOP, check=True)
    nsd.systemctl("disable", "--now", *START, check=True)
    settle(nsd)
    before = unit_states(nsd)
    assert before == {**{u: ("active", "enabled") for u in STOP}, **{u: ("inactive", "disabled") for u in START}}
    return before


def run_until(nsd, argv, env, point: tuple[str, int], lock_file, journal):
    """Start argv; SIGKILL its process group once `point` is reached: ("lock", 0) the lock is held,
    ("line", n) the journal has n lines. Returns whether it was killed (False: it ended first)."""
    proc = nsd.popen(argv, env=env, stdout=-3, stderr=-3)
    try:
        while proc.poll() is None:
            if point[0] == "lock":
                reached = lock_file.exists() and lock_file.stat().st_size > 0
            else:
                reached = lines_of(journal) >= point[1]
            if reached:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.002)
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_kill_9_at_random_points_of_apply_then_the_next_run_converges(crash_units, tmp_path, capfd):
    nsd = crash_units
    rng = random.Random(SEED)
    state = tmp_path / "state.yaml"
    state.write_text(STATE)
    env = cli_env(tmp_path)
    outcomes = {"killed": 0, "finished first": 0, "torn line": 0, "changed before the kill": 0}
    for trial in range(CRASH_TRIALS):
        before = reset(nsd)
        journal = tmp_path / f"t{trial}" / "journal.jsonl"
        lock_file = journal.parent / "lock"
        point = ("lock", 0) if rng.random() < 0.1 else ("line", rng.randint(1, 22))
        killed = run_until(nsd, reconcile_argv("apply", str(state), "--journal", str(journal)), env, point,
                           lock_file, journal)
        outcomes["killed" if killed else "finished first"] += 1
        settle(nsd)
        after = unit_states(nsd)
        # Every change systemd shows has the journal's word for it, at least an intent.
        entries = Journal(journal).read()
        assert Journal(journal).read() is not None
        intended = {e["target"] for e in entries if e.get("event") == "intent"}
        changed = {u for u in UNITS if after[u] != before[u]}
        outcomes["changed before the kill"] += bool(changed)
        assert changed <= intended, (trial, point, changed, intended)
        for e in entries:  # each line whole: an intent or result names its action
            assert e["event"] in ("intent", "result", "verified") and e["resource"].startswith("unit:k-"), e
        if rng.random() < 0.2:  # a crash in the middle of writing a line
            with open(journal, "ab") as fh:
                fh.write(b'{"event": "intent", "time": "2026-')
            outcomes["torn line"] += 1
        capfd.readouterr()
        # The next run: no stale lock (no waiting allowed), converges, then diff finds nothing.
        again = nsd.run(reconcile_argv("apply", str(state), "--journal", str(journal), "--lock-timeout", "0s"),
                        env=env)
        assert again.returncode == 0, (trial, point, again.stdout, again.stderr)
        assert "Traceback" not in again.stderr
        assert unit_states(nsd) == {**{u: ("inactive", "disabled") for u in STOP},
                                    **{u: ("active", "enabled") for u in START}}
        j = Journal(journal)
        entries = j.read()
        last = lines_of(journal)
        assert all(n < last for n in j.skipped) and len(j.skipped) <= 1, j.skipped  # only the torn one
        assert all(e["event"] in ("intent", "result", "verified") for e in entries)
        diff = nsd.run(reconcile_argv("diff", str(state)), env=env)
        assert diff.returncode == 0, (trial, diff.stdout, diff.stderr)
    assert outcomes["killed"] >= CRASH_TRIALS * 0.6 and outcomes["changed before the kill"] >= 10, outcomes
    print(f"crash trials: {outcomes}")


def test_torn_last_line_is_skipped_with_a_warning_and_the_next_line_stays_whole(tmp_path, capfd):
    journal = Journal(tmp_path / "journal.jsonl")
    journal({"event": "intent", "resource": "unit:a", "action": "stop", "target": "a"})
    with open(journal.path, "ab") as fh:
        fh.write(b'{"event": "result", "resou')  # killed mid-write
    assert [e["event"] for e in Journal(journal.path).read()] == ["intent"]
    assert "its last line is torn; skipped" in capfd.readouterr().err
    later = Journal(journal.path)  # the next run appends: not glued onto the torn line
    later({"event": "intent", "resource": "unit:b", "action": "stop", "target": "b"})
    assert "its last line is incomplete" in capfd.readouterr().err
    reader = Journal(journal.path)
    assert [e["resource"] for e in reader.read()] == ["unit:a", "unit:b"] and reader.skipped == [2]


SLOW = """[Unit]
Description=stops only when the test says so
[Service]
ExecStart=/bin/sleep infinity
ExecStop=/bin/sh -c 'read x < {fifo}'
TimeoutStopSec=120
"""


def test_two_applies_at_once_exactly_one_acts(nsystemd, tmp_path):
    rng = random.Random(SEED)
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    nsystemd.write_unit("k-slow.service", SLOW.format(fifo=fifo))
    state = tmp_path / "state.yaml"
    state.write_text("version: 1\nunits:\n  k-slow.service:\n    active: false\n")
    env = cli_env(tmp_path)
    seen = {"refused": 0, "waited": 0}
    for trial in range(CONCURRENT_TRIALS):
        nsystemd.systemctl("start", "k-slow.service", check=True)
        journal = tmp_path / f"c{trial}" / "journal.jsonl"
        wait = rng.random() < 0.3
        argv = [reconcile_argv("apply", str(state), "--journal", str(journal),
                               "--lock-timeout", "120s" if wait else "0s") for _ in range(2)]
        procs = [nsystemd.popen(a, env=env, stdout=-1, stderr=-1, text=True) for a in argv]
        try:
            # The holder's intent is on disk before it stops the unit; it then blocks in ExecStop. The
            # other one, not waiting, may be refused before that (the holder takes the lock, then
            # observes): an early end is allowed for it alone, and only as that refusal.
            deadline = time.monotonic() + 60
            ended: tuple | None = None
            while not [e for e in _entries(journal) if e["event"] == "intent"]:
                for p in procs:
                    if ended is None and p.poll() is not None:
                        ended = (p, *p.communicate())
                        assert not wait and p.returncode == 1, _outputs(procs) + " | " + ended[2]
                assert time.monotonic() < deadline, _outputs(procs)
                assert all(p.poll() is None for p in procs if ended is None or p is not ended[0]), _outputs(procs)
                time.sleep(0.005)
            [intent] = [e for e in _entries(journal) if e["event"] == "intent"]
            if not wait:  # the other one is refused while the holder is blocked, naming it
                if ended is None:
                    loser = _first_to_end(procs)
                    out, err = loser.communicate()
                else:
                    loser, out, err = ended
                assert loser.returncode == 1, out + err
                assert err.startswith("reconcile: error: another reconcile apply holds"), err
                assert f"pid {intent['pid']}," in err, (err, intent)
                seen["refused"] += 1
            with open(fifo, "w") as fh:  # let ExecStop end
                fh.write("go\n")
            for p in procs:
                out, err = p.communicate(timeout=120)
                if p.returncode != 1:
                    assert p.returncode == 0, out + err
            if wait:
                assert all(p.returncode == 0 for p in procs), _outputs(procs)
                seen["waited"] += 1
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
        entries = _entries(journal)
        assert len({e["pid"] for e in entries if "pid" in e}) == 1  # exactly one acted
        assert [(e["event"], e["action"]) for e in entries if e["event"] != "verified"] == [
            ("intent", "stop"), ("result", "stop")]
        assert nsystemd.systemctl("is-active", "k-slow.service").stdout.strip() == "inactive"
    assert seen["refused"] and seen["waited"], seen


def _entries(journal) -> list[dict]:
    try:
        return [json.loads(line) for line in journal.read_text().splitlines() if line.endswith("}")]
    except FileNotFoundError:
        return []


def _first_to_end(procs):
    deadline = time.monotonic() + 60
    while True:
        for p in procs:
            if p.poll() is not None:
                return p
        assert time.monotonic() < deadline, "neither apply ended while the holder was blocked"
        time.sleep(0.005)


def _outputs(procs) -> str:
    return " | ".join(f"rc={p.poll()}" for p in procs)


def test_a_full_disk_under_the_journal_refuses_to_act(nsystemd, tmp_path):
    """ENOSPC on the journal (a full tmpfs, mounted in the namespace only): nothing is done without
    a record. (Not a link to /dev/full: reconcile follows no link where it keeps its own files.)"""
    nsystemd.write_unit("k-full.service", service("full"))
    nsystemd.systemctl("start", "k-full.service", check=True)
    state = tmp_path / "state.yaml"
    state.write_text("version: 1\nunits:\n  k-full.service:\n    active: false\n")
    journal = tmp_path / "j" / "journal.jsonl"
    journal.parent.mkdir(mode=0o700)
    nsystemd.run(["mount", "-t", "tmpfs", "-o", "size=4k,mode=0700", "tmpfs", str(journal.parent)], check=True)
    try:
        # Every block taken: the journal's first record cannot be written.
        nsystemd.run(["sh", "-c", 'dd if=/dev/zero of="$1/fill" bs=4096 count=16 2>/dev/null; true', "sh",
                      str(journal.parent)], check=True)
        proc = nsystemd.run(reconcile_argv("apply", str(state), "--journal", str(journal), "--format", "json"),
                            env=cli_env(tmp_path))
    finally:
        nsystemd.run(["umount", str(journal.parent)])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout, proc.stderr
    [res] = json.loads(proc.stdout)["resources"]
    assert res["status"] == "error"
    assert [(a["action"], a["result"]) for a in res["actions"]] == [("stop", "failed")]
    assert "not carried out: the journal cannot be written (No space left on device)" in res["actions"][0]["message"]
    assert nsystemd.systemctl("is-active", "k-full.service").stdout.strip() == "active"  # untouched
