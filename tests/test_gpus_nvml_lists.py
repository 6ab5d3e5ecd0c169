"""The process lists: what reconcile asks of NVML for them, and what the fake libnvidia-ml
(tests/fakenvml/fakenvml_procs.c) reads of /proc to answer.

reconcile reads each list in one call with room to spare (nvml.py _process_list), where pynvml's
wrappers make two (the count, then the entries); the answers, errors included, must be pynvml's own
on the same fake. The fake counts each call and each scan of /proc in $FAKE_NVML_COUNT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import gpu_support as gs
import pytest

LISTS = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3")


def run_py(lib: Path, config: Path, code: str, count: Path | None = None) -> str:
    """CODE (pynvml imported as n and initialised; reconcile's nvml module as N) on the fake; its stdout."""
    env = {**os.environ, **gs.nvml_env(lib, config)}
    if count is not None:
        env["FAKE_NVML_COUNT"] = str(count)
    src = ("import json, pynvml as n\nfrom reconcile_host.reconcilers.gpus import nvml as N\nn.nvmlInit()\n"
           + textwrap.dedent(code))
    proc = subprocess.run([sys.executable, "-c", src], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def counted(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def list_calls(path: Path) -> list[tuple[str, int, int, int, str]]:
    """(function, GPU, room, infos given, result) of each process-list call the fake answered."""
    out = []
    for words in counted(path):
        if words[0].startswith("nvmlDevice"):
            fields = dict(w.split("=", 1) for w in words[1:4])
            out.append((words[0], int(fields["gpu"]), int(fields["room"]), int(fields["infos"]), words[5]))
    return out


def scans(path: Path) -> list[dict[str, int]]:
    return [{k: int(v) for k, v in (w.split("=") for w in words[1:])} for words in counted(path) if words[0] == "scan"]


def test_a_diff_asks_for_each_process_list_once_and_lists_what_pynvml_lists(tmp_path, fake_lib, holders):
    """Three GPUs: a compute process on 0, a C+G one on 1, a graphics one on 2, one on none. Each list
    of each GPU is one call (no size query with no buffer), and the holders reconcile reports are
    those pynvml's own two-call wrappers list on the same fake."""
    tags = [gs.new_tag() for _ in range(3)]
    config = gs.FakeConfig(gpus=gs.seed_gpus(4), holders=[
        gs.FakeHolder(mib=1000, gpus=[0], cmdline=tags[0]),
        gs.FakeHolder(mib=2000, gpus=[1], cmdline=tags[1], both=True),
        gs.FakeHolder(mib=3000, gpus=[2], cmdline=tags[2], graphics=True)]).write(tmp_path / "nvml.conf")
    procs = [holders.start(f"job-{i}", tag) for i, tag in enumerate(tags)]
    theirs = json.loads(run_py(fake_lib, config, """
        out = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            for p in n.nvmlDeviceGetComputeRunningProcesses(h) + n.nvmlDeviceGetGraphicsRunningProcesses(h):
                out.append([p.pid, i, p.usedGpuMemory])
        print(json.dumps(sorted(set(map(tuple, out)))))"""))
    assert [p[:2] for p in theirs] == [[procs[0].pid, 0], [procs[1].pid, 1], [procs[2].pid, 2]]

    count = tmp_path / "count"
    proc = gs.cli(tmp_path, fake_lib, config, "diff", str(gs.write_state(tmp_path, "gpus:\n  count: 4\n")),
                  "--format", "json", FAKE_NVML_COUNT=str(count))
    report = gs.gpus_report(proc)
    ours = sorted([h["pid"], u["gpu"], u["used_bytes"]] for h in report["observed"]["holders"] for u in h["uses"])
    assert ours == [list(p) for p in theirs]
    calls = list_calls(count)
    assert sorted((c[0], c[1]) for c in calls) == sorted((fn, g) for fn in LISTS for g in range(4))
    assert all(room > 0 and infos == 1 and result == "ok" for _, _, room, infos, result in calls), calls


def test_more_processes_than_the_first_call_has_room_for(tmp_path, fake_lib, holders):
    """NVML answers INSUFFICIENT_SIZE with the count it needs; the second call, with room for it, lists
    every process pynvml lists."""
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), holders=[gs.FakeHolder(mib=100, gpus=[0], cmdline=tag)]
                           ).write(tmp_path / "nvml.conf")
    pids = sorted(holders.start(f"job-{i}", tag).pid for i in range(3))
    count = tmp_path / "count"
    out = json.loads(run_py(fake_lib, config, """
        h = n.nvmlDeviceGetHandleByIndex(0)
        theirs = sorted(p.pid for p in n.nvmlDeviceGetComputeRunningProcesses_v3(h))
        ours = sorted(p.pid for p in N._process_list(n, h, "nvmlDeviceGetComputeRunningProcesses_v3", room=1))
        print(json.dumps([theirs, ours]))""", count))
    assert out == [pids, pids]
    ours = list_calls(count)[2:]  # after pynvml's two: the size query, then the entries
    assert ours == [(LISTS[0], 0, 1, 1, "insufficient_size"), (LISTS[0], 0, 3 * 2 + 5, 1, "ok")], counted(count)


@pytest.mark.parametrize("error, fault", [
    ("no_permission", {"fail": {"processes": "no_permission"}}),
    ("not_supported", {"fail": {"processes": "not_supported"}}),
    ("unknown", {"fail": {"processes": "unknown"}}),
    ("lost", {"error": "lost", "error_on": ("processes",)}),
    ("reset_required", {"error": "reset_required", "error_on": ("processes",)}),
])
def test_a_list_that_fails_raises_what_pynvml_raises_and_is_never_empty(tmp_path, fake_lib, holders, error, fault):
    """On GB10-like unified memory (no memory reading), who holds the GPU decides its memory verdict:
    a list that cannot be read makes it unknown (or the GPU lost), never 0 MiB; NOT_SUPPORTED is a GPU
    that has no such list. The error is the one pynvml's own wrapper raises."""
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=[gs.FakeGpu(name="NVIDIA GB10", unsupported=("memory",), **fault)],
                           holders=[gs.FakeHolder(mib=19456, gpus=[0], cmdline=tag)]).write(tmp_path / "nvml.conf")
    holders.start("python-job", tag)
    raised = json.loads(run_py(fake_lib, config, """
        h = n.nvmlDeviceGetHandleByIndex(0)
        out = []
        for fn in (n.nvmlDeviceGetComputeRunningProcesses_v3,
                   lambda h: N._process_list(n, h, "nvmlDeviceGetComputeRunningProcesses_v3")):
            try:
                fn(h)
                out.append(None)
            except n.NVMLError as e:
                out.append(type(e).__name__)
        print(json.dumps(out))"""))
    assert raised[0] is not None and raised[0] == raised[1]
    state = "gpus:\n  max_memory_used: 0MiB\n  healthy: true\n"
    proc = gs.cli(tmp_path, fake_lib, config, "diff", str(gs.write_state(tmp_path, state)), "--format", "json")
    gpus_ = gs.gpus_report(proc)
    memory = [d["have"] for d in gpus_["drift"] if d["field"] == "gpu0.memory_used"]
    gpu = gpus_["observed"]["gpus"][0]
    if error == "not_supported":
        assert memory == [] and gpu["health"] == "healthy"  # no list to read: no holder known, none counted
    else:
        assert memory == ["unknown"]
        assert gpu["health"] == ("unhealthy" if error in ("lost", "reset_required") else "unknown")


