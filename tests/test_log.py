"""`reconcile log`: the journal as a timeline, and its bounded growth.

The journals read back here are written by real `reconcile apply` runs against the namespaced
systemd (tests/nsystemd.py), one of them killed with SIGKILL mid-run as tests/test_crash.py does;
the expected answer is the journal file itself, read line by line at test time. The terminal
behaviour is tried on a real pseudo-terminal and through a real `head` pipe.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

from cli_support import NsCli, cli_env, reconcile_argv, run_cli, service
from reconcile_host.pipeline.journal import MAX_LIST_ITEMS, Journal, Rotation
from reconcile_host.pipeline.journal_read import read_newest_first, rotated_files
from ssh_support import sshd  # noqa: F401  (the fixture)

UNITS = ("lg-a.service", "lg-b.service")
STATE = "version: 1\nunits:\n" + "".join(f"  {u}:\n    active: false\n    enabled: false\n" for u in UNITS)


def file_lines(journal: Path) -> list[dict]:
    """Every line of the journal and its rotated files, oldest first, straight from the files."""
    out = []
    for path in reversed(rotated_files(journal)):
        if path.exists():
            out.extend(json.loads(raw) for raw in path.read_bytes().split(b"\n") if raw.strip())
    return out


def applied(nsd, tmp: Path, **env: str) -> NsCli:
    for u in UNITS:
        nsd.write_unit(u, service(u))
    nsd.systemctl("enable", "--now", *UNITS, check=True)
    cli = NsCli(nsd, tmp)
    proc = cli("apply", str(cli.state(STATE)), **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cli


def log_json(tmp: Path, journal: Path, *args: str) -> dict:
    proc = run_cli(tmp, "log", "--journal", str(journal), "--format", "json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_real_apply_read_back_as_runs_actions_and_observations(nsystemd, tmp_path):
    cli = applied(nsystemd, tmp_path)
    lines = file_lines(cli.journal)
    doc = log_json(tmp_path, cli.journal)
    runs = [e for e in doc["events"] if e["event"] == "run"]
    assert [r["run"] for r in runs] == list(dict.fromkeys(e["run"] for e in lines))
    intents = [e for e in lines if e["event"] == "intent"]
    results = {(e["resource"], e["action"], e["target"]): e for e in lines if e["event"] == "result"}
    actions = runs[0]["actions"]
    assert [(a["resource"], a["action"], a["target"]) for a in actions] == \
        [(e["resource"], e["action"], e["target"]) for e in intents]
    for a in actions:
        assert a["outcome"] == results[(a["resource"], a["action"], a["target"])]["result"] == "done"
    after = {e["resource"]: e["after"] for e in lines if e["event"] == "verified"}
    assert {o["resource"]: o["after"] for o in runs[0]["observed"]} == after
    # What systemd says now is what the journal's last observation says.
    for u in UNITS:
        assert after[f"unit:{u}"]["active_state"] == nsystemd.systemctl("is-active", u).stdout.strip()

    text = run_cli(tmp_path, "log", "--journal", str(cli.journal))
    assert text.returncode == 0 and "\x1b[" not in text.stdout  # a pipe: no colour
    for e in intents:
        assert any(e["description"] in line and "→ done" in line for line in text.stdout.splitlines())
    one = log_json(tmp_path, cli.journal, "--resource", f"unit:{UNITS[0]}")
    assert {a["resource"] for r in one["events"] for a in r["actions"]} == {f"unit:{UNITS[0]}"}
    assert log_json(tmp_path, cli.journal, "--run", "0" * 12)["events"] == []
    assert log_json(tmp_path, cli.journal, "--run", runs[0]["run"][:6])["events"][0]["run"] == runs[0]["run"]
    assert log_json(tmp_path, cli.journal, "--until", "2000-01-01T00:00:00Z")["events"] == []


def test_a_run_killed_mid_action_says_it_may_or_may_not_have_happened(nsystemd, tmp_path):
    for u in UNITS:
        nsystemd.write_unit(u, service(u, "ExecStop=/bin/sleep 30"))  # a stop long enough to be killed in
    nsystemd.systemctl("enable", "--now", *UNITS, check=True)
    journal = tmp_path / "journal.jsonl"
    state = tmp_path / "s.yaml"
    state.write_text(STATE)
    proc = nsystemd.popen(reconcile_argv("apply", str(state), "--journal", str(journal)), env=cli_env(tmp_path),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any(e["event"] == "intent" and e["action"] == "stop" for e in _lines_if_any(journal)):
            assert time.monotonic() < deadline and proc.poll() is None, "the stop's intent never came"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    with open(journal, "ab") as fh:  # and a crash in the middle of writing the next line
        fh.write(b'{"event": "result", "time": "2026-')
    lines = file_lines_but_torn(journal)
    done = {(r["resource"], r["action"], r["target"]) for r in lines if r["event"] == "result"}
    key = ("resource", "action", "target")
    open_intents = [e for e in lines if e["event"] == "intent" and tuple(e[k] for k in key) not in done]
    assert open_intents
    doc = run_cli(tmp_path, "log", "--journal", str(journal), "--format", "json")
    assert doc.returncode == 0 and "its last line is incomplete" in doc.stderr and "Traceback" not in doc.stderr
    unknown = [a for r in json.loads(doc.stdout)["events"] for a in r["actions"] if a["outcome"] == "unknown"]
    assert [(a["resource"], a["action"]) for a in unknown] == [(e["resource"], e["action"]) for e in open_intents]
    text = run_cli(tmp_path, "log", "--journal", str(journal)).stdout
    for e in open_intents:
        assert any(e["description"] in line and "may or may not have happened" in line for line in text.splitlines())


def _lines_if_any(journal: Path) -> list[dict]:
    try:
        return [json.loads(raw) for raw in journal.read_bytes().split(b"\n") if raw.strip()]
    except (FileNotFoundError, ValueError):
        return []


def file_lines_but_torn(journal: Path) -> list[dict]:
    raw = journal.read_bytes()
    return [json.loads(line) for line in raw[:raw.rindex(b"\n")].split(b"\n") if line.strip()]


def test_rotation_by_size_keeps_every_line_and_reconcile_log_reads_across(nsystemd, tmp_path):
    # Each line rotates the file (1 byte): the extreme case; three files kept.
    cli = applied(nsystemd, tmp_path, RECONCILE_JOURNAL_MAX_BYTES="1", RECONCILE_JOURNAL_KEEP="20")
    files = [p for p in rotated_files(cli.journal) if p.exists()]
    lines = file_lines(cli.journal)
    assert len(files) == len(lines) > 2  # one line a file, none lost
    doc = log_json(tmp_path, cli.journal)
    assert sum(len(r["actions"]) for r in doc["events"]) == sum(e["event"] == "intent" for e in lines)
    assert all(a["outcome"] == "done" for r in doc["events"] for a in r["actions"])


def test_rotation_keeps_at_most_keep_files_and_rotates_by_age(tmp_path):
    j = Journal(tmp_path / "journal.jsonl", Rotation(max_bytes=200, max_age_s=0, keep=3))
    written = [{"event": "intent", "time": f"2026-12-01T00:00:{n:02d}.000Z", "n": n} for n in range(40)]
    for e in written:
        j(e)
    files = [p for p in rotated_files(j.path) if p.exists()]
    assert [p.name for p in files] == ["journal.jsonl", "journal.jsonl.1", "journal.jsonl.2", "journal.jsonl.3"]
    kept = file_lines(j.path)
    assert kept == written[-len(kept):]  # the newest lines, in order, each whole
    assert [e["n"] for e in read_newest_first(j.path)] == [e["n"] for e in reversed(kept)]

    old = Journal(tmp_path / "aged.jsonl", Rotation(max_bytes=0, max_age_s=3600, keep=2))
    old({"event": "intent", "time": "2000-01-01T00:00:00.000Z"})
    old({"event": "intent", "time": "2026-12-01T00:00:00.000Z"})
    assert [json.loads(p.read_text())["time"][:4] for p in rotated_files(old.path)] == ["2026", "2000"]


def test_huge_observations_are_summarised(tmp_path):
    j = Journal(tmp_path / "journal.jsonl")
    missing = [[i, i] for i in range(0, 40000, 2)]
    j({"event": "intent", "before": {"missing": missing, "done": 1}})
    line = json.loads(j.path.read_text())
    assert line["before"]["missing"][:MAX_LIST_ITEMS] == missing[:MAX_LIST_ITEMS]
    assert line["before"]["missing"][-1] == f"... {len(missing) - MAX_LIST_ITEMS} more ({len(missing)} in all)"
    assert len(j.path.read_bytes()) < 2000


def test_since_stops_before_the_older_files(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.with_name("journal.jsonl.1").write_text("not json: never read with a recent --since\n")
    now = time.time()
    # Pass n an hour after pass n-1; the last 10 minutes from now (far from --since's edge).
    path.write_text("".join(json.dumps({"event": "watch-pass", "pass": n, "time": _iso(now - 3600 * (10 - n) + 600)})
                            + "\n" for n in range(10)))
    proc = run_cli(tmp_path, "log", "--journal", str(path), "--since", "2h", "--format", "json")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert [e["pass"] for e in json.loads(proc.stdout)["events"]] == [8, 9]
    everything = run_cli(tmp_path, "log", "--journal", str(path), "--format", "json")
    assert "not a journal line; skipped" in everything.stderr  # without --since, the old file is read


def _iso(t: float) -> str:
    from reconcile_host.core.contract import utc_iso

    return utc_iso(t, millis=True)


def _big_journal(tmp_path: Path, n: int = 3000) -> Path:
    path = tmp_path / "journal.jsonl"
    with open(path, "w") as fh:
        for k in range(n):
            fh.write(json.dumps({"event": "watch-pass", "pass": k, "time": _iso(1.7e9 + k), "pid": 1,
                                 "resources": {"gpus": "ok"}, "actions_done": 1, "actions_failed": 0}) + "\n")
    return path


def test_piped_into_head_ends_quietly(tmp_path):
    path = _big_journal(tmp_path)
    argv = " ".join(f"'{a}'" for a in reconcile_argv("log", "--journal", str(path)))
    proc = subprocess.run(["bash", "-c", f"{argv} | head -n 2; echo \"status ${{PIPESTATUS[0]}}\" >&2"],
                          capture_output=True, text=True, env=cli_env(tmp_path), timeout=60)
    assert len(proc.stdout.splitlines()) == 2 and "watch pass 0 " in proc.stdout.splitlines()[0]
    assert proc.stderr.strip() == "status 0", proc.stderr


def test_colour_on_a_terminal_not_with_no_color_or_term_dumb(tmp_path):
    cli_journal = tmp_path / "journal.jsonl"
    cli_journal.write_text(json.dumps({"event": "intent", "time": _iso(1.7e9), "run": "r1", "pid": 1,
                                       "resource": "unit:x", "action": "stop", "target": "x",
                                       "description": "stop x"}) + "\n")
    # no-color.org: only a NO_COLOR that is not empty disables colour; clig.dev: so does TERM=dumb.
    for env in ({"TERM": "xterm"}, {"TERM": "xterm", "NO_COLOR": ""}):
        coloured = _on_a_pty(tmp_path, cli_journal, env)
        assert "\x1b[33m" in coloured and "may or may not have happened" in coloured, env
    for env in ({"TERM": "xterm", "NO_COLOR": "1"}, {"TERM": "dumb"}):
        plain = _on_a_pty(tmp_path, cli_journal, env)
        assert "\x1b[" not in plain and "may or may not have happened" in plain, env


def _on_a_pty(tmp_path: Path, journal: Path, env: dict[str, str]) -> str:
    master, slave = pty.openpty()
    proc = subprocess.Popen(reconcile_argv("log", "--journal", str(journal)), stdin=slave, stdout=slave,
                            stderr=slave, env=cli_env(tmp_path, **env), close_fds=True)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        proc.wait(timeout=30)
    assert proc.returncode == 0, out
    return out.decode()


def test_bad_since_and_unreadable_journal_are_one_line(tmp_path):
    bad = run_cli(tmp_path, "log", "--journal", str(tmp_path / "j"), "--since", "last tuesday")
    assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1 and "--since 'last tuesday'" in bad.stderr
    journal = _big_journal(tmp_path, 3)
    journal.with_name("journal.jsonl.1").mkdir()  # a rotated file that cannot be read
    unreadable = run_cli(tmp_path, "log", "--journal", str(journal))
    assert unreadable.returncode == 1 and unreadable.stderr.startswith("reconcile: error: cannot read the journal")
    assert "Traceback" not in unreadable.stderr


def _remote_command(tmp: Path) -> str:
    """The target's reconcile: this interpreter (ssh passes no environment)."""
    import sys

    return (f"env RECONCILE_CACHE_DIR={tmp / 'remote-cache'} RECONCILE_STATE_DIR={tmp / 'remote-state'} "
            f"{sys.executable} -m reconcile_host")


