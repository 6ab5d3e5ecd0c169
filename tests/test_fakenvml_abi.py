"""The header check (docs/testing.md): the fake driver and pynvml against NVIDIA's own nvml.h.

- the fake (tests/fakenvml/) is compiled against nvml.h, so every function it exports has the header's
  prototype and every struct the header's layout; a prototype that differs does not build;
- for every NVML call reconcile makes (recorded from reconcile's own code running on the fake, in each
  driver the fake models), what pynvml passes (argument sizes, pointers, each struct's fields, the
  `version` of a versioned struct) equals what nvml.h declares: with the pynvml installed here and with
  the lowest nvidia-ml-py pyproject.toml allows;
- the NVML numbers reconcile writes as literals (field ids, clock-event bits, error codes, modes) and
  the pynvml constants it uses equal nvml.h's.
nvml.h comes from PyPI at test time (tests/nvml_header.py); without it these skip, which fails a CI run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gpu_support as gs
import nvml_abi as na
import pytest
from nvml_header import NvmlHeaderUnavailable, include_dir

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"current driver": {}, "no nvmlDeviceGetTemperatureV": {"temperature_v": False},
            "driver before 510": {"old_driver": True}}
BROKEN_PYNVML = "12.535.77"  # c_nvmlProcessInfo_t with a fifth field no nvml.h has (see reconcilers/gpus/nvml.py)


@pytest.fixture(scope="module")
def nvml_include(tmp_path_factory) -> Path:
    try:
        return include_dir(tmp_path_factory.mktemp("nvml-h"))
    except NvmlHeaderUnavailable as exc:
        pytest.skip(f"NVIDIA's nvml.h is not available: {exc}")  # no [ci-ok]: CI fetches it (.ci/run)


@pytest.fixture(scope="module")
def libs(tmp_path_factory, nvml_include) -> dict[str, Path]:
    return {name: gs.build_fake_nvml(tmp_path_factory.mktemp("abi-lib"), **kw) for name, kw in VARIANTS.items()}


def exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib / "libnvidia-ml.so.1")], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if re.search(r" T nvml", line)}


def pip_target(into: Path, requirement: str) -> Path:
    """REQUIREMENT (a pure-Python wheel) installed into INTO with pip; skips without PyPI (not [ci-ok])."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(into),
                           requirement], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"pip install {requirement}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
    return into


def floor_of_pynvml() -> str:
    """The lowest nvidia-ml-py pyproject.toml allows (its `nvidia-ml-py>=X`)."""
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'"nvidia-ml-py>=([0-9.]+)"', text).group(1)


# --- the fake against the header ------------------------------------------------------------------


def test_the_fake_builds_against_nvml_h_in_every_driver_it_models(libs):
    current, old = exported(libs["current driver"]), exported(libs["driver before 510"])
    no_v = exported(libs["no nvmlDeviceGetTemperatureV"])
    newer = {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV",
             "nvmlDeviceGetCurrentClocksEventReasons"}
    assert newer <= current and not newer & old
    assert current - no_v == {"nvmlDeviceGetTemperatureV"}
    assert {"nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetCurrentClocksThrottleReasons"} <= old


def copy_sources(tmp: Path) -> list[Path]:
    (tmp / "src").mkdir()
    for f in (gs.HERE / "fakenvml").glob("fakenvml*"):
        shutil.copy(f, tmp / "src" / f.name)
    return [tmp / "src" / p.name for p in gs.FAKE_SRC]


def test_a_prototype_unlike_nvml_h_does_not_build(tmp_path, nvml_include):
    """The check can fail: an output pointer one size too wide (unsigned long long * where nvml.h says
    unsigned int *) is C's "conflicting types" against the header's prototype."""
    src = copy_sources(tmp_path)
    text = src[0].read_text()
    assert "nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *power)" in text
    src[0].write_text(text.replace("nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *power)",
                                   "nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned long long *power)"))
    with pytest.raises(subprocess.CalledProcessError) as failed:
        gs.build_fake_nvml(tmp_path / "lib", sources=src)
    assert re.search(r"conflicting types for .nvmlDeviceGetPowerUsage.", failed.value.stderr), failed.value.stderr


def test_a_function_nvml_h_does_not_declare_does_not_build(tmp_path, nvml_include):
    src = copy_sources(tmp_path)
    src[1].write_text(src[1].read_text() + "nvmlReturn_t nvmlDeviceGetNoSuchThing(nvmlDevice_t dev, unsigned *v) {\n"
                      "    (void)dev; *v = 0; return NVML_SUCCESS;\n}\n")
    with pytest.raises(subprocess.CalledProcessError) as failed:
        gs.build_fake_nvml(tmp_path / "lib", sources=src)
    assert "no previous prototype for" in failed.value.stderr and "nvmlDeviceGetNoSuchThing" in failed.value.stderr


