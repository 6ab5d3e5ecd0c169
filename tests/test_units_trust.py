"""What a unit may be trusted for, against the namespaced systemd 252 (tests/nsystemd.py):

- a mount unit that exists only from the mount table (no unit file, UnitFileState empty) declared
  `enabled: true`: systemctl itself refuses to enable it, and reconcile blocks with the step
  instead of planning an `enable` that would fail;
- a template declared `active: true`: systemctl itself refuses to start it, and `validate`
  refuses the state at the value; an instance of the same template validates and is started;
- a template declared with any other state (`active: false`, `enabled:`, masked): systemd has no
  state of the template's own to show, so `validate` (and diff's, apply's loading) refuses it at
  the name, instead of diff failing on it.
"""

from __future__ import annotations

import re

import pytest
from cli_support import NsCli, is_active, service, wait_for


@pytest.fixture
def cli(nsystemd, tmp_path):
    return NsCli(nsystemd, tmp_path)


def test_enabling_a_mount_unit_without_a_unit_file_is_blocked(nsystemd, cli, tmp_path):
    where = tmp_path / "scratch"
    where.mkdir()
    unit = nsystemd.run(["systemd-escape", "--path", "--suffix=mount", str(where)], check=True).stdout.strip()
    nsystemd.run(["mount", "-t", "tmpfs", "trust-scratch", str(where)], check=True)
    try:
        wait_for(lambda: nsystemd.show(unit, "ActiveState") == "active", what=f"{unit} seen by systemd")
        # systemd's own word: a loaded unit with no unit file, which it will not enable.
        assert nsystemd.show(unit, "LoadState") == "loaded"
        assert nsystemd.show(unit, "UnitFileState") == ""
        refused = nsystemd.systemctl("enable", unit)
        assert refused.returncode != 0 and "does not exist" in refused.stderr, refused
        state = cli.state(f"version: 1\nunits:\n  {unit}:\n    enabled: true\n")
        rc, doc = cli.json("diff", str(state))
        [res] = doc["resources"]
        assert (rc, res["status"], res["actions"]) == (2, "blocked", []), res
        assert "has no unit file" in res["message"] and "fstab" in res["message"], res["message"]
        rc, doc = cli.json("apply", str(state))
        [res] = doc["resources"]
        assert res["status"] == "blocked" and res["actions"] == [], res
        assert not [e for e in cli.journal_lines() if e.get("action") == "enable"]  # never attempted
        assert nsystemd.show(unit, "UnitFileState") == ""
    finally:
        nsystemd.run(["umount", str(where)])


def test_a_template_cannot_be_declared_active_but_its_instance_can(nsystemd, cli):
    nsystemd.write_unit("t-tpl@.service", service("tpl %i"))
    refused = nsystemd.systemctl("start", "t-tpl@.service")
    assert refused.returncode != 0 and "instance name" in refused.stderr, refused  # systemd's refusal
    state = cli.state("version: 1\nunits:\n  t-tpl@.service:\n    active: true\n")
    proc = cli("validate", str(state))
    assert proc.returncode == 1 and proc.stderr == (
        f'{state}:4:13: units."t-tpl@.service".active: a template cannot be active (systemd starts only its '
        "instances); declare an instance such as t-tpl@NAME.service\n"), proc.stderr
    state = cli.state("version: 1\nunits:\n  t-tpl@a.service:\n    active: true\n", "instance.yaml")
    rc, doc = cli.json("apply", str(state))
    assert rc == 0, doc
    assert is_active(nsystemd, "t-tpl@a.service") == "active"
    nsystemd.systemctl("stop", "t-tpl@a.service")


@pytest.mark.parametrize("declared", ["active: false", "enabled: true", "enabled: false", "enabled: masked"])
def test_a_template_has_no_state_of_its_own_so_no_state_validates(nsystemd, cli, declared):
    nsystemd.write_unit("t-tpl@.service", service("tpl %i"))
    # systemd's own word: what diff would have to read does not exist for a template.
    shown = nsystemd.systemctl("show", "t-tpl@.service", "-p", "ActiveState,UnitFileState")
    asked = nsystemd.systemctl("is-active", "t-tpl@.service")
    assert shown.returncode != 0 and asked.returncode != 0, (shown, asked)
    [why] = re.findall(r"t-tpl@\.service is (neither .*?)\.$", shown.stderr, re.M)
    assert why in asked.stderr, asked
    state = cli.state(f"version: 1\nunits:\n  t-tpl@.service:\n    {declared}\n")
    expected = (f'{state}:3:3: units."t-tpl@.service": a template has no state of its own to check: systemd '
                f'keeps one only for its instances (`systemctl show t-tpl@.service`: "{why}"); declare an '
                "instance such as t-tpl@NAME.service\n")
    proc = cli("validate", str(state))
    assert (proc.returncode, proc.stderr) == (1, expected), proc
    for command in ("diff", "apply"):
        proc = cli(command, str(state))
        assert (proc.returncode, proc.stderr) == (1, expected), (command, proc)
    assert cli.journal_lines() == []  # nothing was observed or done
