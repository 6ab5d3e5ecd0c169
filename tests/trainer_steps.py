"""Writes Hugging Face Trainer checkpoints of a given size with the real torch and safetensors
(run under the torch interpreter, tests/torch_support.py): what `Trainer._save_checkpoint` leaves
in `checkpoint-N/` — the weights by `safetensors.torch.save_file` (one `model.safetensors`, or
shards and `model.safetensors.index.json` as `save_pretrained` shards them), `optimizer.pt`,
`scheduler.pt` and `rng_state.pth` by `torch.save`, `trainer_state.json` — random data, nothing
sparse. Used by tests/test_checkpoints_records.py and bench/bench_checkpoints.py.

    python trainer_steps.py RUN_DIR MODEL_BYTES OPTIMIZER_BYTES SHARDS STEP [STEP...]
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

CHUNK = 1 << 26  # elements per tensor: the shards hold several, as a model's layers


def tensors(nbytes: int, prefix: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    out, left, k = {}, nbytes // 4, 0
    while left > 0:
        n = min(CHUNK, left)
        out[f"{prefix}.{k}.weight"] = torch.randn(n, generator=gen)
        left, k = left - n, k + 1
    return out


def write_step(run: str, step: int, model_bytes: int, optim_bytes: int, shards: int) -> None:
    gen = torch.Generator().manual_seed(step)
    d = os.path.join(run, f"checkpoint-{step}")
    os.makedirs(d)
    if shards == 1:
        save_file(tensors(model_bytes, "model", gen), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map, total = {}, 0
        for k in range(1, shards + 1):
            name = f"model-{k:05d}-of-{shards:05d}.safetensors"
            part = tensors(model_bytes // shards, f"layers.{k}", gen)
            save_file(part, os.path.join(d, name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, name))
            total += sum(t.numel() * 4 for t in part.values())
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    half = tensors(optim_bytes // 2, "exp_avg", gen)
    state = {i: {"step": torch.tensor(float(step)), "exp_avg": t, "exp_avg_sq": torch.rand_like(t)}
             for i, t in enumerate(half.values())}
    torch.save({"state": state, "param_groups": [{"lr": 1e-4, "params": list(state)}]}, os.path.join(d, "optimizer.pt"))
    torch.save({"last_epoch": step, "_step_count": step + 1}, os.path.join(d, "scheduler.pt"))
    torch.save({"cpu": torch.get_rng_state()}, os.path.join(d, "rng_state.pth"))
    with open(os.path.join(d, "trainer_state.json"), "w") as fh:
        json.dump({"global_step": step, "log_history": []}, fh)


def main() -> None:
    run, model_bytes, optim_bytes, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    for step in map(int, sys.argv[5:]):
        write_step(run, step, model_bytes, optim_bytes, shards)


if __name__ == "__main__":
    main()
