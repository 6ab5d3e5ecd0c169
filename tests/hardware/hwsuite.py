"""The hardware suite: does reconcile agree with a real NVIDIA driver? One run, one report.

    python tests/hardware/hwsuite.py --out DIR      (tests/hardware/run.sh wraps it)

Sections, each written to DIR/report.json and DIR/report.txt as soon as it is done (a run cut
short still leaves what it found):

1. snapshot: reconcile's observation through NVML (observe.py nvml), `nvidia-smi --query-gpu`,
   `nvidia-smi -q -x`, /proc/driver/nvidia/gpus/*/information and reconcile's nvidia-smi
   fallback (observe.py smi), read one after the other within a second or two; compared by
   hwcompare.py (count, UUIDs, bus ids, minors, memory, ECC and remapping, persistence, MIG,
   clocks, power limits and constraints, PCIe, the health verdict of both paths), and the PCI
   bus reconcile reads against `lspci -D -vmmnk` and the driver's list (read-only: nothing is
   reset, unbound or rescanned);
2. xid: the Xid events reconcile found against the kernel log's `NVRM: Xid` lines;
3. holder: a real CUDA context (torch's CUDA build, else a C program compiled here against
   libcuda.so.1, else a process holding /dev/nvidiaN open) run as a transient systemd unit
   (systemd-run), found by `reconcile diff` with its unit and memory, freed by `reconcile
   apply` (stop_units), the GPU back to its baseline memory (nvidia-smi's memory.used);
4. setters: on GPU 0, the power limit 1 W below the current one and the compute mode set by
   `reconcile apply`, read back with nvidia-smi, then set back; each restored through NVML in a
   `finally` and at exit whatever happened. Never MIG, ECC, clocks or a reset.

The holder and the setters need root; without it only sections 1 and 2 run. Its self-test
(tests/test_hardware_suite.py) runs the same code on the fake driver and the stand-in nvidia-smi
(fake_smi.py), through `Rig`.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hwcompare as hc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CI_OK = "[ci-ok]"
HOLD_MIB = 1024
CUDA_HOLDER_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
typedef int (*init_t)(unsigned); typedef int (*dev_t_)(int *, int); typedef int (*ctx_t)(void **, unsigned, int);
typedef int (*alloc_t)(unsigned long long *, size_t);
int main(int argc, char **argv) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "no libcuda.so.1: %s\n", dlerror()); return 3; }
    init_t cuInit = (init_t)dlsym(lib, "cuInit"); dev_t_ cuDeviceGet = (dev_t_)dlsym(lib, "cuDeviceGet");
    ctx_t cuCtxCreate = (ctx_t)dlsym(lib, "cuCtxCreate_v2"); alloc_t cuMemAlloc = (alloc_t)dlsym(lib, "cuMemAlloc_v2");
    int dev, rc; void *ctx; unsigned long long ptr;
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 1024;
    if ((rc = cuInit(0)) || (rc = cuDeviceGet(&dev, 0)) || (rc = cuCtxCreate(&ctx, 0, dev)) ||
        (rc = cuMemAlloc(&ptr, mib << 20))) { fprintf(stderr, "CUDA error %d\n", rc); return 4; }
    printf("ready\n"); fflush(stdout);
    for (;;) pause();
}
"""


