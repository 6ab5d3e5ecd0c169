#!/usr/bin/env python3
"""What the integrity check of extraction samples costs (not run in CI).

1. Per MB: the structural check, the content check (every entry's CRC-32; a .gz decompressed
   whole) and, for comparison, `cat FILE > /dev/null` and a bare read loop, on one sample of
   --mib MiB (a torch.save-layout ZIP written by tests/fake_extract.py's writer; its tensor
   bytes look like bf16 hidden states to gzip: random mantissas, a few exponents) and its .gz
   (gzip level 6, as SpecForge's --compress). Medians of --runs, warm page
   cache: this is the CPU cost of checking, not the disk's speed.
2. The share of files the `recent` rule reads whole: a tree of --files samples written at
   --rate samples/s up to now (the story's 37,312 at ~20/s), observed cold (no record), warm
   in the same boot after the job wrote --more files, and after a reboot (another boot id).

    python bench/bench_integrity.py [--mib 64] [--runs 5] [--files 37312] [--rate 20] [--dir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fake_extract import ckpt_bytes, torch_pickle  # noqa: E402
from reconcile_host.common.filechecks.integrity import CONTENT, STRUCTURE, check_path  # noqa: E402

from common import median_time as median  # noqa: E402


def bf16_like(n: int) -> bytes:
    """n bytes that compress like bf16 values of a normal distribution: a random low byte, a
    high byte (sign and exponent) from a handful of values."""
    out = bytearray(n)
    out[0::2] = os.urandom(len(out[0::2]))
    out[1::2] = os.urandom(len(out[1::2])).translate(bytes(b"\x3b\x3c\x3d\x3e\x3f\x40\xbb\xbc\xbd\xbe\xbf\xc0"
                                                         [i % 12] for i in range(256)))
    return bytes(out)


def big_sample(path: Path, mib: int) -> None:
    numel = mib * 2**20
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("data_0/data.pkl", torch_pickle(0, numel))
        zf.writestr("data_0/data/0", bf16_like(numel))
        zf.writestr("data_0/version", "3\n")
    path.write_bytes(buf.getvalue())


def read_all(path: Path) -> None:
    buf = bytearray(2**20)
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(buf):
            pass


def per_mb(base: Path, mib: int, runs: int) -> None:
    ckpt = base / "data_0.ckpt"
    big_sample(ckpt, mib)
    gz = base / "data_0.ckpt.gz"
    gz.write_bytes(gzip.compress(ckpt.read_bytes(), compresslevel=6))
    mb = ckpt.stat().st_size / 1e6
    rows = [
        ("cat FILE > /dev/null", median(lambda: subprocess.run(["cat", str(ckpt)], stdout=subprocess.DEVNULL,
                                                                 check=True), runs)),
        ("read loop (1 MiB readinto)", median(lambda: read_all(ckpt), runs)),
        ("structural check", median(lambda: check_path(str(ckpt), STRUCTURE), runs)),
        ("content check (CRC-32 of every entry)", median(lambda: check_path(str(ckpt), CONTENT), runs)),
        (".gz content check (decompress + inner CRCs)", median(lambda: check_path(str(gz), CONTENT), runs)),
    ]
    assert check_path(str(ckpt), CONTENT).whole and check_path(str(gz), CONTENT).whole
    print(f"\n{mb:.1f} MB sample ({gz.stat().st_size / 1e6:.1f} MB as .gz), medians of {runs}:")
    print(f"{'':46} {'ms':>8} {'ms/MB':>8} {'MB/s':>8}")
    for name, t in rows:
        print(f"{name:46} {t * 1e3:8.2f} {t * 1e3 / mb:8.3f} {mb / t:8.0f}")
    crc = rows[3][1] - rows[2][1]
    print(f"CRC-32 check: {crc * 1e3 / mb:.3f} ms per MB ({mb / crc:.0f} MB/s); "
          f"content check at {rows[0][1] / rows[3][1]:.2f}x the speed of cat")


def tree(root: Path, n: int, rate: float, start: int = 0, end_at: float | None = None) -> None:
    end_at = end_at or time.time()
    for i in range(start, n):
        g = i // 2000 * 2000
        d = root / f"rows_{g}-{g + 2000}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"data_{i}.ckpt"
        p.write_bytes(ckpt_bytes(f"data_{i}", i, 256))
        t = end_at - (n - 1 - i) / rate
        os.utime(p, (t, t))


def share(base: Path, n: int, rate: float, more: int) -> None:
    from reconcile_host.local.host import LocalHost
    from reconcile_host.reconcilers.extractions import ExtractionsReconciler

    root = base / "hs"
    boot = base / "boot_id"
    boot.write_text("boot-1\n")
    os.environ.update(RECONCILE_STATE_DIR=str(base / "state"), RECONCILE_BOOT_ID_FILE=str(boot))
    tree(root, n, rate)
    for d in root.iterdir():
        os.utime(d, (time.time() - 10, time.time() - 10))
    rec = ExtractionsReconciler()
    (r,) = rec.resources({"x": {"dir": str(root), "total": n + more, "job": {"command": ["true"]}}})

    def run(label: str) -> None:
        obs = rec.observe(LocalHost(), [r])[r.id]
        print(f"{label:52} {obs.files:>7,} {obs.checked:>8,} {obs.content_checked:>8,} "
              f"{100 * obs.content_checked / obs.files:6.1f}%")

    print(f"\n`verify: at-risk` on {n:,} files written at {rate:g}/s (window: {300 * rate:,.0f} files):")
    print(f"{'':52} {'files':>7} {'checked':>8} {'read all':>8} {'share':>7}")
    run("first check (no record)")
    run("again, same boot, nothing new")
    tree(root, n + more, rate, start=n, end_at=time.time() + more / rate)
    run(f"same boot, the job wrote {more} more")
    boot.write_text("boot-2\n")
    run("after a reboot")
    run("again after the reboot")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--files", type=int, default=37312)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--more", type=int, default=100)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-integrity-", dir=a.dir))
    try:
        per_mb(base, a.mib, a.runs)
        share(base, a.files, a.rate, a.more)
    finally:
        shutil.rmtree(base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