# --- the fake: what it reads of /proc, and that it follows processes as they change ----------------

def test_the_fake_reads_only_what_its_holders_match_on(tmp_path, fake_lib, holders):
    """A holder matched by name: each process's stat once, no command line. By command line: the
    command lines, and stat only for a process that matches (is it a zombie?). None on the GPU: no scan."""
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(2), holders=[gs.FakeHolder(mib=100, gpus=[0], comm="by-name"),
                                                          gs.FakeHolder(mib=200, gpus=[0], cmdline=tag)]
                           ).write(tmp_path / "nvml.conf")
    holders.start("by-name", gs.new_tag())
    holders.start("by-cmdline", tag)
    count = tmp_path / "count"
    used = json.loads(run_py(fake_lib, config, """
        print(json.dumps([n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(i)).used // 2**20 for i in (0, 1)]))
        """, count))
    assert used == [300, 0]
    (scan,) = scans(count)  # GPU 1: no holder on it, no scan
    assert scan["matches"] == 2 and scan["stat"] == scan["procs"] and scan["cmdline"] <= scan["procs"]
    count.unlink()
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), holders=[gs.FakeHolder(mib=100, gpus=[0], comm="by-name")]
                           ).write(tmp_path / "nvml.conf")
    run_py(fake_lib, config, "n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0))", count)
    (scan,) = scans(count)
    assert scan["cmdline"] == 0 and scan["matches"] == 1
    count.unlink()
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), holders=[gs.FakeHolder(mib=200, gpus=[0], cmdline=tag)]
                           ).write(tmp_path / "nvml.conf")
    run_py(fake_lib, config, "n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0))", count)
    (scan,) = scans(count)
    assert scan["matches"] == 1 and scan["stat"] == 1 and scan["cmdline"] >= 1


def test_the_fake_follows_exits_zombies_and_execs_at_once(tmp_path, fake_lib):
    """Asked twice in one NVML session (one process, nothing cached between calls): a process that
    execs into a holder's command line holds from that call on; killed and not yet reaped (a zombie,
    as /proc says) it holds nothing."""
    tag = gs.new_tag()
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), holders=[gs.FakeHolder(mib=500, gpus=[0], cmdline=tag)]
                           ).write(tmp_path / "nvml.conf")
    env = {**os.environ, **gs.nvml_env(fake_lib, config)}
    # The reader: one NVML session, a reading each time a line comes on its stdin.
    reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import json, sys, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        for _ in sys.stdin:
            print(json.dumps([n.nvmlDeviceGetMemoryInfo(h).used // 2**20,
                              [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]]), flush=True)
        """)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    # The job: the tag comes on its stdin (it is in no command line yet), then it execs into a holder.
    job = subprocess.Popen([sys.executable, "-c", "import os, sys\ntag = sys.stdin.readline().strip()\n"
                            f"os.execv(sys.executable, [sys.executable, {str(gs.HOLDER)!r}, 'job', tag])"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        def reading() -> list:
            reader.stdin.write("\n")
            reader.stdin.flush()
            return json.loads(reader.stdout.readline())

        assert tag not in Path(f"/proc/{job.pid}/cmdline").read_text()
        assert reading() == [0, []]
        job.stdin.write(tag + "\n")
        job.stdin.flush()
        assert job.stdout.readline().strip() == "ready"
        assert tag in Path(f"/proc/{job.pid}/cmdline").read_bytes().decode()
        assert reading() == [500, [job.pid]]
        job.send_signal(signal.SIGKILL)  # our own child, by PID; not reaped yet
        while gs.proc_alive(job.pid):  # until /proc says zombie
            pass
        assert Path(f"/proc/{job.pid}").exists()
        assert reading() == [0, []]
    finally:
        for p in (job, reader):
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)
