"""GPU settings (`gpus.settings`) without a host: observed GPUs in, drift per GPU per setting and the
minimal plan out; the state file's values and the errors for bad ones. (Through the fake driver and
the real pynvml: test_gpus_settings.py; on the namespaced systemd: test_seed_recovery.py,
test_gpus_boot.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
from reconcile_host.common.systemd import UnitObserved
from reconcile_host.core.contract import Context, Resource
from reconcile_host.pipeline.engine import judge
from reconcile_host.pipeline.statefile import StateFileError, validate_text
from reconcile_host.reconcilers.gpus import GpusReconciler
from reconcile_host.reconcilers.gpus.observed import MIB, Gpu, GpuSettings, GpusObserved, GpuUse, Holder, SettingsHost
from reconcile_host.reconcilers.gpus.settings import parse_clock, parse_power

REC = GpusReconciler()
PERSISTENCED = "nvidia-persistenced.service"
CLOCKS = ((14001, tuple(range(210, 2431, 15))), (405, tuple(range(210, 421, 15))))


def settings(**kw) -> GpuSettings:
    base = dict(power_limit_mw=600000, power_default_mw=600000, power_min_mw=150000, power_max_mw=600000,
                compute_mode="default", application_clocks=(14001, 1590), default_application_clocks=(14001, 1590),
                supported_clocks=CLOCKS, graphics_clock=210, mig_pending=False, ecc=True, ecc_pending=True)
    base.update(kw)
    return GpuSettings(**base)


def gpu(i: int, persistence=True, mig=False, **kw) -> Gpu:
    return Gpu(i, "NVIDIA RTX PRO 6000 Blackwell Server Edition", f"GPU-{i}", f"00000000:{i + 1:02X}:00.0",
               97887 * MIB, 0, health="healthy", persistence_mode=persistence, mig=mig,
               settings=kw.pop("s", None) or settings(), **kw)


def observed(gpus, holders=(), unit=None, note="", source="nvml") -> GpusObserved:
    return GpusObserved(source, "590.48.01", tuple(gpus), tuple(holders),
                        settings_host=SettingsHost(unit, note, "boot-1", "[    4.2] NVRM: loading"))


def unit(active="inactive", file_state="disabled", load="loaded") -> UnitObserved:
    return UnitObserved(PERSISTENCED, load, active, "running" if active == "active" else "dead", file_state, 0,
                        f"/usr/lib/systemd/system/{PERSISTENCED}")


def resource(settings_section, **section) -> Resource:
    return REC.resources({"settings": settings_section, "observe_timeout": "20s", **section})[0]


def assess(res, obs, declared=()):
    ctx = Context(resources={r.id: r for r in (res, *declared)})
    drift = REC.diff(res, obs)
    plan = REC.plan(res, obs, drift, ctx)
    return drift, plan, judge(drift, plan)


def fields(drift):
    return {d.field: (d.want, d.have) for d in drift}


def holder(pid, name, on, unit_name=None) -> Holder:
    return Holder(pid, name, name, unit_name, 1000 + pid, tuple(GpuUse(g, 72289 * MIB) for g in on))


# --- the state file --------------------------------------------------------------------------------

def test_values_read_in_nvml_units():
    assert parse_power("450W") == 450000 and parse_power("0.45kW") == 450000 and parse_power("450.5 W") == 450500
    assert parse_power("default") == "default"
    assert parse_clock("1980MHz") == 1980 and parse_clock("1.98GHz") == 1980
    for bad in ("450", "450w", "W", "-3W"):
        with pytest.raises(ValueError):
            parse_power(bad)
    r = resource({"power_limit": "450W", "application_clocks": {"memory": "9501MHz", "graphics": "1.98GHz"},
                  "locked_clocks": "none", "mig": "disabled", "ecc": "enabled", "persistence_mode": True,
                  "per_gpu": {3: {"power_limit": "default"}, "5": {"mig": "enabled"}}})
    assert r.spec["settings"] == {
        "all": {"persistence_mode": True, "power_limit": 450000, "application_clocks": (9501, 1980),
                "locked_clocks": "none", "mig": False, "ecc": True},
        "per_gpu": {3: {"power_limit": "default"}, 5: {"mig": True}}}


@pytest.mark.parametrize(("body", "where", "message"), [
    ("    power_limit: 450\n", "4:18", "gpus.settings.power_limit: invalid power limit 450: use watts with a unit"),
    ("    power_limit: 450mW\n", "4:18", "invalid power limit '450mW'"),
    ("    compute_mode: exclusive\n", "4:19", 'gpus.settings.compute_mode: expected one of "default", '
                                              '"exclusive_process", "prohibited"; got "exclusive"'),
    ("    application_clocks: {memory: 9501, graphics: 1980MHz}\n", "4:34",
     "gpus.settings.application_clocks.memory: invalid clock 9501: use MHz"),
    ("    application_clocks: fast\n", "4:25", "gpus.settings.application_clocks: expected default or "
                                               "{memory: 9501MHz, graphics: 1980MHz}, got 'fast'"),
    ("    locked_clocks: {min: 1500MHz}\n", "4:20", "gpus.settings.locked_clocks: missing required key 'max'"),
    ("    locked_clocks: {min: 1980MHz, max: 1500MHz}\n", "4:26",
     "gpus.settings.locked_clocks: min 1980MHz is above max 1500MHz"),
    ("    mig: on\n", "4:10", 'gpus.settings.mig: expected one of "enabled", "disabled"; got "on"'),
    ("    per_gpu:\n      x: {ecc: enabled}\n", "5:7", "gpus.settings.per_gpu: invalid name 'x'"),
    ("    per_gpu:\n      2: {powr_limit: 400W}\n", "5:11",
     "gpus.settings.per_gpu.2: unknown key 'powr_limit' (did you mean 'power_limit'?)"),
    ("    per_gpu:\n      2: {locked_clocks: {min: 2GHz, max: 1GHz}}\n", "5:32",
     "gpus.settings.per_gpu.2.locked_clocks: min 2GHz is above max 1GHz"),
    ("    per_gpu:\n      2: {ecc: enabled}\n      '02': {ecc: disabled}\n", "6:13",
     "gpus.settings.per_gpu: GPU 2 is declared twice"),
    ("    persistence_mode: false\n  checks:\n    persistence_mode: enabled\n", "4:23",
     "gpus.settings.persistence_mode: false contradicts checks.persistence_mode: enabled"),
])
def test_bad_values_are_one_line_with_file_line_col(body, where, message):
    text = "version: 1\ngpus:\n  settings:\n" + body
    with pytest.raises(StateFileError) as err:
        validate_text(text, "s.yaml")
    lines = err.value.problems
    assert len(lines) == 1 and lines[0].startswith(f"s.yaml:{where}: "), lines
    assert message in lines[0], lines


def test_the_issues_example_is_valid():
    validate_text("version: 1\ngpus:\n  settings:\n    persistence_mode: true\n    power_limit: 450W\n"
                  "    compute_mode: default\n    application_clocks: {memory: 9501MHz, graphics: 1980MHz}\n"
                  "    locked_clocks: {min: 1500MHz, max: 1980MHz}\n    mig: disabled\n    ecc: enabled\n"
                  "    per_gpu:\n      3: {power_limit: default, locked_clocks: none}\n", "s.yaml")


# --- drift: per GPU, per field; nothing for what is right -------------------------------------------

def test_story_host_drift_is_exactly_the_wrong_fields():
    gpus = [gpu(i, persistence=False) for i in range(8)]
    gpus[5] = replace(gpus[5], settings=settings(power_limit_mw=450000))
    res = resource({"persistence_mode": True, "power_limit": "600W", "compute_mode": "default", "mig": "disabled",
                    "ecc": "enabled"})
    drift, plan, status = assess(res, observed(gpus))
    assert fields(drift) == {**{f"gpu{i}.persistence_mode": (True, False) for i in range(8)},
                             "gpu5.power_limit": ("600 W", "450 W")}
    assert status.value == "drift"
    # nvidia-persistenced not installed: one NVML setter per GPU, and one power limit.
    assert [(a.action, a.target) for a in plan.actions] == [
        *(("set", f"gpu{i}.persistence_mode") for i in range(8)), ("set", "gpu5.power_limit")]
    assert plan.actions[-1].params["value"] == 600000
    assert plan.actions[-1].description == "set GPU 5's power limit to 600 W (now 450 W)"
    assert "nvidia-persistenced.service is not installed: persistence mode on GPUs 0-7 is set through NVML" \
        in plan.message
    # All right: no drift, no action.
    ok = [gpu(i) for i in range(8)]
    assert assess(res, observed(ok))[0] == []


def test_default_means_the_gpus_own_default():
    res = resource({"power_limit": "default", "application_clocks": "default"})
    g = gpu(0, s=settings(power_limit_mw=450000, power_default_mw=575000, application_clocks=(14001, 2430)))
    drift, plan, _ = assess(res, observed([g]))
    assert fields(drift) == {"gpu0.power_limit": ("default (575 W)", "450 W"),
                             "gpu0.application_clocks": ("default (memory 14001 MHz, graphics 1590 MHz)",
                                                         "memory 14001 MHz, graphics 2430 MHz")}
    assert [(a.target, a.params["value"]) for a in plan.actions] == [("gpu0.power_limit", 575000),
                                                                     ("gpu0.application_clocks", "default")]


def test_per_gpu_overrides_and_a_gpu_the_host_does_not_have():
    res = resource({"compute_mode": "exclusive_process",
                    "per_gpu": {1: {"compute_mode": "default"}, 9: {"ecc": "enabled"}}})
    g = [gpu(0), gpu(1, s=settings(compute_mode="exclusive_process"))]
    drift, plan, status = assess(res, observed(g))
    assert fields(drift) == {"gpu0.compute_mode": ("exclusive_process", "default"),
                             "gpu1.compute_mode": ("default", "exclusive_process"),
                             "gpu9.settings": ("a GPU to set", "no such GPU")}
    assert status.value == "blocked"
    assert "settings.per_gpu names GPU 9, which this host does not have (2 GPUs)" in plan.blocked
    assert [a.target for a in plan.actions] == ["gpu0.compute_mode", "gpu1.compute_mode"]


# --- values a GPU does not support: blocked for that GPU, with the range ----------------------------

def test_power_limit_outside_the_constraints_is_blocked_with_the_range():
    res = resource({"power_limit": "700W"})
    drift, plan, status = assess(res, observed([gpu(0), gpu(1, s=settings(power_max_mw=750000))]))
    assert status.value == "blocked"
    assert "GPU 0: power_limit 700 W is outside what it supports: 150 W to 600 W " \
           "(nvmlDeviceGetPowerManagementLimitConstraints)" in plan.blocked
    assert [a.target for a in plan.actions] == ["gpu1.power_limit"]  # the other GPU goes on


def test_clocks_the_gpu_does_not_support_are_blocked_with_what_it_does():
    res = resource({"application_clocks": {"memory": "9501MHz", "graphics": "1980MHz"}, "per_gpu": {
        1: {"application_clocks": {"memory": "14001MHz", "graphics": "1985MHz"}},
        2: {"application_clocks": "default", "locked_clocks": {"min": "100MHz", "max": "1980MHz"}}}})
    _, plan, status = assess(res, observed([gpu(0), gpu(1), gpu(2)]))
    assert status.value == "blocked"
    assert "GPU 0: application_clocks memory 9501 MHz is not a memory clock it supports: 14001 MHz, 405 MHz " \
           "(nvmlDeviceGetSupportedMemoryClocks)" in plan.blocked
    assert "GPU 1: application_clocks graphics 1985 MHz is not a graphics clock it supports with memory at " \
           "14001 MHz: 210-2430 MHz, 149 clocks" in plan.blocked
    assert "GPU 2: locked_clocks 100-1980 MHz is outside the graphics clocks it supports: 210-2430 MHz" in plan.blocked
    assert not plan.actions  # GPU 2's application clocks are its defaults already


def test_unsupported_deprecated_and_unreadable_settings_are_blocked_for_that_gpu():
    res = resource({"ecc": "enabled", "application_clocks": {"memory": "14001MHz", "graphics": "1980MHz"},
                    "compute_mode": "default"})
    geforce = gpu(0, s=settings(ecc=None, ecc_pending=None, application_clocks=None,
                                unsupported=(("application_clocks", "deprecated by this driver (NVML: Requested "
                                                                    "functionality has been deprecated)"),
                                             ("ecc", "not supported by this GPU or driver"))))
    broken = gpu(1, s=settings(compute_mode=None, unreadable=(("compute_mode", "Unknown Error"),)))
    drift, plan, status = assess(res, observed([geforce, broken]))
    assert fields(drift) == {"gpu0.application_clocks": ("memory 14001 MHz, graphics 1980 MHz", "not supported"),
                             "gpu0.ecc": ("enabled", "not supported"),
                             "gpu1.compute_mode": ("default", "unknown"),
                             "gpu1.application_clocks": ("memory 14001 MHz, graphics 1980 MHz",
                                                         "memory 14001 MHz, graphics 1590 MHz")}
    assert status.value == "blocked"
    assert "GPU 0: application_clocks cannot be set: deprecated by this driver (NVML: Requested functionality has " \
           "been deprecated): declare locked_clocks instead" in plan.blocked
    assert "GPU 0: ecc cannot be set: not supported by this GPU or driver" in plan.blocked
    assert "GPU 1: compute_mode cannot be read (Unknown Error): not set" in plan.blocked
    assert [a.target for a in plan.actions] == ["gpu1.application_clocks"]


def test_without_nvml_the_settings_are_read_but_not_set():
    res = resource({"power_limit": "450W"})
    _, plan, status = assess(res, observed([gpu(0)], source="nvidia-smi"))
    assert status.value == "blocked" and not plan.actions
    assert "GPU settings are set through NVML, which is unavailable here" in plan.blocked


# --- MIG and ECC: pending, converging, refused on a busy GPU ---------------------------------------

def test_mig_and_ecc_pending_are_converging_never_done():
    res = resource({"mig": "enabled", "per_gpu": {1: {"ecc": "disabled"}}})
    g = [gpu(0, s=settings(mig_pending=True)), gpu(1, mig=True, s=settings(mig_pending=True, ecc_pending=False))]
    drift, plan, status = assess(res, observed(g))
    assert fields(drift) == {"gpu0.mig": ("enabled", "disabled (pending: enabled)"),
                             "gpu1.ecc": ("disabled", "enabled (pending: disabled)")}
    assert status.value == "converging" and not plan.actions
    assert plan.converging == "GPU 1: ECC mode disabled is pending: reboot; GPU 0: MIG mode enabled is pending: " \
                              "reset GPU 0"


def test_a_pending_change_the_state_does_not_want_is_undone():
    res = resource({"mig": "disabled"})
    drift, plan, _ = assess(res, observed([gpu(0, s=settings(mig_pending=True))]))
    assert fields(drift) == {"gpu0.mig": ("disabled", "disabled (pending: enabled)")}
    assert [(a.target, a.params["value"]) for a in plan.actions] == [("gpu0.mig", False)]


def test_mig_on_a_held_gpu_is_blocked_naming_the_holder_the_others_go_on():
    res = resource({"mig": "enabled", "ecc": "disabled"})
    vllm = holder(4242, "vllm", [0], "vllm-kimi-k25-int4.service")
    drift, plan, status = assess(res, observed([gpu(0), gpu(1)], holders=[vllm]))
    assert status.value == "blocked"
    assert "GPU 0: MIG mode cannot be changed while a process holds the GPU: 4242 (vllm) in " \
           "vllm-kimi-k25-int4.service" in plan.blocked
    assert "GPU 0: ECC mode cannot be changed while a process holds the GPU" in plan.blocked
    assert [a.target for a in plan.actions] == ["gpu1.ecc", "gpu1.mig"]


def test_mig_waits_for_a_holder_a_declared_unit_stops_first():
    res = resource({"mig": "enabled"})
    vllm_unit = Resource(id="unit:vllm.service", kind="unit", name="vllm.service", spec={"active": False})
    drift, plan, status = assess(res, observed([gpu(0)], holders=[holder(4242, "vllm", [0], "vllm.service")]),
                                 declared=[vllm_unit])
    assert status.value == "drift" and not plan.actions and not plan.blocked
    assert "GPU 0: MIG mode is set once 4242 (vllm) in vllm.service has let go of it (freed first)" in plan.message


def test_other_settings_are_set_on_a_busy_gpu():
    res = resource({"power_limit": "450W", "compute_mode": "exclusive_process"})
    _, plan, status = assess(res, observed([gpu(0)], holders=[holder(7, "python", [0])]))
    assert status.value == "drift" and [a.target for a in plan.actions] == ["gpu0.compute_mode", "gpu0.power_limit"]


# --- persistence: nvidia-persistenced where it exists ----------------------------------------------

def test_persistence_through_the_installed_daemon_is_enabled_and_started_by_the_units_rules():
    res = resource({"persistence_mode": True})
    g = [gpu(0, persistence=False), gpu(1, persistence=False)]
    _, plan, _ = assess(res, observed(g, unit=unit()))
    assert [(a.action, a.target) for a in plan.actions] == [("enable", PERSISTENCED), ("start", PERSISTENCED)]
    assert plan.actions[0].description == f"enable {PERSISTENCED}: persistence mode on GPUs 0,1 (NVIDIA's " \
                                          "persistence daemon)"
    # enabled but stopped: started only
    _, plan, _ = assess(res, observed(g, unit=unit(file_state="enabled")))
    assert [(a.action, a.target) for a in plan.actions] == [("start", PERSISTENCED)]
    # a static unit (no [Install] of its own) is started, not enabled
    _, plan, _ = assess(res, observed(g, unit=unit(file_state="static")))
    assert [(a.action, a.target) for a in plan.actions] == [("start", PERSISTENCED)]


def test_a_running_daemon_that_left_persistence_off_gets_the_nvml_setter():
    res = resource({"persistence_mode": True})
    _, plan, _ = assess(res, observed([gpu(0, persistence=False), gpu(1)], unit=unit("active", "enabled")))
    assert [(a.action, a.target) for a in plan.actions] == [("set", "gpu0.persistence_mode")]
    assert "nvidia-persistenced.service is running, yet persistence mode on GPU 0 is off (a daemon started with " \
           "--no-persistence-mode?): set through NVML" in plan.message


def test_masked_daemon_missing_daemon_and_no_systemd_use_nvml():
    res = resource({"persistence_mode": True})
    g = [gpu(0, persistence=False)]
    for obs, why in ((observed(g, unit=unit(file_state="masked", load="masked")), f"{PERSISTENCED} is masked"),
                     (observed(g, unit=unit(load="not-found", file_state="")), f"{PERSISTENCED} is not installed"),
                     (observed(g, note="systemctl is not installed"), "systemctl is not installed")):
        _, plan, _ = assess(res, obs)
        assert [(a.action, a.target) for a in plan.actions] == [("set", "gpu0.persistence_mode")], why
        assert f"{why}: persistence mode on GPU 0 is set through NVML" in plan.message


def test_a_declared_persistenced_unit_does_the_work_or_contradicts():
    res = resource({"persistence_mode": True})
    g = [gpu(0, persistence=False)]
    declared = Resource(id=f"unit:{PERSISTENCED}", kind="unit", name=PERSISTENCED, spec={"active": True})
    _, plan, status = assess(res, observed(g, unit=unit()), declared=[declared])
    assert not plan.actions and f"persistence mode on GPU 0: by unit:{PERSISTENCED}" in plan.message
    against = Resource(id=f"unit:{PERSISTENCED}", kind="unit", name=PERSISTENCED, spec={"active": False})
    _, plan, status = assess(res, observed(g, unit=unit()), declared=[against])
    assert status.value == "blocked" and f"persistence_mode: true needs {PERSISTENCED} running, but the state " \
                                         "declares it active: false" in plan.blocked


def test_the_setting_stands_for_the_check_of_the_same_field():
    res = REC.resources({"settings": {"persistence_mode": True}, "checks": {"persistence_mode": "enabled"}})[0]
    drift, plan, _ = assess(res, observed([gpu(0, persistence=False)]))
    assert [d.field for d in drift] == ["gpu0.persistence_mode"]
    assert not plan.blocked and [a.target for a in plan.actions] == ["gpu0.persistence_mode"]


# --- locked clocks: NVML has no getter ------------------------------------------------------------

def test_locked_clocks_unknown_until_recorded_then_held_against_the_clock():
    res = resource({"locked_clocks": {"min": "1500MHz", "max": "1980MHz"}})
    drift, plan, _ = assess(res, observed([gpu(0)]))
    assert fields(drift) == {"gpu0.locked_clocks": ("1500-1980 MHz", "unknown")}
    [a] = plan.actions
    assert a.params == {"gpu": 0, "uuid": "GPU-0", "setting": "locked_clocks", "value": [1500, 1980],
                        "timeout": 20.0, "boot_id": "boot-1", "driver_load": "[    4.2] NVRM: loading"}
    recorded = gpu(0, s=settings(locked_clocks=(1500, 1980), graphics_clock=1500))
    assert assess(res, observed([recorded]))[0] == []
    # The GPU runs faster than the recorded lock allows: the lock is gone.
    gone = gpu(0, s=settings(locked_clocks=(1500, 1980), graphics_clock=2430))
    assert fields(assess(res, observed([gone]))[0]) == {
        "gpu0.locked_clocks": ("1500-1980 MHz", "not in force (graphics clock 2430 MHz, above 1980 MHz)")}
    none = resource({"locked_clocks": "none"})
    assert [a.params["value"] for a in assess(none, observed([gpu(0)]))[1].actions] == ["none"]
    assert assess(none, observed([gpu(0, s=settings(locked_clocks="none"))]))[0] == []


def test_a_lost_gpus_settings_are_left_to_its_health_verdict():
    lost = replace(gpu(1, persistence=None), lost="GPU is lost", health="unhealthy", step="reboot the node",
                   settings=GpuSettings())
    res = resource({"power_limit": "450W"}, healthy=False)
    drift, plan, status = assess(res, observed([gpu(0), lost]))
    assert fields(drift)["gpu1.power_limit"] == ("450 W", "unknown")
    assert "GPU 1 is lost (GPU is lost): its settings can be neither read nor set" in plan.blocked
    assert [a.target for a in plan.actions] == ["gpu0.power_limit"]
    judged = resource({"power_limit": "450W"})
    assert "gpu1.power_limit" not in fields(assess(judged, observed([gpu(0), lost]))[0])
