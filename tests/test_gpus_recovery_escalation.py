"""Recovery escalates as declared: a reset whose validation gate then fails is followed by the
reboot when `recover.reboot` allows it (within `max_reboots`, journaled as an escalation), and by a
person after that; without `reboot`, `blocked` with the gate's tail, as before. The CLI on the fake
libnvidia-ml and its nvidia-smi stand-in (tests/test_gpus_recovery.py's Rig), real gate commands,
and the journal the caps count from. Nothing reboots: the `systemctl` first on PATH refuses
`reboot` and records that it was asked."""

from __future__ import annotations

from test_gpus_recovery import Rig, actions, gpu_uuid, gpus, state

FAILS = "[sh, -c, 'echo NCCL all_reduce: 3 of 8 ranks timed out >&2; exit 1']"


def body(recover: str) -> str:
    return state(recover=recover, validate=f"{{command: {FAILS}, after: [recover]}}")


def reset_then_failed_gate(rig: Rig, recover: str) -> None:
    """First apply: the reset is done (NVML says the fault is gone), then the gate fails."""
    code, report = rig.run("apply", body(recover))
    assert rig.resets() == [(1, "ok")] and rig.health()[1]["ecc_volatile"] == 0
    assert [(a, r) for a, _, r in actions(report)] == [("reset", "done"), ("validate", "failed")], report
    assert code != 0


def journal(rig: Rig, action: str, event: str) -> list[dict]:
    return [e for e in rig.lines() if e.get("action") == action and e["event"] == event]


def test_a_gate_failing_after_a_reset_escalates_to_the_reboot_then_to_a_person(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus(ecc_volatile=2))
    recover = "{reset: true, reboot: true, max_reboots: 2}"
    reset_then_failed_gate(rig, recover)
    reset_at = journal(rig, "reset", "intent")[0]["time"]

    # The next step, planned: the reboot, saying it escalates from that reset and why.
    code, plan = rig.run("apply", body(recover), "--dry-run")
    assert code == 2 and [(a, t, r) for a, t, r in actions(plan)] == [("reboot", "node", "planned")], plan
    said = plan["actions"][0]["description"]
    assert f"escalation: after the reset at {reset_at[:19]}" in said and "3 of 8 ranks timed out" in said, said
    assert gpu_uuid(1) in said and not rig.reboot_asked.exists()

    # Carried out: journaled (intent first, with this boot) as an escalation; the init system is asked.
    rig.run("apply", body(recover))
    assert rig.reboot_asked.read_text().split() == ["reboot"]
    intent = journal(rig, "reboot", "intent")
    assert len(intent) == 1 and "escalation: after the reset at" in intent[0]["description"]
    assert intent[0]["boot"] == journal(rig, "reset", "intent")[0]["boot"]
    assert rig.resets() == [(1, "ok")]  # never reset again in this boot

    # The node came back (a new boot): the gate runs after the reboot; failing again, a person is next.
    rig.new_boot()
    code, report = rig.run("apply", body(recover))
    assert [(a, r) for a, _, r in actions(report)] == [("validate", "failed")], report
    code, report = rig.run("apply", body(recover))
    assert code == 2 and report["status"] == "blocked" and report["actions"] == []
    assert "the validation gate" in report["message"] and "3 of 8 ranks timed out" in report["message"]
    assert rig.reboot_asked.read_text().split() == ["reboot"] and rig.resets() == [(1, "ok")]


def test_the_escalation_stops_at_max_reboots_with_the_history(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus(ecc_volatile=2))
    recover = "{reset: true, reboot: true, max_reboots: 1}"
    reset_then_failed_gate(rig, recover)
    rig.run("apply", body(recover))  # the one reboot allowed (refused by the test's systemctl)
    asked = journal(rig, "reboot", "intent")
    assert len(asked) == 1 and rig.reboot_asked.read_text().split() == ["reboot"]
    code, report = rig.run("apply", body(recover))
    assert code == 2 and report["status"] == "blocked" and report["actions"] == []
    message = report["message"]
    assert "needs service: reconcile rebooted it 1 time(s) in 24h (max_reboots 1)" in message, message
    assert asked[0]["time"][:19] in message and "escalation: after the reset at" in message
    assert rig.reboot_asked.read_text().split() == ["reboot"]


def test_without_reboot_a_gate_failing_after_a_reset_stays_blocked_with_its_tail(tmp_path, fake_lib):
    rig = Rig(tmp_path, fake_lib, gpus(ecc_volatile=2))
    reset_then_failed_gate(rig, "{reset: true}")
    code, report = rig.run("apply", body("{reset: true}"))
    assert code == 2 and report["status"] == "blocked" and report["actions"] == []
    assert "the validation gate" in report["message"] and "3 of 8 ranks timed out" in report["message"]
    assert "reboot the node" not in report["message"] and not rig.reboot_asked.exists()
    assert rig.resets() == [(1, "ok")]
