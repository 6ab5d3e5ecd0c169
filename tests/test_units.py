"""Units on a real systemd 252 (PID 1 of its own namespace): the CLI as a user runs it,
checked with systemctl itself, never through reconcile's own code."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from cli_support import NsCli, cli_env, is_active, is_enabled, reconcile_argv, service, wait_for
from test_units_unitfiles import INSTALL_CASES

STATIC = "[Unit]\nDescription=static\n[Service]\nExecStart=/bin/sleep infinity\n"
VLLM = "vllm-kimi-k25-int4.service"


@pytest.fixture
def cli(nsystemd, tmp_path):
    return NsCli(nsystemd, tmp_path)


SEED_STATE = f"""version: 1
units:
  {VLLM}:
    active: false
    enabled: false
"""


def start_seed_unit(nsd):
    nsd.write_unit(VLLM, service(VLLM, "Restart=always\nRestartSec=100ms"), enable=True)
    nsd.systemctl("start", VLLM, check=True)
    assert is_active(nsd, VLLM) == "active" and is_enabled(nsd, VLLM) == "enabled"


def test_seed_unit_diff_apply_verify_and_idempotent(nsystemd, cli):
    start_seed_unit(nsystemd)
    state = cli.state(SEED_STATE)

    code, report = cli.json("diff", str(state))
    assert code == 2
    [res] = report["resources"]
    assert res["id"] == f"unit:{VLLM}" and res["kind"] == "unit" and res["status"] == "drift"
    assert res["drift"] == [{"field": "active", "want": False, "have": True},
                            {"field": "enabled", "want": False, "have": True}]
    assert [(a["action"], a["target"], a["result"]) for a in res["actions"]] == [
        ("disable", VLLM, "planned"), ("stop", VLLM, "planned")]
    assert report["format_version"] == "1" and report["command"] == "diff"
    assert report["summary"]["drift"] == 1
    # diff changed nothing
    assert is_active(nsystemd, VLLM) == "active" and is_enabled(nsystemd, VLLM) == "enabled"

    proc = cli("apply", str(state))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Applied 2 actions" in proc.stdout
    # Checked with systemctl, not with reconcile; Restart=always did not bring it back.
    time.sleep(0.5)
    assert is_active(nsystemd, VLLM) == "inactive"
    assert is_enabled(nsystemd, VLLM) == "disabled"

    again = cli("apply", str(state))
    assert again.returncode == 0
    assert "No changes" in again.stdout
    code, report = cli.json("apply", str(state))
    assert code == 0 and report["summary"]["actions_done"] == 0
    assert report["resources"][0]["actions"] == []

    assert cli("diff", str(state)).returncode == 0


def test_journal_has_one_line_per_action_in_order(nsystemd, cli):
    start_seed_unit(nsystemd)
    state = cli.state(SEED_STATE)
    assert cli("apply", str(state)).returncode == 0
    lines = [json.loads(line) for line in cli.journal.read_text().splitlines()]
    # each action: its intent (with what was observed before), its result; then what verification saw
    assert [(e["event"], e["resource"], e.get("action"), e.get("result")) for e in lines] == [
        ("intent", f"unit:{VLLM}", "disable", None), ("result", f"unit:{VLLM}", "disable", "done"),
        ("intent", f"unit:{VLLM}", "stop", None), ("result", f"unit:{VLLM}", "stop", "done"),
        ("verified", f"unit:{VLLM}", None, None)]
    for e in lines:
        assert e["time"].endswith("Z")
    assert all(e["before"]["active_state"] == "active" for e in lines if e["event"] == "intent")
    assert lines[-1]["after"]["active_state"] == "inactive" and lines[-1]["after"]["unit_file_state"] == "disabled"
    # a second apply adds nothing
    assert cli("apply", str(state)).returncode == 0
    assert len(cli.journal.read_text().splitlines()) == 5


def test_start_enable_and_needs_order(nsystemd, cli):
    nsystemd.write_unit("t-db.service", service("db"))
    nsystemd.write_unit("t-app.service", service("app"))
    state = cli.state("""version: 1
