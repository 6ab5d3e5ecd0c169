#!/usr/bin/env python3
"""Run by a Python with torch (tests/torch_support.py's): write N samples with the real
torch.save, in SpecForge's layout (rows_{g}-{g+2000}/data_{i}.ckpt), for bench/bench_firstcheck.py.

`specforge`: SpecForge's own sample (tests/torch_samples.py `record`, from
scripts/prepare_hidden_states.py @ a6b6b02: input_ids, loss_mask, aux_hidden_state [1, T, 3H],
hidden_state [1, T, H], bf16), with T = 15..19 tokens (every file has its own sizes, offsets
and CRCs) and H = 32: about 6.8 KB and 10 ZIP entries (4 storages, data.pkl, 5 records).
`wide`: a dict of 10 small tensors (target, attention_mask, position_ids, ... besides those):
about 6.8 KB too, 16 ZIP entries. Written into DIR.tmp, renamed to DIR when complete, so an
interrupted run is never reused.

    torch_tree.py DIR N [specforge|wide]
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from torch_samples import record  # noqa: E402


def wide(i: int, g: torch.Generator) -> dict:
    t, h = 8 + i % 5, 32
    return {
        "input_ids": torch.randint(0, 151_000, (t,), generator=g),
        "loss_mask": torch.cat([torch.zeros(t // 3, dtype=torch.long), torch.ones(t - t // 3, dtype=torch.long)]),
        "hidden_state": torch.randn(1, t, h, generator=g).to(torch.bfloat16),
        "target": torch.randn(1, t, h, generator=g).to(torch.bfloat16),
        "aux_hidden_states": torch.randn(1, t, 3 * h, generator=g).to(torch.bfloat16),
        "attention_mask": torch.ones(t, dtype=torch.bool),
        "position_ids": torch.arange(t),
        "seq_len": torch.tensor(t),
        "index": torch.tensor(i),
        "weight": torch.tensor(1.0),
    }


def main() -> int:
    dest, n = sys.argv[1], int(sys.argv[2])
    kind = sys.argv[3] if len(sys.argv) > 3 else "specforge"
    tmp = dest + ".tmp"
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        d = os.path.join(tmp, f"rows_{i // 2000 * 2000}-{i // 2000 * 2000 + 2000}")
        if i % 2000 == 0:
            os.makedirs(d, exist_ok=True)
        sample = wide(i, g) if kind == "wide" else record(15 + i % 5, 32, "bf16", i)
        torch.save(sample, os.path.join(d, f"data_{i}.ckpt"))
    os.rename(tmp, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