def test_a_remote_journal_over_ssh_and_an_inventory_with_an_unreachable_host(sshd, tmp_path):  # noqa: F811
    journal = _big_journal(tmp_path, 5)
    local = log_json(tmp_path, journal)
    proc = run_cli(tmp_path, "log", "--journal", str(journal), "--format", "json", "--host", sshd.address,
                   *sshd.ssh_option_args(), "--remote-command", _remote_command(tmp_path))
    assert proc.returncode == 0, proc.stderr
    there = json.loads(proc.stdout)
    assert there["events"] == local["events"] and there["host"].startswith("root@127.0.0.1")
    text = run_cli(tmp_path, "log", "--journal", str(journal), "--host", sshd.address, *sshd.ssh_option_args(),
                   "--remote-command", _remote_command(tmp_path))
    assert text.returncode == 0 and text.stdout == run_cli(tmp_path, "log", "--journal", str(journal)).stdout

    from ssh_support import free_port

    inventory = tmp_path / "hosts.yaml"
    opts = "".join(f"\n      - {json.dumps(o)}" for o in sshd.client_options)
    inventory.write_text(f"""version: 1
defaults:
  remote_command: {json.dumps(_remote_command(tmp_path))}
  connect_timeout: 5s
  ssh_options:{opts}
hosts:
  here:
    address: {sshd.address}
    state: s.yaml
    journal: {journal}
  gone:
    address: ssh://root@127.0.0.1:{free_port()}
    state: s.yaml
""")
    both = run_cli(tmp_path, "log", "--inventory", str(inventory), "--format", "json")
    assert both.returncode == 1, both.stderr
    hosts = {h["name"]: h for h in json.loads(both.stdout)["hosts"]}
    assert hosts["here"]["events"] == local["events"]
    assert hosts["gone"]["error"].startswith("cannot reach root@127.0.0.1")
    assert "reconcile: error: gone: cannot reach" in both.stderr


