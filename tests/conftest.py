"""Shared pytest fixtures.

``nsystemd`` lives next to this file (tests/ is put on sys.path by pytest's
default "prepend" import mode, as tests/ has no __init__.py).
"""

from __future__ import annotations

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
