"""`--format junit`: one test case per resource; drift, blocked and errors as failures/errors."""

from __future__ import annotations

import io
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv
from gitops_support import cli, is_active, service  # noqa: F401  (cli is a fixture)
from reconcile_host.views.junit import render_junit

CASE_CHILDREN = {"failure", "error", "skipped", "system-out", "system-err"}


def junit_of(doc: dict) -> ET.Element:
    out = io.StringIO()
    render_junit(doc, out)
    text = out.getvalue()
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    return ET.fromstring(text.encode())


def check_junit_shape(root: ET.Element) -> None:
    """The essentials of the JUnit XML schema CI systems read (Jenkins/Ant junit.xsd):
    testsuites > testsuite > testcase, required attributes, counts that add up."""
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert suites
    for suite in suites:
        for attr in ("name", "tests", "failures", "errors"):
            assert attr in suite.attrib, attr
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == sum(1 for c in cases if c.find("failure") is not None)
        assert int(suite.get("errors")) == sum(1 for c in cases if c.find("error") is not None)
        for case in cases:
            assert case.get("name") and case.get("classname")
            assert {child.tag for child in case} <= CASE_CHILDREN
            for bad in case.findall("failure") + case.findall("error"):
                assert bad.get("message") and bad.get("type")


def res(rid, kind, status, drift=(), actions=(), message="", **extra):
    return {"id": rid, "kind": kind, "status": status, "drift": list(drift), "actions": list(actions),
            "message": message, **extra}


def doc_with(*resources, command="diff") -> dict:
    statuses = ["ok", "drift", "converging", "blocked", "error"]
    return {
        "format_version": "1", "reconcile_version": "0.1.0", "command": command, "dry_run": False,
        "state_file": "states/kpro6.yaml", "host": "kpro6", "host_pattern": "kpro6*", "host_matches": True,
        "started": 1_700_000_000.0, "duration_s": 0.25, "exit_code": 2, "resources": list(resources),
        "summary": {**{s: sum(1 for r in resources if r["status"] == s) for s in statuses},
                    "actions_planned": 0, "actions_done": 0, "actions_failed": 0},
        "notes": [],
    }


VLLM = "vllm-kimi-k25-int4.service"
SEED = doc_with(
    res(f"unit:{VLLM}", "unit", "drift",
        [{"field": "active", "want": False, "have": True}, {"field": "enabled", "want": False, "have": True}],
        [{"action": "disable", "target": VLLM, "description": f"disable {VLLM}", "result": "planned"},
         {"action": "stop", "target": VLLM, "description": f"stop {VLLM}", "result": "planned"}]),
    res("gpus", "gpus", "blocked", [{"field": "gpu0.memory_used", "want": "<= 1024 MiB", "have": "75800 MiB"}],
        message="pid 4242 (python) holding 75800 MiB on GPU 0 is not in gpus.allow"),
    res("mount:/data", "mount", "ok", summary="/dev/nvme1n1 ext4"),
    res("extraction:eagle3", "extraction", "converging", [{"field": "done", "want": ">= 37312", "have": 18400}],
        message="unit extract.service running (active): 18400/37312 (49%)"),
    res("unit:gone.service", "unit", "error", message="cannot read unit state from systemd: exited 1"),
)


@pytest.mark.pure
def test_one_testcase_per_resource_with_status_mapping():
    root = junit_of(SEED)
    check_junit_shape(root)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert list(cases) == [r["id"] for r in SEED["resources"]]
    assert {c.get("name"): c.get("classname") for c in cases.values()}["gpus"] == "gpus"
    assert cases[f"unit:{VLLM}"].get("classname") == "unit"

    drift = cases[f"unit:{VLLM}"].find("failure")
    assert drift.get("type") == "drift"
    assert drift.get("message") == "drift: active: true -> false, enabled: true -> false"
    assert "active: want false, have true" in drift.text
    assert f"planned: stop {VLLM}" in drift.text

    blocked = cases["gpus"].find("failure")
    assert blocked.get("type") == "blocked" and "not in gpus.allow" in blocked.get("message")
    assert "gpu0.memory_used: want <= 1024 MiB, have 75800 MiB" in blocked.text

    assert cases["mount:/data"].find("failure") is None and cases["mount:/data"].find("error") is None

    conv = cases["extraction:eagle3"]
    assert conv.find("failure") is None and conv.find("error") is None
    assert "18400/37312" in conv.find("system-out").text

    err = cases["unit:gone.service"].find("error")
    assert err is not None and "cannot read unit state" in err.get("message")

    suite = root.find("testsuite")
    counts = [suite.get(k) for k in ("tests", "failures", "errors", "skipped")]
    assert counts == ["5", "2", "1", "0"]
    assert suite.get("hostname") == "kpro6" and suite.get("timestamp") == "2023-11-14T22:13:20"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["state_file"] == "states/kpro6.yaml" and props["exit_code"] == "2"


