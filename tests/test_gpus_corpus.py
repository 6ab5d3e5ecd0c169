"""Real nvidia-smi captures (tests/data/gpus/real/, README there) replayed through reconcile's
nvidia-smi fallback: a stand-in `nvidia-smi` answers reconcile's exact queries from each capture
(tests/smi_capture.py), /proc/driver/nvidia/gpus holds each GPU's Device Minor as the capture
says, and every GPU's reading and verdict is compared with what the capture says."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import gpu_support as gs
import pytest
import smi_capture as sc
from cli_support import report_of, run_cli
from reconcile_host.reconcilers.gpus.smi import Value, parse_nvlink_status

MIB = 2**20
REPLAYED = sorted(p.name for p in sc.REAL.iterdir()
                  if p.suffix in (".xml", ".txt") and not p.name.startswith("issue__") and "nvlink" not in p.name)
FEATURES = json.loads((sc.REAL / "features.json").read_text())


@pytest.fixture(scope="module")
def no_nvml(tmp_path_factory) -> Path:
    """The fake libnvidia-ml with no config: nvmlInit says Driver Not Loaded, as on a host whose
    NVML cannot start, so reconcile takes the nvidia-smi path whatever this machine has."""
    try:
        return gs.build_fake_nvml(tmp_path_factory.mktemp("nonvml"))
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot build the fake libnvidia-ml.so.1: {exc}")


def replay(tmp: Path, lib: Path, cap: sc.Capture, state: str, dev_glob: str = "", **extra) -> tuple[int, dict]:
    env = sc.install(cap, tmp, **extra)
    klog = tmp / "kern.log"
    if not klog.exists():
        klog.write_text("")
    path = tmp / "state.yaml"
    path.write_text("version: 1\n" + textwrap.dedent(state))
    proc = run_cli(tmp, "diff", str(path), "--format", "json", LD_LIBRARY_PATH=str(lib), RECONCILE_KERNEL_LOG=str(klog),
                   RECONCILE_NVIDIA_DEV_GLOB=dev_glob or str(tmp / "no-such-dev*"), **env)
    assert "Traceback" not in proc.stderr, proc.stderr
    report = report_of(proc)
    return proc.returncode, next(r for r in report["resources"] if r["id"] == "gpus")


def test_corpus_is_what_the_readme_says():
    manifest = json.loads((sc.REAL / "manifest.json").read_text())
    files = {p.name for p in sc.REAL.iterdir()} - {"README.md", "manifest.json", "features.json"}
    assert {e["file"] for e in manifest} == files
    assert all(e["licence"].split(" (")[0] in ("MIT", "Apache-2.0", "none stated") for e in manifest)
    readme = (sc.REAL / "README.md").read_text()
    assert all(name in readme for name in files)


@pytest.mark.parametrize("name", REPLAYED)
def test_translation_agrees_with_the_research_summary(name):
    """The stand-in's values (tests/smi_capture.py) against features.json, which the research
    tool wrote from the raw files by other code: minor, memory, remap, persistence, PCIe."""
    cap = sc.load(sc.REAL / name)
    for row, feat in zip(cap.gpus, FEATURES[name], strict=True):
        assert cap.minors[row["pci.bus_id"]] == (feat["minor"] or "N/A")
        if feat["fb"][0]:
            assert (row["memory.total"], row["memory.used"]) == tuple(feat["fb"])
        if isinstance(feat["remap"], list):
            assert row["remapped_rows.pending"] == feat["remap"][2]
        if feat["persistence"] not in (None, "N/A"):
            assert row["persistence_mode"] == feat["persistence"]
        width = (feat["pcie"][2] or "").rstrip("x")
        if width.isdigit():
            assert row["pcie.link.width.current"] == width


@pytest.mark.parametrize("name", REPLAYED)
def test_every_gpu_reads_as_its_capture_says(tmp_path, no_nvml, name):
    cap = sc.load(sc.REAL / name)
    code, gpus = replay(tmp_path, no_nvml, cap, f"gpus:\n  count: {len(cap.gpus)}\n  healthy: true\n")
    observed = gpus["observed"]
    assert observed["source"] == "nvidia-smi", gpus["message"]
    want = sc.expected(cap)
    assert len(observed["gpus"]) == len(want)
    for w, have in zip(want, observed["gpus"], strict=True):
        for key, value in w.items():
            if key != "step" or value:
                assert have[key] == value, (name, w["index"], key)
    # Every compute process on the GPU its UUID names, with its memory; C+G processes once.
    index = {w["uuid"]: w["index"] for w in want}
    uses = {(h["pid"], u["gpu"]): u["used_bytes"] for h in observed["holders"] for u in h["uses"]}
    for app in cap.apps:
        mem = Value(app["used_gpu_memory"]).int()
        assert uses[(int(app["pid"]), index[app["gpu_uuid"]])] == (None if mem is None else mem * MIB)
    assert len(uses) == len({(a["pid"], a["gpu_uuid"]) for a in cap.apps})
    # The verdict: a GPU the capture shows needing a reset is blocked with the step, without -v too.
    bad = [w for w in want if w["health"] == "unhealthy"]
    assert gpus["status"] == ("blocked" if bad else "ok") and code == (2 if bad else 0)
    for w in bad:
        assert f"GPU {w['index']} ({w['bus_id']}) must not run jobs: reset the GPU" in gpus["message"]


def test_a10_with_a_pending_row_remap_is_blocked_in_the_text_report(tmp_path, no_nvml):
    cap = sc.load(sc.REAL / "gpud__a10__535.129.03.q.txt")
    code, gpus = replay(tmp_path, no_nvml, cap, "gpus:\n  healthy: true\n")
    assert code == 2 and gpus["drift"] == [{"field": "gpu0.healthy", "want": True, "have": False}]
    assert "row remapping pending [NVIDIA GPU Memory Error Management]" in gpus["message"]


def test_minor_numbers_not_indices_decide_who_holds_a_gpu(tmp_path, no_nvml):
    """8x RTX 4090 (gpud capture): minors 3,2,1,0,7,6,5,4 by index. /dev/nvidia1 is index 2, idle;
    index 1 is busy with 6 MiB more than its one process holds. A holder of /dev/nvidia1 must not be
    put on the busy GPU (reading the minor as the index did, and planned to terminate it)."""
    cap = sc.load(sc.REAL / "gpud__8x-rtx-4090__535.154.05__1.q.txt")
    rows = {int(r["index"]): r for r in cap.gpus}
    assert cap.minors[rows[2]["pci.bus_id"]] == "1" and rows[1]["memory.used"] == "21608 MiB"
    devdir = tmp_path / "dev"
    devdir.mkdir()
    for n in range(8):
        (devdir / f"nvidia{n}").write_bytes(b"")
    holders = gs.Holders()
    try:
        idle = holders.start("python-idle", gs.new_tag(), hold=devdir / "nvidia1")
        busy = holders.start("python-busy", gs.new_tag(), hold=devdir / "nvidia2")  # minor 2 = index 1
        state = "gpus:\n  max_memory_used: 0MiB\n  healthy: true\n  free_with: {kill: [\"python*\"]}\n"
        code, gpus = replay(tmp_path, no_nvml, cap, state, dev_glob=str(devdir / "nvidia*"))
        targets = [a["target"] for a in gpus["actions"]]
        assert f"pid {idle.pid}" not in targets
        assert f"pid {busy.pid}" in targets
        on = {h["pid"]: [u["gpu"] for u in h["uses"]] for h in gpus["observed"]["holders"]}
        assert on[idle.pid] == [2] and on[busy.pid] == [1]
        # Without /proc/driver/nvidia (minors unknown) no device-file holder is tied to a GPU or signalled.
        for info in (tmp_path / "proc-driver-nvidia-gpus").rglob("information"):
            info.unlink()
        cap.minors = {bus: "N/A" for bus in cap.minors}
        code, gpus = replay(tmp_path, no_nvml, cap, state, dev_glob=str(devdir / "nvidia*"))
        assert not any(a["action"] == "terminate" and a["target"] in (f"pid {idle.pid}", f"pid {busy.pid}")
                       for a in gpus["actions"])
        assert "its minor number is unknown" in gpus["message"]
        assert idle.poll() is None and busy.poll() is None
    finally:
        holders.cleanup()


def test_gpu_nvidia_smi_cannot_reach_is_blocked_reboot_the_node(tmp_path, no_nvml):
    cap = sc.load(sc.REAL / "telegraf__dual_a5000-v13.xml")
    lost = cap.gpus.pop(1)
    cap.apps = [a for a in cap.apps if a["gpu_uuid"] != lost["uuid"]]
    code, gpus = replay(tmp_path, no_nvml, cap, "gpus:\n  count: 2\n  healthy: true\n", unreachable=[
        ["00000000:C1:00.0", "GPU is lost. Reboot the system to recover this GPU"]])
    assert code == 2 and gpus["status"] == "blocked"
    have = gpus["observed"]["gpus"]
    assert [g["index"] for g in have] == [0, 1] and have[1]["bus_id"] == "00000000:C1:00.0"
    assert have[1]["minor"] == 0  # /proc/driver/nvidia still knows it
    assert "GPU 1 (00000000:C1:00.0) must not run jobs: reboot the node" in gpus["message"]


def test_nvml_and_nvidia_smi_both_failing_name_the_step(tmp_path, no_nvml):
    cap = sc.load(sc.REAL / "telegraf__tesla-t4.xml")
    code, gpus = replay(tmp_path, no_nvml, cap, "gpus:\n  count: 1\n",
                        fail="Failed to initialize NVML: Driver/library version mismatch", rc=18)
    assert code == 1 and gpus["status"] == "error"
    assert "Driver/library version mismatch" in gpus["message"]
    assert "reboot the node, or reload the nvidia kernel modules" in gpus["message"]


def test_unified_memory_fragments_read_as_unknown():
    """DGX Spark (GB10) fragments quoted in public PRs: memory is [N/A], never 0 MiB."""
    lines = (sc.REAL / "issue__nvitop-208__gb10__580.173.02.csv").read_text().splitlines()
    header = [h.split(" [")[0].strip() for h in lines[0].split(",")]
    row = dict(zip(header, (Value(c) for c in lines[1].split(",")), strict=True))
    assert row["memory.total"].mib() is None and row["memory.used"].mib() is None
    assert not row["memory.used"].error  # not supported, not an error
    assert row["power.draw"].float() == 11.17 and row["temperature.gpu"].int() == 35
    marimo = [Value(c) for c in (sc.REAL / "issue__marimo-6822__gb10__580.95.05.csv").read_text().split(",")]
    assert [v.mib() for v in marimo[2:]] == [None, None, None]


def test_nvlink_status_capture():
    status = parse_nvlink_status((sc.REAL / "gpud__8x-a100__nvlink-status.txt").read_text())
    assert sorted(status) == list(range(8)) and all(v == (12, ()) for v in status.values())
    down = parse_nvlink_status("GPU 0: A100 (UUID: GPU-x)\n\t Link 0: 25 GB/s\n\t Link 1: <inactive>\n")
    assert down == {0: (2, (1,))}


SETTINGS_STATE = """gpus:
  healthy: false
  settings:
    persistence_mode: true
    power_limit: default
    compute_mode: default
    application_clocks: default
    locked_clocks: none
    mig: disabled
    ecc: enabled
