"""Helpers for the mount tests: private mount namespaces and a FUSE server that stops answering.

Every mount a test makes lives in a private mount namespace (`unshare --mount
--propagation private`) that dies with the scenario's process group, so nothing is
left on the host even when a test fails half-way.

Run as a script, this module is the hanging FUSE server:

    python mounts_support.py fuse-hang MOUNTPOINT READY_FILE

It opens /dev/fuse, mounts it on MOUNTPOINT (mount -i, no helper), answers the
kernel's INIT like any FUSE server, touches READY_FILE and then never reads
/dev/fuse again: every request on the mount (statfs included) waits forever, as on
a filesystem whose server or backend stopped answering. Killing the server closes
/dev/fuse, which aborts the connection and releases whoever was waiting.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# --- the FUSE protocol, just enough for INIT (include/uapi/linux/fuse.h) ---------------
FUSE_INIT = 26
IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
INIT_IN = struct.Struct("<IIII")  # major, minor, max_readahead, flags (the rest ignored)
# major, minor, max_readahead, flags, max_background, congestion_threshold, max_write,
# time_gran, max_pages, map_alignment, flags2, unused[7]
INIT_OUT = struct.Struct("<IIIIHHIIHHI28x")


def fuse_hang(mountpoint: str, ready: str) -> None:
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}"
    subprocess.run(["mount", "-i", "-t", "fuse.hang", "-o", opts, "hang", mountpoint],
                   pass_fds=(fd,), check=True)
    buf = os.read(fd, 1 << 20)
    _len, opcode, unique, *_ = IN_HEADER.unpack_from(buf)
    if opcode != FUSE_INIT:
        raise SystemExit(f"expected FUSE_INIT, got opcode {opcode}")
    major, minor, readahead, _flags = INIT_IN.unpack_from(buf, IN_HEADER.size)
    body = INIT_OUT.pack(7, min(minor, 31), readahead, 0, 1, 1, 4096, 1, 1, 0, 0)
    os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), 0, unique) + body)
    Path(ready).write_text(str(os.getpid()))
    # From here on the server "stops answering": it keeps /dev/fuse open and never reads it.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        time.sleep(3600)


# --- namespaces --------------------------------------------------------------------------

def namespaces_missing() -> str | None:
    """Why mount-namespace tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (mounts in a private mount namespace)"
    if not shutil.which("unshare"):
        return "unshare (util-linux) not installed"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a mount namespace: {probe.stderr.strip()}"
    return None


def fuse_missing() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse not present"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"cannot open /dev/fuse: {exc.strerror}"
    return None


def in_namespace(script: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a shell script in a fresh private mount namespace, in its own process group.

    Whatever happens, the whole group is SIGKILLed afterwards: with every process of the
    namespace gone, the namespace and all its mounts go with it (a FUSE server that dies
    closes /dev/fuse, which aborts its connection and frees anyone waiting on it).
    """
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-euc", textwrap.dedent(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
        raise AssertionError(f"scenario did not finish within {timeout}s\nstdout:\n{out}\nstderr:\n{err}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_scenario(tmp: Path, script: str, timeout: float = 120) -> dict:
    """Run a Python scenario (using tests/mounts_ns.py) in a fresh private mount namespace; the
    facts it recorded. Its state files, reports and journal stay under `tmp`."""
    import json

    from cli_support import cli_env

    (tmp / "scenario.py").write_text("from mounts_ns import *  # noqa: F403\n" + textwrap.dedent(script))
    env = cli_env(tmp, T=str(tmp), PY=sys.executable, PYTHONPATH=str(HERE),
                  RECONCILE_STATE_DIR=str(tmp / "state"), BLKID_FILE=str(tmp / "blkid.tab"))
    proc = in_namespace('exec "$PY" "$T/scenario.py"', env, timeout=timeout)
    facts = tmp / "facts.json"
    assert proc.returncode == 0, f"scenario failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    return json.loads(facts.read_text()) if facts.exists() else {}


def rid(p: str) -> str:
    return f"mount:{p}"


def assert_applied_once(facts: dict, name: str, paths: list[str]) -> None:
    """The first apply mounted each path and ended ok; the second took no action; the kernel
    lists exactly one mount at each (resolved) path."""
    first, second = facts[f"{name}.first"], facts[f"{name}.second"]
    assert first["rc"] == 0 and second["rc"] == 0, (first, second)
    for p in paths:
        r1, r2 = first["resources"][rid(p)], second["resources"][rid(p)]
        assert [a["action"] for a in r1["actions"]] == ["mount"] and r1["status"] == "ok", r1
        assert r1["actions"][0]["result"] == "done", r1
        assert r2["actions"] == [] and r2["status"] == "ok", r2
    for p, count in facts[f"{name}.count"].items():
        assert count == 1, f"{p!r}: {count} mounts there after two applies"


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "fuse-hang":
        fuse_hang(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} fuse-hang MOUNTPOINT READY_FILE")