def hardware_missing() -> str | None:
    """Why this machine cannot run the suite against a real driver (None: it can)."""
    if not Path("/dev/nvidiactl").exists():
        return f"no /dev/nvidiactl: no NVIDIA driver on this machine {CI_OK}"
    probe = ("import ctypes, sys\ntry:\n    lib = ctypes.CDLL('libnvidia-ml.so.1')\nexcept OSError as e:\n"
             "    sys.exit('no libnvidia-ml.so.1: %s' % e)\n"
             "sys.exit('libnvidia-ml.so.1 is the test fake' if hasattr(lib, 'fake_nvml_reboot') else 0)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        return f"{(proc.stderr or proc.stdout).strip()} {CI_OK}"
    if shutil.which("nvidia-smi") is None:
        return f"nvidia-smi not found {CI_OK}"
    return None


def sections_for_this_user() -> tuple[tuple[str, ...], str]:
    """All sections as root; without root only those that read (the holder's unit and the
    setters need root, as on any real driver)."""
    if os.geteuid() == 0:
        return ("snapshot", "xid", "holder", "setters"), ""
    return ("snapshot", "xid"), "not root: the holder and setters sections need root and were not run"


@dataclass
class Rig:
    """Where the suite finds the driver and its tools: the real ones by default; the self-test
    points them at the fake driver, the stand-in nvidia-smi, a /proc directory and a kernel log."""

    env: dict[str, str] = field(default_factory=dict)  # added to every child's environment
    proc_dir: Path = Path("/proc/driver/nvidia/gpus")
    kernel_log: Callable[[], str] | None = None  # None: dmesg (what reconcile reads too)
    # Starts a holder of HOLD_MIB on GPU 0 -> (pid, unit or None, how it holds, stop()); None: the real ways.
    start_holder: Callable[[Path], tuple[int, str | None, str, Callable[[], None]]] | None = None
    mode: str = "hardware"


class Suite:
    def __init__(self, out: Path, rig: Rig):
        self.out, self.rig = out, rig
        out.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="reconcile-hw-"))
        self.report: dict[str, Any] = {
            "suite": "reconcile hardware suite (tests/hardware)", "mode": rig.mode, "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sections": {}}
        self.restores: list[tuple[str, Callable[[], None]]] = []
        atexit.register(self.restore_all)

    # --- running things ---

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, **self.rig.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH", "")]))
        env.setdefault("RECONCILE_CACHE_DIR", str(self.tmp / "cache"))
        env.setdefault("RECONCILE_STATE_DIR", str(self.tmp / "state"))
        env.update(extra)
        return env

    def run(self, argv: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env(**env),
                              cwd=self.tmp)

    def smi(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(["nvidia-smi", *args], timeout=120)

    def observe(self, path: str) -> dict[str, Any]:
        proc = self.run([sys.executable, str(HERE / "observe.py"), path], timeout=300)
        if proc.returncode:
            raise RuntimeError(f"observe.py {path} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def reconcile(self, command: str, state: str, *args: str) -> tuple[int, dict[str, Any], str]:
        path = self.tmp / f"state-{uuid.uuid4().hex[:8]}.yaml"
        path.write_text("version: 1\n" + textwrap.dedent(state))
        if command == "apply":  # never the host's /var/lib/reconcile journal
            args = ("--journal", str(self.tmp / "journal.jsonl"), *args)
        proc = self.run([sys.executable, "-m", "reconcile_host", command, str(path), "--format", "json", *args],
                        timeout=300)
        try:
            doc = json.loads(proc.stdout)
            gpus = next(r for r in doc["resources"] if r["id"] == "gpus")
        except (ValueError, StopIteration, KeyError):
            gpus = {}
        return proc.returncode, gpus, proc.stderr.strip()[-2000:]

    def query(self, fields: list[str], *args: str) -> tuple[list[dict[str, str]], list[str]]:
        """--query-gpu rows; fields this nvidia-smi refuses are dropped (and returned)."""
        refused: list[str] = []
        while True:
            asked = [f for f in fields if f not in refused]
            proc = self.smi(f"--query-gpu={','.join(asked)}", "--format=csv,noheader,nounits", *args)
            bad = re.search(r'Field "([^"]+)" is not a valid field', proc.stdout + proc.stderr)
            if bad and bad.group(1) not in refused:
                refused.append(bad.group(1))
                continue
            if proc.returncode and not proc.stdout.strip():
                raise RuntimeError(f"nvidia-smi --query-gpu exited {proc.returncode}: {proc.stderr.strip()}")
            return hc.parse_query(proc.stdout, asked), refused

    def kernel_log(self) -> str:
        """The kernel log from where reconcile said it read it (dmesg, the journal, a file)."""
        if self.rig.kernel_log is not None:
            return self.rig.kernel_log()
        from reconcile_host.reconcilers.gpus.kernel_log import JOURNAL_ARGV

        source = ((getattr(self, "nvml", None) or {}).get("kernel_log") or {}).get("source") or "dmesg"
        if source.startswith("journalctl"):
            argv = JOURNAL_ARGV
        elif source == "dmesg":
            argv = ["dmesg"]
        else:
            return Path(source).read_text(errors="replace")
        proc = self.run(argv, timeout=120)
        return proc.stdout if proc.returncode == 0 else ""

    # --- the report ---

    def section(self, name: str, checks: list[dict], note: str = "", status: str | None = None) -> None:
        bad = [c for c in checks if c["verdict"] == "disagree"]
        self.report["sections"][name] = {
            "status": status or ("disagree" if bad else "agree"), "note": note, "checks": checks}
        self.write()

    def write(self) -> None:
        counts: dict[str, int] = {}
        for s in self.report["sections"].values():
            for c in s["checks"]:
                counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
        self.report["summary"] = {"verdicts": counts, "sections": {k: v["status"] for k, v in
                                                                   self.report["sections"].items()}}
        self.report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        (self.out / "report.json").write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        (self.out / "report.txt").write_text(text_summary(self.report))

    def guarded(self, name: str, fn: Callable[[], None]) -> None:
        """Run one section; an exception is that section's error, recorded, and the next one runs."""
        t0 = time.monotonic()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the report must say what broke, and go on
            self.section(name, [], note=f"{type(exc).__name__}: {exc}", status="error")
        self.report["sections"].setdefault(name, {"status": "error", "note": "no result", "checks": []})
        self.report["sections"][name]["seconds"] = round(time.monotonic() - t0, 2)
        self.write()

    # --- 1. the snapshot ---

    def snapshot(self) -> None:
        t0 = time.monotonic()
        nvml = self.observe("nvml")
        rows, refused = self.query(list(hc.QUERY))
        xml_proc = self.smi("-q", "-x")
        xml = hc.parse_xml(xml_proc.stdout) if xml_proc.returncode == 0 else (None, [])
        proc_readable = self.rig.proc_dir.is_dir()
        proc = hc.parse_proc(self.rig.proc_dir) if proc_readable else {}
        smi = self.observe("smi")
        spread = round(time.monotonic() - t0, 2)
        self.nvml, self.smi_path = nvml, smi
        self.report["driver"] = nvml.get("driver_version")
        self.report["cuda"] = nvml.get("cuda_version")
        self.report["gpus"] = [{k: g.get(k) for k in ("index", "name", "uuid", "bus_id", "minor", "health")}
                               for g in nvml["gpus"]]
        note = f"all read within {spread}s"
        self.section("count", hc.compare_count(nvml, rows, xml, proc, proc_readable), note)
        self.section("query-gpu", hc.compare_fields("query-gpu", nvml, rows, refused),
                     note + (f"; refused by this nvidia-smi: {', '.join(refused)}" if refused else ""))
        self.section("q-x", hc.compare_fields("q-x", nvml, xml[1]), note)
        self.section("minors", hc.compare_minors(nvml, xml[1], proc, proc_readable),
                     note if proc_readable else f"{self.rig.proc_dir} not readable")
        self.section("pci-bus", *self.pci_bus(nvml))
        path_checks = hc.compare_paths(nvml, smi)
        self.section("smi-path", [c for c in path_checks if c["section"] == "smi-path"], note)
        self.section("health", [c for c in path_checks if c["section"] == "health"],
                     "; ".join(f"GPU {g['index']}: {g['health']}" for g in nvml["gpus"]))

    def pci_bus(self, nvml: dict[str, Any]) -> tuple[list[dict], str]:
        """lspci's NVIDIA GPUs and their drivers against reconcile's bus reading (read-only)."""
        sysfs = self.rig.env.get("RECONCILE_SYSFS_PCI")
        where = ["-A", "linux-sysfs", "-O", f"sysfs.path={sysfs}"] if sysfs else []
        try:
            proc = self.run(["lspci", *where, "-D", "-vmmnk"], timeout=60)
        except OSError as exc:
            return hc.compare_pci_bus(nvml, None), f"lspci not run: {exc}"
        if proc.returncode:
            return hc.compare_pci_bus(nvml, None), f"lspci exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
        note = "" if (nvml.get("pci_bus") or {}).get("readable") else (nvml.get("pci_bus") or {}).get("note", "")
        return hc.compare_pci_bus(nvml, hc.parse_lspci_vmm(proc.stdout)), note

    # --- 2. the kernel log ---

    def xid(self) -> None:
        log = self.kernel_log()
        self.section("xid", hc.compare_xids(self.nvml, log),
                     f"{sum(1 for _ in hc.XID_RE.finditer(log))} Xid lines in {len(log.splitlines())} lines of log")

    # --- 3. a real holder, found and freed ---

    def holder(self) -> None:
        base, _ = self.query(["index", "memory.used"])
        baseline = {int(r["index"]): hc.value("mib", r["memory.used"]) for r in base}
        others = self.smi("--query-compute-apps=pid", "--format=csv,noheader").stdout.split()
        if others:  # `apply` with stop_units would stop their units too: the suite never touches others' work
            self.section("holder", [], f"GPUs already in use by PIDs {', '.join(others)}: not run", status="skipped")
            return
        start = self.rig.start_holder or self.start_real_holder
        pid, unit, how, stop = start(self.tmp)
        self.restores.append(("holder", stop))
        checks: list[dict] = []
        try:
            if how.startswith("python3 holding "):  # holder_argv's last way: no CUDA, no memory
                checks += self.device_file_holder(pid, how)
                return
            held = self.wait_for(lambda: self.app_memory(pid), 120)
            checks.append(hc.check("holder", 0, "nvidia-smi lists the holder", True, held is not None))
            limit = max(v or 0 for v in baseline.values()) + HOLD_MIB // 4
            comm = _comm(pid)  # without a unit, the holder is freed by its process name
            free_with = "{stop_units: true}" if unit else f"{{kill: [{json.dumps(comm)}], grace: 5s}}"
            state = f"gpus:\n  max_memory_used: {limit}MiB\n  free_with: {free_with}\n  settle: 60s\n"
            rc, report, err = self.reconcile("diff", state)
            mine = next((h for h in (report.get("observed") or {}).get("holders", ()) if h["pid"] == pid), None)
            checks.append(hc.check("holder", 0, "reconcile diff exit (2: drift)", rc, 2, "int", note=err))
            checks.append(hc.check("holder", 0, "holder found (pid)", mine and mine["pid"], pid, "int"))
            checks.append(hc.check("holder", 0, "holder's unit", mine and mine.get("unit"), unit))
            used = None
            if mine:
                used = sum((u.get("used_bytes") or 0) for u in mine.get("uses", ())) // hc.MIB or None
            checks.append(hc.check("holder", 0, "holder's memory (MiB)", used, held, "mib"))
            rc, report, err = self.reconcile("apply", state)
            checks.append(hc.check("holder", 0, "reconcile apply exit", rc, 0, "int", note=err))
            checks.append(hc.check("holder", 0, "holder gone", _alive(pid), False))
            if unit:
                active = self.run(["systemctl", "is-active", unit]).stdout.strip()
                checks.append(hc.check("holder", 0, "unit stopped (systemctl is-active)", active in (
                    "inactive", "failed", "unknown", ""), True, note=active))
            after = self.wait_for(lambda: self._back_to(baseline), 60)
            now, _ = self.query(["index", "memory.used"])
            for r in now:
                i = int(r["index"])
                checks.append(hc.check("holder", i, "memory.used back to baseline (MiB)", baseline.get(i),
                                       hc.value("mib", r["memory.used"]), "mib",
                                       note="" if after else "not back within 60s"))
            rc, _, err = self.reconcile("diff", state)
            checks.append(hc.check("holder", 0, "second diff exit (0: nothing to do)", rc, 0, "int", note=err))
        finally:
            stop()
            self.section("holder", checks, f"holder: {how}" + (f" in {unit}" if unit else " (no systemd unit)"))

    def device_file_holder(self, pid: int, how: str) -> list[dict]:
        """Without CUDA: a process holding the device file open holds no memory; reconcile must
        still name it with its device file (procfs.scan_device_holders)."""
        rc, report, err = self.reconcile("diff", "gpus:\n  max_memory_used: 1048576MiB\n")
        mine = next((h for h in (report.get("observed") or {}).get("holders", ()) if h["pid"] == pid), None)
        dev = how.rsplit(" ", 1)[1]
        return [hc.check("holder", 0, "device-file holder found (pid)", mine and mine["pid"], pid, "int", note=err),
                hc.check("holder", 0, "its device file", list((mine or {}).get("device_files") or ()), [dev])]

    def app_memory(self, pid: int) -> int | None:
        proc = self.smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        for line in proc.stdout.splitlines():
            cells = [c.strip() for c in line.split(",")]
            if cells and cells[0] == str(pid):
                return hc.value("mib", cells[1]) if len(cells) > 1 else None
        return None

    def _back_to(self, baseline: dict[int, int | None]) -> bool | None:
        now, _ = self.query(["index", "memory.used"])
        ok = all(abs((hc.value("mib", r["memory.used"]) or 0) - (baseline.get(int(r["index"])) or 0)) <= 1
                 for r in now)
        return True if ok else None

    @staticmethod
    def wait_for(fn: Callable[[], Any], seconds: float) -> Any:
        deadline = time.monotonic() + seconds
        while True:
            v = fn()
            if v is not None or time.monotonic() > deadline:
                return v
            time.sleep(0.5)

    def start_real_holder(self, tmp: Path) -> tuple[int, str | None, str, Callable[[], None]]:
        argv, how = self.holder_argv(tmp)
        if shutil.which("systemd-run") and Path("/run/systemd/system").is_dir():
            unit = f"reconcile-hw-holder-{uuid.uuid4().hex[:8]}.service"
            proc = self.run(["systemd-run", f"--unit={unit}", "--collect", "--property=KillMode=control-group",
                             "--", *argv], timeout=60)
            if proc.returncode:
                raise RuntimeError(f"systemd-run failed: {proc.stderr.strip()}")
            pid = self.wait_for(lambda: int(self.run(["systemctl", "show", "-p", "MainPID", "--value", unit]
                                                     ).stdout.strip() or 0) or None, 30)

            def stop() -> None:
                self.run(["systemctl", "stop", unit], timeout=60)
            return int(pid or 0), unit, how, stop
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=self.env())

        def stop_proc() -> None:
            if p.poll() is None:
                p.kill()  # our own child, by PID
            p.wait(timeout=30)
        return p.pid, None, how, stop_proc

    def holder_argv(self, tmp: Path) -> tuple[list[str], str]:
        """torch's CUDA build if this machine has it, else a C program against libcuda, else a
        process holding /dev/nvidia<minor of GPU 0> open (found by its device file, no memory)."""
        for py in (sys.executable, shutil.which("python3") or ""):
            if py and self.run([py, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                               timeout=120).returncode == 0:
                code = (f"import torch, time\nx = torch.empty({HOLD_MIB} << 20, dtype=torch.uint8, device='cuda')\n"
                        "torch.cuda.synchronize()\ntime.sleep(3600)\n")
                return [py, "-c", code], f"{py} (torch CUDA)"
        gcc = shutil.which("gcc") or shutil.which("cc")
        if gcc:
            (tmp / "holder.c").write_text(CUDA_HOLDER_C)
            exe = tmp / "cuda-holder"
            if subprocess.run([gcc, "-O1", "-o", str(exe), str(tmp / "holder.c"), "-ldl"],
                              capture_output=True).returncode == 0:
                return [str(exe), str(HOLD_MIB)], str(exe)
        minor = (self.nvml["gpus"][0].get("minor") if getattr(self, "nvml", None) else None) or 0
        code = f"import time\nf = open('/dev/nvidia{minor}', 'rb', buffering=0)\ntime.sleep(3600)\n"
        return [sys.executable, "-c", code], f"python3 holding /dev/nvidia{minor}"

    # --- 4. the setters, round-tripped ---

    def setters(self) -> None:
        fields = ["power.limit", "power.min_limit", "power.max_limit", "compute_mode"]
        rows, refused = self.query(["index", *fields], "-i", "0")
        if not rows or refused:
            self.section("setters", [], f"nvidia-smi cannot read {refused or fields} on GPU 0", status="skipped")
            return
        r = rows[0]
        limit, low = hc.value("watts", r["power.limit"]), hc.value("watts", r["power.min_limit"])
        mode = hc.value("compute", r["compute_mode"])
        checks: list[dict] = []
        if isinstance(limit, int):
            self.restores.append(("power limit", lambda: self.nvml_set("nvmlDeviceSetPowerManagementLimit", limit)))
            target = limit // 1000 - 1
            if isinstance(low, int) and target * 1000 < low:
                checks.append(hc.check("setters", 0, "power limit", None, None, note="already at its minimum"))
            else:
                checks += self.round_trip("power_limit", f"{target}W", target * 1000, "power.limit", "watts")
                back = f"{limit // 1000}W" if limit % 1000 == 0 else None
                if back:
                    checks += self.round_trip("power_limit", back, limit, "power.limit", "watts")
        if isinstance(mode, str):
            from_code = {"default": 0, "prohibited": 2, "exclusive_process": 3}
            self.restores.append(("compute mode", lambda: self.nvml_set("nvmlDeviceSetComputeMode",
                                                                         from_code.get(mode, 0))))
            other = "exclusive_process" if mode == "default" else "default"
            checks += self.round_trip("compute_mode", other, other, "compute_mode", "compute")
            checks += self.round_trip("compute_mode", mode, mode, "compute_mode", "compute")
        self.restore_all()
        after, _ = self.query(["index", *fields], "-i", "0")
        checks.append(hc.check("setters", 0, "power.limit restored", limit, hc.value("watts", after[0]["power.limit"]),
                               "watts"))
        checks.append(hc.check("setters", 0, "compute_mode restored", mode,
                               hc.value("compute", after[0]["compute_mode"])))
        self.section("setters", checks, "GPU 0 only; MIG, ECC, clocks and resets are never touched")

    def round_trip(self, setting: str, declared: str, want: Any, field: str, kind: str) -> list[dict]:
        state = f"gpus:\n  settings:\n    per_gpu:\n      0: {{{setting}: {declared}}}\n"
        rc, _, err = self.reconcile("apply", state)
        out = [hc.check("setters", 0, f"apply {setting}: {declared} (exit)", rc, 0, "int", note=err)]
        rows, _ = self.query(["index", field], "-i", "0")
        out.append(hc.check("setters", 0, f"{field} after apply {setting}: {declared}", want,
                            hc.value(kind, rows[0][field]) if rows else None, kind))
        rc, _, err = self.reconcile("diff", state)
        out.append(hc.check("setters", 0, f"diff after {setting}: {declared} (exit 0)", rc, 0, "int", note=err))
        return out

    def nvml_set(self, fn: str, value: int) -> None:
        code = (f"import pynvml as n\nn.nvmlInit()\nh = n.nvmlDeviceGetHandleByIndex(0)\nn.{fn}(h, {value})\n"
                "n.nvmlShutdown()\n")
        self.run([sys.executable, "-c", code], timeout=60)

    def restore_all(self) -> None:
        while self.restores:
            what, fn = self.restores.pop()
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - every restore is tried, each failure recorded
                self.report.setdefault("restore_errors", []).append(f"{what}: {exc}")

    def run_all(self, sections: tuple[str, ...] = ("snapshot", "xid", "holder", "setters")) -> dict[str, Any]:
        try:
            self.guarded("snapshot", self.snapshot)
            if not hasattr(self, "nvml"):
                return self.report
            for name in sections[1:]:
                self.guarded(name, getattr(self, name))
        finally:
            self.restore_all()
            self.report["sections"].pop("snapshot", None)  # its parts are sections of their own
            self.write()
            shutil.rmtree(self.tmp, ignore_errors=True)
        return self.report


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def text_summary(report: dict[str, Any]) -> str:
    lines = [f"{report['suite']}: {report['mode']} on {report['host']}, driver {report.get('driver', '?')}, "
             f"{len(report.get('gpus') or [])} GPU(s), {report['started']} to {report.get('finished', '?')}"]
    if report.get("note"):
        lines.append(f"note: {report['note']}")
    v = (report.get("summary") or {}).get("verdicts", {})
    lines.append("verdicts: " + ", ".join(f"{k} {n}" for k, n in sorted(v.items())))
    for name, s in report["sections"].items():
        bad = [c for c in s["checks"] if c["verdict"] in ("disagree", "absent")]
        lines.append(f"- {name}: {s['status']}" + (f" ({s['note']})" if s.get("note") else ""))
        for c in bad:
            gpu = "" if c["gpu"] is None else f"GPU {c['gpu']} "
            lines.append(f"    {c['verdict']}: {gpu}{c['field']}: reconcile {c['reconcile']!r}, "
                         f"authority {c['authority']!r}" + (f" ({c['note']})" if c.get("note") else ""))
    for e in report.get("restore_errors", ()):
        lines.append(f"! restore failed: {e}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "hardware-report")
    args = ap.parse_args(argv)
    out = Path(args.out)
    why = hardware_missing()
    if why:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.txt").write_text(f"reconcile hardware suite: skipped: {why}\n")
        print(f"skipped: {why}")
        return 0
    # A run cut short (the device tool's time limit sends SIGTERM) still restores and writes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sections, why_not = sections_for_this_user()
    suite = Suite(out, Rig())
    if why_not:
        suite.report["note"] = why_not
    report = suite.run_all(sections)
    sys.stdout.write((out / "report.txt").read_text())
    return 1 if any(s["status"] in ("disagree", "error") for s in report["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
