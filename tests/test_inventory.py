"""`--inventory`: many hosts in parallel (here: one real sshd on 127.0.0.1 standing in for twenty
hosts, each with its own state file and directory), one summary table, the worst exit code."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from cli_support import run_cli
from ssh_support import free_port, sshd  # noqa: F401  (the fixture)


def remote_command(tmp: Path, inner_prefix: str = "") -> str:
    # ssh passes no environment: the target's records in TMP too, never in /var/lib/reconcile.
    return (f"{inner_prefix}env RECONCILE_CACHE_DIR={tmp / 'remote-cache'} RECONCILE_STATE_DIR={tmp / 'remote-state'} "
            f"{sys.executable} -m reconcile_host")


def write_inventory(tmp: Path, server, hosts: dict[str, dict], groups: dict[str, list[str]],
                    inner_prefix: str = "") -> Path:
    lines = ["version: 1", "defaults:", f"  remote_command: {json.dumps(remote_command(tmp, inner_prefix))}",
             "  connect_timeout: 5s", "  ssh_options:"]
    lines += [f"    - {json.dumps(opt)}" for opt in server.client_options]
    lines.append("hosts:")
    for name, spec in hosts.items():
        lines.append(f"  {name}:")
        lines += [f"    {k}: {json.dumps(v)}" for k, v in spec.items()]
    lines.append("groups:" if groups else "")
    for name, members in groups.items():
        lines.append(f"  {name}: [{', '.join(members)}]")
    path = tmp / "inventory" / "hosts.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The summary table: HOST STATUS DRIFT ACTIONS SECONDS [message], keyed by host."""
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if re.match(r"^HOST\s+STATUS\s+DRIFT\s+ACTIONS\s+SECONDS$", line))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cells = line.split(None, 5)
        rows[cells[0]] = cells[1:]
    return rows


def test_twenty_hosts_in_parallel_with_one_summary(sshd, tmp_path):  # noqa: F811
    hosts, drifty = {}, []
    for i in range(1, 21):
        name = f"h{i:02d}"
        home = tmp_path / "inventory" / "hosts" / name
        (home / "mnt").mkdir(parents=True)
        if i <= 15:  # right as it is
            text = "version: 1\nmounts:\n  /:\n    mounted: true\n"
        else:  # a tmpfs that is not mounted: drift, one planned mount
            drifty.append(name)
            text = f"version: 1\nmounts:\n  {home / 'mnt'}:\n    source: tmpfs\n    fstype: tmpfs\n"
        (home / "state.yaml").write_text(text)
        hosts[name] = {"address": sshd.address, "state": f"hosts/{name}/state.yaml"}
    down_port = free_port()  # nothing listens there
    hosts["down"] = {"address": f"ssh://root@127.0.0.1:{down_port}", "state": "hosts/h01/state.yaml",
                     "connect_timeout": "3s"}
    inventory = write_inventory(tmp_path, sshd, hosts, {"drifty": drifty, "lab": ["h01", "down"]})

    report_dir = tmp_path / "reports"
    proc = run_cli(tmp_path, "diff", "--inventory", str(inventory), "--report-dir", str(report_dir), timeout=180)
    assert proc.returncode == 1, proc.stderr  # the worst host's: one is unreachable
    rows = table_rows(proc.stdout)
    assert list(rows) == [*(f"h{i:02d}" for i in range(1, 21)), "down"]
    for i in range(1, 16):
        assert rows[f"h{i:02d}"][:3] == ["ok", "0", "0"], rows[f"h{i:02d}"]
    for name in drifty:
        assert rows[name][:3] == ["drift", "1", "1"], rows[name]
    status, drift, actions, seconds, message = rows["down"]
    assert (status, drift, actions) == ("error", "-", "-")
    assert message.startswith(f"cannot reach root@127.0.0.1:{down_port}: ")
    assert float(seconds) < 6  # within (2x) its connect timeout; the others went on regardless
    assert "21 hosts: 15 ok, 5 drift, 1 error." in proc.stdout
    # Each host's own report, rendered as a local run renders it, precedes the table.
    assert proc.stdout.count("reconcile diff: ") == 20
    assert f"mount -t tmpfs tmpfs {tmp_path / 'inventory' / 'hosts' / 'h16' / 'mnt'}" in proc.stdout

    files = sorted(p.name for p in report_dir.iterdir())
    assert files == sorted([*(f"h{i:02d}.json" for i in range(1, 21)), "down.json"])
    h16 = json.loads((report_dir / "h16.json").read_text())
    assert h16["exit_code"] == 2 and h16["report"]["state_file"].endswith("hosts/h16/state.yaml")
    assert "report" not in json.loads((report_dir / "down.json").read_text())


