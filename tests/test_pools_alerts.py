"""The pools kind's alerting rules (contrib/prometheus/reconcile-ceph.rules.yml) with Prometheus's
own promtool: they load, their unit tests pass, and a rule broken on purpose fails them (the
unit tests can fail). tests/test_pools_ceph.py feeds them the series of a real run against a real
Ceph."""

from __future__ import annotations

from pathlib import Path

from promtool_support import needs_promtool, promtool, rule_tests_with

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "contrib" / "prometheus" / "reconcile-ceph.rules.yml"
RULES_TEST = ROOT / "contrib" / "prometheus" / "reconcile-ceph.rules.test.yml"


@needs_promtool
def test_the_rules_load_and_their_unit_tests_pass():
    check = promtool("check", "rules", str(RULES), timeout=30)
    assert check.returncode == 0 and "SUCCESS: 2 rules found" in check.stdout, check.stdout + check.stderr
    test = promtool("test", "rules", str(RULES_TEST), cwd=RULES.parent)
    assert test.returncode == 0, test.stdout + test.stderr


@needs_promtool
def test_a_broken_rule_fails_its_unit_tests(tmp_path):
    broken = rule_tests_with(RULES, RULES_TEST, "reconcile_pool_days_to_full < 5", "reconcile_pool_days_to_full < 2",
                             tmp_path)
    assert broken.returncode != 0 and "ReconcilePoolFillsSoon" in broken.stdout + broken.stderr
