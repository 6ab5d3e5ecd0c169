"""The gpus kind without a host: observed fixtures in, drift and plan out: memory and holders,
the health verdict, the declared checks; the /proc/PID/cgroup parser. (The kernel log and the
Xid catalogue: test_gpus_xid.py; real nvidia-smi captures: test_gpus_corpus.py.)"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from reconcile_host.core.contract import Context, Resource
from reconcile_host.pipeline.engine import judge
from reconcile_host.pipeline.statefile import StateFileError, validate_text
from reconcile_host.reconcilers.gpus import GpusReconciler, health
from reconcile_host.reconcilers.gpus.checks import version_satisfies
from reconcile_host.reconcilers.gpus.fold import parse_kernel_log
from reconcile_host.reconcilers.gpus.observed import MIB, Gpu, GpusObserved, GpuUse, Holder, KernelLog
from reconcile_host.reconcilers.gpus.procfs import unit_of_cgroup

REC = GpusReconciler()
VLLM = "vllm-kimi-k25-int4.service"


def resource(**section) -> Resource:
    return REC.resources(section)[0]


def gpus(n=8, used_mib=0, total_mib=97887, **kw) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, "RTX PRO 6000", f"GPU-{i}", f"00000000:{i + 1:02X}:00.0", total_mib * MIB,
                     used_mib * MIB, health=kw.get("health", "healthy"), problems=kw.get("problems", ()))
                 for i in range(n))


def holder(pid, name, mib, on, unit=None, visible=True) -> Holder:
    return Holder(pid, name, name, unit, 1000 + pid, tuple(GpuUse(g, None if mib is None else mib * MIB) for g in on),
                  visible=visible)


def observed(gpu_list, holders=(), xids=()) -> GpusObserved:
    return GpusObserved("nvml", "590.48.01", tuple(gpu_list), tuple(holders), tuple(xids), cuda_version="13.1")


def assess(res, obs, declared=()):
    ctx = Context(resources={r.id: r for r in (res, *declared)})
    drift = REC.diff(res, obs)
    plan = REC.plan(res, obs, drift, ctx)
    return drift, plan, judge(drift, plan)


def unit_resource(name, **spec) -> Resource:
    return Resource(id=f"unit:{name}", kind="unit", name=name, spec=spec)


SEED_SPEC = dict(count=8, max_memory_used="0MiB", allow=["unit:eagle3-extract.service"], healthy=True,
                 free_with={"stop_units": True, "kill": ["python*", "vllm*", "sglang*"], "grace": "10s"},
                 settle="30s")
SPEC = {k: v for k, v in SEED_SPEC.items() if k != "count"}  # for fixtures with fewer GPUs


def test_resources_normalise_sizes_and_durations():
    r = resource(**SPEC)
    assert r.id == "gpus" and r.kind == "gpus" and r.settle == 30.0
    assert r.spec["max_memory_used"] == 0 and r.spec["free_with"]["grace"] == 10.0
    assert r.spec["allow"] == ("unit:eagle3-extract.service",)
    d = resource(count=1)
    assert d.spec["healthy"] is True and d.spec["free_with"] == {"stop_units": False, "stop_containers": False,
                                                                 "kill": (), "grace": 10.0}
    assert d.settle == 30.0 and d.spec["max_memory_used"] is None


def test_seed_declared_unit_defers_to_units():
    obs = observed(gpus(used_mib=72289), [holder(4242, "python3", 72289, range(8), unit=VLLM)])
    drift, plan, status = assess(resource(**SEED_SPEC), obs, [unit_resource(VLLM, active=False, enabled=False)])
    assert [d.field for d in drift] == [f"gpu{i}.memory_used" for i in range(8)]
    assert drift[0].want == "<= 0MiB" and drift[0].have == "72289MiB"
    assert plan.actions == () and plan.blocked is None and status.value == "drift"
    assert f"freed by unit:{VLLM}" in plan.message
    assert "GPU 7: 72289MiB / 97887MiB, healthy" in plan.message


def test_undeclared_unit_stopped_once_for_all_its_processes():
    obs = observed(gpus(2, used_mib=1000), [holder(10, "python3", 1000, [0], unit=VLLM),
                                            holder(11, "python3", 1000, [1], unit=VLLM)])
    _, plan, status = assess(resource(**SPEC), obs)
    assert [(a.action, a.target) for a in plan.actions] == [("stop", VLLM)]
    assert plan.actions[0].description == f"stop unit {VLLM} (10 (python3) holding 1000MiB on GPU 0)"
    assert status.value == "drift"


def test_declared_active_unit_is_blocked_not_stopped():
    obs = observed(gpus(1, used_mib=500), [holder(10, "python3", 500, [0], unit=VLLM)])
    _, plan, status = assess(resource(**SPEC), obs, [unit_resource(VLLM, active=True)])
    assert plan.actions == () and status.value == "blocked"
    assert f"add unit:{VLLM} to gpus.allow" in plan.blocked


def test_unit_without_stop_units_is_terminated_with_a_warning():
    spec = {**SPEC, "free_with": {"kill": ["python*"]}}
    obs = observed(gpus(1, used_mib=500), [holder(10, "python3", 500, [0], unit=VLLM)])
    _, plan, _ = assess(resource(**spec), obs)
    (action,) = plan.actions
    assert (action.action, action.target) == ("terminate", "pid 10")
    assert action.params == {"pid": 10, "name": "python3", "starttime": 1010, "grace": 10.0}
    assert "with Restart= it may come back" in action.description


@pytest.mark.parametrize("pid", [1, os.getpid()], ids=["pid-1", "reconcile-itself"])  # ids: one name in every worker
def test_pid_1_and_reconcile_itself_never_signalled(pid):
    obs = observed(gpus(1, used_mib=500), [holder(pid, "python3", 500, [0])])
    _, plan, status = assess(resource(**{**SPEC, "free_with": {"kill": ["*"]}}), obs)
    assert plan.actions == () and status.value == "blocked"
    assert "never signalled" in plan.blocked


def test_holder_not_killable_blocks_and_names_it():
    obs = observed(gpus(1, used_mib=300), [holder(77, "jupyter", 300, [0])])
    _, plan, status = assess(resource(**SPEC), obs)
    assert status.value == "blocked" and plan.actions == ()
    assert plan.blocked == ("77 (jupyter) holding 300MiB on GPU 0 is not in gpus.allow nor matched by "
                            "free_with.kill: nothing was signalled")


def test_invisible_pid_blocked():
    obs = observed(gpus(1, used_mib=300), [holder(77, "", 300, [0], visible=False)])
    _, plan, status = assess(resource(**{**SPEC, "free_with": {"kill": ["*"]}}), obs)
    assert status.value == "blocked" and "not visible from here" in plan.blocked


def test_allowed_holders_not_counted():
    obs = observed(gpus(2, used_mib=18000), [holder(5, "python3", 18000, [0, 1], unit="eagle3-extract.service")])
    drift, plan, status = assess(resource(**SPEC), obs)
    assert drift == [] and status.value == "ok" and plan.message == ""
    by_name = resource(**{**SPEC, "allow": ["eagle3*"]})
    installed = replace(holder(5, "python3", 1000, [0]), path="/usr/local/bin/eagle3-extract")
    assert assess(by_name, observed(gpus(1, used_mib=1000), [installed]))[0] == []
    by_path = resource(**{**SPEC, "allow": ["/usr/local/bin/eagle3-*"]})
    assert assess(by_path, observed(gpus(1, used_mib=1000), [installed]))[0] == []


def test_a_name_a_process_gives_itself_is_never_allowed():
    """comm and argv[0] are what the process says it is: `allow` trusts only the program it runs
    when root put it there (Holder.path, procfs.trusted_exe; "" for a user's copy)."""
    by_name = resource(**{**SPEC, "allow": ["eagle3*", "nvidia-smi"]})
    for name in ("eagle3-extract", "nvidia-smi"):
        obs = observed(gpus(1, used_mib=1000), [holder(5, name, 1000, [0])])  # no trusted path
        drift, _, status = assess(by_name, obs)
        assert [d.field for d in drift] == ["gpu0.memory_used"] and status.value != "ok", name
    elsewhere = replace(holder(5, "eagle3-extract", 1000, [0]), path="/home/u/bin/other")
    assert assess(by_name, observed(gpus(1, used_mib=1000), [elsewhere]))[0] != []


def test_memory_nobody_visible_holds_is_blocked():
    _, plan, status = assess(resource(**SPEC), observed(gpus(1, used_mib=4000)))
    assert status.value == "blocked"
    assert "GPU 0: 4000MiB held by no process visible here" in plan.blocked


def test_device_file_holder_suspect_only_when_memory_is_unexplained():
    spec = {**SPEC, "max_memory_used": "100MiB", "free_with": {"kill": ["vllm*"]}}
    dev = holder(9, "vllm-worker", None, [0])
    _, plan, _ = assess(resource(**spec), observed(gpus(1, used_mib=5000), [dev]))
    assert [a.target for a in plan.actions] == ["pid 9"]
    assert "memory not reported by NVML" in plan.actions[0].description
    # The memory is explained by a listed process: the device-file holder is left alone.
    listed = holder(8, "vllm-serve", 5000, [0])
    _, plan, _ = assess(resource(**spec), observed(gpus(1, used_mib=5000), [dev, listed]))
    assert [a.target for a in plan.actions] == ["pid 8"]


def test_count_and_health_block():
    bad = list(gpus(7))
    bad[3] = health.judge(Gpu(3, "x", "GPU-3", "00000000:04:00.0", 1, 0, remapped_rows_failure=True), (), None)
    events, _ = parse_kernel_log("[ 9.0] NVRM: Xid (PCI:0000:04:00): 64, pid=7, Row remapper failure\n")
    drift, plan, status = assess(resource(**SEED_SPEC), observed(bad, xids=events))
    assert {d.field for d in drift} == {"count", "gpu3.healthy"}
    assert status.value == "blocked"
    assert "expected 8 GPUs, found 7" in plan.blocked
    assert "GPU 3 (00000000:04:00.0) must not run jobs: reset the GPU; if the remap fails again" in plan.blocked
    assert "kernel log: 0000:04:00: Xid 64 at [ 9.0]: Row remapper failure [Xid 64: RESET_GPU" in plan.message
    # healthy: false switches the check off.
    drift, _, _ = assess(resource(**{**SEED_SPEC, "healthy": False, "count": 7}), observed(bad))
    assert drift == []


def _gpu(**kw) -> Gpu:
    return Gpu(0, "H100", "GPU-0", "00000000:3B:00.0", 80 * 1024 * MIB, 0, **kw)


@pytest.mark.parametrize("kw, log, want", [
    ({}, None, ("healthy", "")),
    ({"ecc_uncorrected_volatile": 2}, None, ("unhealthy", "reset the GPU")),
    ({"retired_pages_pending": True}, None, ("unhealthy", "reset the GPU")),
    ({"remapped_rows_pending": True}, None, ("unhealthy", "reset the GPU")),
    ({"lost": "GPU is lost"}, None, ("unhealthy", "reboot the node")),
    ({"lost": "GPU requires reset"}, None, ("unhealthy", "reset the GPU")),
    ({"recovery_action": 2}, None, ("unhealthy", "reboot the node")),
    ({"recovery_action": 3}, None, ("unhealthy", "drain peer-to-peer traffic from the GPU")),
    ({"recovery_action": 4}, None, ("unhealthy", "drain the GPU's work, then reset the GPU")),
    ({"recovery_action": -1}, None, ("unhealthy", "contact NVIDIA support")),
    ({"recovery_action": 0}, None, ("healthy", "")),
    # GeForce: no ECC, no retirement, no remapping at all: not signals; MIG hides remapped rows.
    ({"ecc_uncorrected_volatile": None, "remapped_rows_pending": None, "mig": True}, None, ("healthy", "")),
    ({"read_errors": ("memory: Unknown Error",)}, None, ("unknown", "")),
    ({}, KernelLog("dmesg", readable=False, note="dmesg: Operation not permitted"), ("unknown", "")),
    ({}, KernelLog("dmesg", complete=False, note="rotated"), ("unknown", "")),
    # The strongest step wins: rebooting the node also resets the GPU.
    ({"lost": "GPU is lost", "remapped_rows_pending": True}, None, ("unhealthy", "reboot the node")),
])
def test_health_verdict(kw, log, want):
    g = health.judge(_gpu(**kw), (), log)
    assert (g.health, g.step) == want
    assert bool(g.problems) == (want[0] != "healthy")


def test_health_counts_only_current_xids_and_the_79_companion_once():
    log = ("[  5.0] NVRM: Xid (PCI:0000:3b:00): 48, DBE\n"
           "[  6.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  590.48.01\n"
           "[ 10.0] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
           "[ 10.1] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n")
    events, last = parse_kernel_log(log)
    assert "loading NVIDIA UNIX" in last
    g = health.judge(_gpu(), events, None)
    assert g.step == "reboot the node" and len(g.signals) == 1 and "Xid 79 at [ 10.0]" in g.signals[0].what
    assert [e.current for e in events] == [False, True, True]


def test_gpu_gone_from_the_driver_is_blocked_by_its_pci_address():
    events, _ = parse_kernel_log("[ 1.0] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
                                 "        NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
                                 "        NVRM: fallen off the bus and is not responding to commands.\n")
    drift, plan, status = assess(resource(**SPEC), observed(gpus(2), xids=events))
    assert [d.field for d in drift] == ["gpu@0000:b3:00.healthy"] and status.value == "blocked"
    assert "the GPU at PCI 0000:b3:00, which the driver does not list, must not run jobs: reboot the node" \
        in plan.blocked


def test_memory_the_gpu_cannot_report_is_judged_from_its_processes():
    """GB10/Grace: NVML says NOT_SUPPORTED for memory. 19 GiB held outside `allow` is drift, not ok."""
    gb10 = (Gpu(0, "NVIDIA GB10", "GPU-0", "0000000F:01:00.0", None, None, health="healthy"),)
    spec = {**SPEC, "free_with": {"kill": ["python*"]}}
    drift, plan, status = assess(resource(**spec), observed(gb10, [holder(9, "python3", 19456, [0])]))
    assert drift[0].field == "gpu0.memory_used" and drift[0].have == "19456MiB"
    assert [a.target for a in plan.actions] == ["pid 9"] and status.value == "drift"
    # A process that does not say how much it holds: unknown, blocked, nothing signalled.
    drift, plan, status = assess(resource(**spec), observed(gb10, [holder(9, "python3", None, [0])]))
    assert drift[0].have == "unknown" and plan.actions == () and status.value == "blocked"
    assert "GPU 0 reports no memory use" in plan.blocked and "9 (python3)" in plan.blocked
    # Nothing holds it: 0 MiB counted, ok.
    assert assess(resource(**spec), observed(gb10))[0] == []


def test_lost_gpu_memory_is_unknown_and_blocked():
    lost = (health.judge(Gpu(0, "?", "?", "?", None, None, lost="GPU is lost", processes_listed=False), (), None),)
    drift, plan, _ = assess(resource(**SPEC), observed(lost))
    assert {d.field: d.have for d in drift} == {"gpu0.healthy": False, "gpu0.memory_used": "unknown"}
    assert "its memory and who holds it cannot be read (GPU is lost)" in plan.blocked
    assert not REC.settles(drift)  # waiting does not help: verification does not poll for it


@pytest.mark.parametrize("have, spec, ok", [
    ("590.48.01", ">=590", True), ("580.95.05", ">=590", False), ("590.48.01", ">590", False),
    ("591.10", ">590", True), ("590.48.01", "==590", True), ("590.48.01", "==590.48.01", True),
    ("590.48.01", ">=580, <600", True), ("610.57.04", ">=580, <600", False), ("13.1", ">=12.8", True),
    ("12.2", ">=12.8", False), ("?", ">=590", None), (None, ">=12", None),
])
def test_version_constraints(have, spec, ok):
    assert version_satisfies(have, spec) is ok


@pytest.mark.parametrize("text, unit", [
    ("12:name=systemd:/system.slice/vllm-kimi-k25-int4.service\n0::/system.slice/vllm-kimi-k25-int4.service\n",
     VLLM),
    ("0::/system.slice/eagle3-extract.service\n", "eagle3-extract.service"),
    ("1:name=systemd:/reconcile-test-1a2b/system.slice/x.service/payload\n", "x.service"),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service\n", None),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("9:name=systemd:/\n0::/\n", None),
    ("", None),
])
def test_unit_of_cgroup(text, unit):
    assert unit_of_cgroup(text) == unit


def test_summary_lists_each_gpu():
    text = REC.summary(resource(count=8), observed(gpus(2)))
    assert text == ("2 GPUs via NVML (driver 590.48.01), healthy: GPU0 0MiB / 97887MiB, GPU1 0MiB / 97887MiB")


@pytest.mark.parametrize("body, expect", [
    ("gpus:\n  count: 8\n  free_with: {kil: [python]}\n", "unknown key 'kil' (did you mean 'kill'?)"),
    ("gpus:\n  max_memory_used: lots\n", "invalid size 'lots'"),
    ("gpus:\n  settle: soon\n", "invalid duration 'soon'"),
    ("gpus:\n  count: -1\n", "gpus.count"),
])
def test_schema_rejects_bad_sections(body, expect):
    with pytest.raises(StateFileError) as exc:
        validate_text("version: 1\n" + body, "s.yaml")
    assert expect in str(exc.value)
