"""Prometheus's own `promtool` on the rule files of contrib/prometheus/: `check rules` and their
unit tests (`test rules`), as shipped and with one rule broken on purpose."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PROMTOOL = "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(not os.access(PROMTOOL, os.X_OK),
                                    reason="promtool not installed (Debian: prometheus)")


def promtool(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def rule_tests_with(rules: Path, rules_test: Path, old: str, new: str, scratch: Path) -> subprocess.CompletedProcess:
    """`promtool test rules` on copies in SCRATCH where RULES has its one OLD replaced by NEW."""
    text = rules.read_text()
    assert text.count(old) == 1
    (scratch / rules.name).write_text(text.replace(old, new))
    shutil.copy(rules_test, scratch / rules_test.name)
    return promtool("test", "rules", rules_test.name, cwd=scratch)
