"""The suite's own guards, run as CI runs them: a child pytest on this file's probe, with the
machine's reconcile directory replaced by a temporary one (RECONCILE_TESTS_HOST_DIR)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = "RECONCILE_TESTS_WRITE_PROBE"


def test_probe_writes_the_host_directory():
    """Only in the child: a test that leaves a file where reconcile's own records live."""
    if not os.environ.get(PROBE):
        return
    folder = Path(os.environ["RECONCILE_TESTS_HOST_DIR"]) / "extractions"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe.check.json").write_text("{}\n")


def child(host_dir: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    full.update({"RECONCILE_TESTS_HOST_DIR": str(host_dir), PROBE: "1", **env})
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
            f"{__file__}::test_probe_writes_the_host_directory"]
    return subprocess.run(argv, capture_output=True, text=True, env=full, cwd=Path(__file__).parent.parent,
                          timeout=300)


def test_a_write_to_the_machines_reconcile_directory_fails_the_run_under_ci(tmp_path):
    host = tmp_path / "var-lib-reconcile"
    host.mkdir()
    proc = child(host, CI="true")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "(not allowed)" in out and str(host / "extractions" / "probe.check.json") in out, out
    # Outside CI the same run passes, with the warning naming the file.
    (host / "extractions" / "probe.check.json").unlink()
    proc = child(host)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"warning: the tests wrote the machine's own {host}: {host / 'extractions' / 'probe.check.json'}" in out


def test_a_run_that_writes_nothing_there_passes_under_ci(tmp_path):
    host = tmp_path / "var-lib-reconcile"
    (host / "extractions").mkdir(parents=True)
    (host / "extractions" / "older.check.json").write_text("{}\n")  # there before the run: not the tests'
    proc = child(host, CI="true", **{PROBE: ""})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "1 passed" in out, out
    assert "not allowed" not in out and "the tests wrote" not in out, out
