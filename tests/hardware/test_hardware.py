"""The hardware suite as a pytest test, for a machine with a real NVIDIA driver (hwsuite.py).

It changes GPU 0's power limit and compute mode (and sets them back) and runs a CUDA holder, so
it runs only when asked: RECONCILE_HARDWARE=1 (tests/hardware/run.sh is the one command; this is
the same run under pytest). Everywhere else, CI included, it is skipped with a `[ci-ok]` reason:
no machine in CI has a GPU. Its comparison code runs in every test run against the fake driver
(tests/test_hardware_suite.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import hwsuite
import pytest


def test_reconcile_agrees_with_the_real_driver(tmp_path):
    if os.environ.get("RECONCILE_HARDWARE") != "1":
        pytest.skip("the hardware suite runs only when asked (RECONCILE_HARDWARE=1, or tests/hardware/run.sh): "
                    "it sets GPU 0's power limit and compute mode and back [ci-ok]")
    why = hwsuite.hardware_missing()
    if why:
        pytest.skip(why)
    out = Path(os.environ.get("OUT") or tmp_path / "hardware-report")
    sections, why_not = hwsuite.sections_for_this_user()
    if why_not:
        pytest.skip(f"{why_not} (run it with sudo)")
    report = hwsuite.Suite(out, hwsuite.Rig()).run_all(sections)
    bad = {k: v["status"] for k, v in report["sections"].items() if v["status"] in ("disagree", "error")}
    assert not bad, (out / "report.txt").read_text()
