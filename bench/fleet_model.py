"""The fleet's wall time projected from one host's latency, and the report of bench/fleet_net.py.

The model, per tool and round-trip time (RTT):

    W(N, P) = F + max(ceil(N / P) * h,  N * c / K)

- c: the controller's CPU per host: (CPU of the N-host run - CPU of the one-host run) / (N - 1),
  both at 0.2 ms (what each extra host adds: its ssh client, its thread or fork, its report);
- F: the run's fixed part: the one-host run's controller CPU less c (the interpreter, the imports,
  reading the inventory and the state, the summary; it runs on the controller alone, at its
  start and end);
- h: one host's own latency: the one-host run's wall at that RTT less F. Waves of P hosts run at
  once, each as long as one host: the fan-out waits on the network and the targets, not on each
  other (every tool here keeps P sessions open at once: reconcile's thread per host, pyinfra's
  greenlets, Ansible's forks);
- K: the controller's cores: past N * c / K the controller itself is the bottleneck.
Targets are other machines in a real fleet: their CPU is in h, not in the controller's sum.
Checked against the N-host run here, where the targets share this machine's cores and other
work shares them too: the check adds the targets' CPU per host t to c, and takes for K the
CPUs the run actually got (its processes' CPU time / its wall time).
"""

from __future__ import annotations

import math

from common import median

TOOLS = (("reconcile", "reconcile diff --inventory (curve25519)"),
         ("reconcile, warm", "reconcile, ControlPersist connection kept"),
         ("reconcile, sntrup761", "reconcile, OpenSSH's default key exchange"),
         ("pyinfra", "pyinfra --dry"), ("ansible", "ansible-playbook --check --diff"))
START = {"reconcile": "reconcile", "reconcile, warm": "reconcile", "reconcile, sntrup761": "reconcile",
         "pyinfra": "pyinfra", "ansible": "ansible"}


def one_host(res: dict) -> dict:
    """tool -> rtt -> {wall, cpu, target_cpu, eff}: the one-host runs' medians."""
    out: dict = {}
    for row in res["rows"]:
        if row["hosts"] != 1:
            continue
        for tool, t in row["tools"].items():
            rs = t["runs"]
            if rs:
                out.setdefault(tool, {})[row["rtt_ms"]] = {
                    "wall": median([r["wall"] for r in rs]), "cpu": median([r["cpu"] for r in rs]),
                    "target_cpu": median([r["target_cpu"] for r in rs]), "eff": row["rtt_effective_ms"],
                    "problems": sum(len(r["problems"]) for r in rs)}
    return out


def big_run(res: dict) -> dict | None:
    return next((r for r in res["rows"] if r["hosts"] > 1), None)


def per_host_cpu(res: dict, tool: str) -> float | None:
    """c: the controller's CPU per extra host, from the one-host and the N-host runs at that RTT."""
    b = big_run(res)
    if b is None or not (b["tools"].get(tool, {}).get("runs")):
        return None
    one = one_host(res)[tool].get(b["rtt_ms"])
    if one is None:
        return None
    big = median([r["cpu"] for r in b["tools"][tool]["runs"]])
    return max(0.0, (big - one["cpu"]) / (b["hosts"] - 1))


def params(res: dict, tool: str, rtt: float) -> tuple[float, float, float, float]:
    """(F, h, c, t) of the model for this tool at this RTT, seconds."""
    m = one_host(res)[tool][rtt]
    c = per_host_cpu(res, tool)
    if c is None:  # no many-host run: the start-up alone is the fixed part
        f = res["startups"].get(START[tool], {"cpu": 0.0})["cpu"]
        c = max(0.0, m["cpu"] - f)
    f = max(0.0, m["cpu"] - c)
    return f, max(0.0, m["wall"] - f), c, m["target_cpu"]


def project(s: float, h: float, c: float, n: int, p: int, k: int, t: float = 0.0) -> float:
    return s + max(math.ceil(n / p) * h, n * (c + t) / k)


