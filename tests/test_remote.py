"""Remote runs as a user types them: `--host ssh://...` against a real sshd on 127.0.0.1, and
`--via nsenter ...` into the namespaced systemd; results checked with systemctl and the
target's own journal, not through reconcile's code."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from cli_support import cli_env, reconcile_argv, run_cli
from ssh_support import free_port, sshd  # noqa: F401  (the fixture)

ROOT_OK = "version: 1\nmounts:\n  /:\n    mounted: true\n"


def remote_command(tmp: Path, inner_prefix: str = "") -> str:
    """The target's reconcile: this interpreter, with the test's cache and state directory (ssh passes
    no environment: without them a root target would keep its records in /var/lib/reconcile)."""
    return (f"{inner_prefix}env RECONCILE_CACHE_DIR={tmp / 'remote-cache'} "
            f"RECONCILE_STATE_DIR={tmp / 'remote-state'} {sys.executable} -m reconcile_host")


def ssh_args(server, tmp: Path, *extra: str, inner_prefix: str = "") -> list[str]:
    return ["--host", server.address, *server.ssh_option_args(), "--remote-command",
            remote_command(tmp, inner_prefix), *extra]


def test_diff_over_ssh_renders_like_a_local_run(sshd, tmp_path):  # noqa: F811
    state = tmp_path / "host.yaml"
    state.write_text(ROOT_OK)
    local = run_cli(tmp_path, "diff", str(state))
    remote = run_cli(tmp_path, "diff", str(state), *ssh_args(sshd, tmp_path))
    assert remote.returncode == local.returncode == 0, remote.stderr
    # Same target machine, same renderer: the very same text, plus the host key ssh connected to.
    import re

    assert re.sub(r", host key ssh-ed25519 SHA256:[A-Za-z0-9+/]+", "", remote.stdout, count=1) == local.stdout
    assert ", host key ssh-ed25519 SHA256:" in remote.stdout
    assert remote.stderr == ""

    proc = run_cli(tmp_path, "diff", str(state), "--format", "json", *ssh_args(sshd, tmp_path))
    doc = json.loads(proc.stdout)
    assert doc["state_file"] == str(state) and doc["exit_code"] == 0
    assert [r["id"] for r in doc["resources"]] == ["mount:/"]
    # The target filled its own cache, not ours: it validated the state itself.
    assert (tmp_path / "remote-cache" / "validated").is_dir()

    # The calls shared one connection: ssh's own master answers on the control socket.
    sockets = [p for p in sshd.control_dir.iterdir() if stat.S_ISSOCK(p.stat().st_mode)]
    assert len(sockets) == 1
    check = subprocess.run(["ssh", "-o", f"ControlPath={sockets[0]}", "-O", "check", "x"],
                           capture_output=True, text=True, timeout=10)
    assert check.returncode == 0, check.stderr


def test_drift_exit_code_comes_from_the_target(sshd, tmp_path):  # noqa: F811
    mnt = tmp_path / "not-mounted"
    mnt.mkdir()
    state = tmp_path / "drift.yaml"
    state.write_text(f"version: 1\nmounts:\n  {mnt}:\n    source: tmpfs\n    fstype: tmpfs\n")
    proc = run_cli(tmp_path, "diff", str(state), *ssh_args(sshd, tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert f"mount -t tmpfs tmpfs {mnt}" in proc.stdout
    assert "Plan: 1 action to take." in proc.stdout


def test_bad_state_errors_point_into_the_users_file(sshd, tmp_path):  # noqa: F811
    state = tmp_path / "bad.yaml"
    state.write_text("version: 1\nmounts:\n  /:\n    mountd: true\n")
    local = run_cli(tmp_path, "diff", str(state))
    remote = run_cli(tmp_path, "diff", str(state), *ssh_args(sshd, tmp_path))
    assert remote.returncode == local.returncode == 1
    assert remote.stderr == local.stderr
    assert remote.stderr.startswith(f"{state}:4:5: ")
    assert "did you mean 'mounted'?" in remote.stderr
    assert remote.stdout == ""


def test_state_from_stdin_keeps_its_label(tmp_path):
    proc = subprocess.run(reconcile_argv("diff", "-", "--state-label", "states/kpro6.yaml"), capture_output=True,
                          text=True, input="version: 1\nmounts:\n  /:\n    mounted: yes please\n",
                          env=cli_env(tmp_path), timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("states/kpro6.yaml:4:14: ")


def test_target_without_reconcile_names_the_install_command(sshd, tmp_path):  # noqa: F811
    state = tmp_path / "host.yaml"
    state.write_text(ROOT_OK)
    proc = run_cli(tmp_path, "diff", str(state), "--host", sshd.address, *sshd.ssh_option_args(),
                   "--remote-command", "reconcile-not-installed-here")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "reconcile is not installed on root@127.0.0.1" in lines[0]
    assert "python3 -m pip wheel --no-deps" in lines[0] and "reconcile-host @ git+" in lines[0]
    assert "Traceback" not in proc.stderr


def test_incompatible_format_version_is_refused(sshd, tmp_path):  # noqa: F811
    fake = tmp_path / "future-reconcile"
    fake.write_text('#!/bin/sh\necho \'{"reconcile_version": "9.0.0", "format_version": "2"}\'\n')
    fake.chmod(0o755)
    state = tmp_path / "host.yaml"
    state.write_text(ROOT_OK)
    proc = run_cli(tmp_path, "diff", str(state), "--host", sshd.address, *sshd.ssh_option_args(),
                   "--remote-command", str(fake))
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1
    assert "runs reconcile 9.0.0 (report format 2)" in proc.stderr
    assert "pip install" in proc.stderr


def test_closed_port_fails_within_the_connect_timeout(tmp_path):
    state = tmp_path / "host.yaml"
    state.write_text(ROOT_OK)
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    proc = run_cli(tmp_path, "diff", str(state), "--host", f"ssh://root@127.0.0.1:{port}", "--connect-timeout", "3s")
    took = time.monotonic() - t0
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"reconcile: error: cannot reach root@127.0.0.1:{port}: ")
    assert "Connection refused" in proc.stderr
    assert took < 30, took  # a guard against waiting for good, not a stopwatch: refused is immediate


def test_silent_server_fails_within_the_connect_timeout(tmp_path):
    """A port that accepts and never says a word (a hung sshd): ssh's ConnectTimeout covers the banner."""
    state = tmp_path / "host.yaml"
    state.write_text(ROOT_OK)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        proc = run_cli(tmp_path, "diff", str(state), "--host", f"ssh://127.0.0.1:{port}", "--connect-timeout", "2s")
        took = time.monotonic() - t0
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"reconcile: error: cannot reach 127.0.0.1:{port}: ")
    assert "timed out" in proc.stderr  # ssh's ConnectTimeout fired: without it ssh waits for the banner for good
    assert took < 30, took  # a guard against waiting for good, not a stopwatch


