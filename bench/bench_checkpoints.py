#!/usr/bin/env python3
"""`reconcile diff` on training run directories, beside the floor.

1. A Hugging Face Trainer run of 100 checkpoints (checkpoint-N: model.safetensors of 1 MiB,
   optimizer.pt, scheduler.pt, rng_state.pth as small torch.save-layout ZIPs, trainer_state.json),
   with `verify: structure` and with the default `verify: at-risk` (every byte of the pick too).
2. One checkpoint of a sharded model: 8 safetensors shards of 4 GiB each, sparse but for their last
   64 KiB (the structural check reads the header, the size and the tail, where zeros would be a
   crash's; the content check would read 32 GiB of zeros, so `verify: structure` only), with its
   model.safetensors.index.json.
3. Real size (`--real-gb N`, 0 to leave it out): a Trainer run directory of 3
   checkpoints of N GB each written by the real torch and safetensors (tests/trainer_steps.py
   under .venv-torch: the weights in 2 safetensors shards + index, an optimizer.pt of twice their
   size, random data, nothing sparse). Measured with the kernel's I/O accounting of the whole
   process tree (tests/io_support.py: `rchar`, bytes read(2) returned; `read_bytes`, bytes from
   the disk), its CPU and wall time: a cold `diff` (page cache dropped: `sync; echo 3 >
   /proc/sys/vm/drop_caches` and posix_fadvise(DONTNEED) on every file; no check record), the
   second `diff` (the record made by the first), `diff --recheck` (every pass before records),
   and three passes of `reconcile watch`; each beside its floor, `cat` of the pick's files, cold
   or warm as the run it stands beside, interleaved in the same run.

Cold: a new process, no validation cache and no check record; warm: the validation cache and
the check records made by the run before (the page cache is warm in both: dropping it would
disturb the machine's other users; the real-size case drops it).
The floor: the same directory listed and, per file the check opens, an open, the header and the
last page read, a close, and the index and trainer_state.json parsed, in one Python process
(no interpreter start-up counted in it: that start-up is printed apart).

    python bench/bench_checkpoints.py [--runs 5] [--dir DIR] [--real-gb 1] [--only-real]

Results are printed as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, clean_env, log, median

sys.path.insert(0, str(ROOT / "tests"))
from fake_extract import ckpt_bytes  # noqa: E402
from io_support import run_counted  # noqa: E402

PAGE = 4096


def _safetensors(path: Path, nbytes: int, sparse: bool) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        if sparse:  # a hole but for the last 64 KiB: the structure check judges a zeroed tail as a crash's
            fh.truncate(8 + len(header) + nbytes - (64 << 10))
            fh.seek(0, os.SEEK_END)
            fh.write(os.urandom(64 << 10))
        else:
            fh.write(os.urandom(nbytes))


def make_hf_run(root: Path, n: int) -> None:
    for i in range(1, n + 1):
        step = i * 100
        d = root / f"checkpoint-{step}"
        d.mkdir(parents=True)
        _safetensors(d / "model.safetensors", 1 << 20, sparse=False)
        for name, size in (("optimizer.pt", 4096), ("scheduler.pt", 16), ("rng_state.pth", 64)):
            (d / name).write_bytes(ckpt_bytes(name.split(".")[0], i, size))
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))


def make_sharded(root: Path, shards: int = 8, size: int = 4 << 30) -> None:
    d = root / "checkpoint-1000"
    d.mkdir(parents=True)
    names = [f"model-{k:05d}-of-{shards:05d}.safetensors" for k in range(1, shards + 1)]
    for name in names:
        _safetensors(d / name, size, sparse=True)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": shards * size}, "weight_map": {f"layer{k}.w": n for k, n in enumerate(names)}}))
    for name, nbytes in (("optimizer.pt", 4096), ("scheduler.pt", 16), ("rng_state.pth", 64)):
        (d / name).write_bytes(ckpt_bytes(name.split(".")[0], 0, nbytes))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 1000}))


def floor(root: Path) -> float:
    """One pass of the floor's reads; seconds."""
    t = time.perf_counter()
    for n in os.listdir(root):
        d = root / n
        if not n.startswith("checkpoint-"):
            continue
        files = os.listdir(d)
        for f in files:
            p = d / f
            if f.endswith(".json"):
                json.loads(p.read_bytes())
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                os.pread(fd, PAGE, 0)
                os.pread(fd, PAGE, max(0, size - PAGE))
            finally:
                os.close(fd)
    return time.perf_counter() - t


