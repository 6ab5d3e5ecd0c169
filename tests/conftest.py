"""Shared pytest fixtures.

``nsystemd`` lives next to this file (tests/ is put on sys.path by pytest's
default "prepend" import mode, as tests/ has no __init__.py).
"""

from __future__ import annotations

import os

import pytest
from nsystemd import NamespacedSystemd

# -- a real systemd in a PID+mount+UTS namespace (tests/nsystemd.py) ----------


@pytest.fixture(scope="session")
def systemd_ns():
    """One namespaced systemd for the whole session (skips without root etc.)."""
    why = NamespacedSystemd.missing_prerequisites()
    if why:
        pytest.skip(f"namespaced systemd unavailable: {why}")
    with NamespacedSystemd() as nsd:
        yield nsd


@pytest.fixture
def nsystemd(systemd_ns):
    """The session's namespaced systemd, reset after the test: units written
    with write_unit() are stopped and removed, the host name is restored."""
    yield systemd_ns
    systemd_ns.reset()


# -- CI must not skip the real-system tests -------------------------------------
# CI runs as root with everything installed (see .ci/run). There a skipped test means
# a real-system test silently did not run, so the session fails. A skip that is
# legitimate even in CI says so in its reason with the marker "[ci-ok]".

_SKIPPED_IN_CI: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and os.environ.get("CI"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "[ci-ok]" not in reason:
            _SKIPPED_IN_CI.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if _SKIPPED_IN_CI:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _SKIPPED_IN_CI:
        terminalreporter.section("tests skipped under CI=true (not allowed)", red=True)
        for line in _SKIPPED_IN_CI:
            terminalreporter.write_line(line)


# -- the fake GPU driver (tests/fakenvml/), built once a session --------------------------------


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory):
    """The directory holding the fake libnvidia-ml.so.1, for LD_LIBRARY_PATH (gpu_support.nvml_env).
    Its state lives in each test's own files (FakeConfig), never beside the library."""
    import subprocess

    from gpu_support import build_fake_nvml

    try:
        return build_fake_nvml(tmp_path_factory.mktemp("fakenvml"))
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot build the fake libnvidia-ml.so.1: {exc}")


@pytest.fixture
def holders():
    """Processes standing in for a GPU's holders (gpu_support.Holders), killed after the test."""
    from gpu_support import Holders

    h = Holders()
    yield h
    h.cleanup()