units:
  t-app.service:
    active: true
    enabled: true
    needs: [unit:t-db.service]
  t-db.service:
    active: true
""")
    code, report = cli.json("apply", str(state))
    assert code == 0, report
    assert [r["id"] for r in report["resources"]] == ["unit:t-db.service", "unit:t-app.service"]
    assert is_active(nsystemd, "t-db.service") == "active"
    assert is_active(nsystemd, "t-app.service") == "active"
    assert is_enabled(nsystemd, "t-app.service") == "enabled"
    starts = [e["target"] for e in map(json.loads, cli.journal.read_text().splitlines())
              if e["event"] == "result" and e["action"] == "start"]
    assert starts == ["t-db.service", "t-app.service"]


def test_need_not_ok_blocks_dependent(nsystemd, cli):
    # t-broken cannot start (its ExecStart fails), so t-after must not be started.
    nsystemd.write_unit("t-broken.service", "[Service]\nType=oneshot\nExecStart=/bin/false\n")
    nsystemd.write_unit("t-after.service", service("after"))
    state = cli.state("""version: 1
units:
  t-broken.service:
    active: true
  t-after.service:
    active: true
    needs: [unit:t-broken.service]
""")
    code, report = cli.json("apply", str(state))
    assert code == 2
    broken, after = report["resources"]
    assert broken["status"] == "drift" and broken["actions"][0]["result"] == "failed"
    assert after["status"] == "blocked" and "unit:t-broken.service" in after["message"]
    assert [a["result"] for a in after["actions"]] == ["skipped"]
    assert is_active(nsystemd, "t-after.service") == "inactive"


@contextlib.contextmanager
def runtime_unit(nsd, name, text):
    """A unit file in /run/systemd/system (the namespace's tmpfs /run): unlike one in /etc, it can be
    masked. Stopped, unmasked, disabled and removed again afterwards."""
    path = nsd.root / "run/systemd/system" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    nsd.systemctl("daemon-reload", check=True)
    try:
        yield path
    finally:
        for verb in ("stop", "unmask", "disable"):
            nsd.systemctl(verb, name)
        path.unlink()
        nsd.systemctl("daemon-reload")


def test_masked_units(nsystemd, cli):
    with runtime_unit(nsystemd, "t-mask.service", service("mask")):
        nsystemd.systemctl("start", "t-mask.service", check=True)
        _masked_units(nsystemd, cli)


def test_mask_refused_for_unit_file_in_etc_is_blocked_but_stopped(nsystemd, cli):
    nsystemd.write_unit("t-etc.service", service("etc"))
    nsystemd.systemctl("start", "t-etc.service", check=True)
    state = cli.state("version: 1\nunits:\n  t-etc.service:\n    active: false\n    enabled: masked\n")
    code, report = cli.json("apply", str(state))
    assert code == 2
    res = report["resources"][0]
    assert res["status"] == "blocked" and "/etc/systemd/system/t-etc.service" in res["message"]
    assert [(a["action"], a["result"]) for a in res["actions"]] == [("stop", "done")]
    assert is_active(nsystemd, "t-etc.service") == "inactive"


def _masked_units(nsystemd, cli):
    state = cli.state("version: 1\nunits:\n  t-mask.service:\n    active: false\n    enabled: masked\n")
    code, report = cli.json("apply", str(state))
    assert code == 0, report
    assert is_enabled(nsystemd, "t-mask.service") == "masked"
    assert is_active(nsystemd, "t-mask.service") == "inactive"
    # masked -> declared disabled again: unmask (and nothing more is needed)
    state2 = cli.state("version: 1\nunits:\n  t-mask.service:\n    enabled: false\n", "s2.yaml")
    code, report = cli.json("apply", str(state2))
    assert code == 0, report["resources"][0]["message"]
    assert is_enabled(nsystemd, "t-mask.service") == "disabled"
    # a masked unit that must run is blocked, not looped on
    nsystemd.systemctl("mask", "t-mask.service", check=True)
    state3 = cli.state("version: 1\nunits:\n  t-mask.service:\n    active: true\n", "s3.yaml")
    code, report = cli.json("apply", str(state3))
    assert code == 2 and report["resources"][0]["status"] == "blocked"
    assert "masked" in report["resources"][0]["message"]


def test_unmask_then_disable_in_one_apply(nsystemd, cli):
    # Masked while its WantedBy link exists: unmasking reveals "enabled", a second pass disables.
    with runtime_unit(nsystemd, "t-um.service", service("um")):
        nsystemd.systemctl("enable", "t-um.service", check=True)
        nsystemd.systemctl("mask", "t-um.service", check=True)
        assert is_enabled(nsystemd, "t-um.service") == "masked"
        state = cli.state("version: 1\nunits:\n  t-um.service:\n    enabled: false\n")
        code, report = cli.json("apply", str(state))
        assert code == 0, report
        assert [a["action"] for a in report["resources"][0]["actions"]] == ["unmask", "disable"]
        assert is_enabled(nsystemd, "t-um.service") == "disabled"


def test_not_found_units(nsystemd, cli):
    state = cli.state("version: 1\nunits:\n  t-ghost.service:\n    active: false\n    enabled: false\n"
                      "  t-ghost2.service:\n    active: true\n")
    code, report = cli.json("diff", str(state))
    ghost, ghost2 = report["resources"]
    assert ghost["status"] == "ok" and "not installed" in ghost["message"]
    assert ghost2["status"] == "blocked" and "not found" in ghost2["message"]
    assert code == 2
    code, _ = cli.json("apply", str(state))
    assert code == 2


def test_static_unit_cannot_be_disabled(nsystemd, cli):
    nsystemd.write_unit("t-static.service", STATIC)
    nsystemd.systemctl("start", "t-static.service", check=True)
    assert is_enabled(nsystemd, "t-static.service") == "static"
    state = cli.state("version: 1\nunits:\n  t-static.service:\n    active: false\n    enabled: false\n")
    code, report = cli.json("apply", str(state))
    assert code == 2
    res = report["resources"][0]
    assert res["status"] == "blocked" and "static" in res["message"] and "enabled: masked" in res["message"]
    assert [(a["action"], a["result"]) for a in res["actions"]] == [("stop", "done")]
    assert is_active(nsystemd, "t-static.service") == "inactive"
    # and a second apply does not try again
    code, report = cli.json("apply", str(state))
    assert code == 2 and report["resources"][0]["actions"] == []


def test_wrong_host_apply_refuses_diff_reports(nsystemd, cli):
    nsystemd.write_unit("t-host.service", service("host"))
    nsystemd.systemctl("start", "t-host.service", check=True)
    nsystemd.set_hostname("gpu-node-7")
    state = cli.state("version: 1\nhost: kpro6-*\nunits:\n  t-host.service:\n    active: false\n")
    proc = cli("apply", str(state))
    assert proc.returncode == 1
    assert "gpu-node-7" in proc.stderr and "kpro6-*" in proc.stderr and "Traceback" not in proc.stderr
    assert is_active(nsystemd, "t-host.service") == "active"
    code, report = cli.json("diff", str(state))
    assert report["host"] == "gpu-node-7" and report["host_matches"] is False
    assert any("kpro6-*" in n for n in report["notes"])
    nsystemd.set_hostname("kpro6-ct129")
    assert cli("apply", str(state)).returncode == 0
    assert is_active(nsystemd, "t-host.service") == "inactive"


def test_lock_contention_between_two_real_processes(nsystemd, cli):
    # Stopping this unit takes ~3 s (ExecStop), which keeps the first apply inside the lock.
    nsystemd.write_unit("t-slow.service", service("slow", "ExecStop=/bin/sleep 3"))
    nsystemd.systemctl("start", "t-slow.service", check=True)
    state = cli.state("version: 1\nunits:\n  t-slow.service:\n    active: false\n")
    lock_file = cli.journal.parent / "lock"
    first = nsystemd.popen(reconcile_argv("apply", str(state), "--journal", str(cli.journal)),
                           env=cli_env(cli.tmp), stdout=-1, stderr=-1, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (lock_file.exists() and lock_file.read_text().strip()):
            assert time.monotonic() < deadline, "first apply never took the lock"
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        holder = json.loads(lock_file.read_text())
        second = cli("apply", str(state))
        assert second.returncode == 1
        assert "another reconcile apply holds" in second.stderr
        assert f"pid {holder['pid']}" in second.stderr and holder["started"] in second.stderr
        waiting = cli("apply", str(state), "--lock-timeout", "60s")
        assert waiting.returncode == 0, waiting.stderr
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0, out + err
    finally:
        if first.poll() is None:
            os.killpg(first.pid, 9)
    assert is_active(nsystemd, "t-slow.service") == "inactive"
    # only the first apply acted
    assert [e["action"] for e in map(json.loads, cli.journal.read_text().splitlines()) if e["event"] == "result"] == [
        "stop"]


def test_dry_run_changes_nothing(nsystemd, cli):
    start_seed_unit(nsystemd)
    state = cli.state(SEED_STATE)
    code, report = cli.json("apply", "--dry-run", str(state))
    assert code == 2 and report["dry_run"] is True
    assert {a["result"] for a in report["resources"][0]["actions"]} == {"planned"}
    assert is_active(nsystemd, VLLM) == "active"


def test_default_state_file_lookup(nsystemd, cli, tmp_path):
    nsystemd.write_unit("t-def.service", service("def"))
    (tmp_path / "states").mkdir()
    nsystemd.set_hostname("kpro6-ct129")
    (tmp_path / "states" / "kpro6-ct129.yaml").write_text("version: 1\nunits:\n  t-def.service:\n    active: true\n")
    proc = nsystemd.run(reconcile_argv("diff", "--format", "json"), env=cli_env(tmp_path), cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert json.loads(proc.stdout)["state_file"] == "states/kpro6-ct129.yaml"
    env_state = cli.state("version: 1\nunits:\n  t-def.service:\n    active: false\n", "env.yaml")
    proc = nsystemd.run(reconcile_argv("diff", "--format", "json"), cwd=str(tmp_path),
                        env=cli_env(tmp_path, RECONCILE_STATE=str(env_state)))
    assert proc.returncode == 0 and json.loads(proc.stdout)["state_file"] == str(env_state)
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = nsystemd.run(reconcile_argv("diff"), env=cli_env(tmp_path), cwd=str(empty))
    assert proc.returncode == 1
    assert "states/kpro6-ct129.yaml" in proc.stderr and "state.yaml" in proc.stderr


def test_many_units_one_batched_call(nsystemd, cli):
    names = [f"t-many{i}.service" for i in range(30)]
    for n in names:
        nsystemd.write_unit(n, service(n))
    state = cli.state("version: 1\nunits:\n" + "".join(f"  {n}:\n    active: false\n" for n in names))
    code, report = cli.json("diff", str(state))
    assert code == 0 and report["summary"]["ok"] == 30


@pytest.mark.skipif(Path("/run/systemd/system").exists(), reason="this host runs systemd as PID 1 [ci-ok]")
def test_unreachable_systemd_is_an_error_not_inactive(tmp_path):
    # On this machine (and CI) PID 1 is not systemd: systemctl cannot reach a manager.
    import subprocess

    state = tmp_path / "s.yaml"
    state.write_text("version: 1\nunits:\n  vllm.service:\n    active: false\n")
    proc = subprocess.run(reconcile_argv("diff", "--format", "json", str(state)), capture_output=True,
                          text=True, env=cli_env(tmp_path))
    assert proc.returncode == 1
    res = json.loads(proc.stdout)["resources"][0]
    assert res["status"] == "error" and "cannot read unit state" in res["message"]


def test_text_output_plan_style_without_colour_when_piped(nsystemd, cli):
    start_seed_unit(nsystemd)
    proc = cli("diff", str(cli.state(SEED_STATE)))
    assert proc.returncode == 2
    assert "\033[" not in proc.stdout
    assert f"~ unit:{VLLM}" in proc.stdout
    assert "active:  true -> false" in proc.stdout
    assert f"→ stop {VLLM}" in proc.stdout
    assert "Plan: 2 actions to take." in proc.stdout


# --- observing without loading: list-units, the unit files, and `show` only where needed ------

TEMPLATE = "[Unit]\nDescription=template %i\n[Service]\nExecStart=/bin/sleep infinity\n" \
           "[Install]\nWantedBy=multi-user.target\n"
SHOWN = "LoadState,ActiveState,SubState,UnitFileState,FragmentPath,MainPID"


def show_props(nsd, name: str) -> dict[str, str]:
    out = nsd.systemctl("show", "-p", SHOWN, "--", name, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def in_memory(nsd, *names: str) -> set[str]:
    """The units of `names` that systemd holds in memory (list-units loads nothing)."""
    out = nsd.systemctl("list-units", "--all", "--plain", "--no-legend", "--full", "--", *names).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def log_count(nsd, text: str) -> int:
    return nsd.log_path.read_text(errors="replace").count(text)


def by_name(report) -> dict[str, dict]:
    return {r["id"].removeprefix("unit:"): r for r in report["resources"]}


def test_units_systemd_does_not_hold_are_observed_without_loading_them(nsystemd, cli):
    # Each unit file has a key systemd does not know: it logs a warning naming the key every time it
    # loads the file, which makes a load visible in its console log.
    tag = uuid.uuid4().hex[:8]
    installs = {"t-cold-dis.service": "[Install]\nWantedBy=multi-user.target\n", "t-cold-static.service": "",
                "t-cold-also.service": "[Install]\nAlso=t-cold-dis.service\n", "t-cold-barrier.service": ""}
    probe = {name: f"ReconcileProbe{tag}N{i}" for i, name in enumerate(installs)}
    for name, key in probe.items():
        nsystemd.write_unit(name, f"[Service]\nExecStart=/bin/sleep infinity\n{key}=1\n{installs[name]}")
    declared = ["t-cold-dis.service", "t-cold-static.service", "t-cold-also.service"]
    assert not in_memory(nsystemd, *probe) and not any(log_count(nsystemd, k) for k in probe.values())
    state = cli.state("version: 1\nunits:\n  t-cold-dis.service: {active: false, enabled: false}\n"
                      "  t-cold-static.service: {active: false}\n  t-cold-also.service: {active: false}\n")
    code, report = cli.json("diff", str(state))
    assert code == 0, report
    got = {n: (r["status"], r["observed"]["load_state"], r["observed"]["active_state"], r["observed"]["sub_state"],
               r["observed"]["unit_file_state"]) for n, r in by_name(report).items()}
    assert got == {"t-cold-dis.service": ("ok", "loaded", "inactive", "dead", "disabled"),
                   "t-cold-static.service": ("ok", "loaded", "inactive", "dead", "static"),
                   "t-cold-also.service": ("ok", "loaded", "inactive", "dead", "indirect")}
    # A barrier: systemd loads this one now and logs its warning, after any it logged during the diff.
    nsystemd.systemctl("show", "-p", "LoadState", "t-cold-barrier.service", check=True)
    wait_for(lambda: log_count(nsystemd, probe["t-cold-barrier.service"]), what="the barrier's warning")
    assert {n: log_count(nsystemd, probe[n]) for n in declared} == dict.fromkeys(declared, 0)
    assert not in_memory(nsystemd, *declared)
    # systemd says the same once asked (and its loading them shows in the log: the probe works)
    for n in declared:
        props = show_props(nsystemd, n)
        assert ("ok", props["LoadState"], props["ActiveState"], props["SubState"], props["UnitFileState"]) == got[n]
    wait_for(lambda: all(log_count(nsystemd, probe[n]) for n in declared), what="the declared units' warnings")


def test_observed_state_is_what_systemctl_show_reports(nsystemd, cli):
    """Every kind of unit, declared as it is (no drift, so no `show` where the listings suffice):
    the observed state in the report is what `systemctl show` says."""
    nsd = nsystemd
    running = {"t-z-run.service", "t-z-staticrun.service", "t-z-wants.service", "t-z-tpl@a.service",
               "t-z-maskrun.service", "t-z-trans.service"}
    nsd.write_unit("t-z-run.service", service("run"), enable=True)
    nsd.write_unit("t-z-en.service", service("en"), enable=True)
    nsd.write_unit("t-z-dis.service", service("dis"))
    nsd.write_unit("t-z-static.service", STATIC)
    nsd.write_unit("t-z-staticrun.service", STATIC)
    nsd.write_unit("t-z-tpl@.service", TEMPLATE)
    nsd.write_unit("t-z-real.service", service("real") + "Alias=t-z-alias.service\n")
    nsd.write_unit("t-z-real2.service", service("real2"))
    nsd.write_unit("t-z-also.service", STATIC + "[Install]\nAlso=t-z-dis.service\n")
    nsd.write_unit("t-z-drop.service", STATIC)
    nsd.write_unit("t-z-wants.service", "[Unit]\nWants=t-z-missing.service\n" + STATIC[len("[Unit]\n"):])
    alias2 = nsd.unit_dir / "t-z-alias2.service"  # a plain alias link, not made by `enable`
    with contextlib.ExitStack() as stack:
        for name in ("t-z-rt.service", "t-z-mask.service", "t-z-maskrun.service"):
            stack.enter_context(runtime_unit(nsd, name, service(name)))
        try:
            (nsd.unit_dir / "t-z-drop.service.d").mkdir()
            (nsd.unit_dir / "t-z-drop.service.d/install.conf").write_text("[Install]\nWantedBy=multi-user.target\n")
            alias2.symlink_to("/etc/systemd/system/t-z-real2.service")
            nsd.systemctl("daemon-reload", check=True)
            for name in ("t-z-real.service", "t-z-tpl@c.service"):
                nsd.systemctl("enable", name, check=True)
            for name in sorted(running - {"t-z-trans.service"}):
                nsd.systemctl("start", name, check=True)
            for name in ("t-z-mask.service", "t-z-maskrun.service"):
                nsd.systemctl("mask", name, check=True)
            nsd.run(["systemd-run", "--unit=t-z-trans", "/bin/sleep", "1000"], check=True)
            names = ["t-z-run.service", "t-z-en.service", "t-z-dis.service", "t-z-static.service",
                     "t-z-staticrun.service", "t-z-tpl@a.service", "t-z-tpl@b.service", "t-z-tpl@c.service",
                     "t-z-real.service", "t-z-alias.service", "t-z-real2.service", "t-z-alias2.service",
                     "t-z-also.service", "t-z-drop.service", "t-z-wants.service", "t-z-missing.service",
                     "t-z-ghost.service", "t-z-rt.service", "t-z-mask.service", "t-z-maskrun.service",
                     "t-z-trans.service"]
            state = cli.state("version: 1\nunits:\n" + "".join(
                f"  {n}: {{active: {str(n in running).lower()}}}\n" for n in names))
            code, report = cli.json("diff", str(state))
            assert code == 0, report
            seen = by_name(report)
            assert {n: r["status"] for n, r in seen.items()} == dict.fromkeys(names, "ok")
            fields = ("load_state", "active_state", "sub_state", "unit_file_state", "fragment_path")
            mine = {n: tuple(seen[n]["observed"][f] for f in fields) for n in names}
            props = {n: show_props(nsd, n) for n in names}
            theirs = {n: (p["LoadState"], p["ActiveState"], p["SubState"], p["UnitFileState"], p["FragmentPath"])
                      for n, p in props.items()}
            assert mine == theirs
            # the spread of cases is real
            assert {mine[n][3] for n in names} >= {"enabled", "disabled", "static", "indirect", "masked",
                                                   "transient", ""}
            assert mine["t-z-maskrun.service"][:3] == ("masked", "active", "running")
            assert mine["t-z-ghost.service"][0] == mine["t-z-missing.service"][0] == "not-found"
            # MainPID is read only where `show` was needed (an instance), not for a plain running unit
            assert int(props["t-z-run.service"]["MainPID"]) > 0 and seen["t-z-run.service"]["observed"]["main_pid"] == 0
            assert seen["t-z-tpl@a.service"]["observed"]["main_pid"] == int(props["t-z-tpl@a.service"]["MainPID"]) > 0
        finally:
            nsd.systemctl("stop", "t-z-tpl@a.service", "t-z-trans.service")
            nsd.systemctl("disable", "t-z-real.service", "t-z-tpl@c.service")
            if alias2.is_symlink():
                alias2.unlink()
            nsd.systemctl("daemon-reload")


def test_a_template_declared_with_any_state_does_not_load(nsystemd, cli):
    # Refused when the file is read (validate's check), so diff observes nothing at all: the
    # template's refusal and its systemd's word are in test_units_trust.py.
    nsystemd.write_unit("t-tp@.service", TEMPLATE)
    nsystemd.write_unit("t-tp-ok.service", service("ok"))
    state = cli.state("version: 1\nunits:\n  t-tp@.service: {active: false}\n  t-tp-ok.service: {active: false}\n")
    code, report = cli.json("diff", str(state))
    assert code == 1 and report["resources"] == [] and report["error"]["reason"] == "state-file", report
    [problem] = report["problems"]
    assert (problem["line"], problem["column"]) == (3, 3) and "template" in problem["message"], problem


def test_drifting_units_are_planned_from_systemctl_show(nsystemd, cli):
    nsystemd.write_unit("t-d-cold.service", service("cold"))  # disabled, not in memory, unit file in /etc
    nsystemd.write_unit("t-d-run.service", service("run"))
    nsystemd.systemctl("start", "t-d-run.service", check=True)
    state = cli.state("version: 1\nunits:\n  t-d-cold.service: {enabled: masked}\n"
                      "  t-d-run.service: {active: false}\n")
    code, report = cli.json("diff", str(state))
    assert code == 2
    seen = by_name(report)
    cold, run = seen["t-d-cold.service"], seen["t-d-run.service"]
    assert cold["status"] == "blocked" and "/etc/systemd/system/t-d-cold.service" in cold["message"]
    assert cold["observed"]["fragment_path"] == nsystemd.show("t-d-cold.service", "FragmentPath")
    assert run["status"] == "drift" and [a["action"] for a in run["actions"]] == ["stop"]
    assert run["observed"]["main_pid"] == nsystemd.main_pid("t-d-run.service") > 0


def test_install_sections_read_as_systemd_reads_them(nsystemd):
    """The [Install] cases the reader decides without systemd (tests/test_units_unitfiles.py),
    checked against systemd: written byte for byte, then `is-enabled` of each."""
    decided = [(f"t-inst{i}.service", label, data, want) for i, (label, data, want) in enumerate(INSTALL_CASES)
               if want]
    try:
        for name, _, data, _ in decided:
            (nsystemd.unit_dir / name).write_bytes(data)
        nsystemd.systemctl("daemon-reload", check=True)
        assert {label: is_enabled(nsystemd, name) for name, label, _, _ in decided} == {
            label: want for _, label, _, want in decided}
    finally:
        for name, _, _, _ in decided:
            (nsystemd.unit_dir / name).unlink(missing_ok=True)
        nsystemd.systemctl("daemon-reload")


_ = sys