def test_limit_and_json(sshd, tmp_path):  # noqa: F811
    for name in ("a1", "a2", "b1"):
        home = tmp_path / "inventory" / name
        home.mkdir(parents=True)
        (home / "state.yaml").write_text("version: 1\nmounts:\n  /:\n    mounted: true\n")
    hosts = {n: {"address": sshd.address, "state": f"{n}/state.yaml"} for n in ("a1", "a2", "b1")}
    inventory = write_inventory(tmp_path, sshd, hosts, {"bees": ["b1"]})

    proc = run_cli(tmp_path, "diff", "--inventory", str(inventory), "--limit", "a2,bees", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["format_version"] == "1" and doc["command"] == "diff" and doc["exit_code"] == 0
    assert [h["host"] for h in doc["hosts"]] == ["a2", "b1"]
    assert all(h["report"]["exit_code"] == 0 and h["status"] == "ok" for h in doc["hosts"])
    assert doc["summary"]["hosts"] == 2 and doc["summary"]["ok"] == 2

    none = run_cli(tmp_path, "diff", "--inventory", str(inventory), "--limit", "c*")
    assert none.returncode == 1
    assert none.stderr.startswith("reconcile: error: --limit 'c*' matches no host of ")


def test_inventory_errors_have_positions(tmp_path):
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        "version: 1\n"
        "hosts:\n"
        "  gpu1:\n"
        "    adress: ssh://root@gpu1\n"
        "    state: gpu1.yaml\n"
        "  gpu2:\n"
        "    address: root@gpu2\n"
        "    state: gpu2.yaml\n"
        "groups:\n"
        "  gpus: [gpu1, gpu3]\n"
    )
    proc = run_cli(tmp_path, "diff", "--inventory", str(inventory))
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"{inventory}:4:5: hosts.gpu1: unknown key 'adress' (did you mean 'address'?)",
        f"{inventory}:7:14: hosts.gpu2.address: invalid address 'root@gpu2': expected ssh://[user@]host[:port]",
    ]
    inventory.write_text("version: 1\nhosts:\n  gpu1:\n    state: gpu1.yaml\ngroups:\n  gpus: [gpu1, gpu3]\n")
    proc = run_cli(tmp_path, "diff", "--inventory", str(inventory))
    assert proc.stderr.splitlines() == [
        f"{inventory}:6:16: groups.gpus: unknown host 'gpu3'",
        f"{inventory}:3:3: hosts.gpu1: give either address (ssh://[user@]host[:port]) or via (a command prefix)",
    ]


SERVICE = "[Unit]\nDescription=inventory test\n[Service]\nExecStart=/bin/sleep infinity\n"


def test_apply_over_an_inventory_converges_each_host(sshd, nsystemd, tmp_path):  # noqa: F811
    """Three 'hosts' (ssh, then nsenter into the namespaced systemd), each stopping its own unit,
    each with its own journal and lock on the target."""
    names = ["n1", "n2", "n3"]
    hosts = {}
    for name in names:
        nsystemd.write_unit(f"inv-{name}.service", SERVICE)
        nsystemd.systemctl("start", f"inv-{name}.service", check=True)
        home = tmp_path / "inventory" / name
        home.mkdir(parents=True)
        (home / "state.yaml").write_text(f"version: 1\nunits:\n  inv-{name}.service:\n    active: false\n")
        hosts[name] = {"address": sshd.address, "state": f"{name}/state.yaml"}
    inventory = write_inventory(tmp_path, sshd, hosts, {},
                                inner_prefix=f"nsenter -t {nsystemd.pid} -m -p -u ")
    # All three "hosts" are this machine: each needs its own directory for its own lock.
    journal = tmp_path / "journals" / "{host}" / "journal.jsonl"
    proc = run_cli(tmp_path, "apply", "--inventory", str(inventory), "--journal", str(journal), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    assert {n: rows[n][:3] for n in names} == {n: ["changed", "0", "1"] for n in names}
    for name in names:
        assert nsystemd.systemctl("is-active", f"inv-{name}.service").stdout.strip() == "inactive"
        entries = (tmp_path / "journals" / name / "journal.jsonl").read_text().splitlines()
        assert [json.loads(e)["target"] for e in entries if json.loads(e)["event"] == "result"] == [
            f"inv-{name}.service"]


def test_a_hosts_journal_is_applys_and_diff_still_runs(sshd, tmp_path):  # noqa: F811
    """`journal:` of an inventory host names apply's journal on the target; `diff` has no
    --journal, so a diff over the same inventory must not pass it on (it did: every host failed
    with "No such option '--journal'")."""
    home = tmp_path / "inventory" / "j1"
    home.mkdir(parents=True)
    (home / "state.yaml").write_text("version: 1\nmounts:\n  /:\n    mounted: true\n")
    journal = tmp_path / "journals" / "j1" / "journal.jsonl"
    hosts = {"j1": {"address": sshd.address, "state": "j1/state.yaml", "journal": str(journal)}}
    inventory = write_inventory(tmp_path, sshd, hosts, {})
    proc = run_cli(tmp_path, "diff", "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert table_rows(proc.stdout)["j1"][:3] == ["ok", "0", "0"]
    assert not journal.exists()