def report(meta: dict, res: dict) -> str:
    k = res["cpus"]
    m = one_host(res)
    rtts = sorted({r["rtt_ms"] for r in res["rows"] if r["hosts"] == 1})
    eff = {r["rtt_ms"]: r["rtt_effective_ms"] for r in res["rows"] if r["hosts"] == 1}
    loads = [r["load"][0] for r in res["rows"]]
    lines = [
        "# The fleet over a network (bench/fleet_net.py)", "",
        f"{k} CPUs · load average {meta['load_start'][0]:.1f} at the start, {min(loads):.1f}–{max(loads):.1f} "
        f"between the steps, {meta['load_end'][0]:.1f} at the end · peers: "
        + ", ".join(f"{a} {b}" for a, b in meta.get("peers", {}).items())
        + f" · `bench/run.py {' '.join(meta['argv'])}` · {meta['seconds'] / 60:.0f} min", "",
        "## One host at a time", "",
        "Each tool's run on a one-host inventory (the incident's audit on the host: vLLM unit, "
        + ("8 fake GPUs, " if res["gpus"] else "") + f"`/data` tmpfs, {res['files']:,} samples), from the "
        "controller's network namespace to the target's over a veth pair and the delay relay "
        "(RTT asked; in brackets the RTT a one-byte ping-pong through it took, "
        + ("at real-time priority: the network's own" if res.get("probe") == "fifo" else
           "from a process of normal priority: on a loaded machine its wake-ups add to the network's")
        + "). Every process measured at nice -19 (fleet_net.py). Medians of the runs after a warm-up; every run "
        "but the ControlPersist row starts without a connection. Start-up (`TOOL --version`): "
        + ", ".join(f"{t} {v['wall']:.3f} s wall / {v['cpu']:.3f} s CPU" for t, v in res["startups"].items())
        + ".", "",
        "| tool | " + " | ".join(f"{r:g} ms ({eff[r]:.2f}): wall s / controller CPU s / target CPU s" for r in rtts)
        + " | round trips a host (wall slope) |",
        "|---|" + "---:|" * (len(rtts) + 1),
    ]
    for tool, label in TOOLS:
        if tool not in m:
            continue
        cells = [f"{m[tool][r]['wall']:.3f} / {m[tool][r]['cpu']:.3f} / {m[tool][r]['target_cpu']:.3f}"
                 + (" ⚠" if m[tool][r]["problems"] else "") if r in m[tool] else "–" for r in rtts]
        lo, hi = rtts[0], rtts[-1]
        trips = ((m[tool][hi]["wall"] - m[tool][lo]["wall"]) / ((hi - lo) / 1000)
                 if lo in m[tool] and hi in m[tool] else float("nan"))
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {trips:.1f} |")
    lines += ["", "## Projected: N hosts at --parallel P", "",
              f"W(N, P) = F + max(ceil(N/P) · h, N · c / K), K = {k} controller cores (bench/fleet_model.py: F "
              "the run's fixed part, h one host's latency, c the controller's CPU per host). Seconds:", "",
              "| tool | RTT ms | F s | h s | c ms | 100, P 10 | 100, P 50 | 1,000, P 10 | 1,000, P 50 |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for tool, label in TOOLS:
        if tool not in m:
            continue
        for r in rtts:
            if r not in m[tool]:
                continue
            s, h, c, _t = params(res, tool, r)
            cells = [project(s, h, c, n, p, k) for n in (100, 1000) for p in (10, 50)]
            lines.append(f"| {label} | {r:g} | {s:.2f} | {h:.3f} | {c * 1000:.0f} | "
                         + " | ".join(f"{x:,.1f}" for x in cells) + " |")
    b = big_run(res)
    if b:
        n, p = b["hosts"], res["parallel"]
        lines += ["", f"## The check: {n} hosts measured at {b['rtt_ms']:g} ms, --parallel {p}", "",
                  f"All {n} targets on this machine's {k} cores, beside other work (load {b['load'][0]:.1f} after; "
                  f"{b.get('priority', '')}): the model with the targets' CPU per host added to the controller's, "
                  "N · (c + t) / K', K' the CPUs the run got (its CPU time ÷ its wall), against the measured wall.", "",
                  "| tool | measured wall s | controller + targets' CPU s | K' | projected s | projected ÷ measured |",
                  "|---|---:|---:|---:|---:|---:|"]
        for tool, label in TOOLS:
            rs = b["tools"].get(tool, {}).get("runs") or []
            if not rs or tool not in m or b["rtt_ms"] not in m[tool]:
                continue
            w = median([r["wall"] for r in rs])
            cpu = median([r["cpu"] + r["target_cpu"] for r in rs])
            kk = cpu / w
            s, h, c, t = params(res, tool, b["rtt_ms"])
            pr = project(s, h, c, n, p, kk, t)
            bad = sum(len(r["problems"]) for r in rs)
            lines.append(f"| {label} | {w:.2f}{' ⚠' if bad else ''} | {cpu:.2f} | {kk:.2f} | {pr:.2f} | "
                         f"{pr / w:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import json
    import sys

    data = json.load(open(sys.argv[1]))  # noqa: SIM115 (bench/results/netfleet.json)
    print(report(data["meta"], data["results"]))