@pytest.mark.pure
def test_markup_and_control_characters_stay_valid_xml():
    nasty = 'exit 1: <b>&"quoted"</b> \x1b[31mred\x1b[0m \x00'
    root = junit_of(doc_with(res("unit:a&b<c>.service", "unit", "error", message=nasty)))
    check_junit_shape(root)
    case = root.find("testsuite/testcase")
    assert case.get("name") == "unit:a&b<c>.service"
    assert '<b>&"quoted"</b>' in case.find("error").text
    assert "\x1b" not in case.find("error").text


@pytest.mark.pure
def test_apply_results_failed_and_done():
    doc = doc_with(
        res("unit:a.service", "unit", "ok", actions=[{"action": "stop", "target": "a.service", "result": "done"}]),
        res("unit:b.service", "unit", "drift", [{"field": "active", "want": True, "have": False}],
            [{"action": "start", "target": "b.service", "result": "failed", "message": "Job failed"}],
            message="not verified: drift remains after acting; start b.service failed: Job failed"),
        command="apply")
    root = junit_of(doc)
    check_junit_shape(root)
    a, b = root.iter("testcase")
    assert a.find("failure") is None and "done: stop a.service" in a.find("system-out").text
    assert "failed: start b.service: Job failed" in b.find("failure").text
    assert root.get("name") == "reconcile apply"


@pytest.mark.pure
def test_empty_report():
    root = junit_of(doc_with())
    check_junit_shape(root)
    assert root.get("tests") == "0"


@pytest.mark.skipif(Path("/run/systemd/system").exists(), reason="this host runs systemd as PID 1 [ci-ok]")
def test_cli_junit_error_report_when_systemd_unreachable(tmp_path):
    state = tmp_path / "s.yaml"
    state.write_text("version: 1\nunits:\n  vllm.service:\n    active: false\n")
    proc = subprocess.run(reconcile_argv("diff", "--format", "junit", str(state)), capture_output=True, text=True,
                          env=cli_env(tmp_path))
    assert proc.returncode == 1
    root = ET.fromstring(proc.stdout.encode())
    check_junit_shape(root)
    err = root.find("testsuite/testcase/error")
    assert root.find("testsuite/testcase").get("name") == "unit:vllm.service"
    assert "cannot read unit state" in err.get("message")


def test_cli_junit_diff_and_apply_on_real_systemd(nsystemd, cli):  # noqa: F811
    nsystemd.write_unit("t-junit.service", service("junit"))
    nsystemd.systemctl("start", "t-junit.service", check=True)
    state = cli.state("version: 1\nunits:\n  t-junit.service:\n    active: false\n")
    proc = cli("diff", "--format", "junit", str(state))
    assert proc.returncode == 2, proc.stderr
    root = ET.fromstring(proc.stdout.encode())
    check_junit_shape(root)
    failure = root.find("testsuite/testcase/failure")
    assert failure.get("type") == "drift" and "active: want false, have true" in failure.text

    proc = cli("apply", "--format", "junit", str(state))
    assert proc.returncode == 0, proc.stderr
    root = ET.fromstring(proc.stdout.encode())
    check_junit_shape(root)
    case = root.find("testsuite/testcase")
    assert case.find("failure") is None and "done: stop t-junit.service" in case.find("system-out").text
    assert is_active(nsystemd, "t-junit.service") == "inactive"
