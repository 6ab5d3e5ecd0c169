"""The tools under test: the peers' virtual environment and a fresh `pip install .` of reconcile."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from common import PEER_PACKAGES, PEERS, RECONCILE_VENV, ROOT, log


def ensure_peers() -> dict[str, str]:
    """Create bench/.peers with the peer tools if missing; return their versions."""
    if not (PEERS / "bin" / "ansible-playbook").exists() or not (PEERS / "bin" / "pyinfra").exists() \
            or not (PEERS / "bin" / "pytest").exists():
        log(f"installing {', '.join(PEER_PACKAGES)} into {PEERS}")
        subprocess.run([sys.executable, "-m", "venv", str(PEERS)], check=True)
        subprocess.run([str(PEERS / "bin" / "pip"), "install", "-q", *PEER_PACKAGES], check=True)
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            f"{list(PEER_PACKAGES)!r}}}))")
    out = subprocess.run([str(PEERS / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def install_reconcile() -> None:
    """This working tree installed as a user installs it (`pip install .`, no editable finder on
    the import path) into a virtual environment of its own, bench/.reconcile, like the peers in
    bench/.peers: neither pays for the packages or .pth files of the interpreter's site-packages."""
    if not (RECONCILE_VENV / "bin" / "python").exists():
        log(f"creating {RECONCILE_VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(RECONCILE_VENV)], check=True)
        subprocess.run([str(RECONCILE_VENV / "bin" / "pip"), "install", "-q", str(ROOT)], check=True)
    # Always the current tree: reinstalled without touching the dependencies.
    subprocess.run([str(RECONCILE_VENV / "bin" / "pip"), "install", "-q", "--no-deps", "--force-reinstall",
                    str(ROOT)], check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(ROOT / "build", ignore_errors=True)


def reconcile_cmd(use_venv: bool) -> tuple[list[str], str]:
    """The console script a user types: bench/.reconcile's (see install_reconcile), or with
    --installed the one next to this interpreter, else `python -m reconcile_host`."""
    script = (RECONCILE_VENV / "bin" if use_venv else Path(sys.executable).parent) / "reconcile"
    if script.is_file():
        return [str(script)], "reconcile (pip install . in bench/.reconcile)" if use_venv else "reconcile"
    return [sys.executable, "-m", "reconcile_host"], "python -m reconcile_host"


def registered_kinds() -> set[str]:
    sys.path.insert(0, str(ROOT.parent))
    try:
        from reconcile_host.reconcilers import KINDS
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_registry", ROOT / "reconcilers" / "__init__.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        KINDS = mod.KINDS  # noqa: N806
    return set(KINDS)
