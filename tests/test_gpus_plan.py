"""The gpus kind without a host: observed fixtures in, drift and plan out; parsers of the
kernel log, /proc/PID/cgroup and recorded nvidia-smi CSV."""

from __future__ import annotations

import os

import gpu_support as gs
import pytest
from reconcile_host.pipeline.contract import Context, Resource
from reconcile_host.pipeline.engine import judge
from reconcile_host.pipeline.statefile import StateFileError, validate_text
from reconcile_host.reconcilers.gpus import GpusReconciler
from reconcile_host.reconcilers.gpus.observed import MIB, Gpu, GpusObserved, GpuUse, Holder, health_of
from reconcile_host.reconcilers.gpus.procfs import unit_of_cgroup
from reconcile_host.reconcilers.gpus.smi import parse_smi_apps, parse_smi_gpus
from reconcile_host.reconcilers.gpus.xid import parse_xids

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
    return GpusObserved("nvml", "590.48.01", tuple(gpu_list), tuple(holders), tuple(xids))


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
    assert d.spec["healthy"] is True and d.spec["free_with"] == {"stop_units": False, "kill": (), "grace": 10.0}
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


@pytest.mark.parametrize("pid", [1, os.getpid()])
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
    obs = observed(gpus(1, used_mib=1000), [holder(5, "eagle3-extract", 1000, [0])])
    assert assess(by_name, obs)[0] == []


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
    bad[3] = Gpu(3, "x", "GPU-3", "00000000:04:00.0", 1, 0, health="unhealthy",
                 problems=("row remapping failed",))
    drift, plan, status = assess(resource(**SEED_SPEC), observed(bad, xids=["Xid 64 on PCI:0000:04:00"]))
    assert {d.field for d in drift} == {"count", "gpu3.healthy"}
    assert status.value == "blocked"
    assert "expected 8 GPUs, found 7" in plan.blocked
    assert "GPU 3 (00000000:04:00.0) is unhealthy: row remapping failed" in plan.blocked
    assert "kernel log: Xid 64 on PCI:0000:04:00" in plan.message
    # healthy: false switches the check off.
    drift, _, _ = assess(resource(**{**SEED_SPEC, "healthy": False, "count": 7}), observed(bad))
    assert drift == []


@pytest.mark.parametrize("args, want", [
    ((0, False, False, False), ("healthy", ())),
    ((2, False, None, None), ("unhealthy", ("2 volatile uncorrected ECC errors",))),
    ((0, True, None, None), ("unhealthy", ("retired pages pending (needs a reset)",))),
    ((None, None, True, False), ("unhealthy", ("row remapping pending (needs a reset)",))),
    ((None, None, None, None), ("unknown", ())),
    ((0, False, None, None), ("healthy", ())),
    ((None, None, False, False), ("healthy", ())),
])
def test_health_of(args, want):
    assert health_of(*args) == want


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


def test_parse_xids_keeps_critical_ones_once():
    log = ("[ 10.0] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
           "[ 11.0] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
           "[ 12.0] NVRM: Xid (PCI:0000:5e:00): 13, pid=1, name=python, Graphics SM Warp Exception\n"
           "[ 13.0] NVRM: Xid (PCI:0000:5e:00): 94, pid=2, name=python, Contained: SM (0x1).\n"
           "[ 14.0] unrelated line\n")
    assert parse_xids(log) == ("Xid 79 on PCI:0000:3b:00: GPU has fallen off the bus.",
                               "Xid 94 on PCI:0000:5e:00: Contained: SM (0x1).")


def test_recorded_nvidia_smi_csv():
    idle = parse_smi_gpus((gs.DATA / "query-gpu-idle.csv").read_text(),
                          (gs.DATA / "query-remapped-rows.csv").read_text())
    assert len(idle) == 8 and {g.health for g in idle} == {"healthy"}
    assert (idle[0].memory_used, idle[0].memory_total) == (0, 97887 * MIB)
    assert idle[0].power_w == 84.12 and idle[0].temperature_c == 28
    busy = parse_smi_gpus((gs.DATA / "query-gpu-vllm.csv").read_text())
    assert busy[3].ecc_uncorrected_volatile is None and busy[3].health == "unknown"  # [N/A], no remap query
    uses = parse_smi_apps((gs.DATA / "query-compute-apps-vllm.csv").read_text(), {g.uuid: g.index for g in busy})
    assert list(uses) == [41876] and [u.gpu for u in uses[41876]] == list(range(8))
    assert uses[41876][0].used_bytes == 72289 * MIB


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
