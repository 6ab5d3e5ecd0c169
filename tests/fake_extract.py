#!/usr/bin/env python3
"""A small but real extraction job in SpecForge's layout, without torch.

Writes `{out}/rows_{g}-{g+G}/data_{idx}.ckpt` (G = --group-size) as torch.save does: a
ZIP archive (entries `<stem>/data.pkl`, `<stem>/data/0`, `<stem>/version`) written
straight to its final path, no temp file. The pickle is torch's own form (protocol 2, a
`torch._utils._rebuild_tensor_v2` of a ByteStorage named by a persistent id), assembled here
by hand so that no torch is needed: torch.load(weights_only=True) loads it as
{"index": idx, "hidden_state": uint8 tensor} (tests/test_extractions_torch.py checks that).
With --torch (run by a Python that has torch) each sample is SpecForge's own dict written by
the real torch.save (tests/torch_samples.py `record`). Like `prepare_hidden_states.py` on
resume, it skips every index whose file exists without looking inside, and never writes the
indices given by --nan (samples with NaN). Paced at --rate samples/s.

--pause-at IDX with --pause-flag FILE: if FILE exists when IDX is due, remove FILE, write
the first half of that sample's file, print "paused at IDX" and hang, so a test can
SIGKILL the job while that file is incomplete (the next run does not pause: FILE is gone).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import struct
import sys
import time
import zipfile


def payload(idx: int, size: int) -> bytes:
    return bytes((idx + i) % 251 for i in range(size))


def torch_pickle(idx: int, numel: int) -> bytes:
    """{"index": idx, "hidden_state": a uint8 tensor of numel elements on storage "0"}, in the
    opcodes torch.save (pickle protocol 2) writes."""
    def text(s: str) -> bytes:
        return b"X" + struct.pack("<I", len(s)) + s.encode()

    def integer(n: int) -> bytes:
        return b"J" + struct.pack("<i", n)

    return b"".join([
        b"\x80\x02}(", text("index"), integer(idx), text("hidden_state"),
        b"ctorch._utils\n_rebuild_tensor_v2\n(",
        b"(", text("storage"), b"ctorch\nByteStorage\n", text("0"), text("cpu"), integer(numel), b"tQ",
        integer(0), integer(numel), b"\x85", integer(1), b"\x85", b"\x89",
        b"ccollections\nOrderedDict\n)R", b"tR", b"u.",
    ])


def ckpt_bytes(stem: str, idx: int, size: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{stem}/data.pkl", torch_pickle(idx, size))
        zf.writestr(f"{stem}/data/0", payload(idx, size))
        zf.writestr(f"{stem}/version", "3\n")
    return buf.getvalue()


def safetensors_bytes(idx: int, size: int) -> bytes:
    header = json.dumps({"__metadata__": {"index": str(idx)},
                         "hidden_state": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + payload(idx, size)


def torch_bytes(idx: int, fmt: str) -> bytes:
    """SpecForge's sample (63 tokens, hidden size 256, bf16) as the real torch.save writes it."""
    import torch
    from torch_samples import record

    buf = io.BytesIO()
    rec = record(63, 256, "bf16", idx)
    if fmt == "ckpt.gz":
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6) as f:
            torch.save(rec, f)
    else:
        torch.save(rec, buf)
    return buf.getvalue()


def sample_path(out: str, idx: int, group: int, fmt: str) -> str:
    g = idx // group * group
    ext = {"ckpt": ".ckpt", "ckpt.gz": ".ckpt.gz", "safetensors": ".safetensors"}[fmt]
    return os.path.join(out, f"rows_{g}-{g + group}", f"data_{idx}{ext}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--total", type=int, required=True)
    ap.add_argument("--rate", type=float, default=20.0, help="samples per second")
    ap.add_argument("--group-size", type=int, default=2000)
    ap.add_argument("--format", choices=["ckpt", "ckpt.gz", "safetensors"], default="ckpt")
    ap.add_argument("--size", type=int, default=4096, help="bytes of tensor data per sample")
    ap.add_argument("--nan", default="", help="comma-separated indices never written")
    ap.add_argument("--torch", action="store_true", help="write SpecForge samples with the real torch.save")
    ap.add_argument("--pause-at", type=int)
    ap.add_argument("--pause-flag")
    a = ap.parse_args()
    nan = {int(x) for x in a.nan.split(",") if x}
    start = time.monotonic()
    written = 0
    for idx in range(a.total):
        path = sample_path(a.out, idx, a.group_size, a.format)
        if idx in nan or os.path.exists(path):
            continue
        if a.torch:
            data = torch_bytes(idx, a.format)
        elif a.format == "safetensors":
            data = safetensors_bytes(idx, a.size)
        else:
            data = ckpt_bytes(f"data_{idx}", idx, a.size)
            if a.format == "ckpt.gz":
                data = gzip.compress(data)
        # Pace: the n-th written sample is due at start + n / rate.
        delay = start + written / a.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if idx == a.pause_at and a.pause_flag and os.path.exists(a.pause_flag):
            os.unlink(a.pause_flag)
            with open(path, "wb") as fh:
                fh.write(data[: len(data) // 2])
                fh.flush()
                os.fsync(fh.fileno())
            print(f"paused at {idx} writing {path}", flush=True)
            while True:
                time.sleep(3600)
        with open(path, "wb") as fh:
            fh.write(data)
        written += 1
        print(f"wrote {idx}", flush=True)
    print(f"finished: wrote {written}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