def test_bad_host_address_is_one_line(tmp_path):
    proc = run_cli(tmp_path, "diff", "x.yaml", "--host", "root@kpro6")
    assert proc.returncode == 1
    assert proc.stderr == "reconcile: error: invalid host 'root@kpro6': expected ssh://[user@]host[:port]\n"


# --- on the namespaced systemd ---------------------------------------------------------

SERVICE = "[Unit]\nDescription=remote test {name}\n[Service]\nExecStart=/bin/sleep infinity\n{extra}\n" \
          "[Install]\nWantedBy=multi-user.target\n"


def unit_state(name: str) -> str:
    return f"version: 1\nunits:\n  {name}:\n    active: false\n    enabled: false\n"


def test_via_nsenter_converges_units(nsystemd, tmp_path):
    name = "remote-via.service"
    nsystemd.write_unit(name, SERVICE.format(name=name, extra=""), enable=True)
    nsystemd.systemctl("start", name, check=True)
    state = tmp_path / "units.yaml"
    state.write_text(unit_state(name))
    via = f"nsenter -t {nsystemd.pid} -m -p -u"
    journal = tmp_path / "journal.jsonl"
    args = ["--via", via, "--remote-command", remote_command(tmp_path)]

    diff = run_cli(tmp_path, "diff", str(state), *args)
    assert diff.returncode == 2, diff.stderr
    assert f"stop {name}" in diff.stdout

    proc = run_cli(tmp_path, "apply", str(state), "--journal", str(journal), "--format", "json", *args)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["command"] == "apply" and doc["summary"]["actions_done"] == 2
    assert nsystemd.systemctl("is-active", name).stdout.strip() == "inactive"
    assert nsystemd.systemctl("is-enabled", name).stdout.strip() == "disabled"
    # The target wrote its own journal (the path is on the target).
    assert sorted(e["action"] for e in map(json.loads, journal.read_text().splitlines())
                  if e["event"] == "result") == ["disable", "stop"]

    again = run_cli(tmp_path, "diff", str(state), *args)
    assert again.returncode == 0, again.stdout + again.stderr