"""


@pytest.mark.parametrize("name", REPLAYED)
def test_every_gpus_settings_read_as_its_capture_says(tmp_path, no_nvml, name):
    """Power limits, compute mode, application clocks (deprecated on 590+), the graphics clock, MIG and
    ECC modes current and pending, through the nvidia-smi fallback's --query-gpu fields."""
    cap = sc.load(sc.REAL / name)
    _, gpus = replay(tmp_path, no_nvml, cap, SETTINGS_STATE)
    assert gpus["observed"]["source"] == "nvidia-smi", gpus["message"]
    for want, have in zip(sc.expected_settings(cap), gpus["observed"]["gpus"], strict=True):
        got = have["settings"]
        for key, value in want.items():
            if key in ("unsupported", "unreadable"):
                assert sorted(name for name, _ in got[key]) == value, (name, have["index"], key, got[key])
            else:
                assert got[key] == value, (name, have["index"], key)
    # Read, never set: without NVML the plan is blocked and names how to set them by hand.
    assert not [a for a in gpus["actions"] if a["action"] == "set"]
    if any(d["field"].startswith("gpu") for d in gpus["drift"]):
        assert "GPU settings are set through NVML, which is unavailable here" in gpus["message"]


@pytest.mark.parametrize("name", REPLAYED)
def test_settings_translation_agrees_with_the_research_summary(name):
    """The stand-in's settings values against features.json (power limits, application clocks,
    compute mode, ECC and MIG modes), written from the raw files by other code."""
    cap = sc.load(sc.REAL / name)
    for row, feat in zip(cap.gpus, FEATURES[name], strict=True):
        limit, default, low, high = feat["power"]
        for col, value in (("power.limit", limit), ("power.default_limit", default), ("power.min_limit", low),
                           ("power.max_limit", high)):
            if value and value != "N/A":
                assert row[col] == value, (col, row[col], value)
        graphics, memory = feat["app_clocks"]
        if graphics and graphics.endswith("MHz"):
            assert (row["clocks.applications.graphics"], row["clocks.applications.memory"]) == (graphics, memory)
        elif graphics and "deprecated" in graphics:
            assert "deprecated" in row["clocks.applications.graphics"]
        if feat["compute_mode"]:
            assert row["compute_mode"] == feat["compute_mode"]
        for col, value in (("ecc.mode.current", feat["ecc"][0]), ("ecc.mode.pending", feat["ecc"][1]),
                           ("mig.mode.pending", feat["mig"][1])):
            if value in ("Enabled", "Disabled"):
                assert row[col] == value, (col, row[col], value)


def test_a_stray_power_limit_in_a_real_capture_is_drift_with_its_range(tmp_path, no_nvml):
    """telegraf's RTX 3090 capture: a 200 W limit on a GPU whose default is 350 W (100-375 W)."""
    cap = sc.load(sc.REAL / "telegraf__rtx-3090-v12.xml")
    _, gpus = replay(tmp_path, no_nvml, cap, "gpus:\n  settings:\n    power_limit: default\n    ecc: enabled\n")
    assert gpus["drift"] == [{"field": "gpu0.power_limit", "want": "default (350 W)", "have": "200 W"},
                             {"field": "gpu0.ecc", "want": "enabled", "have": "not supported"}]
    assert gpus["status"] == "blocked"
