"""The measurements (the audit, the breakdown, growth with units and files, apply, imports) and the report."""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

from samples import generate_files
from scenario import Scenario

from common import (
    GPU_COUNT,
    PEERS,
    TARGET_500_UNITS_S,
    TARGET_ANSIBLE,
    TARGET_FLOOR_RATIO,
    TARGET_MILLION_S,
    TARGET_PYINFRA,
    TARGET_TESTINFRA,
    VLLM,
    VLLM_MIB,
    log,
    median,
)


class Bench(Scenario):
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
        if self.args.compare:  # another build, interleaved with this one: a before/after in one run
            jobs.insert(1, self.job("reconcile diff (compared build)", [self.args.compare, "diff", st],
                                    expect=[re.escape(VLLM)], rcs=[2]))
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
        empty = self.work / "no-resources.yaml"
        empty.write_text("version: 1\n")
        jobs = [self.job("python -c pass", [self.python, "-c", "pass"], rcs=[0]),
                self.job("reconcile --version", [*self.rec, "--version"], rcs=[0]),
                self.job("reconcile diff, no resources", [*self.rec, "diff", str(empty)], rcs=[0])]
        for kind in sorted(self.kinds):
            path = self.work / f"only-{kind}.yaml"
            path.write_text(self.state_yaml(kinds={kind}))
            jobs.append(self.job(f"reconcile diff, {kind} only", [*self.rec, "diff", str(path)], rcs=[0, 2]))
        jobs.append(self.job("reconcile diff, all kinds", [*self.rec, "diff", str(self.state)], rcs=[2]))
        if self.args.compare:
            jobs.append(self.job("reconcile diff, all kinds (compared build)", [self.args.compare, "diff",
                                                                               str(self.state)], rcs=[2]))
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
            jobs.append({"name": f"scan {n}", "type": "scan", "dir": str(d), "total": n, "verify": "at-risk",
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
        """`reconcile apply` on the incident scenario; the scenario is reset before each run."""
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
        # As the console script starts it (no runpy); the observer children write no importtime
        # (their stderr is /dev/null): these are the parent's imports.
        script = "import sys; from reconcile_host.__main__ import main; sys.argv[0] = 'reconcile'; main()"
        for _ in range(5):
            res = self.nsd.run([self.python, "-X", "importtime", "-c", script, "diff", str(self.state)],
                               env=self.env, timeout=120)
            runs.append(parse_importtime(res.stderr))
        names = set().union(*runs)
        first = runs[0]
        self.results["importtime"] = {
            n: {"self_us": median([r.get(n, (0, 0, 0, 0))[0] for r in runs]),
                "cumulative_us": median([r.get(n, (0, 0, 0, 0))[1] for r in runs]),
                "depth": first.get(n, (0, 0, 99, 0))[2], "order": first.get(n, (0, 0, 0, 10**6))[3]}
            for n in names}

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
        if "reconcile diff (compared build)" in seed and "shell floor" in seed:
            floor = median(seed["shell floor"]["walls"])
            other = median(seed["reconcile diff (compared build)"]["walls"])
            lines += ["", f"Compared build (`{a.compare}`): {other:.3f} s, {other / floor:.1f}× the shell floor; "
                      f"this tree: {base:.3f} s, {base / floor:.1f}×, in the same run."]
        if "apply" in self.results:
            r = self.results["apply"]["reconcile apply"]
            lines += ["", f"`reconcile apply` on the incident (reset before each run: vLLM unit re-enabled and "
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
            lines += ["", "## Files in the extraction (verify: at-risk)", "",
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
            lines += ["", "## reconcile start-up: imports (`python -X importtime`, `reconcile diff` as the console "
                      "script runs it, the parent process, median of 5; "
                      f"all imports {total / 1000:.0f} ms; rows ≥ 2 ms, three levels)", "",
                      "| module | cumulative ms | self ms |", "| --- | ---: | ---: |"]
            for n, v in rows:
                indent = "&nbsp;&nbsp;" * v["depth"]
                lines.append(f"| {indent}{n} | {v['cumulative_us'] / 1000:.1f} | {v['self_us'] / 1000:.1f} |")
            top = sorted(imp.items(), key=lambda nv: -nv[1]["self_us"])[:15]
            lines += ["", "The largest self times (the module's own code: its classes, dataclasses, "
                      "compiled expressions):", "", "| module | self ms |", "| --- | ---: |"]
            lines += [f"| {n} | {v['self_us'] / 1000:.1f} |" for n, v in top]
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
