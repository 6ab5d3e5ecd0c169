"""Who is exempt from the GPU checks, and how a holder is signalled, when a local user picks the
names: the NVIDIA tools' exemption and `allow`'s name globs go by the program a process runs
(/proc/PID/exe, a file only root could have put there), never by its comm or argv[0]; a signal
goes through a pidfd after the start-time check. Real processes (one of them an unprivileged
user's), real device-like files, the fake NVML and the CLI as a user runs it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import gpu_support as gs
import pytest
from reconcile_host.local.host import LocalHost
from reconcile_host.reconcilers.gpus.procfs import proc_info, trusted_exe

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs a process as another user and chowns files: root")


@pytest.fixture
def user_dir():
    """A folder of an unprivileged user's (nobody's), where that user may put any program."""
    d = Path(tempfile.mkdtemp(prefix="rc-user-", dir="/tmp"))
    os.chmod(d, 0o755)
    os.chown(d, NOBODY, NOBODY)
    yield d
    shutil.rmtree(d)


def devices(tmp: Path) -> tuple[Path, dict[str, str]]:
    d = tmp / "dev"
    d.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (d / name).write_bytes(b"")
    return d, {"RECONCILE_NVIDIA_DEV_GLOB": str(d / "nvidia*")}


def test_a_users_program_named_nvidia_smi_is_a_holder_like_any_other(tmp_path, fake_lib, holders, user_dir):
    dev, env = devices(tmp_path)
    tag, argv0_tag = gs.new_tag(), gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), holders=[gs.FakeHolder(mib=5000, gpus=[0], cmdline=tag),
                                                          gs.FakeHolder(mib=2000, gpus=[0], cmdline=argv0_tag)]
                           ).write(tmp_path / "nvml.conf")
    # The user's own copy of a program, named nvidia-smi (comm and argv[0] both say nvidia-smi).
    fake = holders.start("nvidia-smi", tag, hold=dev / "nvidia0",
                         program=gs.program_copy(user_dir, "nvidia-smi", owner=NOBODY), user=NOBODY)
    # The system's Python run as `exec -a nvidia-smi`: argv[0] says nvidia-smi (the interpreter
    # lies under /root here, which nobody cannot enter: run as root, the name is what is tried).
    python = os.path.realpath(gs.sys.executable)
    renamed = subprocess.Popen(["nvidia-smi", str(gs.HOLDER), "python3", argv0_tag], executable=python,
                               stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    holders.procs.append(renamed)
    assert renamed.stdout.readline().strip() == "ready"
    # nvidia-smi as root installs it: exempt.
    real = holders.start("nvidia-smi", gs.new_tag(), hold=dev / "nvidia0",
                         program=gs.program_copy(tmp_path, "nvidia-smi"))
    assert Path(f"/proc/{fake.pid}/comm").read_text().strip() == "nvidia-smi"
    assert Path(f"/proc/{renamed.pid}/cmdline").read_bytes().split(b"\0")[0] == b"nvidia-smi"
    assert os.stat(f"/proc/{fake.pid}/exe").st_uid == NOBODY  # the authority: whose file it runs
    assert trusted_exe(fake.pid) == "" and trusted_exe(renamed.pid) in ("", python)
    assert trusted_exe(real.pid) == str(tmp_path / "nvidia-smi")

    state = gs.write_state(tmp_path, """
        gpus:
          max_memory_used: 0MiB
          allow: ["nvidia-smi"]
          free_with: {kill: ["*"], grace: 1s}
        """)
    plan = gs.gpus_report(gs.cli(tmp_path, fake_lib, config, "diff", str(state), "--format", "json", **env))
    held = {h["pid"] for h in plan["observed"]["holders"]}
    assert {fake.pid, renamed.pid} <= held and real.pid not in held
    # Its memory is not excused by `allow: [nvidia-smi]`: the user's program is not that program.
    assert plan["drift"] == [{"field": "gpu0.memory_used", "want": "<= 0MiB", "have": "7000MiB"}]
    assert sorted(a["target"] for a in plan["actions"]) == sorted([f"pid {fake.pid}", f"pid {renamed.pid}"])
    code, doc, err = gs.cli_json(tmp_path, fake_lib, config, "apply", str(state), **env)
    assert code == 0, (doc, err)
    assert fake.wait(timeout=10) == -signal.SIGTERM and renamed.wait(timeout=10) == -signal.SIGTERM
    assert real.poll() is None


def test_the_installed_program_is_exempt_and_allowed_by_its_path(tmp_path, fake_lib, holders, user_dir):
    tag, user_tag = gs.new_tag(), gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), holders=[gs.FakeHolder(mib=3000, gpus=[0], cmdline=tag),
                                                          gs.FakeHolder(mib=2000, gpus=[0], cmdline=user_tag)]
                           ).write(tmp_path / "nvml.conf")
    server = holders.start("vllm-server", tag, program=gs.program_copy(tmp_path, "vllm-server"))
    mimic = holders.start("vllm-server", user_tag, program=gs.program_copy(user_dir, "vllm-server", owner=NOBODY),
                          user=NOBODY)
    for allow in ('["vllm-*"]', f'["{tmp_path}/vllm-*"]'):
        code, doc, err = gs.cli_json(tmp_path, fake_lib, config, "diff", str(gs.write_state(
            tmp_path, f"gpus:\n  max_memory_used: 0MiB\n  allow: {allow}\n")))
        gpus_ = gs.gpus_of(doc)
        # The root-installed server's 3000 MiB is expected; the user's same-named copy's 2000 are not.
        assert gpus_["drift"] == [{"field": "gpu0.memory_used", "want": "<= 0MiB", "have": "2000MiB"}], allow
        paths = {h["pid"]: h["path"] for h in gpus_["observed"]["holders"]}
        assert paths == {server.pid: str(tmp_path / "vllm-server"), mimic.pid: ""}
    assert server.poll() is None and mimic.poll() is None


def test_a_program_in_a_folder_a_user_can_write_is_not_trusted(tmp_path):
    """Root's own file, in a folder a user owns or anyone may write (they could have swapped it in):
    not trusted; in a sticky folder (as /tmp), where no one else can rename root's entry, it is."""
    sub = tmp_path / "bin"
    sub.mkdir(mode=0o755)
    os.chown(sub, NOBODY, NOBODY)
    prog = gs.program_copy(sub, "nvidia-smi")  # root-owned file, user-owned folder
    proc = subprocess.Popen([str(prog), "-c", "import time; time.sleep(600)"])
    try:
        assert os.stat(prog).st_uid == 0 and trusted_exe(proc.pid) == ""
        os.chown(sub, 0, 0)
        assert trusted_exe(proc.pid) == str(prog)
        os.chmod(sub, 0o777)  # writable by all, not sticky
        assert trusted_exe(proc.pid) == ""
        os.chmod(sub, 0o1777)
        assert trusted_exe(proc.pid) == str(prog)
        os.chmod(prog, 0o775)  # the file itself writable by its group
        assert trusted_exe(proc.pid) == ""
    finally:
        proc.kill()
        proc.wait()


# --- the signal: a pidfd, after the start-time check -----------------------------------------------

def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "600"])


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_a_signal_reaches_only_the_process_that_started_then(monkeypatch, pidfd):
    if not pidfd:  # a kernel without pidfd_open(2) (before 5.3): ENOSYS, then kill(2)
        def enosys(pid, flags=0):
            raise OSError(38, "Function not implemented")
        monkeypatch.setattr(os, "pidfd_open", enosys)
    host = LocalHost()
    proc = _sleeper()
    try:
        started = proc_info(proc.pid)["starttime"]
        with pytest.raises(ProcessLookupError):
            host.signal(proc.pid, signal.SIGTERM, started + 1)  # another process's start: not sent
        assert proc.poll() is None
        host.signal(proc.pid, signal.SIGTERM, started)
        assert proc.wait(timeout=10) == -signal.SIGTERM
        with pytest.raises(ProcessLookupError):
            host.signal(proc.pid, signal.SIGTERM, started)  # reaped: gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
