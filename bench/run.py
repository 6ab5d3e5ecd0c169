#!/usr/bin/env python3
"""Benchmark `reconcile diff` against Ansible, pyinfra, testinfra and the plain shell (run by hand, as root).

It boots a real systemd as PID 1 of a namespace (tests/nsystemd.py) and builds the seed
host in it: `vllm-kimi-k25-int4.service` enabled and running (Restart=always), 8 fake
GPUs held by it at 72,289 MiB each (when the fake libnvidia-ml can be built), `/data` a
tmpfs mounted inside the namespace only, and an EAGLE-3 extraction in SpecForge layout
with 37,312 sample files. Then it times the same audit with each tool, inside the
namespace, N times each after a warm-up run, and reports medians of wall time and peak
RSS; then how reconcile's cost grows with files (37,312 -> 1,000,000) and declared units
(1 -> 500), and the time of `reconcile apply` on the seed scenario.

    sudo python3 bench/run.py                  # everything (about 10 min on 2 cores)
    sudo python3 bench/run.py --quick          # 3 runs, no 1,000,000-file step

The peers are installed into bench/.peers (a separate virtual environment) when missing.
Every tool runs without PYTHONDONTWRITEBYTECODE, so byte-code caches are used as on a
normal install. Results: bench/results/latest.md and latest.json (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS = HERE / ".peers"
RECONCILE_VENV = HERE / ".reconcile"
RESULTS = HERE / "results"
VLLM = "vllm-kimi-k25-int4.service"
PEER_PACKAGES = ("ansible-core", "pyinfra", "pytest-testinfra")
SEED_TOTAL = 37_312
GPU_COUNT, GPU_TOTAL_MIB, VLLM_MIB = 8, 97_887, 72_289  # 75.8 GB per GPU, as in the seed
MIN_FREE = "100MiB"
MIN_FREE_BYTES = 100 * 1024 * 1024

# The targets of issue 6 (medians, same run).
TARGET_FLOOR_RATIO = 3.0
TARGET_PYINFRA, TARGET_TESTINFRA, TARGET_ANSIBLE = 4.0, 3.0, 50.0
TARGET_MILLION_S, TARGET_500_UNITS_S = 1.0, 0.3


# ---------------------------------------------------------------------------
# Inside the namespace: the timing harness (run.py --inner JOBFILE)
# ---------------------------------------------------------------------------

GNU_TIME = "/usr/bin/time"


def _run_once(job: dict, out_path: str) -> tuple[float, int, int]:
    """Run a job's command once; return (wall seconds, peak RSS KiB, exit code).

    Peak RSS comes from GNU time when installed: a child spawned straight from this harness
    inherits the harness's own peak RSS (vfork shares its memory until exec), which would
    put a floor of ~20 MiB under every tool. Without GNU time, wait4's figure is kept:
    exact for tools bigger than the harness, an upper bound for the small ones."""
    argv = job["argv"]
    rss_file = out_path + ".rss"
    use_time = os.access(GNU_TIME, os.X_OK)
    if use_time:
        argv = [GNU_TIME, "-o", rss_file, "-f", "%M", *argv]
    with open(out_path, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=job["env"], cwd=job.get("cwd") or "/",
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        # wait4: this child's own rusage; ru_maxrss covers its waited-for descendants too
        # (Ansible's forked workers).
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    rss = usage.ru_maxrss
    if use_time:
        try:
            rss = int(Path(rss_file).read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            pass
    return wall, rss, os.waitstatus_to_exitcode(status)


def _reset(job: dict) -> None:
    for argv in job.get("reset", ()):
        subprocess.run(argv, env=job["env"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)


def inner_commands(jobs: list[dict]) -> dict:
    """Warm up every job, then run them round-robin, so that load changes on the machine
    during the run touch every tool alike."""
    results = {}
    for job in jobs:
        first = None
        for i in range(job.get("warmup", 1)):
            _reset(job)
            wall, rss, rc = _run_once(job, job["log"])
            if i == 0:
                first = {"wall": wall, "rss_kib": rss, "rc": rc,
                         "output": Path(job["log"]).read_text(errors="replace")[-6000:]}
        results[job["name"]] = {"walls": [], "rss_kib": [], "rcs": [], "first": first}
        print(f"  warm-up {job['name']}: {first['wall']:.3f}s exit {first['rc']}", file=sys.stderr, flush=True)
    for rep in range(max(job["reps"] for job in jobs)):
        for job in jobs:
            if rep >= job["reps"]:
                continue
            _reset(job)
            wall, rss, rc = _run_once(job, job["log"])
            r = results[job["name"]]
            r["walls"].append(wall)
            r["rss_kib"].append(rss)
            r["rcs"].append(rc)
        print(f"  round {rep + 1} done", file=sys.stderr, flush=True)
    for job in jobs:
        results[job["name"]]["last_output"] = Path(job["log"]).read_text(errors="replace")[-6000:]
    return results


def inner_scan(job: dict) -> dict:
    """Time reconcile's extraction scan in-process (no interpreter start-up)."""
    sys.path.insert(0, str(HERE))
    os.environ.update(job["env"])
    from reconcile_host.machines.host import Host
    from reconcile_host.reconcilers.extractions import ExtractionsReconciler
    from reconcile_host.reconcilers.extractions.listing import list_tree

    rec, host = ExtractionsReconciler(), Host()
    (res,) = rec.resources({"kimi-k25-eagle3": {"dir": job["dir"], "total": job["total"], "verify": job["verify"]}})
    out: dict = {}

    def timed(fn, reps):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times

    pattern = "rows_{group}/data_{index}.ckpt"
    # Every directory listed, no listing cache: what the first observe (or one after the tree
    # changed everywhere) pays for the names.
    out["list_cold"] = timed(lambda: list_tree(job["dir"], pattern), job["reps"])
    state = Path(job["env"]["RECONCILE_STATE_DIR"])

    def cold():
        shutil.rmtree(state, ignore_errors=True)  # no earlier integrity check recorded
        return rec.observe(host, [res])

    out["observe_cold"] = timed(cold, job.get("cold_reps", 1))
    obs = rec.observe(host, [res])[res.id]
    out["done"] = getattr(obs, "done", None)
    out["observe_warm"] = timed(lambda: rec.observe(host, [res]), job["reps"])
    return out


