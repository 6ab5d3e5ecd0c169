#!/usr/bin/env python3
"""Run by the sample-writer interpreter (a Python with torch, and safetensors where it has it):
writes SpecForge samples with the real torch.save / safetensors, and judges damaged copies
with the real torch.load / safetensors.torch.load_file. Never imported by reconcile's tests.

    torch_samples.py write SPEC.json       # [{"path", "fmt", "t", "h", "dtype", "seed", "crc"}]
    torch_samples.py same SPEC.json        # exit 0 if each file loads as the sample it should be
    torch_samples.py judge PLAN.json OUT.json

The sample is SpecForge's (scripts/prepare_hidden_states.py @ a6b6b02, MIT):
{input_ids: int64[T], loss_mask: int64[T] (0 over the prompt), aux_hidden_state: [1, T, 3H],
hidden_state: [1, T, H]}, saved with `torch.save(d, path)` or inside
`gzip.open(path, "wb", compresslevel=6)`. The judge loads each damaged copy as SpecForge does
(`.ckpt`: torch.load(p, weights_only=False, mmap=True); `.gz`: gzip read whole, then
torch.load(BytesIO)), and also with weights_only=True and False without mmap: a file is whole
only if every one of them loads the original tensors.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import tempfile
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sample_damage import apply  # noqa: E402

warnings.filterwarnings("ignore")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HAS_MMAP = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 1)


def record(t: int, h: int, dtype: str, seed: int, layout: str = "specforge") -> dict:
    """SpecForge's sample, or (`layout`) a variant with tensors that are legitimately zero at the end
    of the file (safetensors orders tensors by dtype, largest first, then by name: BOOL and U8 last):
    "padded-bool" / "padded-u8": an attention mask padded with zeros to a fixed length; "tokens": a
    tokenised shard without hidden states (int64 ids padded with 0, a loss_mask ending in zeros);
    "positions": int32 position ids; "tail-mask": the loss_mask zero over the last turn too."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 151_000, (t,), dtype=torch.long, generator=g)
    loss_mask = torch.zeros(t, dtype=torch.long)
    loss_mask[t // 3:] = 1
    if layout in ("tail-mask", "tokens"):
        loss_mask[t - t // 4:] = 0
    if layout == "tokens":
        pad = t // 5
        input_ids[t - pad:] = 0
        attention = torch.ones(t, dtype=torch.long)
        attention[t - pad:] = 0
        return {"input_ids": input_ids, "loss_mask": loss_mask, "attention_mask": attention}
    dt = DTYPES[dtype]
    aux = torch.randn(1, t, 3 * h, generator=g).to(dt).clone()
    last = torch.randn(1, t, h, generator=g).to(dt).clone()
    out = {"input_ids": input_ids, "loss_mask": loss_mask, "aux_hidden_state": aux, "hidden_state": last}
    if layout in ("padded-bool", "padded-u8"):
        mask = torch.zeros(t + t // 2, dtype=torch.bool if layout == "padded-bool" else torch.uint8)
        mask[:t] = 1
        out["attention_mask"] = mask
    if layout == "positions":
        out["position_ids"] = torch.arange(t, dtype=torch.int32)
    return out


def write(spec: list[dict]) -> None:
    for s in spec:
        rec = record(s["t"], s["h"], s["dtype"], s["seed"], s.get("layout", "specforge"))
        if hasattr(torch.serialization, "set_crc32_options"):
            torch.serialization.set_crc32_options(s.get("crc", True))
        elif not s.get("crc", True):
            raise SystemExit("this torch cannot write without CRCs")
        if s["fmt"] == "safetensors":
            from safetensors.torch import save_file

            save_file(rec, s["path"])
        elif s["fmt"] == "gz":
            with gzip.open(s["path"], "wb", compresslevel=6) as f:
                torch.save(rec, f)
        else:
            torch.save(rec, s["path"])
    print(json.dumps({"torch": torch.__version__}))


def _same(got: object, want: dict) -> bool:
    if not isinstance(got, dict) or set(got) != set(want):
        return False
    return all(isinstance(got[k], torch.Tensor) and got[k].dtype == v.dtype and got[k].shape == v.shape
               and torch.equal(got[k], v) for k, v in want.items())


def _outcome(load, want: dict) -> str:
    try:
        got = load()
    except BaseException as exc:  # noqa: BLE001 - whatever torch raises is its verdict
        if isinstance(exc, KeyboardInterrupt):
            raise
        return f"error: {type(exc).__name__}: {str(exc)[:120]}"
    return "same" if _same(got, want) else "differs"


def judge(plan: list[dict]) -> list[dict]:
    """plan: [{"path", "fmt", "t", "h", "dtype", "seed", "damages": [...]}]; for each damage,
    each loader's outcome ("same", "differs", "error: ...")."""
    out = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("RECONCILE_JUDGE_TMP")) as tmp:
        for item in plan:
            want = record(item["t"], item["h"], item["dtype"], item["seed"], item.get("layout", "specforge"))
            with open(item["path"], "rb") as fh:
                pristine = fh.read()
            suffix = {"gz": ".ckpt.gz", "safetensors": ".safetensors"}.get(item["fmt"], ".ckpt")
            path = os.path.join(tmp, "sample" + suffix)
            results = []
            for d in item["damages"]:
                data = apply(pristine, d)
                with open(path, "wb") as fh:
                    fh.write(data)
                results.append(_loaders(path, item["fmt"], want))
            out.append({"path": item["path"], "results": results})
    return out


def _loaders(path: str, fmt: str, want: dict) -> dict[str, str]:
    if fmt == "safetensors":
        from safetensors.torch import load_file

        return {"load_file": _outcome(lambda: load_file(path), want)}
    if fmt == "gz":
        def content() -> io.BytesIO:
            with gzip.open(path, "rb") as f:
                return io.BytesIO(f.read())

        return {"specforge": _outcome(lambda: torch.load(content(), weights_only=False), want),
                "weights_only": _outcome(lambda: torch.load(content(), weights_only=True), want)}
    res = {"full": _outcome(lambda: torch.load(path, weights_only=False), want)}
    if HAS_MMAP:
        res["specforge"] = _outcome(lambda: torch.load(path, weights_only=False, mmap=True), want)
    res["weights_only"] = _outcome(lambda: torch.load(path, weights_only=True), want)
    return res


_SAME = {"safetensors": {"load_file": "same"}, "gz": {"specforge": "same", "weights_only": "same"},
         "ckpt": {"full": "same", **({"specforge": "same"} if HAS_MMAP else {}), "weights_only": "same"}}


def main() -> int:
    cmd = sys.argv[1]
    with open(sys.argv[2]) as fh:
        arg = json.load(fh)
    if cmd == "write":
        write(arg)
    elif cmd == "same":
        bad = [s["path"] for s in arg if _loaders(s["path"], s["fmt"], record(
            s["t"], s["h"], s["dtype"], s["seed"], s.get("layout", "specforge"))) != _SAME[s["fmt"]]]
        if bad:
            raise SystemExit(f"not the samples they should be: {bad}")
    elif cmd == "judge":
        with open(sys.argv[3], "w") as fh:
            json.dump({"torch": torch.__version__, "items": judge(arg)}, fh)
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
