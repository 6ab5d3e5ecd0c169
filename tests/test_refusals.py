"""Refusals a machine can read, and the right machine (docs/json-report.md#error-reports,
docs/state-file.md#host).

Each refusal (the apply lock held, another host, another machine-id, a journal that cannot be
used, a --host that cannot be reached or refuses, an inventory host down) gives, with --format
json / junit / prometheus, an error report on stdout saying why, the same one line on stderr,
and exit 1. The authorities: the lock is a real flock held by this test; the machine's
identity is /etc/machine-id and the kernel's boot id as the files say; the SSH host key is the
one the real sshd serves, fingerprinted by ssh-keygen; the report is checked against
schema/report.schema.json by jsonschema, the JUnit by ElementTree, the metrics by
prometheus_client's parser."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from cli_support import run_cli
from ssh_support import free_port, sshd  # noqa: F401  (the fixture)
from test_inventory import remote_command

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())
OK_STATE = "version: 1\nmounts:\n  /:\n    mounted: true\n"
FORMATS = ("json", "junit", "prometheus")


def machine_id() -> str | None:
    try:
        return Path("/etc/machine-id").read_text().strip() or None
    except OSError:
        return None


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def other_id() -> str:
    mine = machine_id() or ""
    return "0123456789abcdef0123456789abcdef" if mine != "0123456789abcdef0123456789abcdef" else "f" * 32


def check_refusal(proc, fmt: str, reason: str) -> str:
    """Exit 1, one line on stderr, and a report on stdout that says the same. Returns the line."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("reconcile: error: "), proc.stderr
    message = lines[0].removeprefix("reconcile: error: ")
    if fmt == "json":
        doc = json.loads(proc.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["exit_code"] == 1 and doc["resources"] == []
        assert doc["error"] == {"reason": reason, "message": message}
    elif fmt == "junit":
        root = ET.fromstring(proc.stdout)
        errors = root.findall(".//testcase/error")
        assert [(e.get("type"), e.get("message")) for e in errors] == [(reason, message)]
        assert root.get("errors") == "1"
    else:
        from prometheus_client.parser import text_string_to_metric_families

        found = {(s.name, tuple(sorted(s.labels.items()))): s.value
                 for fam in text_string_to_metric_families(proc.stdout) for s in fam.samples}
        assert found[("reconcile_up", ())] == 0
        assert found[("reconcile_error_info", (("reason", reason),))] == 1
        assert not [k for k in found if k[0].startswith("reconcile_resource")]
    return message


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_held_lock_is_a_report_that_says_so(tmp_path, fmt):
    from reconcile_host.pipeline.journal import Lock

    state = tmp_path / "s.yaml"
    state.write_text(OK_STATE)
    journal = tmp_path / "j" / "journal.jsonl"
    journal.parent.mkdir()
    from reconcile_host.pipeline.journal import Journal

    lock = Lock(Journal.at(str(journal)).lock_path)
    lock.acquire()  # a real flock, held by this process
    with lock:
        proc = run_cli(tmp_path, "apply", str(state), "--journal", str(journal), "--format", fmt)
    message = check_refusal(proc, fmt, "lock-held")
    assert "another reconcile apply holds" in message


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_journal_that_cannot_be_used_is_a_report(tmp_path, fmt):
    state = tmp_path / "s.yaml"
    state.write_text(OK_STATE)
    (tmp_path / "afile").write_text("")  # the journal's directory is a regular file: ENOTDIR
    proc = run_cli(tmp_path, "apply", str(state), "--journal", str(tmp_path / "afile" / "journal.jsonl"),
                   "--format", fmt)
    try:  # what the kernel says to making a file beneath it (the lock, beside the journal)
        os.open(tmp_path / "afile" / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        said = exc.strerror
    assert said in check_refusal(proc, fmt, "journal")


@pytest.mark.parametrize("fmt", FORMATS)
def test_another_host_is_a_report(tmp_path, fmt):
    state = tmp_path / "s.yaml"
    state.write_text("version: 1\nhost: not-this-host-*\n" + OK_STATE.split("\n", 1)[1])
    proc = run_cli(tmp_path, "apply", str(state), "--journal", str(tmp_path / "journal.jsonl"), "--format", fmt)
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    assert f"this host is {hostname!r}" in check_refusal(proc, fmt, "host-mismatch")


@pytest.mark.parametrize("command", ["diff", "apply"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_another_machine_id_refuses_diff_and_apply(tmp_path, command, fmt):
    state = tmp_path / "s.yaml"
    state.write_text(f"version: 1\nhost: {{name: '*', machine_id: {other_id()}}}\n" + OK_STATE.split("\n", 1)[1])
    args = ["--journal", str(tmp_path / "journal.jsonl")] if command == "apply" else []
    proc = run_cli(tmp_path, command, str(state), *args, "--format", fmt)
    message = check_refusal(proc, fmt, "machine-mismatch")
    assert other_id() in message and f"refusing to {'plan' if command == 'diff' else 'apply'}" in message
    assert (machine_id() or "no readable /etc/machine-id") in message


def test_the_pinned_machine_runs_and_every_report_names_it(tmp_path):
    mid = machine_id()
    if not mid:
        pytest.skip("no /etc/machine-id here [ci-ok]")
    state = tmp_path / "s.yaml"
    state.write_text(f"version: 1\nhost: {{machine_id: {mid}}}\n" + OK_STATE.split("\n", 1)[1])
    proc = run_cli(tmp_path, "diff", str(state), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    assert doc["machine"] == {"hostname": hostname, "machine_id": mid, "boot_id": boot_id()}
    text = run_cli(tmp_path, "diff", str(state)).stdout
    assert f"machine-id {mid}" in text and f"boot {boot_id()}" in text
    junit = ET.fromstring(run_cli(tmp_path, "diff", str(state), "--format", "junit").stdout)
    props = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert props["machine.machine_id"] == mid and props["machine.boot_id"] == boot_id()
    prom = run_cli(tmp_path, "diff", str(state), "--format", "prometheus").stdout
    assert f'reconcile_machine_info{{hostname="{hostname}",machine_id="{mid}",boot_id="{boot_id()}"}} 1' in prom


def test_a_recreated_vm_is_refused_until_adopted_on_purpose(tmp_path):
    """The VM was recreated: a new /etc/machine-id (here a file standing in for it). The pinned
    state refuses; writing the new id into the state file (docs/state-file.md) adopts it."""
    new = tmp_path / "machine-id"
    new.write_text(other_id() + "\n")
    state = tmp_path / "s.yaml"
    state.write_text(f"version: 1\nhost: {{machine_id: {'a' * 32}}}\n" + OK_STATE.split("\n", 1)[1])
    proc = run_cli(tmp_path, "diff", str(state), RECONCILE_MACHINE_ID_FILE=str(new))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"has machine-id {other_id()}" in proc.stderr
    state.write_text(state.read_text().replace("a" * 32, new.read_text().strip()))
    assert run_cli(tmp_path, "diff", str(state), RECONCILE_MACHINE_ID_FILE=str(new)).returncode == 0


def test_a_bad_machine_id_is_a_position(tmp_path):
    state = tmp_path / "s.yaml"
    state.write_text("version: 1\nhost: {name: x, machine_id: NOT-HEX}\n")
    proc = run_cli(tmp_path, "validate", str(state))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"{state}:2:"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


# --- remote ------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_an_unreachable_host_is_a_report(tmp_path, fmt):
    state = tmp_path / "s.yaml"
    state.write_text(OK_STATE)
    port = free_port()  # nothing listens there
    proc = run_cli(tmp_path, "diff", str(state), "--host", f"ssh://root@127.0.0.1:{port}", "--connect-timeout", "3s",
                   "--format", fmt)
    assert "Connection refused" in check_refusal(proc, fmt, "unreachable")


def host_key_fingerprint(server) -> str:
    """The sshd's host key as ssh-keygen fingerprints it: `256 SHA256:... comment (ED25519)`."""
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(server.dir / "host_key.pub")],
                         capture_output=True, text=True, check=True).stdout.split()
    return out[1]


def test_a_remote_report_names_the_host_key_it_connected_to(sshd, tmp_path):  # noqa: F811
    state = tmp_path / "s.yaml"
    state.write_text(OK_STATE)
    args = ["--host", sshd.address, *sshd.ssh_option_args(), "--remote-command", remote_command(tmp_path)]
    for _ in range(2):  # the second run shares the first's connection (ControlMaster): same key
        proc = run_cli(tmp_path, "diff", str(state), *args, "--format", "json")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["machine"]["ssh_host_key"] == f"ssh-ed25519 {host_key_fingerprint(sshd)}"
        assert doc["machine"]["boot_id"] == boot_id() and doc["machine"]["machine_id"] == machine_id()
    text = run_cli(tmp_path, "diff", str(state), *args).stdout
    assert host_key_fingerprint(sshd) in text


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_refusal_on_the_target_comes_back_as_its_report(sshd, tmp_path, fmt):  # noqa: F811
    """The far side's apply finds its lock held: its error report comes back, host key added."""
    from reconcile_host.pipeline.journal import Journal, Lock

    state = tmp_path / "s.yaml"
    state.write_text(OK_STATE)
    journal = tmp_path / "remote-journal" / "journal.jsonl"
    journal.parent.mkdir()
    lock = Lock(Journal.at(str(journal)).lock_path)
    lock.acquire()
    with lock:
        proc = run_cli(tmp_path, "apply", str(state), "--host", sshd.address, *sshd.ssh_option_args(),
                       "--remote-command", remote_command(tmp_path), "--journal", str(journal), "--format", fmt)
    check_refusal(proc, fmt, "lock-held")
    if fmt == "json":
        assert json.loads(proc.stdout)["machine"]["ssh_host_key"].endswith(host_key_fingerprint(sshd))


def test_a_target_without_reconcile_is_a_report(sshd, tmp_path):  # noqa: F811
    state = tmp_path / "s.yaml"
    state.write_text(OK_STATE)
    proc = run_cli(tmp_path, "diff", str(state), "--host", sshd.address, *sshd.ssh_option_args(),
                   "--remote-command", "reconcile-not-installed", "--format", "json")
    assert "not installed on" in check_refusal(proc, "json", "remote-error")


def write_inventory(tmp: Path, server, hosts: dict[str, dict]) -> Path:
    lines = ["version: 1", "defaults:", f"  remote_command: {json.dumps(remote_command(tmp))}",
             "  connect_timeout: 5s", "  ssh_options:"]
    lines += [f"    - {json.dumps(opt)}" for opt in server.client_options]
    lines.append("hosts:")
    for name, spec in hosts.items():
        lines.append(f"  {name}:")
        lines += [f"    {k}: {json.dumps(v)}" for k, v in spec.items()]
    path = tmp / "hosts.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_inventory_reports_every_host_and_one_machine_under_two_names(sshd, tmp_path):  # noqa: F811
    (tmp_path / "s.yaml").write_text(OK_STATE)
    down = free_port()
    inventory = write_inventory(tmp_path, sshd, {
        "gpu-a": {"address": sshd.address, "state": "s.yaml"},
        "gpu-a-alias": {"address": sshd.address, "state": "s.yaml"},  # the same machine, another name
        "down": {"address": f"ssh://root@127.0.0.1:{down}", "state": "s.yaml", "connect_timeout": "3s"},
    })
    proc = run_cli(tmp_path, "diff", "--inventory", str(inventory), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    by_name = {h["host"]: h for h in doc["hosts"]}
    assert set(by_name) == {"gpu-a", "gpu-a-alias", "down"}
    assert by_name["down"]["reason"] == "unreachable" and "Connection refused" in by_name["down"]["error"]
    assert by_name["gpu-a"]["same_machine_as"] == ["gpu-a-alias"]
    assert by_name["gpu-a-alias"]["same_machine_as"] == ["gpu-a"]
    ids = {by_name[n]["report"]["machine"]["machine_id"] for n in ("gpu-a", "gpu-a-alias")}
    assert ids == {machine_id()}
    assert doc["summary"]["hosts"] == 3 and doc["summary"]["machines"] == 2
    text = run_cli(tmp_path, "diff", "--inventory", str(inventory)).stdout
    assert "same machine as gpu-a-alias (machine-id)" in text and "3 inventory names reached 2 machines" in text
    junit = ET.fromstring(run_cli(tmp_path, "diff", "--inventory", str(inventory), "--format", "junit").stdout)
    suites = {s.get("name").split(" ")[0]: s for s in junit.findall("testsuite")}
    assert set(suites) == {"gpu-a", "gpu-a-alias", "down"}
    assert [e.get("type") for e in suites["down"].iter("error")] == ["unreachable"]
    assert junit.get("errors") == "1"


def test_a_saved_plan_made_on_another_machine_is_refused(tmp_path):
    """Same hostname, another /etc/machine-id (a recreated VM): the plan is not carried out."""
    before, after = tmp_path / "id-before", tmp_path / "id-after"
    before.write_text("a" * 32 + "\n")
    after.write_text("b" * 32 + "\n")
    state = tmp_path / "s.yaml"
    state.write_text(OK_STATE)
    plan = tmp_path / "plan.json"
    made = run_cli(tmp_path, "diff", str(state), "--out", str(plan), RECONCILE_MACHINE_ID_FILE=str(before))
    assert made.returncode == 0, made.stderr
    proc = run_cli(tmp_path, "apply", str(plan), "--journal", str(tmp_path / "journal.jsonl"), "--format", "json",
                   RECONCILE_MACHINE_ID_FILE=str(after))
    message = check_refusal(proc, "json", "machine-mismatch")
    assert f"made on machine-id {'a' * 32}, this machine has {'b' * 32}" in message
    again = run_cli(tmp_path, "apply", str(plan), "--journal", str(tmp_path / "journal.jsonl"),
                    RECONCILE_MACHINE_ID_FILE=str(before))
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("do_apply", [False, True], ids=["diff", "apply"])
def test_slurm_health_judges_another_machine_unhealthy(tmp_path, monkeypatch, do_apply):
    """slurm-health's check (the part before scontrol) on a state pinned to another machine-id:
    not healthy, and the refusal's reason is what its journal line records as the problem."""
    from reconcile_host.doors import slurm
    from reconcile_host.pipeline.journal import Journal

    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    state = tmp_path / "s.yaml"
    state.write_text(f"version: 1\nhost: {{machine_id: {other_id()}}}\n" + OK_STATE.split("\n", 1)[1])
    journal = Journal.at(str(tmp_path / "journal.jsonl"))
    verdict, _, _ = slurm._check(slurm.Settings(str(state), "n1", str(journal.path), apply=do_apply), journal)
    assert not verdict.healthy and verdict.problems == ("machine-mismatch",)
    assert verdict.reason.startswith("reconcile: state file: ") and other_id() in verdict.reason