def inner(jobfile: str) -> None:
    jobs = json.loads(Path(jobfile).read_text())
    results = {}
    for job in jobs:
        if job.get("type") == "scan":
            print(f"  {job['name']}", file=sys.stderr, flush=True)
            results[job["name"]] = inner_scan(job)
    commands = [job for job in jobs if job.get("type") != "scan"]
    if commands:
        results.update(inner_commands(commands))
    print(json.dumps(results))


# ---------------------------------------------------------------------------
# On the host: scenario, peers, jobs, report
# ---------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ensure_peers() -> dict[str, str]:
    """Create bench/.peers with the peer tools if missing; return their versions."""
    if not (PEERS / "bin" / "ansible-playbook").exists() or not (PEERS / "bin" / "pyinfra").exists() \
            or not (PEERS / "bin" / "pytest").exists():
        log(f"installing {', '.join(PEER_PACKAGES)} into {PEERS}")
        subprocess.run([sys.executable, "-m", "venv", str(PEERS)], check=True)
        subprocess.run([str(PEERS / "bin" / "pip"), "install", "-q", *PEER_PACKAGES], check=True)
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            f"{list(PEER_PACKAGES)!r}}}))")
    out = subprocess.run([str(PEERS / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update({"LC_ALL": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", "NO_COLOR": "1"})
    return env


def install_reconcile() -> None:
    """This working tree installed as a user installs it (`pip install .`, no editable finder on
    the import path) into a virtual environment of its own, bench/.reconcile, like the peers in
    bench/.peers: neither pays for the packages or .pth files of the interpreter's site-packages."""
    if not (RECONCILE_VENV / "bin" / "python").exists():
        log(f"creating {RECONCILE_VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(RECONCILE_VENV)], check=True)
        subprocess.run([str(RECONCILE_VENV / "bin" / "pip"), "install", "-q", str(ROOT)], check=True)
    # Always the current tree: reinstalled without touching the dependencies.
    subprocess.run([str(RECONCILE_VENV / "bin" / "pip"), "install", "-q", "--no-deps", "--force-reinstall",
                    str(ROOT)], check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(ROOT / "build", ignore_errors=True)


def reconcile_cmd(use_venv: bool) -> tuple[list[str], str]:
    """The console script a user types: bench/.reconcile's (see install_reconcile), or with
    --installed the one next to this interpreter, else `python -m reconcile_host`."""
    script = (RECONCILE_VENV / "bin" if use_venv else Path(sys.executable).parent) / "reconcile"
    if script.is_file():
        return [str(script)], "reconcile (pip install . in bench/.reconcile)" if use_venv else "reconcile"
    return [sys.executable, "-m", "reconcile_host"], "python -m reconcile_host"


def registered_kinds() -> set[str]:
    sys.path.insert(0, str(ROOT.parent))
    try:
        from reconcile_host.reconcilers import KINDS
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_registry", ROOT / "reconcilers" / "__init__.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        KINDS = mod.KINDS  # noqa: N806
    return set(KINDS)


def _ckpt_maker():
    """A maker of small valid torch.save-layout ZIPs (tests/fake_extract.py's, when there)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    try:
        from fake_extract import ckpt_bytes

        return lambda stem, idx: ckpt_bytes(stem, idx, 64)
    except ImportError:
        import io
        import zipfile

        def make(stem: str, idx: int) -> bytes:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
                z.writestr(f"{stem}/data.pkl", b"\x80\x02}q\x00.")
                z.writestr(f"{stem}/data/0", bytes(64))
                z.writestr(f"{stem}/version", b"3\n")
            return buf.getvalue()

        return make


def generate_files(root: Path, n: int, group: int = 2000, recent: int = 2000) -> None:
    """SpecForge layout rows_{g}-{g+group}/data_{i}.ckpt, as a running job leaves it: the last
    `recent` files written one second apart up to now, each with its own content; the older ones
    a day old and sharing one valid archive's bytes (the integrity check reads the ZIP structure,
    not the names inside), so that 1,000,000 files take seconds, not minutes, to write."""
    now = time.time()
    ckpt = _ckpt_maker()
    old = ckpt("data_0", 0)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    for g in range(0, n, group):
        d = root / f"rows_{g}-{g + group}"
        d.mkdir(parents=True, exist_ok=True)
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(g, min(n, g + group)):
                is_recent = i >= n - recent
                fd = os.open(f"data_{i}.ckpt", flags, 0o644, dir_fd=dfd)
                try:
                    os.write(fd, ckpt(f"data_{i}", i) if is_recent else old)
                    t = now - (n - i) if is_recent else now - 86400
                    os.utime(fd, (t, t))
                finally:
                    os.close(fd)
        finally:
            os.close(dfd)


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="reconcile-bench-"))
        self.data = self.work / "data"  # tmpfs, mounted inside the namespace only
        self.growth = self.work / "growth"  # a second tmpfs for the 1,000,000-file step
        self.hs = self.data / "hidden_states"
        self.cache = self.work / "cache"
        self.state_dir = self.work / "state"
        self.nsd = None
        self.gpus = False
        self.gpus_why = ""
        self.env = clean_env()
        self.env.update({"RECONCILE_CACHE_DIR": str(self.cache), "RECONCILE_STATE_DIR": str(self.state_dir),
                         "HOME": str(self.work / "home"), "TMPDIR": str(self.work / "tmp")})
        (self.work / "home").mkdir()
        (self.work / "tmp").mkdir()
        self.rec, self.rec_label = reconcile_cmd(not args.installed)
        # The interpreter reconcile runs on (the venv's when the script is there), for the
        # `python -c pass` and `-X importtime` rows.
        venv_python = Path(self.rec[0]).parent / "python"
        self.python = str(venv_python) if venv_python.exists() and self.rec[0] != sys.executable else sys.executable
        self.results: dict = {}
        self.meta: dict = {}

    # -- scenario ------------------------------------------------------------

    def ns_path(self, p: Path) -> Path:
        """The namespace's view of an absolute path, from the host."""
        return self.nsd.root / str(p).lstrip("/")

    def build_fake_nvml(self) -> None:
        kinds = registered_kinds()
        src = ROOT / "tests" / "fakenvml" / "fakenvml.c"
        gcc = shutil.which("gcc") or shutil.which("cc")
        if "gpus" not in kinds:
            self.gpus_why = "the gpus kind is not registered"
        elif not src.exists():
            self.gpus_why = "tests/fakenvml/fakenvml.c not found"
        elif gcc is None:
            self.gpus_why = "no C compiler to build the fake libnvidia-ml"
        elif self.args.no_gpus:
            self.gpus_why = "--no-gpus"
        if self.gpus_why:
            return
        libdir = self.work / "nvml"
        libdir.mkdir()
        subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", str(libdir / "libnvidia-ml.so.1"), str(src)],
                       check=True, capture_output=True)
        subprocess.run([gcc, "-O2", "-o", str(self.work / "nvsmi"), str(HERE / "nvsmi.c"), "-ldl"],
                       check=True, capture_output=True)
        conf = ["driver version=590.48.01"]
        for i in range(GPU_COUNT):
            conf.append(f'gpu name="NVIDIA RTX PRO 6000 Blackwell Server Edition" uuid=GPU-bench-{i} '
                        f"bus=00000000:{0x11 + i * 0x10:02X}:00.0 total_mib={GPU_TOTAL_MIB} used_mib=0 "
                        "reserved_mib=0 temp=28 power_mw=84000")
        # The vLLM unit's process (/bin/sleep infinity) "holds" 72,289 MiB on every GPU while alive.
        conf.append(f'holder cmdline="sleep infinity" mib={VLLM_MIB} gpus={",".join(map(str, range(GPU_COUNT)))}')
        (self.work / "nvml.conf").write_text("\n".join(conf) + "\n")
        self.env.update({"LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_CONFIG": str(self.work / "nvml.conf")})
        self.gpus = True

    def start(self) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        from nsystemd import NamespacedSystemd

        why = NamespacedSystemd.missing_prerequisites()
        if why:
            sys.exit(f"bench: cannot boot the namespaced systemd: {why}")
        self.build_fake_nvml()
        self.data.mkdir()
        self.growth.mkdir()
        self.nsd = NamespacedSystemd(f"reconcile-bench-{os.getpid()}")
        self.nsd.write_unit(VLLM, "[Unit]\nDescription=vLLM Kimi-K2.5 INT4 (benchmark stand-in)\n\n"
                            "[Service]\nExecStart=/bin/sleep infinity\nRestart=always\n\n"
                            "[Install]\nWantedBy=multi-user.target\n", enable=True)
        t0 = time.perf_counter()
        self.nsd.start()
        self.nsd.wait_active(VLLM)
        log(f"systemd booted in the namespace ({self.nsd.boot_state}, {time.perf_counter() - t0:.1f}s); "
            f"{VLLM} active")
        self.nsd.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", str(self.data)], check=True)
        t0 = time.perf_counter()
        generate_files(self.ns_path(self.hs), self.args.done)
        log(f"generated {self.args.done:,} sample files in {time.perf_counter() - t0:.1f}s")
        self.write_tools()

    def stop(self) -> None:
        if self.nsd is not None:
            self.nsd.stop()  # SIGKILL to its PID 1: every process and mount of the namespace goes with it
            self.nsd = None
        if self.args.keep:
            log(f"kept {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    # -- the audit, written for each tool ------------------------------------

    def state_yaml(self, units: list[str] | None = None, kinds: set[str] | None = None,
                   extraction_dir: Path | None = None, total: int = SEED_TOTAL) -> str:
        kinds = kinds if kinds is not None else self.kinds
        lines = ["version: 1"]
        if "units" in kinds:
            lines.append("units:")
            for u in units or [VLLM]:
                lines += [f"  {u}:", "    active: false", "    enabled: false"]
        if "gpus" in kinds:
            lines += ["gpus:", f"  count: {GPU_COUNT}", "  max_memory_used: 0MiB", "  free_with:",
                      "    stop_units: true"] + ([f"  needs: [unit:{VLLM}]"] if "units" in kinds else [])
        if "mounts" in kinds:
            lines += ["mounts:", f"  {self.data}:", "    fstype: tmpfs", f"    min_free: {MIN_FREE}"]
        if "extractions" in kinds:
            needs = [f"mount:{self.data}"] if "mounts" in kinds and extraction_dir is None else []
            lines += ["extractions:", "  kimi-k25-eagle3:", f"    dir: {extraction_dir or self.hs}",
                      f"    total: {total}", "    verify: recent"]
            if needs:
                lines.append(f"    needs: [{', '.join(needs)}]")
        return "\n".join(lines) + "\n"

    def write_tools(self) -> None:
        registered = registered_kinds()
        self.kinds = {"units"} | ({"mounts", "extractions"} & registered) | ({"gpus"} if self.gpus else set())
        self.state = self.work / "seed.yaml"
        self.state.write_text(self.state_yaml())
        nvsmi = str(self.work / "nvsmi")
        hs, data, total = str(self.hs), str(self.data), self.args.done
        find_sh = f"find {shlex.quote(hs)} -name 'data_*' | wc -l"

        # Ansible: two variants of the file count (command vs the find module).
        pb_dir = self.work / "ansible"
        pb_dir.mkdir()
        for variant in ("shell", "find"):
            tasks = [
                "    - name: vLLM unit stopped and disabled",
                "      ansible.builtin.systemd_service:",
                f"        name: {VLLM}",
                "        state: stopped",
                "        enabled: false",
            ]
            if self.gpus:
                tasks += [
                    "    - name: GPU memory in use (nvidia-smi)",
                    f"      ansible.builtin.command: {nvsmi}",
                    "      check_mode: false",
                    "      changed_when: false",
                    "      register: gpu",
                    "    - name: GPUs free",
                    "      ansible.builtin.assert:",
                    "        that: \"{{ gpu.stdout_lines | map('split', ', ') | map('last') | map('int') "
                    "| max == 0 }}\"",
                    "      ignore_errors: true",
                ]
            tasks += [
                "    - name: mount facts",
                "      ansible.builtin.mount_facts:",
                "        fstypes: [tmpfs]",
                "    - name: /data mounted, tmpfs, enough free space",
                "      ansible.builtin.assert:",
                "        that:",
                f"          - \"'{data}' in ansible_facts.mount_points\"",
                f"          - \"ansible_facts.mount_points['{data}'].fstype == 'tmpfs'\"",
                f"          - \"ansible_facts.mount_points['{data}'].size_available >= {MIN_FREE_BYTES}\"",
                "      ignore_errors: true",
            ]
            if variant == "shell":
                tasks += [
                    "    - name: count the extraction's files",
                    f"      ansible.builtin.shell: \"{find_sh}\"",
                    "      check_mode: false",
                    "      changed_when: false",
                    "      register: files",
                    "    - name: files done",
                    "      ansible.builtin.debug:",
                    "        msg: \"files={{ files.stdout | int }}\"",
                ]
            else:
                tasks += [
                    "    - name: find the extraction's files",
                    "      ansible.builtin.find:",
                    f"        paths: {hs}",
                    "        patterns: 'data_*'",
                    "        recurse: true",
                    "      register: files",
                    "    - name: files done",
                    "      ansible.builtin.debug:",
                    "        msg: \"files={{ files.matched }}\"",
                ]
            (pb_dir / f"audit-{variant}.yml").write_text("\n".join([
                "- name: audit the seed host",
                "  hosts: localhost",
                "  connection: local",
                "  gather_facts: false",
                "  vars:",
                f"    ansible_python_interpreter: {PEERS / 'bin' / 'python'}",
                "  tasks:",
                *tasks,
            ]) + "\n")

        # pyinfra: the operation in --dry mode, plus facts.
        py_dir = self.work / "pyinfra"
        py_dir.mkdir()
        deploy = [
            "from pyinfra import host",
            "from pyinfra.facts.files import FindFiles",
            "from pyinfra.facts.server import Command, Mounts",
            "from pyinfra.operations import systemd",
            "",
            f"systemd.service(name='vLLM unit stopped and disabled', service={VLLM!r}, running=False, enabled=False)",
            f"m = host.get_fact(Mounts).get({data!r})",
            "print('mount', 'ok' if m and m.get('type') == 'tmpfs' else 'MISSING', flush=True)",
            f"avail = int(host.get_fact(Command, command={f'df -B1 --output=avail {data} | tail -1'!r}))",
            f"print('free', 'ok' if avail >= {MIN_FREE_BYTES} else 'LOW', flush=True)",
            f"files = host.get_fact(FindFiles, path={hs!r}, fname='data_*')",
            "print(f'files={len(files)}', flush=True)",
        ]
        if self.gpus:
            deploy += [
                f"used = [int(line.split(', ')[1]) for line in host.get_fact(Command, command={nvsmi!r}).splitlines()]",
                "print('gpus', 'free' if max(used) == 0 else f'BUSY {max(used)} MiB', flush=True)",
            ]
        (py_dir / "audit.py").write_text("\n".join(deploy) + "\n")

        # testinfra: the equivalent assertions.
        ti_dir = self.work / "testinfra"
        ti_dir.mkdir()
        tests = [
            f"VLLM = {VLLM!r}",
            "",
            "def test_vllm_stopped(host):",
            "    assert not host.service(VLLM).is_running",
            "",
            "def test_vllm_disabled(host):",
            "    assert not host.service(VLLM).is_enabled",
            "",
            "def test_data_mounted(host):",
            f"    mp = host.mount_point({data!r})",
            "    assert mp.exists and mp.filesystem == 'tmpfs'",
            "",
            "def test_data_free(host):",
            f"    assert int(host.check_output('df -B1 --output=avail {data} | tail -1')) >= {MIN_FREE_BYTES}",
            "",
            "def test_extraction_files(host):",
            f"    n = int(host.check_output({find_sh!r}))",
            "    print(f'files={n}')",
            f"    assert n == {total}",
        ]
        if self.gpus:
            tests += [
                "",
                "def test_gpus_free(host):",
                f"    used = [int(line.split(', ')[1]) for line in host.check_output({nvsmi!r}).splitlines()]",
                "    assert max(used) == 0",
            ]
        (ti_dir / "test_audit.py").write_text("\n".join(tests) + "\n")

        # The floor.
        floor = [f"systemctl show -p ActiveState,SubState,UnitFileState,MainPID {VLLM}"]
        if self.gpus:
            floor.append(nvsmi)
        floor += [f"findmnt -D {shlex.quote(data)}", find_sh]
        (self.work / "floor.sh").write_text("\n".join(floor) + "\n")

    def peer_env(self) -> dict[str, str]:
        env = dict(self.env)
        env.update({"ANSIBLE_HOME": str(self.work / "ansible-home"), "ANSIBLE_NOCOLOR": "1",
                    "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
                    "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml",
                    "PYINFRA_PROGRESS": "off"})
        return env

    # -- running jobs inside the namespace -----------------------------------

    def job(self, name: str, argv: list[str], *, reps: int | None = None, warmup: int = 1, env=None,
            cwd: str | None = None, reset=(), expect=None, rcs=None) -> dict:
        return {"name": name, "argv": argv, "reps": reps or self.args.runs, "warmup": warmup,
                "env": env or self.env, "cwd": cwd, "reset": list(reset), "log": str(self.work / f"{name}.log"),
                "expect": expect, "rcs": rcs}

    def run_jobs(self, jobs: list[dict], timeout: float = 7200) -> dict:
        """Run the jobs in one harness inside the namespace (its progress goes to our stderr)."""
        jobfile = self.work / "jobs.json"
        jobfile.write_text(json.dumps(jobs))
        log("running " + "; ".join(f"{j['name']} ({j['reps']}x)" for j in jobs))
        load = os.getloadavg()[0]
        proc = self.nsd.popen([sys.executable, str(Path(__file__).resolve()), "--inner", str(jobfile)],
                              env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # our own harness (nsenter's process group)
            proc.communicate()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"the harness failed (exit {proc.returncode})")
        out = json.loads(stdout)
        for job in jobs:
            r = out[job["name"]]
            r["load_before"] = load
            r["problems"] = self.check(job, r)
            for p in r["problems"]:
                log(f"  WARNING {job['name']}: {p}")
            if "walls" in r:
                log(f"  {job['name']}: median {median(r['walls']):.3f}s, peak RSS "
                    f"{median(r['rss_kib']) / 1024:.0f} MiB, exit {sorted(set(r['rcs']))}")
        return out

    @staticmethod
    def check(job: dict, r: dict) -> list[str]:
        """Did the tool really do the audit? (the expected text in its output, the expected exit codes)"""
        problems = []
        if job.get("type") == "scan" or r.get("first") is None:
            return problems
        outs = [r["first"]["output"], r["last_output"]]
        for pat in job.get("expect") or ():
            for o in outs:
                if not re.search(pat, o):
                    problems.append(f"output lacks /{pat}/; tail: {o[-400:]!r}")
                    break
        if job.get("rcs") is not None:
            bad = sorted({rc for rc in [r["first"]["rc"], *r["rcs"]] if rc not in job["rcs"]})
            if bad:
                problems.append(f"exit codes {bad}, expected {job['rcs']}; tail: {outs[-1][-400:]!r}")
        return problems

    # -- the measurements -----------------------------------------------------

    def seed_audit(self) -> None:
        total = self.args.done
        rec = self.rec
        st = str(self.state)
        clear = ["rm", "-rf", str(self.cache), str(self.state_dir)]
        jobs = [
            self.job("reconcile diff", [*rec, "diff", st], expect=[re.escape(VLLM)], rcs=[2]),
            self.job("reconcile diff --format json", [*rec, "diff", "--format", "json", st],
                     expect=[re.escape(VLLM)], rcs=[2]),
            # Cold: no validated-state cache and no extraction integrity record: what the
            # first run after an install (or after editing the state file) costs.
            self.job("reconcile diff (cold caches)", [*rec, "diff", st], reset=[clear], warmup=1,
                     expect=[re.escape(VLLM)], rcs=[2]),
            self.job("shell floor", ["/bin/sh", str(self.work / "floor.sh")], expect=[rf"(?m)^{total}$"], rcs=[0]),
        ]
        if not self.args.no_peers:
            penv = self.peer_env()
            jobs += [
                self.job("pyinfra @local --dry", [str(PEERS / "bin" / "pyinfra"), "@local", "audit.py", "--dry"],
                         cwd=str(self.work / "pyinfra"), env=penv, expect=[f"files={total}"], rcs=[0]),
                self.job("pytest-testinfra",
                         [str(PEERS / "bin" / "pytest"), "-p", "no:cacheprovider", "-q", "-s", "--hosts=local://",
                          "test_audit.py"], cwd=str(self.work / "testinfra"), env=penv,
                         expect=[f"files={total}", "failed"], rcs=[1]),
                self.job("ansible-playbook --check --diff (find | wc -l)",
                         [str(PEERS / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", "--check",
                          "--diff", str(self.work / "ansible" / "audit-shell.yml")], env=penv,
                         reps=self.args.ansible_runs, expect=[f"files={total}", "changed="], rcs=[0]),
                self.job("ansible-playbook --check --diff (find module)",
                         [str(PEERS / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", "--check",
                          "--diff", str(self.work / "ansible" / "audit-find.yml")], env=penv,
                         reps=self.args.ansible_runs, expect=[f"files={total}", "changed="], rcs=[0]),
            ]
        self.results["seed"] = self.run_jobs(jobs)
        self.results["seed"]["reconcile diff (cold caches)"]["note"] = "validation cache and integrity record cleared"

    def breakdown(self) -> None:
        """Where reconcile diff's time goes: the interpreter, the CLI alone, each kind alone."""
        jobs = [self.job("python -c pass", [self.python, "-c", "pass"], rcs=[0]),
                self.job("reconcile --version", [*self.rec, "--version"], rcs=[0])]
        for kind in sorted(self.kinds):
            path = self.work / f"only-{kind}.yaml"
            path.write_text(self.state_yaml(kinds={kind}))
            jobs.append(self.job(f"reconcile diff, {kind} only", [*self.rec, "diff", str(path)], rcs=[0, 2]))
        jobs.append(self.job("reconcile diff, all kinds", [*self.rec, "diff", str(self.state)], rcs=[2]))
        self.results["breakdown"] = self.run_jobs(jobs)

    def growth_units(self) -> None:
        """reconcile diff with 1..500 declared units, none drifted. Two sets: disabled units, which
        systemd has not loaded (so every `systemctl show` makes it load each unit file), and
        enabled-but-stopped units, which stay loaded (multi-user.target wants them)."""
        n_max = max(self.args.units)
        udir = self.nsd.unit_dir
        wants = udir / "multi-user.target.wants"
        wants.mkdir(exist_ok=True)
        sets = {"disabled": [f"bench-off-{i:03d}.service" for i in range(n_max)],
                "enabled": [f"bench-on-{i:03d}.service" for i in range(n_max)]}
        text = "[Unit]\nDescription=benchmark unit\n\n[Service]\nExecStart=/bin/true\n\n" \
               "[Install]\nWantedBy=multi-user.target\n"
        for kind, names in sets.items():
            for name in names:
                (udir / name).write_text(text)
                if kind == "enabled":
                    (wants / name).symlink_to(f"/etc/systemd/system/{name}")
        self.nsd.systemctl("daemon-reload", check=True)
        jobs = []
        for kind, names in sets.items():
            for n in self.args.units:
                path = self.work / f"units-{kind}-{n}.yaml"
                lines = ["version: 1", "units:"]
                enabled = "true" if kind == "enabled" else "false"
                for u in names[:n]:
                    lines += [f"  {u}:", "    active: false", f"    enabled: {enabled}"]
                path.write_text("\n".join(lines) + "\n")
                jobs.append(self.job(f"reconcile diff, {n} units ({kind})", [*self.rec, "diff", str(path)], rcs=[0]))
            jobs.append(self.job(f"systemctl show, {n_max} units ({kind})",
                                 ["systemctl", "show", "-p", "Id,LoadState,ActiveState,SubState,UnitFileState,MainPID",
                                  *names], rcs=[0]))
        # What a units observer could ask instead: two listings, no unit loaded on request.
        jobs.append(self.job("systemctl list-units --all + list-unit-files",
                             ["/bin/sh", "-c", "systemctl list-units --all --plain --no-legend --no-pager >/dev/null; "
                              "systemctl list-unit-files --plain --no-legend --no-pager >/dev/null"], rcs=[0]))
        self.results["units"] = self.run_jobs(jobs)

    def growth_files(self) -> None:
        if "extractions" not in self.kinds:
            return
        jobs = []
        sizes = [self.args.done] + [n for n in self.args.files if n != self.args.done]
        self.nsd.run(["mount", "-t", "tmpfs", "-o", "size=12g,nr_inodes=4m", "tmpfs", str(self.growth)], check=True)
        for n in sizes:
            if n == self.args.done:
                d = self.hs
            else:
                d = self.growth / f"hs-{n}"
                t0 = time.perf_counter()
                generate_files(self.ns_path(d), n)
                log(f"generated {n:,} files in {time.perf_counter() - t0:.1f}s")
            st_dir = self.work / f"state-files-{n}"
            env = dict(self.env, RECONCILE_STATE_DIR=str(st_dir))
            reps = self.args.runs if n < 500_000 else max(3, self.args.runs // 2)
            jobs.append({"name": f"scan {n}", "type": "scan", "dir": str(d), "total": n, "verify": "recent",
                         "reps": reps, "cold_reps": 1, "env": env})
            path = self.work / f"files-{n}.yaml"
            path.write_text(self.state_yaml(kinds={"extractions"}, extraction_dir=d, total=n))
            jobs.append(self.job(f"reconcile diff, {n} files", [*self.rec, "diff", str(path)], env=env, reps=reps,
                                 rcs=[0]))
            jobs.append(self.job(f"find | wc -l, {n} files", ["/bin/sh", "-c", f"find {d} -name 'data_*' | wc -l"],
                                 reps=reps, rcs=[0], expect=[rf"^{n}$"]))
        # The scans run in a harness of their own: a harness that held 1,000,000 names in
        # memory would lend its peak RSS to the commands it starts (see _run_once).
        self.results["files"] = self.run_jobs([j for j in jobs if j.get("type") == "scan"])
        self.results["files"].update(self.run_jobs([j for j in jobs if j.get("type") != "scan"]))

    def apply_seed(self) -> None:
        """`reconcile apply` on the seed scenario; the scenario is reset before each run."""
        journal = self.work / "journal" / "journal.jsonl"
        ctl = ["systemctl", "--no-pager"]
        reset = [[*ctl, "enable", VLLM], [*ctl, "start", VLLM],
                 ["sh", "-c", f"until systemctl is-active -q {VLLM}; do sleep 0.02; done"]]
        jobs = [self.job("reconcile apply", [*self.rec, "apply", "--journal", str(journal), str(self.state)],
                         reset=reset, rcs=[0, 2], expect=[re.escape(VLLM)])]
        self.results["apply"] = self.run_jobs(jobs)
        r = self.nsd.systemctl("is-enabled", VLLM).stdout.strip()
        a = self.nsd.systemctl("is-active", VLLM).stdout.strip()
        self.results["apply"]["reconcile apply"]["after"] = {"is-enabled": r, "is-active": a}
        log(f"after the last apply: {VLLM} is {a}, {r}")

    def importtime(self) -> None:
        """Where reconcile diff's start-up goes: `python -X importtime`, median of 5, warm caches."""
        runs = []
        for _ in range(5):
            res = self.nsd.run([self.python, "-X", "importtime", "-m", "reconcile", "diff", str(self.state)],
                               env=self.env, timeout=120)
            runs.append(parse_importtime(res.stderr))
        names = set().union(*runs)
        first = runs[0]
        self.results["importtime"] = {
            n: {"self_us": median([r.get(n, (0, 0, 0, 0))[0] for r in runs]),
                "cumulative_us": median([r.get(n, (0, 0, 0, 0))[1] for r in runs]),
                "depth": first.get(n, (0, 0, 99, 0))[2], "order": first.get(n, (0, 0, 0, 10**6))[3]}
            for n in names}

    # -- report ----------------------------------------------------------------

    def report(self) -> str:
        a = self.args
        seed = self.results.get("seed", {})
        base = median(seed["reconcile diff"]["walls"])
        cpu = "?"
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        lines = [
            "# reconcile benchmark",
            "",
            f"{time.strftime('%Y-%m-%d %H:%M')} · {os.cpu_count()} CPUs ({cpu}) · Linux {platform.release()} · "
            f"Python {platform.python_version()} · load average {self.meta.get('load_start', [0])[0]:.1f} at the "
            f"start, {self.meta.get('load_end', [0])[0]:.1f} at the end · peers: " + ", ".join(f"{k} {v}" for k, v in
                                                                         self.meta.get("peers", {}).items()),
            "",
            f"Scenario: a real systemd (PID 1 of a namespace) running `{VLLM}` (enabled, Restart=always); "
            + (f"{GPU_COUNT} fake GPUs (fake libnvidia-ml) held by it at {VLLM_MIB:,} MiB each; " if self.gpus
               else f"no GPUs ({self.gpus_why}: left out of every tool's audit); ")
            + f"`/data` a tmpfs; {a.done:,} sample files in SpecForge layout (`rows_*/data_*.ckpt`). "
            f"Every tool runs inside the namespace, {a.runs} runs after one warm-up "
            f"(Ansible: {a.ansible_runs}), medians; PYTHONDONTWRITEBYTECODE unset, so byte-code caches are used. "
            f"reconcile is run as `{self.rec_label}`; its validated-state cache is warm except in the cold row.",
            "",
            "| tool | median wall s | peak RSS MiB | ratio to `reconcile diff` | exit |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        for name, r in seed.items():
            t = median(r["walls"])
            cell = name.replace("|", "\\|")  # a pipe in a cell would end it
            lines.append(f"| {cell} | {t:.3f} | {median(r['rss_kib']) / 1024:.0f} | {t / base:.1f}× | "
                         f"{','.join(map(str, sorted(set(r['rcs']))))} |")
        if "apply" in self.results:
            r = self.results["apply"]["reconcile apply"]
            lines += ["", f"`reconcile apply` on the seed scenario (reset before each run: vLLM unit re-enabled and "
                      f"started): median {median(r['walls']):.3f} s, peak RSS {median(r['rss_kib']) / 1024:.0f} MiB, "
                      f"exit {sorted(set(r['rcs']))}; afterwards the unit is {r['after']['is-active']}, "
                      f"{r['after']['is-enabled']}."]
        if "breakdown" in self.results:
            lines += ["", "## Where `reconcile diff` spends its time (each kind alone)", "",
                      "| command | median wall s | peak RSS MiB |", "| --- | ---: | ---: |"]
            for name, r in self.results["breakdown"].items():
                lines.append(f"| {name} | {median(r['walls']):.3f} | {median(r['rss_kib']) / 1024:.0f} |")
        if "units" in self.results:
            lines += ["", "## Declared units (`list-units` + unit files read in-process; `show` only for drift)", "",
                      "| command | median wall s | peak RSS MiB |", "| --- | ---: | ---: |"]
            for name, r in self.results["units"].items():
                lines.append(f"| {name} | {median(r['walls']):.3f} | {median(r['rss_kib']) / 1024:.0f} |")
        if "files" in self.results:
            lines += ["", "## Files in the extraction (verify: recent)", "",
                      "| files | list names, no cache (in-process) s | observe, warm (in-process) s | observe, cold "
                      "(in-process) s | `reconcile diff` (whole command) s | its peak RSS MiB | `find \\| wc -l` s |",
                      "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
            for name, r in self.results["files"].items():
                if not name.startswith("scan "):
                    continue
                n = int(name.split()[1])
                cmd = self.results["files"][f"reconcile diff, {n} files"]
                fnd = self.results["files"][f"find | wc -l, {n} files"]
                lines.append(f"| {n:,} | {median(r['list_cold']):.3f} | {median(r['observe_warm']):.3f} | "
                             f"{median(r['observe_cold']):.3f} | {median(cmd['walls']):.3f} | "
                             f"{median(cmd['rss_kib']) / 1024:.0f} | {median(fnd['walls']):.3f} |")
        lines += ["", "## Targets", ""]
        for ok, text in self.targets():
            lines.append(f"- {'PASS' if ok else 'FAIL'}: {text}")
        problems = [(s, n, p) for s, group in self.results.items() if isinstance(group, dict)
                    for n, r in group.items() if isinstance(r, dict) for p in r.get("problems", ())]
        if problems:
            lines += ["", "## Problems seen (the numbers of these rows are suspect)", ""]
            lines += [f"- {n}: {p}" for _s, n, p in problems]
        if "importtime" in self.results:
            imp = self.results["importtime"]
            rows = [(n, v) for n, v in imp.items() if v["depth"] <= 2 and v["cumulative_us"] >= 2000]
            rows.sort(key=lambda nv: nv[1]["order"])
            total = sum(v["cumulative_us"] for v in imp.values() if v["depth"] == 0)
            lines += ["", "## reconcile start-up: imports (`python -X importtime -m reconcile_host diff`, "
                      "median of 5; "
                      f"all imports {total / 1000:.0f} ms; rows ≥ 2 ms, three levels)", "",
                      "| module | cumulative ms | self ms |", "| --- | ---: | ---: |"]
            for n, v in rows:
                indent = "&nbsp;&nbsp;" * v["depth"]
                lines.append(f"| {indent}{n} | {v['cumulative_us'] / 1000:.1f} | {v['self_us'] / 1000:.1f} |")
        return "\n".join(lines) + "\n"

    def targets(self) -> list[tuple[bool, str]]:
        out = []
        seed = self.results.get("seed", {})
        base = median(seed["reconcile diff"]["walls"])
        if "shell floor" in seed:
            floor = median(seed["shell floor"]["walls"])
            out.append((base <= TARGET_FLOOR_RATIO * floor,
                        f"reconcile diff {base:.3f} s ≤ {TARGET_FLOOR_RATIO:g}× the shell floor {floor:.3f} s "
                        f"(ratio {base / floor:.1f})"))
        for key, want in (("pyinfra @local --dry", TARGET_PYINFRA), ("pytest-testinfra", TARGET_TESTINFRA)):
            if key in seed:
                t = median(seed[key]["walls"])
                out.append((t >= want * base, f"≥ {want:g}× faster than {key}: {t / base:.1f}×"))
        ans = [median(r["walls"]) for n, r in seed.items() if n.startswith("ansible")]
        if ans:
            t = min(ans)  # the faster variant: the stricter test
            out.append((t >= TARGET_ANSIBLE * base,
                        f"≥ {TARGET_ANSIBLE:g}× faster than Ansible (its faster variant): {t / base:.1f}×"))
        files = self.results.get("files", {})
        big = max((int(n.split()[1]) for n in files if n.startswith("scan ")), default=0)
        if big:
            t = median(files[f"scan {big}"]["observe_warm"])
            c = median(files[f"reconcile diff, {big} files"]["walls"])
            out.append((t < TARGET_MILLION_S and big >= 1_000_000,
                        f"{big:,} files scanned in < {TARGET_MILLION_S:g} s: observe {t:.3f} s "
                        f"(whole `reconcile diff` {c:.3f} s)"))
        units = self.results.get("units", {})
        nu = max((int(n.split()[2]) for n in units if n.startswith("reconcile diff,")), default=0)
        for kind in ("disabled", "enabled"):
            r = units.get(f"reconcile diff, {nu} units ({kind})")
            if r:
                t = median(r["walls"])
                out.append((t < TARGET_500_UNITS_S and nu >= 500,
                            f"{nu} units ({kind}) in < {TARGET_500_UNITS_S:g} s: {t:.3f} s"))
        return out


def parse_importtime(stderr: str) -> dict[str, tuple[int, int, int, int]]:
    """name -> (self µs, cumulative µs, depth, tree order) from `-X importtime` output (which
    lists children before their parent: the order is reversed within each level)."""
    rows = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((m.group(4), int(m.group(1)), int(m.group(2)), (len(m.group(3)) - 1) // 2))
    # Reversed, the post-order lists each parent before its children: the display order.
    pos: dict[str, int] = {}
    for i, (name, *_rest) in enumerate(reversed(rows)):
        pos.setdefault(name, i)
    out = {}
    for name, self_us, cum, depth in rows:
        out[name] = (self_us, cum, depth, pos[name])
    return out


def parse_list(text: str) -> list[int]:
    return [int(x.replace("_", "").replace(",", "")) for x in text.split("/") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Time the seed host's audit with reconcile, Ansible, pyinfra, testinfra and plain shell "
                    "(needs root; boots a namespaced systemd; about 10 minutes).",
        epilog="Writes bench/results/latest.md and latest.json.")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per tool after one warm-up (default 7)")
    ap.add_argument("--ansible-runs", type=int, help="timed runs of each Ansible variant (default: --runs)")
    ap.add_argument("--done", type=int, default=SEED_TOTAL,
                    help=f"sample files in the seed extraction (default {SEED_TOTAL:,}; the seed host had 18,400 "
                         f"of {SEED_TOTAL:,})")
    ap.add_argument("--files", type=parse_list, default=[SEED_TOTAL, 1_000_000],
                    help="file counts for the growth table, separated by / (default 37312/1000000)")
    ap.add_argument("--units", type=parse_list, default=[1, 100, 500],
                    help="declared-unit counts for the growth table (default 1/100/500)")
    ap.add_argument("--quick", action="store_true", help="3 runs, files only up to 37,312")
    ap.add_argument("--no-peers", action="store_true", help="skip Ansible, pyinfra and testinfra")
    ap.add_argument("--no-gpus", action="store_true", help="leave the fake GPUs out")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: breakdown,units,files,apply,importtime")
    ap.add_argument("--installed", action="store_true",
                    help="time the `reconcile` installed next to this interpreter instead of a fresh "
                         "`pip install .` of this tree in bench/.reconcile")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, state files, playbooks)")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        inner(a.inner)
        return
    if a.quick:
        a.runs = 3
        a.files = [n for n in a.files if n <= SEED_TOTAL] or [SEED_TOTAL]
    a.ansible_runs = a.ansible_runs or a.runs
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it boots systemd in a namespace, mounts tmpfs there): sudo python3 bench/run.py")

    if not a.installed:
        install_reconcile()
    b = Bench(a)
    b.meta["argv"] = sys.argv[1:]
    if not a.no_peers:
        b.meta["peers"] = ensure_peers()
    t_start = time.perf_counter()
    b.meta["load_start"] = os.getloadavg()
    if b.meta["load_start"][0] > 1.0:
        log(f"WARNING: load average {b.meta['load_start'][0]:.1f} on {os.cpu_count()} CPUs: other work will skew "
            "the times (the tools run round-robin, so the ratios suffer less than the absolute times)")
    try:
        b.start()
        b.seed_audit()
        if "breakdown" not in skip:
            b.breakdown()
        if "apply" not in skip:
            b.apply_seed()
        if "units" not in skip:
            b.growth_units()
        if "importtime" not in skip:
            b.importtime()
        if "files" not in skip:
            b.growth_files()
    finally:
        b.stop()
    b.meta["seconds"] = time.perf_counter() - t_start
    b.meta["load_end"] = os.getloadavg()
    b.meta.update({"gpus": b.gpus, "gpus_left_out_because": b.gpus_why, "kinds": sorted(b.kinds),
                   "reconcile": b.rec_label, "cpus": os.cpu_count()})
    text = b.report()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.md").write_text(text)
    (RESULTS / "latest.json").write_text(json.dumps({"meta": b.meta, "results": b.results,
                                                     "targets": [{"pass": ok, "text": t} for ok, t in b.targets()]},
                                                    indent=1))
    print(text)
    log(f"done in {b.meta['seconds']:.0f}s; wrote {RESULTS / 'latest.md'} and latest.json")


if __name__ == "__main__":
    main()
