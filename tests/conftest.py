"""Shared pytest fixtures.

``nsystemd`` lives next to this file (tests/ is put on sys.path by pytest's
default "prepend" import mode, as tests/ has no __init__.py).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from nsystemd import NamespacedSystemd

# -- the lanes (docs/testing.md#lanes) ---------------------------------------------------------
# pure: no host touched: data in (dataclasses, state files, files in a temporary directory),
#   drift, plan, report or error out; runs anywhere, no root.
# reference: expected answers from upstream: its test tables, outputs captured from the real
#   programs (tests/data/<kind>/, with provenance), or its tool run offline (findmnt --tab-file,
#   systemctl --root); no root, no daemon.
# system: the CLI or a kind against real components: the namespaced systemd, mount namespaces,
#   FUSE, real processes and daemons (sshd, dockerd, podman, slurmctld, Prometheus), the fake
#   NVML built with gcc, torch and the training frameworks; as root in CI.
# terminal: the text views (diff, apply, log, watch, errors, --help) as a person reads them on a
#   real pseudo-terminal, colour on and off, TERM=dumb, a narrow window; no root.
# Every test file names its lane here (a file missing from the table fails the collection, so a
# new file must choose); a test that belongs to another lane than its file's carries that lane's
# marker itself (@pytest.mark.system). `pytest -m "not system"` is the inner loop.
LANES = ("pure", "reference", "system", "terminal")
LANE_OF_FILE = {
    "test_add_a_format.py": "pure",
    "test_add_a_kind.py": "pure",
    "test_add_a_sink.py": "pure",
    "test_ansible.py": "system",
    "test_cache_auth.py": "pure",
    "test_checkpoints.py": "pure",  # the Megatron tests (real torch) are marked system
    "test_checkpoints_accelerate.py": "system",
    "test_checkpoints_frameworks.py": "system",
    "test_checkpoints_more_frameworks.py": "system",
    "test_checkpoints_records.py": "system",
    "test_cli_manners.py": "pure",
    "test_containers.py": "system",
    "test_containers_plan.py": "reference",
    "test_containers_podman.py": "system",
    "test_containers_units.py": "system",
    "test_crash.py": "system",
    "test_docs.py": "system",
    "test_engine.py": "pure",
    "test_extractions.py": "system",
    "test_extractions_integrity.py": "system",
    "test_extractions_job.py": "system",
    "test_extractions_fastpath.py": "system",
    "test_extractions_parallel.py": "system",
    "test_extractions_plan.py": "pure",
    "test_extractions_quarantine.py": "system",
    "test_extractions_torch.py": "system",
    "test_file_bounds.py": "pure",
    "test_extractions_zero_tail.py": "system",
    "test_fakenvml_abi.py": "reference",
    "test_fast_diff.py": "pure",
    "test_fuzz_files.py": "pure",
    "test_fuzz_statefile.py": "pure",
    "test_gitops.py": "system",  # the two schema tests are marked pure
    "test_gpus.py": "system",
    "test_gpus_boot.py": "system",
    "test_gpus_containers.py": "system",
    "test_gpus_corpus.py": "reference",
    "test_gpus_exemptions.py": "system",
    "test_gpus_kernel_log.py": "system",
    "test_gpus_nvml.py": "system",
    "test_gpus_nvml_lists.py": "system",
    "test_gpus_plan.py": "pure",
    "test_gpus_recovery.py": "system",
    "test_gpus_pcibus.py": "system",
    "test_gpus_recovery_boot.py": "system",
    "test_gpus_recovery_escalation.py": "system",
    "test_gpus_settings.py": "system",
    "test_gpus_settings_plan.py": "pure",
    "test_gpus_temperature.py": "system",
    "test_gpus_xid.py": "reference",
    "test_hardening.py": "pure",
    "test_hardware_suite.py": "system",
    "test_host_doubles.py": "pure",
    "test_inventory.py": "system",
    "test_journal.py": "pure",
    "test_kernel_log_quotes.py": "reference",
    "test_kernel_log_block_fold.py": "reference",
    "test_junit_report.py": "system",  # the in-memory rendering tests are marked pure
    "test_kind_metrics.py": "system",
    "test_layers.py": "pure",
    "test_log.py": "system",
    "test_mounts.py": "system",
    "test_mounts_kernel.py": "system",
    "test_mounts_mount8.py": "system",
    "test_mounts_plan.py": "pure",
    "test_mounts_tables.py": "reference",
    "test_mounts_trust.py": "system",
    "test_nsystemd.py": "system",
    "test_own_files.py": "system",
    "test_progress.py": "pure",
    "test_pools_alerts.py": "pure",
    "test_pools_ceph.py": "system",
    "test_pools_parsers.py": "pure",
    "test_prometheus.py": "system",
    "test_prometheus_alerts.py": "system",
    "test_prometheus_live.py": "system",
    "test_refusals.py": "system",
    "test_remote.py": "system",
    "test_output_escapes.py": "pure",  # the --via test through the real sshd is marked system
    "test_report_text.py": "pure",
    "test_runs.py": "pure",
    "test_saved_plan.py": "system",
    "test_schema_edges.py": "pure",
    "test_seed_recovery.py": "system",
    "test_slurm.py": "system",
    "test_slurm_gate.py": "system",
    "test_slurm_guard.py": "system",
    "test_slurm_reboot.py": "system",
    "test_statefile.py": "pure",
    "test_statefile_limits.py": "pure",
    "test_startup_imports.py": "pure",  # the tests with the fake GPU driver are marked system
    "test_terminal.py": "terminal",
    "test_suite_guards.py": "pure",
    "test_units.py": "system",
    "test_usertree.py": "pure",
    "test_usertree_adversarial.py": "system",
    "test_units_differential.py": "system",
    "test_units_plan.py": "pure",
    "test_units_trust.py": "system",
    "test_units_unitfiles.py": "reference",
    "test_words.py": "pure",
    "test_vocabulary.py": "pure",
    "test_watch.py": "system",
    "hardware/test_hardware.py": "system",
}
_TESTS = Path(__file__).parent


def lane_of(item) -> str:
    """The test's own lane marker, else its file's lane in LANE_OF_FILE."""
    own = {m.name for m in item.iter_markers() if m.name in LANES}
    if len(own) > 1:
        raise pytest.UsageError(f"{item.nodeid}: in {len(own)} lanes ({', '.join(sorted(own))}); a test is in one")
    if own:
        return own.pop()
    rel = Path(item.path).relative_to(_TESTS).as_posix() if Path(item.path).is_relative_to(_TESTS) else None
    lane = LANE_OF_FILE.get(rel)
    if lane not in LANES:
        raise pytest.UsageError(f"{rel or item.path}: no lane; add it to LANE_OF_FILE in tests/conftest.py "
                                f"as one of {', '.join(LANES)} (docs/testing.md#lanes)")
    return lane


_LANE_OF_TEST: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers added here
def pytest_collection_modifyitems(items):
    for item in items:
        _LANE_OF_TEST[item.nodeid] = lane = lane_of(item)
        item.add_marker(lane)


# Each lane's share of the run, printed at the end (CI's log keeps it; docs/testing.md#lanes).
_LANE_SECONDS: Counter = Counter()
_LANE_TESTS: Counter = Counter()

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
    lane = _LANE_OF_TEST.get(report.nodeid)
    if lane:
        _LANE_SECONDS[lane] += report.duration
        _LANE_TESTS[lane] += report.when == "call" or (report.when == "setup" and report.skipped)
    if report.skipped and os.environ.get("CI"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "[ci-ok]" not in reason:
            _SKIPPED_IN_CI.append(f"{report.nodeid}: {reason}")


# Tests write only into temporary directories and namespaces. The kinds' records go to a
# session-wide temporary state directory unless a test names its own (every reconcile the tests
# start inherits it); what still lands in the machine's own /var/lib/reconcile (a root apply
# without --journal, a reconcile started where the environment does not reach) is listed at the
# end of the run, to be fixed in the test that wrote it; under CI=true the run fails for it.
# RECONCILE_TESTS_HOST_DIR stands in for it in tests/test_suite_guards.py, which checks this check.
_HOST_DIR = os.environ.get("RECONCILE_TESTS_HOST_DIR") or "/var/lib/reconcile"
_HOST_SEEN: dict[str, float] = {}
_HOST_WRITTEN: list[str] = []


def _host_files() -> dict[str, float]:
    found = {}
    for folder, _dirs, files in os.walk(_HOST_DIR):
        for name in files:
            path = os.path.join(folder, name)
            try:
                found[path] = os.stat(path).st_mtime
            except OSError:
                pass
    return found


def pytest_sessionstart(session):
    import tempfile

    os.environ.setdefault("RECONCILE_STATE_DIR", tempfile.mkdtemp(prefix="reconcile-test-state-"))
    # The validation cache too: as root its default is the machine's /var/cache/reconcile.
    os.environ.setdefault("RECONCILE_CACHE_DIR", tempfile.mkdtemp(prefix="reconcile-test-cache-"))
    _HOST_SEEN.update(_host_files())


def _host_written() -> list[str]:
    return sorted(p for p, t in _host_files().items() if _HOST_SEEN.get(p) != t)


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller, which saw the machine before any worker, judges
    _HOST_WRITTEN[:] = _host_written()
    if _SKIPPED_IN_CI or (_HOST_WRITTEN and os.environ.get("CI")):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _LANE_TESTS:
        terminalreporter.write_line("lanes: " + "; ".join(
            f"{lane} {_LANE_TESTS[lane]} tests {_LANE_SECONDS[lane]:.0f}s" for lane in LANES if _LANE_TESTS[lane])
            + " (setup, call and teardown)")
    if _HOST_WRITTEN and os.environ.get("CI"):
        terminalreporter.section(f"the tests wrote the machine's own {_HOST_DIR} (not allowed)", red=True)
        for path in _HOST_WRITTEN:
            terminalreporter.write_line(path)
    elif _HOST_WRITTEN:
        terminalreporter.write_line(f"warning: the tests wrote the machine's own {_HOST_DIR}: "
                                    f"{', '.join(_HOST_WRITTEN)}")
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