def test_every_nvml_symbol_the_fake_exports_is_declared_by_nvml_h(libs, nvml_include, tmp_path):
    """Compiled on its own: C refuses the address of a function no declaration names."""
    symbols = set().union(*(exported(lib) for lib in libs.values()))
    src = tmp_path / "declared.c"
    src.write_text("#define NVML_NO_UNVERSIONED_FUNC_DEFS\n#include <nvml.h>\nvoid *const declared[] = {\n"
                   + "".join(f"    (void *)&{s},\n" for s in sorted(symbols)) + "};\n")
    proc = subprocess.run(["gcc", "-c", "-Wno-deprecated-declarations", f"-I{nvml_include}", "-o",
                           str(tmp_path / "declared.o"), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(symbols) > 60


# --- pynvml against the header, for the calls reconcile makes -------------------------------------


def record(tmp: Path, lib: Path, holders, pynvml_dir: Path | None = None) -> dict:
    """Reconcile's own NVML code on the fake LIB (tests/nvml_abi.py record), with pynvml from PYNVML_DIR
    (default: the one installed): two compute processes and a C+G one on GPU 0, one in a MIG instance."""
    tag = gs.new_tag()
    for name in ("abi-compute", "abi-second", "abi-both"):
        holders.start(name, tag)
    conf = gs.FakeConfig(
        gpus=[gs.FakeGpu(nvlink=(1, 0)), gs.FakeGpu(mig=True, mig_instances=((1, 0, 40192), (2, 0, 40192)))],
        holders=[gs.FakeHolder(mib=1000, gpus=[0], comm="abi-compute"),
                 gs.FakeHolder(mib=2000, gpus=[0, 1], comm="abi-second", gi=1),
                 gs.FakeHolder(mib=300, gpus=[0], comm="abi-both", both=True)],
        driver="550.54.15").write(tmp / "nvml.conf")
    env = dict(os.environ, **gs.nvml_env(lib, conf))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pynvml_dir or ""), str(gs.HERE)) if p)
    out = tmp / "recorded.json"
    proc = subprocess.run([sys.executable, str(gs.HERE / "nvml_abi.py"), "record", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads(out.read_text())
    if pynvml_dir is not None:
        assert recorded["pynvml"].startswith(str(pynvml_dir)), recorded["pynvml"]
    return recorded


def merged(recordings: list[dict]) -> dict:
    calls: dict = {}
    for rec in recordings:
        for name, entry in rec["calls"].items():
            into = calls.setdefault(name, {"params": [], "restype": entry["restype"]})
            for i, seen in enumerate(entry["params"]):
                if i == len(into["params"]):
                    into["params"].append([])
                into["params"][i] += [d for d in seen if d not in into["params"][i]]
    return calls


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, libs) -> list[dict]:
    out = []
    for name, lib in libs.items():
        h = gs.Holders()
        try:
            out.append(record(tmp_path_factory.mktemp(f"rec-{name.split()[0]}"), lib, h))
        finally:
            h.cleanup()
    return out


def test_every_pynvml_function_reconcile_names_is_recorded(recorded):
    import pynvml

    funcs, _ = na.referenced(ROOT, pynvml)
    reached = set().union(*(set(r["wrappers"]) for r in recorded))
    assert funcs - reached == set()
    # the fallbacks the fake's drivers make reconcile take, reached through reconcile's code, not called directly
    by_code = set().union(*(set(r["wrappers"]) - set(r["direct"]) for r in recorded))
    assert {"nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksThrottleReasons",
            "nvmlDeviceGetMemoryInfo"} <= by_code
    # the process lists reconcile reads itself (nvml.py _process_list): the library's _v2 on a driver before 510
    assert {"nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v2",
            "nvmlDeviceGetComputeRunningProcesses_v3"} <= set().union(*(set(r["by_code"]) for r in recorded))
    assert len(funcs) > 40


def test_pynvml_passes_what_nvml_h_declares_for_every_call_reconcile_makes(recorded, nvml_include, tmp_path):
    calls = merged(recorded)
    facts = na.header_facts(nvml_include, calls, [], tmp_path)
    assert na.compare(calls, facts) == []
    # what was compared: the structs, with their version macros
    assert {"nvmlMemory_v2", "nvmlTemperature_v1"} <= set(facts["versions"])
    compared = {d["ctype"] for e in calls.values() for seen in e["params"] for d in seen if "layout" in d}
    assert {"c_nvmlMemory_t", "c_nvmlMemory_v2_t", "c_nvmlFieldValue_t", "c_nvmlTemperature_v1_t"} <= compared
    assert any("ProcessInfo" in c for c in compared) and any("PciInfo" in c for c in compared)


def test_the_lowest_pynvml_reconcile_allows_passes_what_nvml_h_declares(tmp_path, libs, nvml_include, holders):
    floor = floor_of_pynvml()
    pyn = pip_target(tmp_path / "pynvml", f"nvidia-ml-py=={floor}")
    rec = record(tmp_path, libs["current driver"], holders, pyn)
    calls = merged([rec])
    assert na.compare(calls, na.header_facts(nvml_include, calls, [], tmp_path)) == []


def test_the_pynvml_constants_reconcile_uses_equal_nvml_h(nvml_include, tmp_path):
    import pynvml

    _, consts = na.referenced(ROOT, pynvml)
    assert {"NVML_TEMPERATURE_GPU", "NVML_VOLATILE_ECC", "nvmlMemory_v2"} <= consts
    facts = na.header_facts(nvml_include, {}, sorted(consts), tmp_path)
    assert {c: getattr(pynvml, c) for c in consts} == facts["constants"]


def test_reconciles_own_nvml_numbers_equal_nvml_h(nvml_include, tmp_path):
    """Literals in reconcile's code, by the nvml.h name each stands for (the names are the code's own
    comments; the values are read from the header)."""
    from reconcile_host.reconcilers.gpus import catalogue, nvml, nvml_settings

    ours = {"NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": nvml.FIELD_RECOVERY_ACTION,
            "NVML_FI_DEV_NVLINK_LINK_COUNT": nvml.FIELD_NVLINK_LINK_COUNT,
            "NVML_CLOCK_GRAPHICS": nvml_settings.CLOCK_GRAPHICS, "NVML_CLOCK_MEM": nvml_settings.CLOCK_MEM,
            "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18, "NVML_ERROR_NO_PERMISSION": 4,
            "NVML_ERROR_DRIVER_NOT_LOADED": 9, "NVML_ERROR_LIBRARY_NOT_FOUND": 12}
    assert set(nvml.INIT_HINTS) == {18, 4, 9, 12}
    # nvml.h names the three hardware reasons only as nvmlClocksThrottleReason*
    events = {"gpu_idle": "EventReasonGpuIdle", "applications_clocks": "EventReasonApplicationsClocksSetting",
              "sw_power_cap": "EventReasonSwPowerCap", "hw_slowdown": "ThrottleReasonHwSlowdown",
              "sync_boost": "EventReasonSyncBoost", "sw_thermal": "EventReasonSwThermalSlowdown",
              "hw_thermal": "ThrottleReasonHwThermalSlowdown", "hw_power_brake": "ThrottleReasonHwPowerBrakeSlowdown",
              "display_clocks": "EventReasonDisplayClockSetting"}
    ours.update({f"nvmlClocks{events[name]}": bit for bit, name in nvml.CLOCK_EVENT_BITS.items()})
    modes = {"default": "DEFAULT", "exclusive_thread": "EXCLUSIVE_THREAD", "prohibited": "PROHIBITED",
             "exclusive_process": "EXCLUSIVE_PROCESS"}
    ours.update({f"NVML_COMPUTEMODE_{modes[name]}": code for code, name in nvml_settings.COMPUTE_MODES.items()})
    ours.update({f"NVML_GPU_RECOVERY_ACTION_{name.upper()}": code for code, name in catalogue.RECOVERY_NAMES.items()})
    facts = na.header_facts(nvml_include, {}, sorted(ours), tmp_path)
    assert ours == facts["constants"]


# --- a pynvml that is wrong: found by the check, worked around by reconcile --------------------------


def test_a_pynvml_with_the_wrong_process_entry_is_found_and_reconcile_reads_the_lists_right(
        tmp_path, libs, nvml_include, holders):
    """nvidia-ml-py 12.535.77 reads the _v3 process lists with a 32-byte entry; nvml.h's is 24 bytes.
    The check names it; reconcile, run with that pynvml, lists the same processes and memory as the
    installed pynvml reads from the same fake."""
    pyn = pip_target(tmp_path / "pynvml", f"nvidia-ml-py=={BROKEN_PYNVML}")
    rec = record(tmp_path, libs["current driver"], holders, pyn)
    calls = merged([rec])
    problems = na.compare(calls, na.header_facts(nvml_include, calls, [], tmp_path))
    assert any("usedGpuCcProtectedMemory" in p for p in problems), problems
    assert any("RunningProcesses_v3" in p and "32 bytes" in p and "24" in p for p in problems), problems

    # the same fake and processes (record() wrote the config and started them), read three ways
    env = dict(os.environ, **gs.nvml_env(libs["current driver"], tmp_path / "nvml.conf"))
    code = ("import json\nfrom reconcile_host.reconcilers.gpus.nvml import nvml_observe\nr = nvml_observe()\n"
            "print(json.dumps(sorted([pid, u.gpu, u.used_bytes, u.gpu_instance] for pid, us in r.uses.items() "
            "for u in us)))")
    with_broken = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 env=dict(env, PYTHONPATH=str(pyn)))
    with_installed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    uses = json.loads(with_broken.stdout)
    assert uses == json.loads(with_installed.stdout)
    pids = {p.pid for p in holders.procs}
    assert {u[0] for u in uses} == pids
    assert sorted(u[1] for u in uses) == [0, 0, 0, 1]  # three on GPU 0 (the C+G one once), one on GPU 1

    # and pynvml's own list, which reconcile no longer takes from it, is wrong beyond the first entry
    raw = ("import json, pynvml\npynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
           "print(json.dumps(sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))))")
    theirs = json.loads(subprocess.run([sys.executable, "-c", raw], capture_output=True, text=True, check=True,
                                       env=dict(env, PYTHONPATH=str(pyn))).stdout)
    assert set(theirs) != {u[0] for u in uses if u[1] == 0}