def reconcile_argv() -> list[str]:
    exe = ROOT / ".venv" / "bin" / "reconcile"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "reconcile_host"]


def run_diff(state: Path, cache: Path) -> float:
    # The validation cache and the check records both in `cache`: a new one is neither.
    env = {**clean_env(), "RECONCILE_CACHE_DIR": str(cache), "RECONCILE_STATE_DIR": str(cache / "state")}
    t = time.perf_counter()
    proc = subprocess.run(reconcile_argv() + ["diff", str(state)], capture_output=True, text=True, env=env)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"diff exited {proc.returncode}: {proc.stdout[-400:]}{proc.stderr[-400:]}")
    return took


def bench(label: str, root: Path, verify: str, runs: int, tmp: Path) -> str:
    state = tmp / f"state-{label}-{verify}.yaml"
    state.write_text(f"version: 1\ncheckpoints:\n  run:\n    dir: {root}\n    layout: hf-trainer\n"
                     f"    verify: {verify}\n")
    cold, warm = [], []
    for r in range(runs):
        cache = tmp / f"cache-{label}-{verify}-{r}"
        cold.append(run_diff(state, cache))
        warm.append(run_diff(state, cache))
        shutil.rmtree(cache, ignore_errors=True)
    fl = median([floor(root) for _ in range(runs)])
    return (f"| {label} | {verify} | {median(cold) * 1000:.0f} ms | {median(warm) * 1000:.0f} ms | "
            f"{fl * 1000:.1f} ms |")


def survey_in_process(root: Path, verify: str, runs: int, tmp: Path) -> str:
    """The survey alone, in this process: without a check record, then with the one it made."""
    from reconcile_host.reconcilers.checkpoints.survey import survey

    os.environ["RECONCILE_STATE_DIR"] = str(tmp / "inproc-state")
    spec = {"dir": str(root), "layout": "hf-trainer", "verify": verify}
    cold, warm = [], []
    for _ in range(runs):
        shutil.rmtree(tmp / "inproc-state", ignore_errors=True)
        t = time.perf_counter()
        survey(spec)
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        survey(spec)
        warm.append(time.perf_counter() - t)
    return (f"survey in-process, {verify}: {median(cold) * 1000:.1f} ms without a record, "
            f"{median(warm) * 1000:.1f} ms with it")


def startup(runs: int) -> float:
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        ts.append(time.perf_counter() - t)
    return median(ts)


# --- real size -------------------------------------------------------------------

def write_real_run(run: Path, gb: float) -> None:
    python = ROOT / ".venv-torch" / "bin" / "python"
    if not python.exists():
        raise SystemExit("the real-size case needs .venv-torch (torch and safetensors): see tests/torch_support.py")
    each = int(gb * 1e9)
    model, optim = each // 3, each - each // 3
    subprocess.run([str(python), str(ROOT / "tests" / "trainer_steps.py"), str(run), str(model), str(optim), "2",
                    "1000", "2000", "3000"], check=True)


def drop_caches(paths: list[Path]) -> str:
    """The page cache emptied of these files: the kernel's whole cache dropped where we may (root),
    and posix_fadvise(DONTNEED) on each file (which a clean page leaves at once) in any case."""
    os.sync()
    how = "posix_fadvise(DONTNEED)"
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        how = "drop_caches + " + how
    except OSError:
        pass
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return how


def settle(run: Path) -> None:
    """Past the check records' racy window (records.RACY_NS, 2 s): a step changed within it is
    checked but not recorded."""
    newest = max(max(p.stat().st_mtime_ns, p.stat().st_ctime_ns) for p in run.rglob("*"))
    wait = (newest + 2 * 10**9 - time.time_ns()) / 1e9 + 0.1
    if wait > 0:
        time.sleep(wait)


