"""The fleet's measurements: the three tools against 10 .. 100 hosts, round-robin, each run in a
cgroup of its own (wall time, controller CPU and peak memory, the targets' CPU); then where
one host's time goes; and the report section with its targets."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time

from cgroups import Group
from fleet import FleetScenario

from common import TARGET_FLEET_ANSIBLE, TARGET_FLEET_PYINFRA, log, median


class Fleet(FleetScenario):
    def measure(self, job: dict, name: str, grp: Group | None = None, keep: bool = False) -> dict:
        """Run one job in a fresh cgroup (or in `grp`, counting from now); what it used, and what it
        printed. Unless `keep`, what it left running (ssh masters) is stopped afterwards."""
        fresh = grp is None
        grp = grp or Group(f"{self.cg_prefix}-{name}")
        cpu0 = (0.0, 0.0) if fresh else grp.cpu()
        peak_ok = fresh or grp.reset_peak()
        out_path = self.work / f"{name}.log"
        t_cpu0 = sum(self.targets.cpu())
        with open(out_path, "wb") as out:
            t0 = time.perf_counter()
            proc = subprocess.Popen(grp.wrap(job["argv"]), env=job["env"], cwd=job.get("cwd"), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
        t_cpu = sum(self.targets.cpu()) - t_cpu0
        user, system = (now - before for now, before in zip(grp.cpu(), cpu0, strict=True))
        peak = grp.peak_bytes() if peak_ok else None
        exact = grp.available
        if not exact:  # no cgroup: what wait4 saw (misses daemonised ssh masters)
            user, system, peak = usage.ru_utime, usage.ru_stime, usage.ru_maxrss * 1024
        left = 0
        if not keep:
            left = grp.stop_all()  # the ssh masters a tool leaves behind (ControlPersist)
            grp.remove()
            for d in (self.work / "run" / "reconcile-ssh", self.work / "acp"):
                for sock in d.glob("*") if d.is_dir() else ():
                    sock.unlink(missing_ok=True)  # stale sockets of killed masters: every run starts cold
        text = out_path.read_text(errors="replace")
        rc = os.waitstatus_to_exitcode(status)
        return {"wall": wall, "user": user, "sys": system, "cpu": user + system,
                "peak_mib": None if peak is None else peak / 2**20, "target_cpu": t_cpu, "rc": rc,
                "left_behind": left, "cgroup": exact, "problems": self.check(job, text, rc), "tail": text[-3000:],
                "group": grp if keep else None}

    @staticmethod
    def check(job: dict, text: str, rc: int) -> list[str]:
        problems = []
        if rc not in job["rcs"]:
            problems.append(f"exit {rc}, expected {job['rcs']}; tail: {text[-600:]!r}")
        for pattern, count in job["expect"]:
            seen = len(re.findall(pattern, text))
            if seen != count:
                problems.append(f"/{pattern}/ seen {seen} times, expected {count}; tail: {text[-600:]!r}")
        return problems

    def run_fleet(self) -> None:
        """Per host count: warm-ups, then --fleet-runs rounds of every tool in turn."""
        counts = sorted(set(self.args.fleet_hosts))
        runs = self.args.fleet_runs
        out: dict = {}
        for i, n in enumerate(counts):
            jobs = self.fleet_jobs(n)
            out[n] = {}
            for j in jobs:
                out[n][j["tool"]] = {"label": j["label"], "runs": [], "warmup": None}
                if j.get("warm"):
                    out[n][j["warm"]] = {"label": f"{j['label']}, connections kept from the run before "
                                                  "(ControlPersist)", "runs": [], "warmup": None}
            for job in jobs:
                # reconcile's steady state has each host's validated-state cache and integrity
                # record: warm every host; the peers keep nothing per host (byte-code only).
                if job.get("warmup_each") or i == 0:
                    r = self.measure(job, f"{job['tool']}-{n}-warmup")
                    out[n][job["tool"]]["warmup"] = r
                    log(f"  warm-up {job['label']}, {n} hosts: {r['wall']:.2f}s exit {r['rc']}")
                    for p in r["problems"]:
                        log(f"  WARNING {job['tool']} {n} hosts (warm-up): {p}")
            for rep in range(runs):
                load = os.getloadavg()[0]
                for job in jobs:
                    warm = job.get("warm")
                    r = self.measure(job, f"{job['tool']}-{n}-{rep}", keep=bool(warm))
                    grp = r.pop("group")
                    self._record(out[n], job, r, n, load)
                    if warm:  # the same run again at once: the connections kept by ControlPersist
                        w = self.measure(job, f"{job['tool']}-{n}-{rep}-warm", grp=grp)
                        self._record(out[n], {**job, "tool": warm}, w, n, load)
        self.results["fleet"] = {str(n): v for n, v in out.items()}

    @staticmethod
    def _record(where: dict, job: dict, r: dict, n: int, load: float) -> None:
        r["load"] = load
        r.pop("group", None)
        where[job["tool"]]["runs"].append(r)
        peak = "?" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        log(f"  {job['tool']:14s} {n:3d} hosts: wall {r['wall']:6.2f}s, controller CPU {r['cpu']:6.2f}s, "
            f"peak {peak:>4s} MiB, targets' CPU {r['target_cpu']:6.2f}s, exit {r['rc']}")
        for p in r["problems"]:
            log(f"  WARNING {job['tool']} {n} hosts: {p}")

    def breakdown_fleet(self, reps: int = 7) -> None:
        """Where one host's time goes: the connection, a bare interpreter, the handshake, the run,
        and reconcile end to end (--host), each alone, serially, on the first host."""
        h = self.hosts[0]
        ssh = ["ssh", *(a for o in [*self.ssh_options(), "BatchMode=yes", "ControlMaster=no", "LogLevel=ERROR"]
                        for a in ("-o", o)), "-p", str(h["port"]), "root@127.0.0.1"]
        state = str(h["dir"] / "state.yaml")
        rcmd = self.remote_command(h)
        py = shlex.quote(str(self.python))
        parts = [
            ("ssh HOST true (a new connection)", [*ssh, "true"], None),
            ("ssh HOST python -c pass", [*ssh, f"{py} -c pass"], None),
            ("ssh HOST reconcile version --json (the handshake)", [*ssh, f"{rcmd} version --json"], None),
            ("ssh HOST reconcile diff --format json - (the run)",
             [*ssh, f"{rcmd} diff --format json --state-label {shlex.quote(state)} -"], state),
            ("reconcile diff --host (end to end, one host)",
             [*self.rec, "diff", state, "--host", f"ssh://root@127.0.0.1:{h['port']}", "--remote-command", rcmd,
              *(a for o in self.ssh_options() for a in ("--ssh-option", o))], None),
        ]
        out = {}
        for label, argv, stdin in parts:
            rows = []
            for i in range(reps + 1):
                job = {"argv": ["/bin/sh", "-c", f'exec "$@" < {shlex.quote(stdin)}', "sh", *argv] if stdin else argv,
                       "env": self.env, "cwd": str(self.work), "rcs": [0, 2], "expect": []}
                r = self.measure(job, f"breakdown-{len(out)}-{i}")
                if i:  # the first is a warm-up
                    rows.append(r)
            out[label] = rows
            log(f"  {label}: wall {median([r['wall'] for r in rows]):.3f}s, here "
                f"{median([r['cpu'] for r in rows]):.3f}s CPU, there {median([r['target_cpu'] for r in rows]):.3f}s CPU"
                + (f"; PROBLEM {rows[-1]['problems'][0]}" if rows[-1]["problems"] else ""))
        self.results["fleet_breakdown"] = out

    # --- the report -----------------------------------------------------------------------

    def fleet_header(self) -> str:
        import platform

        cpu = "?"
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        m = self.meta
        return (f"# reconcile fleet benchmark\n\n{time.strftime('%Y-%m-%d %H:%M')} · {os.cpu_count()} CPUs ({cpu}) · "
                f"Linux {platform.release()} · Python {platform.python_version()} · load average "
                f"{m.get('load_start', [0])[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end · peers: "
                + ", ".join(f"{k} {v}" for k, v in m.get("peers", {}).items())
                + f" · reconcile run as `{self.rec_label}` · command: `bench/run.py {' '.join(m.get('argv', []))}`\n")

    def fleet_report(self) -> list[str]:
        fleet = self.results.get("fleet")
        if not fleet:
            return []
        a = self.args
        loads = [r["load"] for v in fleet.values() for t in v.values() for r in t["runs"]]
        exact = all(r["cgroup"] for v in fleet.values() for t in v.values() for r in t["runs"])
        lines = [
            "", "## A fleet: `reconcile diff --inventory` against Ansible and pyinfra", "",
            f"{max(a.fleet_hosts)} inventory hosts, each an sshd port on 127.0.0.1, spread over "
            f"{len(self.nsds) or a.fleet_namespaces} namespaced systemds (the seed host's audit on each: vLLM unit, "
            + ("8 fake GPUs, " if self.gpus else "")
            + f"`/data` tmpfs, {a.fleet_files:,} sample files); --parallel / forks {a.fleet_parallel}; "
            f"{a.fleet_runs} run(s) per tool and host count after warm-ups, round-robin, medians; every run starts "
            "without ssh connections (masters left by a run are stopped). Controller CPU and peak memory: "
            + ("the controller's own cgroup (its whole process tree, ssh clients and masters included)"
               if exact else "wait4 (no cgroup here: ssh masters sent to the background are missed)")
            + "; targets' CPU: every sshd session and what it ran, and the namespaces' systemd. "
            f"Load average during the runs: {min(loads, default=0):.1f}–{max(loads, default=0):.1f} on "
            f"{os.cpu_count()} CPUs.",
            "",
            "| hosts | tool | wall s | controller CPU s (user+sys) | peak controller memory MiB | targets' CPU s "
            "| wall ratio to reconcile | exit |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for n, tools in fleet.items():
            base = median([r["wall"] for r in tools["reconcile"]["runs"]])
            for t in tools.values():
                rs = t["runs"]
                wall = median([r["wall"] for r in rs])
                lines.append(
                    f"| {n} | {t['label']} | {wall:.2f} | {median([r['cpu'] for r in rs]):.2f} "
                    f"({median([r['user'] for r in rs]):.2f}+{median([r['sys'] for r in rs]):.2f}) | "
                    f"{peak_cell(rs)} | {median([r['target_cpu'] for r in rs]):.2f} | "
                    f"{wall / base:.1f}× | {','.join(map(str, sorted({r['rc'] for r in rs})))} |")
        counts = sorted(fleet, key=int)
        if len(counts) > 1:
            lo, hi = counts[0], counts[-1]
            lines += ["", f"Growth from {lo} to {hi} hosts (median wall; the cost of each extra host):", "",
                      f"| tool | {lo} hosts s | {hi} hosts s | ×{int(hi) // int(lo)} hosts: wall × | per extra host ms "
                      "| controller CPU per extra host ms |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
            for tool in fleet[hi]:
                w = [median([r["wall"] for r in fleet[m][tool]["runs"]]) for m in (lo, hi)]
                c = [median([r["cpu"] for r in fleet[m][tool]["runs"]]) for m in (lo, hi)]
                extra = int(hi) - int(lo)
                lines.append(f"| {tool} | {w[0]:.2f} | {w[1]:.2f} | {w[1] / w[0]:.1f} | "
                             f"{(w[1] - w[0]) / extra * 1000:.0f} | {(c[1] - c[0]) / extra * 1000:.0f} |")
        bd = self.results.get("fleet_breakdown")
        if bd:
            lines += ["", "Where one host's time goes (each step alone, serially, on one host; medians of "
                      f"{len(next(iter(bd.values())))}):", "",
                      "| step | wall s | CPU here s | CPU on the target s |", "| --- | ---: | ---: | ---: |"]
            for label, rows in bd.items():
                wall, here, there = (median([r[k] for r in rows]) for k in ("wall", "cpu", "target_cpu"))
                lines.append(f"| {label} | {wall:.3f} | {here:.3f} | {there:.3f} |")
        problems = [(n, tool, p) for n, tools in fleet.items() for tool, t in tools.items()
                    for r in t["runs"] for p in r["problems"]]
        if problems:
            lines += ["", "Problems seen in the fleet runs (these rows are suspect):", ""]
            lines += [f"- {tool}, {n} hosts: {p[:300]}" for n, tool, p in problems[:12]]
        return lines

    def fleet_targets(self) -> list[tuple[bool, str]]:
        fleet = self.results.get("fleet")
        if not fleet:
            return []
        n = max(fleet, key=int)
        tools = fleet[n]
        base = median([r["wall"] for r in tools["reconcile"]["runs"]])
        out = []
        for tool, want in (("ansible", TARGET_FLEET_ANSIBLE), ("pyinfra", TARGET_FLEET_PYINFRA)):
            if tool in tools:
                t = median([r["wall"] for r in tools[tool]["runs"]])
                out.append((t >= want * base, f"{n} hosts: ≥ {want:g}× faster than {tools[tool]['label']}: "
                                              f"{t / base:.1f}× ({base:.2f} s against {t:.2f} s)"))
        if "pyinfra" in tools:
            out += self.per_host_targets(fleet, n)
        return out

    @staticmethod
    def per_host_targets(fleet: dict, n: str) -> list[tuple[bool, str]]:
        """Per host against pyinfra in the same run: the controller's CPU (each extra
        host, from the smallest inventory to the largest) no more than pyinfra's, the CPU asked of
        each target ≤ 1.5× pyinfra's, and the wall time ahead of pyinfra's."""
        def med(tool: str, size: str, key: str) -> float:
            return median([r[key] for r in fleet[size][tool]["runs"]])

        lo = min(fleet, key=int)
        extra = int(n) - int(lo)
        ctl = {t: (med(t, n, "cpu") - med(t, lo, "cpu")) / extra * 1000 if extra else med(t, n, "cpu") / int(n) * 1000
               for t in ("reconcile", "pyinfra")}
        there = {t: med(t, n, "target_cpu") / int(n) * 1000 for t in ("reconcile", "pyinfra")}
        wall = {t: med(t, n, "wall") for t in ("reconcile", "pyinfra")}
        return [
            (ctl["reconcile"] <= ctl["pyinfra"], f"controller CPU per host ≤ pyinfra's: {ctl['reconcile']:.0f} ms "
                                                 f"against {ctl['pyinfra']:.0f} ms"),
            (there["reconcile"] <= 1.5 * there["pyinfra"],
             f"CPU asked of each target ≤ 1.5× pyinfra's: {there['reconcile']:.0f} ms against "
             f"{there['pyinfra']:.0f} ms ({there['reconcile'] / there['pyinfra']:.1f}×)"),
            (wall["reconcile"] < wall["pyinfra"], f"{n} hosts: wall time ahead of pyinfra's: {wall['reconcile']:.2f} s "
                                                  f"against {wall['pyinfra']:.2f} s"),
        ]


def peak_cell(rs: list[dict]) -> str:
    peaks = [r["peak_mib"] for r in rs if r["peak_mib"] is not None]
    return f"{median(peaks):.0f}" if peaks else "n/a"