def test_watch_passes_and_slurm_health_runs_in_the_timeline(nsystemd, tmp_path):
    for u in UNITS:
        nsystemd.write_unit(u, service(u))
    nsystemd.systemctl("enable", "--now", *UNITS, check=True)
    journal = tmp_path / "journal.jsonl"
    state = tmp_path / "s.yaml"
    state.write_text(STATE)
    watch = nsystemd.popen(reconcile_argv("watch", str(state), "--interval", "1h", "--journal", str(journal)),
                           env=cli_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not any(e["event"] == "watch-pass" for e in _lines_if_any(journal)):
            assert time.monotonic() < deadline and watch.poll() is None, "no watch pass was journaled"
            time.sleep(0.05)
    finally:
        os.killpg(watch.pid, 15)
        watch.wait(timeout=60)
    # slurm-health's own line (scontrol stands aside: /bin/true knows no node, which it records).
    health = nsystemd.run(reconcile_argv("slurm-health", str(state), "--node", "n1", "--scontrol", "/bin/true",
                                         "--journal", str(journal)), env=cli_env(tmp_path))
    assert "Traceback" not in health.stderr + health.stdout
    lines = file_lines(journal)
    doc = log_json(tmp_path, journal)
    kinds = [e["event"] for e in doc["events"]]
    assert kinds == ["run", "watch-pass", "slurm-health"], kinds
    passed = next(e for e in lines if e["event"] == "watch-pass")
    assert doc["events"][1] == passed and doc["events"][2] == next(e for e in lines if e["event"] == "slurm-health")
    text = run_cli(tmp_path, "log", "--journal", str(journal)).stdout.splitlines()
    assert f"watch pass {passed['pass']}" in text[-2] and f"{passed['actions_done']} done" in text[-2]
    assert "slurm-health node n1" in text[-1] and f"exit {lines[-1]['exit_code']}" in text[-1]


WRITER = """
import sys
from reconcile_host.pipeline.journal import Journal, Rotation
j = Journal(sys.argv[1], Rotation(max_bytes=800, max_age_s=0, keep=10000))
for n in range(int(sys.argv[3])):
    j({"event": "intent", "time": "2026-12-01T00:00:00.000Z", "writer": sys.argv[2], "n": n, "pad": "x" * 40})
"""


def test_writers_rotating_at_once_lose_no_line(tmp_path):
    """Four processes append and rotate the same journal at once (a rotation every ~8 lines):
    every line each wrote is in exactly one file, whole, in each writer's order."""
    import sys

    path = tmp_path / "journal.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(w), "60"]) for w in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    lines = file_lines(path)
    assert len([p for p in rotated_files(path) if p.exists()]) > 10
    for w in range(4):
        assert [e["n"] for e in lines if e["writer"] == str(w)] == list(range(60))


def test_an_extraction_with_many_damaged_files_is_summarised_in_the_journal(tmp_path):
    """A real apply quarantines 100 empty samples: the journal's observation keeps the first
    MAX_LIST_ITEMS of them and says how many more; the quarantine manifest (what was moved)
    names all 100; `reconcile log` reads the line back."""
    from cli_support import reconcile_json
    from extraction_support import state_yaml, write_samples

    out = tmp_path / "hs"
    write_samples(out, range(200))
    for idx in range(0, 200, 2):
        path = out / f"rows_{idx // 10 * 10}-{idx // 10 * 10 + 10}" / f"data_{idx}.ckpt"
        path.write_bytes(b"")
        os.utime(path, (time.time() - 3600, time.time() - 3600))  # old: not a file being written
    state = state_yaml(tmp_path / "s.yaml", {"dir": str(out), "total": 200, "min_done": 1, "verify": "content"})
    rc, report, err = reconcile_json(tmp_path, "apply", str(state))
    assert rc in (0, 2) and report, err
    (qdir,) = (out / ".reconcile-quarantine").iterdir()
    moved = json.loads((qdir / "manifest.json").read_text())["files"]
    assert len(moved) == 100
    journal = tmp_path / "journal.jsonl"
    intent = next(e for e in file_lines(journal) if e["event"] == "intent")
    damaged = intent["before"]["damaged"]
    assert len(damaged) == MAX_LIST_ITEMS + 1 and damaged[-1] == f"... {100 - MAX_LIST_ITEMS} more (100 in all)"
    assert {d["path"] for d in damaged[:-1]} <= {f["path"] for f in moved}
    assert max(len(line) for line in journal.read_bytes().split(b"\n")) < 16384
    doc = log_json(tmp_path, journal)
    assert [a["action"] for r in doc["events"] for a in r["actions"]] == ["quarantine"]
