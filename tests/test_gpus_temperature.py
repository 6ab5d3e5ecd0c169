"""The GPU temperature through nvmlDeviceGetTemperatureV, and through the deprecated
nvmlDeviceGetTemperature only on a driver without the new call.

The real pynvml loads the fake libnvidia-ml.so.1 built two ways: with the V call (a current driver)
and without it (a driver from before it, where pynvml raises FunctionNotFound). The expected
temperature is what pynvml itself reads from the same library at test time; which call answered
is told by failing the other one alone (the fake's `fail=temp:...` / `fail=temp_v:...`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import gpu_support as gs
import pytest

PROBE = textwrap.dedent("""
    import json, pynvml as n
    n.nvmlInit()
    out = []
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        row = {}
        for name in ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"):
            try:
                row[name] = getattr(n, name)(h, n.NVML_TEMPERATURE_GPU)
            except n.NVMLError as exc:
                row[name] = "error: " + type(exc).__name__
        out.append(row)
    n.nvmlShutdown()
    print(json.dumps(out))
""")


def pynvml_temperatures(lib, config) -> list[dict]:
    """Each GPU's answer to both calls, as pynvml reads them from the fake (or the error class)."""
    env = {**os.environ, **gs.nvml_env(lib, config)}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pre_v_lib(tmp_path_factory):
    """The fake as a driver before nvmlDeviceGetTemperatureV (everything else of a current one)."""
    try:
        return gs.build_fake_nvml(tmp_path_factory.mktemp("fakenvml-pre-v"), temperature_v=False)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot build the fake libnvidia-ml.so.1: {exc}")


def observed(tmp_path, lib, config, n: int) -> list[dict]:
    state = gs.write_state(tmp_path, f"gpus:\n  count: {n}\n")
    proc = gs.cli(tmp_path, lib, config, "diff", str(state), "--format", "json")
    return gs.gpus_report(proc)["observed"]["gpus"]


def config_of(tmp_path, temps, **kw):
    gpus = [gs.FakeGpu(temp=t, **kw) for t in temps]
    return gs.FakeConfig(gpus=gpus).write(tmp_path / "nvml.conf")


def test_current_driver_read_through_temperature_v(tmp_path, fake_lib):
    # The deprecated call refused (as a driver that dropped it would): only V can give the reading.
    config = config_of(tmp_path, (31, 77), fail={"temp": "deprecated"})
    truth = pynvml_temperatures(fake_lib, config)
    assert [t["nvmlDeviceGetTemperature"] for t in truth] == ["error: NVMLError_Deprecated"] * 2
    got = observed(tmp_path, fake_lib, config, 2)
    assert [g["temperature_c"] for g in got] == [t["nvmlDeviceGetTemperatureV"] for t in truth]
    assert all(not g.get("read_errors") for g in got), got


def test_pre_v_driver_falls_back_to_the_old_call(tmp_path, pre_v_lib):
    config = config_of(tmp_path, (29, 64, 88))
    truth = pynvml_temperatures(pre_v_lib, config)
    assert [t["nvmlDeviceGetTemperatureV"] for t in truth] == ["error: NVMLError_FunctionNotFound"] * 3
    got = observed(tmp_path, pre_v_lib, config, 3)
    assert [g["temperature_c"] for g in got] == [t["nvmlDeviceGetTemperature"] for t in truth]
    assert all(not g.get("read_errors") for g in got), got
    # A check on it judges the old call's reading, not "unknown".
    state = gs.write_state(tmp_path, "gpus:\n  count: 3\n  checks: {max_temperature: 80}\n")
    report = gs.gpus_report(gs.cli(tmp_path, pre_v_lib, config, "diff", str(state), "--format", "json"))
    assert report["drift"] == [{"field": "gpu2.temperature", "want": "<= 80C",
                                "have": f"{truth[2]['nvmlDeviceGetTemperature']}C"}]


def test_v_call_error_is_kept_not_hidden_by_the_old_call(tmp_path, fake_lib):
    """Only a missing function falls back: an error from V itself is the reading's error (the old
    call answering would hide a failing sensor)."""
    config = config_of(tmp_path, (40,), fail={"temp_v": "unknown"})
    truth = pynvml_temperatures(fake_lib, config)
    assert truth[0]["nvmlDeviceGetTemperatureV"] == "error: NVMLError_Unknown"
    assert truth[0]["nvmlDeviceGetTemperature"] == 40
    got = observed(tmp_path, fake_lib, config, 1)
    assert got[0]["temperature_c"] is None
    assert any("temperature" in e for e in got[0]["read_errors"]), got[0]


def test_gpu_lost_at_temperature_v_is_lost(tmp_path, fake_lib):
    config = config_of(tmp_path, (40,), error="lost", error_on=("temp_v",))
    truth = pynvml_temperatures(fake_lib, config)
    assert truth[0]["nvmlDeviceGetTemperatureV"] == "error: NVMLError_GpuIsLost"
    got = observed(tmp_path, fake_lib, config, 1)
    assert got[0]["temperature_c"] is None and got[0]["health"] == "unhealthy", got[0]
    assert "GPU is lost" in got[0]["lost"], got[0]


def test_unsupported_sensor_is_unknown_on_both_drivers(tmp_path, fake_lib, pre_v_lib):
    for lib in (fake_lib, pre_v_lib):
        config = config_of(tmp_path, (40,), unsupported=("temp",))
        truth = pynvml_temperatures(lib, config)
        assert truth[0]["nvmlDeviceGetTemperature"] == "error: NVMLError_NotSupported"
        got = observed(tmp_path, lib, config, 1)
        assert got[0]["temperature_c"] is None and not got[0].get("read_errors"), got[0]