def test_connection_dropped_mid_apply_then_rerun_converges(sshd, nsystemd, tmp_path):  # noqa: F811
    """The TCP connection dies while the target is stopping a slow unit: a clear error here,
    the target's apply runs to its end under its own lock, and the next run converges."""
    name = "remote-slow-stop.service"
    nsystemd.write_unit(name, SERVICE.format(name=name, extra="ExecStop=/bin/sleep 3"), enable=False)
    nsystemd.systemctl("start", name, check=True)
    state = tmp_path / "units.yaml"
    state.write_text(unit_state(name))
    journal = tmp_path / "journal.jsonl"
    inner = f"nsenter -t {nsystemd.pid} -m -p -u "
    # No shared connection here: the apply must own the connection that is cut.
    argv = reconcile_argv("apply", str(state), "--journal", str(journal), "--ssh-option", "ControlMaster=no",
                          *ssh_args(sshd, tmp_path, inner_prefix=inner))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while nsystemd.show(name, "ActiveState") != "deactivating":
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the stop never started"
            time.sleep(0.05)
        assert sshd.drop_connections() > 0
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    assert err.startswith("reconcile: error: connection lost during apply on root@127.0.0.1:"), err
    assert f"the target's journal at {journal} holds what was done; run again to reconverge" in err

    # The rerun waits for the orphaned apply's lock on the target, then finds nothing left to do.
    rerun = run_cli(tmp_path, "apply", str(state), "--journal", str(journal), "--lock-timeout", "60s",
                    *ssh_args(sshd, tmp_path, inner_prefix=inner), timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert nsystemd.systemctl("is-active", name).stdout.strip() == "inactive"
    entries = [e for line in journal.read_text().splitlines() if (e := json.loads(line))["event"] == "result"]
    assert [(e["action"], e["target"], e["result"]) for e in entries] == [("stop", name, "done")]


def test_remote_command_is_quoted_once_for_the_remote_shell(sshd, tmp_path):  # noqa: F811
    """A state file name with a space and a quote survives ssh's trip through the remote shell."""
    state = tmp_path / "it's a host.yaml"
    state.write_text("version: 1\nmounts:\n  /:\n    mountd: true\n")
    proc = run_cli(tmp_path, "diff", str(state), *ssh_args(sshd, tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"{state}:4:5: "), proc.stderr


# --- round trips ---------------------------------------------------------------------------

def logging_remote(tmp: Path) -> tuple[str, Path]:
    """A remote command that records each request's arguments, then runs the real reconcile."""
    log = tmp / "requests.log"
    script = tmp / "logging-reconcile"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                      f'RECONCILE_CACHE_DIR={tmp / "remote-cache"} RECONCILE_STATE_DIR={tmp / "remote-state"} '
                      f'exec {sys.executable} -m reconcile_host "$@"\n')
    script.chmod(0o755)
    return str(script), log


def test_a_read_only_run_is_one_round_trip_and_an_apply_asks_first(sshd, tmp_path):  # noqa: F811
    script, log = logging_remote(tmp_path)
    state = tmp_path / "host.yaml"
    state.write_text(ROOT_OK)
    args = ["--host", sshd.address, *sshd.ssh_option_args(), "--remote-command", script]

    proc = run_cli(tmp_path, "diff", str(state), *args)
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().splitlines() == [f"diff --format json --state-label {state} -"]

    log.unlink()
    proc = run_cli(tmp_path, "apply", str(state), "--dry-run", *args)
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["apply"]

    # A real apply: nothing changes on a target before its versions are known.
    log.unlink()
    journal = tmp_path / "journal.jsonl"
    proc = run_cli(tmp_path, "apply", str(state), "--journal", str(journal), *args)
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["version", "apply"]
    assert log.read_text().splitlines()[0] == "version --json"


def test_without_a_state_file_the_target_is_asked_its_name_first(sshd, tmp_path):  # noqa: F811
    script, log = logging_remote(tmp_path)
    short = os.uname().nodename.split(".", 1)[0]  # the target is this machine
    (tmp_path / "states").mkdir()
    (tmp_path / "states" / f"{short}.yaml").write_text(ROOT_OK)
    proc = run_cli(tmp_path, "diff", "--host", sshd.address, *sshd.ssh_option_args(), "--remote-command", script,
                   "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["state_file"] == f"states/{short}.yaml"
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["version", "diff"]


def test_a_target_too_old_for_the_request_is_one_line(sshd, tmp_path):  # noqa: F811
    """A far side whose CLI refuses the request's options (click's usage error, exit 2)."""
    old = tmp_path / "old-reconcile"
    old.write_text("#!/bin/sh\nprintf 'Usage: reconcile diff [OPTIONS] [FILE]\\n"
                   "Try '\\''reconcile diff -h'\\'' for help.\\n\\nError: No such option: --state-label\\n' >&2\n"
                   "exit 2\n")
    old.chmod(0o755)
    state = tmp_path / "host.yaml"
    state.write_text(ROOT_OK)
    proc = run_cli(tmp_path, "diff", str(state), "--host", sshd.address, *sshd.ssh_option_args(),
                   "--remote-command", str(old))
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "runs a reconcile older than this one, which cannot take `diff` from another host" in lines[0]
    assert "No such option: --state-label" in lines[0]
    assert "install this version there: build a wheel of this reconcile" in lines[0]


def test_connection_dropped_mid_diff_is_a_lost_connection(sshd, tmp_path):  # noqa: F811
    """No handshake before a diff: a connection made and then cut must not read 'cannot reach'."""
    marker = tmp_path / "started"
    hang = tmp_path / "hanging-reconcile"
    hang.write_text(f"#!/bin/sh\necho $$ > {marker}.tmp && mv {marker}.tmp {marker}\nexec sleep 120\n")
    hang.chmod(0o755)
    state = tmp_path / "host.yaml"
    state.write_text(ROOT_OK)
    argv = reconcile_argv("diff", str(state), "--host", sshd.address, *sshd.ssh_option_args(),
                          "--ssh-option", "ControlMaster=no", "--remote-command", str(hang))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the far side never started"
            time.sleep(0.05)
        assert sshd.drop_connections() > 0
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.kill(int(marker.read_text()), signal.SIGKILL)  # the far side's sleep, which we started
        except (OSError, ValueError):
            pass
    assert proc.returncode == 1, out + err
    assert err.startswith(f"reconcile: error: connection lost during diff on root@127.0.0.1:{sshd.port}: "), err


def test_the_handshake_answer_skips_the_cli_and_matches_it(tmp_path):
    """`version --json` is answered by __main__.py without importing click; the click command
    (reached through cli.main) prints the very same document."""
    fast = subprocess.run([sys.executable, "-X", "importtime", "-m", "reconcile_host", "version", "--json"],
                          capture_output=True, text=True, env=cli_env(tmp_path), timeout=60)
    assert fast.returncode == 0, fast.stderr
    imported = {line.split("|")[-1].strip() for line in fast.stderr.splitlines() if line.startswith("import time:")}
    assert "reconcile_host" in imported
    assert not {"click", "reconcile_host.cli"} & imported
    via_click = subprocess.run([sys.executable, "-c", "import sys; from reconcile_host.cli import main; "
                                "sys.argv[0] = 'reconcile'; main()", "version", "--json"],
                               capture_output=True, text=True, env=cli_env(tmp_path), timeout=60)
    assert via_click.returncode == 0, via_click.stderr
    assert fast.stdout == via_click.stdout
    doc = json.loads(fast.stdout)
    assert set(doc) == {"reconcile_version", "format_version", "hostname", "journal"}
    assert doc["hostname"] == os.uname().nodename


def negotiated_kex(log: Path) -> str:
    """The key exchange ssh's own debug log says it agreed on (`debug1: kex: algorithm: NAME`)."""
    import re

    found = re.findall(r"kex: algorithm: (\S+)", log.read_text())
    assert found, log.read_text()[-2000:]
    return found[-1]


def test_the_default_key_exchange_stays_post_quantum_and_the_users_choice_wins(sshd, tmp_path):  # noqa: F811
    """reconcile never trades a connection's post-quantum key exchange for CPU by itself: OpenSSH
    9.0-9.8 keeps its own sntrup761x25519 (9.9 is asked for mlkem768x25519 first, 10.0 has it by
    default); a user who wants the cheaper curve25519 names it, and that wins. What ssh agreed on
    is read from ssh's own debug log."""
    offered = subprocess.run(["ssh", "-Q", "kex"], capture_output=True, text=True, timeout=10).stdout.split()
    state = tmp_path / "host.yaml"
    state.write_text(ROOT_OK)
    base = ["--ssh-option", "ControlMaster=no"]
    log = tmp_path / "ssh-default.log"
    proc = run_cli(tmp_path, "diff", str(state), *ssh_args(sshd, tmp_path, *base),
                   RECONCILE_SSH_OPTS=f"-o LogLevel=DEBUG1 -E {log}")
    assert proc.returncode == 0, proc.stderr
    post_quantum = [k for k in offered if k.startswith(("sntrup761x25519", "mlkem768x25519"))]
    if post_quantum:  # a client that has one agrees on one (the sshd of the tests is the same OpenSSH)
        assert negotiated_kex(log) in post_quantum, (negotiated_kex(log), offered)
    log = tmp_path / "ssh-user.log"
    proc = run_cli(tmp_path, "diff", str(state),
                   *ssh_args(sshd, tmp_path, *base, "--ssh-option", "KexAlgorithms=curve25519-sha256"),
                   RECONCILE_SSH_OPTS=f"-o LogLevel=DEBUG1 -E {log}")
    assert proc.returncode == 0, proc.stderr
    assert negotiated_kex(log) == "curve25519-sha256"


def test_old_spellings_read_on_the_target_are_said_where_the_command_was_typed(sshd, tmp_path):  # noqa: F811
    """The far side's warnings (stderr there) reach this terminal's stderr, as a local run prints them,
    and the JSON report carries them (`warnings`); stdout stays the report."""
    data = tmp_path / "hs"
    data.mkdir()
    state = tmp_path / "old.yaml"
    state.write_text(f"version: 1\nextractions:\n  hs:\n    dir: {data}\n    total: 10\n    verify: all\n")
    local = run_cli(tmp_path, "diff", str(state))
    said = [line for line in local.stderr.splitlines() if ": warning: " in line]
    assert said and said[0].startswith(f"{state}:6:13: warning: extractions.hs.verify: 'all'"), local.stderr
    remote = run_cli(tmp_path, "diff", str(state), *ssh_args(sshd, tmp_path))
    assert remote.returncode == local.returncode, remote.stderr
    assert [line for line in remote.stderr.splitlines() if ": warning: " in line] == said, remote.stderr
    as_json = run_cli(tmp_path, "diff", str(state), "--format", "json", *ssh_args(sshd, tmp_path))
    doc = json.loads(as_json.stdout)
    assert doc.get("warnings") == said, (as_json.stderr, doc)
    assert [line for line in as_json.stderr.splitlines() if ": warning: " in line] == said
    from gitops_support import validate_report

    validate_report(doc)
    # No old spelling: no `warnings` in the report, nothing on stderr.
    state.write_text(state.read_text().replace("verify: all", "verify: content"))
    clean = run_cli(tmp_path, "diff", str(state), "--format", "json", *ssh_args(sshd, tmp_path))
    assert "warnings" not in json.loads(clean.stdout) and ": warning: " not in clean.stderr, clean.stderr