def _proc_io(pid: int) -> tuple[int, int, float]:
    """(rchar, read_bytes, CPU s) of a live process, its reaped children included."""
    with open(f"/proc/{pid}/io") as fh:
        io = {k: int(v) for k, v in (line.split(": ") for line in fh.read().splitlines())}
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return io["rchar"], io["read_bytes"], ticks / os.sysconf("SC_CLK_TCK")


def watch_passes(state: Path, env: dict[str, str], tmp: Path, passes: int) -> list[tuple[int, int, float]]:
    """(rchar, read_bytes, CPU s) of each of `passes` passes of `reconcile watch -v`, read
    from its /proc/PID/io (its observer children reaped by it are counted there) between the
    lines it logs at the end of each pass; the first pass (the start-up's imports) is left out."""
    argv = reconcile_argv() + ["watch", "-v", "--interval", "3s", "--journal", str(tmp / "journal.jsonl"), str(state)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out = []
    try:
        last = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if not re.search(r"\bpass \d+: ", line):
                continue
            now = _proc_io(proc.pid)
            if last is not None:
                out.append((now[0] - last[0], now[1] - last[1], now[2] - last[2]))
            last = now
            if len(out) >= passes:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return out


def real_size(tmp: Path, gb: float, cold_runs: int = 3) -> str:
    run = tmp / "real"
    log(f"writing 3 Trainer checkpoints of {gb:g} GB each with torch and safetensors")
    write_real_run(run, gb)
    pick = run / "checkpoint-3000"
    files = sorted(p for p in run.rglob("*") if p.is_file())
    pick_files = sorted(p for p in pick.iterdir() if p.is_file())
    pick_size = sum(p.stat().st_size for p in pick_files)
    total = sum(p.stat().st_size for p in files)
    state = tmp / "state-real.yaml"
    state.write_text(f"version: 1\ncheckpoints:\n  run:\n    dir: {run}\n    layout: hf-trainer\n")
    env = {**clean_env(), "RECONCILE_CACHE_DIR": str(tmp / "cache-real"), "RECONCILE_STATE_DIR": str(tmp / "st")}
    settle(run)

    def counted(argv: list[str]):
        got = run_counted(argv, env, str(tmp), str(tmp / "io.json"), timeout=3600)
        if got.returncode not in (0, 2):
            raise SystemExit(f"{argv} exited {got.returncode}: {got.stdout[-400:]}{got.stderr[-400:]}")
        return got

    cat = ["sh", "-c", 'cat "$@" > /dev/null', "cat", *map(str, pick_files)]
    diff = reconcile_argv() + ["diff", str(state)]
    rows = []

    def row(what: str, got, floor) -> None:
        rows.append(f"| {what} | {got.rchar / 1e6:,.1f} MB | {got.read_bytes / 1e6:,.1f} MB | {got.wall_s:.2f} s | "
                    f"{got.cpu_s:.2f} s | {floor.wall_s:.2f} s ({floor.rchar / 1e6:,.0f} MB) | "
                    f"{got.wall_s / floor.wall_s:.2f}x |")

    empty = tmp / "real-empty"
    empty.mkdir()
    fixed_state = tmp / "state-real-empty.yaml"
    fixed_state.write_text(f"version: 1\ncheckpoints:\n  run:\n    dir: {empty}\n    layout: hf-trainer\n")
    fixed_diff = reconcile_argv() + ["diff", str(fixed_state)]
    counted(fixed_diff)  # (its validation cache, as the run dir's state file gets from its first run)
    counted(diff + ["--recheck"])
    # Cold, interleaved, `cold_runs` times (medians): the floor, reconcile's fixed cost (the
    # interpreter and its modules read from the disk too), and a diff with no record.
    interpreter = [p for p in (ROOT / ".venv").rglob("*") if p.is_file() and p.suffix in (".pyc", ".so")]
    interpreter += [p for p in Path(sys.base_prefix, "lib").rglob("*.pyc") if p.is_file()]
    floors, fixeds, colds = [], [], []
    how = ""
    for _ in range(cold_runs):
        how = drop_caches(files + interpreter)
        floors.append(counted(cat))
        drop_caches(files + interpreter)
        fixeds.append(counted(fixed_diff))
        shutil.rmtree(tmp / "st", ignore_errors=True)  # no record
        drop_caches(files + interpreter)
        colds.append(counted(diff))

    def mid(xs):
        return sorted(xs, key=lambda g: g.wall_s)[len(xs) // 2]

    floor_cold = mid(floors)
    row(f"`diff` cold, no record (median of {cold_runs})", mid(colds), floor_cold)
    row("`diff` cold of an empty run directory (the fixed cost, cold)", mid(fixeds), floor_cold)
    floor_warm = counted(cat)
    second = counted(diff)
    row("`diff` again (the record)", second, floor_warm)
    floor_warm = counted(cat)
    recheck = counted(diff + ["--recheck"])
    row("`diff --recheck` (every pass before records)", recheck, floor_warm)
    fixed = counted(fixed_diff)
    rows.append(f"| `diff` of an empty run directory (the fixed cost) | {fixed.rchar / 1e6:,.1f} MB | "
                f"{fixed.read_bytes / 1e6:,.1f} MB | {fixed.wall_s:.2f} s | {fixed.cpu_s:.2f} s | | |")
    floor_warm = counted(cat)
    for k, (rchar, rbytes, cpu) in enumerate(watch_passes(state, env, tmp, 3), 1):
        rows.append(f"| `watch` pass {k + 1} | {rchar / 1e6:,.1f} MB | {rbytes / 1e6:,.1f} MB | "
                    f"(3 s interval) | {cpu:.2f} s | {floor_warm.wall_s:.2f} s ({floor_warm.rchar / 1e6:,.0f} MB) | |")
    with open("/proc/loadavg") as fh:
        load = " ".join(fh.read().split()[:3])
    head = [f"Real size: 3 checkpoints x {total / 3 / 1e9:.2f} GB ({total / 1e9:.2f} GB; the pick "
            f"{pick.name}: {pick_size / 1e9:.2f} GB in {len(pick_files)} files); cold = {how}; "
            f"{os.cpu_count()} CPUs, load average {load} at the end",
            "",
            "| run | read (rchar) | from disk | wall | CPU | floor: `cat` of the pick | ratio |",
            "|---|---|---|---|---|---|---|"]
    return "\n".join(head + rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to make the run directories (default: a temp dir)")
    ap.add_argument("--real-gb", type=float, default=1.0,
                    help="size of each of the 3 real checkpoints, in GB (0: leave the real-size case out)")
    ap.add_argument("--only-real", action="store_true", help="only the real-size case")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        if args.real_gb > 0:
            print(real_size(tmp, args.real_gb))
        if args.only_real:
            return
        log("making 100 checkpoints and an 8-shard sparse model")
        make_hf_run(tmp / "hf100", 100)
        make_sharded(tmp / "sharded")
        settle(tmp / "sharded")  # past the records' racy window: the first diff's checks are recorded
        rows = ["| run directory | verify | diff cold | diff warm | floor (reads in-process) |",
                "|---|---|---|---|---|"]
        rows.append(bench("100 checkpoints (1 MiB model each)", tmp / "hf100", "structure", args.runs, tmp))
        rows.append(bench("100 checkpoints (1 MiB model each)", tmp / "hf100", "at-risk", args.runs, tmp))
        rows.append(bench("8 shards x 4 GiB (sparse)", tmp / "sharded", "structure", args.runs, tmp))
        empty = tmp / "empty.yaml"
        empty.write_text("version: 1\n")
        base = median([run_diff(empty, tmp / "cache-empty") for _ in range(args.runs)])
        rows.append(f"| (a state declaring nothing: the fixed cost) | | | {base * 1000:.0f} ms | |")
        print("\n".join(rows))
        print(f"\nPython start-up (`{sys.executable} -c pass`): {startup(args.runs) * 1000:.0f} ms")
        for verify in ("structure", "at-risk"):
            print(survey_in_process(tmp / "hf100", verify, args.runs, tmp))
        with open("/proc/loadavg") as fh:
            print(f"load average at the end: {' '.join(fh.read().split()[:3])}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
