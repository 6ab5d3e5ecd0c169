"""The scenario: the story's host built inside a namespaced systemd, and the audit written for every tool."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from install import reconcile_cmd, registered_kinds
from samples import generate_files

from common import (
    GPU_COUNT,
    GPU_TOTAL_MIB,
    HERE,
    MIN_FREE,
    MIN_FREE_BYTES,
    PEERS,
    ROOT,
    SEED_TOTAL,
    VLLM,
    VLLM_MIB,
    clean_env,
    log,
    median,
)


class Scenario:
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
        # The fake is compiled against NVIDIA's nvml.h (tests/nvml_header.py: the cache .ci/run fills, or
        # pip-downloaded into this run's work directory).
        sys.path.insert(0, str(ROOT / "tests"))
        from nvml_header import NvmlHeaderUnavailable, include_dir

        try:
            include = include_dir(self.work)
        except NvmlHeaderUnavailable as exc:
            self.gpus_why = f"nvml.h for the fake libnvidia-ml: {exc}"
            return
        srcs = [str(p) for p in sorted(src.parent.glob("fakenvml*.c"))]
        subprocess.run([gcc, "-shared", "-fPIC", "-O2", f"-I{src.parent}", f"-I{include}", "-o",
                        str(libdir / "libnvidia-ml.so.1"), *srcs], check=True, capture_output=True)
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
        # The fake's PCI bus (tests/pci_support.py): the gpus kind holds NVML's GPUs against
        # /sys/bus/pci, and this machine's shows none. Nor its /proc/driver/nvidia/gpus.
        import pci_support

        slots = [(f"0000:{0x11 + i * 0x10:02x}:00.0", "nvidia") for i in range(GPU_COUNT)]
        sysfs = pci_support.write_tree(self.work / "sys", pci_support.bus_with_gpus(pci_support.DEFAULT_HOST, slots))
        self.env.update({"LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_CONFIG": str(self.work / "nvml.conf"),
                         "RECONCILE_SYSFS_PCI": str(sysfs),
                         "RECONCILE_NVIDIA_PROC_DIR": str(self.work / "no-proc-driver-nvidia-gpus")})
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
                      f"    total: {total}", "    verify: at-risk"]
            if needs:
                lines.append(f"    needs: [{', '.join(needs)}]")
        return "\n".join(lines) + "\n"

    def peer_env(self) -> dict[str, str]:
        env = dict(self.env)
        env.update({"ANSIBLE_HOME": str(self.work / "ansible-home"), "ANSIBLE_NOCOLOR": "1",
                    "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
                    "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml",
                    "PYINFRA_PROGRESS": "off"})
        return env

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
        proc = self.nsd.popen([sys.executable, str(HERE / "run.py"), "--inner", str(jobfile)],
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
