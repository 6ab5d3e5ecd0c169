"""Safetensors files zeroed from any offset to the end (a crash that wrote back the last page in
part, and nothing after): what the content check calls them, against the real library.

Samples are written by the real `safetensors.torch.save_file` (SpecForge's dict in bf16, fp16
and fp32 up to its real size, 2,048 tokens at H = 4,096, and layouts whose last tensor is
legitimately zero at its end: attention masks padded with zeros, bool or uint8, which safetensors
stores last; a tokenised shard of int64 tensors padded with 0; int32 positions). Each is zeroed
from many offsets (random ones, each tensor boundary and the bytes around it, the last 100
bytes); the authority for "damaged" is `safetensors.torch.load_file` of the copy against the
original tensors (a copy whose zeroed bytes were zeros already is the original). Asserted: no
undamaged file, original or copy, is called damaged; a damaged copy is called whole only where
the zeros it ends in are fewer than 64 bytes holding no whole float value (the rule's stated
residue). The figures (false damage, "cannot be proven whole" on undamaged files, detection on
damaged copies) are printed (pytest -s) and are those of docs/extractions.md.
"""

from __future__ import annotations

import json
import random
import struct
from collections import Counter
from pathlib import Path

import torch_support as ts
from reconcile_host.common.filechecks.integrity import CONTENT, STRUCTURE, check_path

# (layout, T, H, dtype, copies): the last two are SpecForge's full size (~64 MiB each)
SAMPLES = [(layout, t, h, dtype, 60)
           for layout in ("specforge", "tail-mask", "padded-bool", "padded-u8", "positions", "tokens")
           for t, h, dtype in ((63, 256, "bf16"), (255, 512, "fp16"), (511, 256, "fp32"), (1000, 512, "bf16"))]
SAMPLES += [("specforge", 2048, 4096, "bf16", 12), ("padded-bool", 2048, 4096, "bf16", 12)]


def _tensors(data: bytes) -> tuple[int, list[tuple[int, int, str, str]]]:
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    spans = sorted((8 + n + m["data_offsets"][0], 8 + n + m["data_offsets"][1], k, m["dtype"])
                   for k, m in header.items() if k != "__metadata__")
    return 8 + n, spans


def _offsets(data: bytes, rng: random.Random, k: int) -> dict[int, str]:
    """Where the zeros start: k random offsets in the tensor data ("random"), and with k > 20 the
    bytes around each tensor boundary and in the last 100 bytes ("edge")."""
    start, spans = _tensors(data)
    size = len(data)
    picks = {}
    if k > 20:
        for a, _, _, _ in spans:
            picks.update((x, "edge") for x in (a - 70, a - 64, a - 2, a - 1, a, a + 1, a + 2, a + 64)
                         if start <= x < size)
        picks.update((size - d, "edge") for d in (1, 2, 7, 8, 31, 33, 63, 64, 65, 100))
    picks.update((rng.randrange(start, size), "random") for _ in range(k))
    return dict(sorted(picks.items()))


def _verdict(path: Path, data: bytes) -> tuple[str, str]:
    path.write_bytes(data)
    v = check_path(str(path), CONTENT)
    assert v.state in ("whole", "damaged", "unproven"), v
    s = check_path(str(path), STRUCTURE)  # the structural check judges the tail too, the same way
    assert s.state == v.state or (v.state == "damaged" and "page of zeros" in v.reason), (s, v)
    return v.state, v.reason


def test_zeroed_tails_against_the_real_library(tmp_path):
    python = ts.need(ts.torch_python(), "torch 2.x interpreter")
    assert ts.has_safetensors(python), "the torch interpreter has no safetensors"
    rng = random.Random(27)
    spec = [{"path": str(tmp_path / f"s{n}.safetensors"), "fmt": "safetensors", "t": t, "h": h, "dtype": dtype,
             "seed": 2700 + n, "layout": layout, "copies": copies}
            for n, (layout, t, h, dtype, copies) in enumerate(SAMPLES)]
    ts.write(python, spec, tmp_path)
    plan = []
    for s in spec:
        data = Path(s["path"]).read_bytes()
        s["origin"] = _offsets(data, rng, s["copies"])
        s["offsets"] = list(s["origin"])
        plan.append({**s, "damages": [{"kind": "zero", "start": x, "end": len(data)} for x in s["offsets"]]})
    proc, out = ts.start_judge(python, plan, tmp_path, "tails")

    originals: Counter = Counter()
    ours: dict[str, list[tuple[str, str, int]]] = {}
    scratch = tmp_path / "copy.safetensors"
    for s in spec:  # while the judge runs
        data = Path(s["path"]).read_bytes()
        state, reason = _verdict(scratch, data)
        originals[state] += 1
        assert state != "damaged", (s["layout"], reason)
        ours[s["path"]] = []
        for x in s["offsets"]:
            copy = data[:x] + bytes(len(data) - x)
            state, reason = _verdict(scratch, copy)
            ours[s["path"]].append((state, reason, len(copy) - len(copy.rstrip(b"\0"))))
    judged = {it["path"]: it["results"] for it in ts.finish_judge(proc, out)["items"]}

    copies: Counter = Counter()
    by_layout: Counter = Counter()
    problems = []
    for s in spec:
        for x, (state, reason, run), loaded in zip(s["offsets"], ours[s["path"]], judged[s["path"]], strict=True):
            damaged = loaded["load_file"] != "same"
            copies[("damaged" if damaged else "undamaged", state)] += 1
            by_layout[(s["layout"], s["origin"][x], "damaged" if damaged else "undamaged", state)] += 1
            if damaged and run >= 64:
                copies[("damaged, tail >= 64 B", state)] += 1
            if not damaged and state == "damaged":
                problems.append(f"{s['layout']} {s['t']}x{s['h']} from {x}: false damage: {reason}")
            if damaged and state == "whole" and run >= 64:
                problems.append(f"{s['layout']} {s['t']}x{s['h']} from {x}: a {run}-byte zero tail called whole")
    n_damaged = sum(v for (k, _), v in copies.items() if k == "damaged")
    n_long = sum(v for (k, _), v in copies.items() if k == "damaged, tail >= 64 B")
    n_undamaged = sum(v for (k, _), v in copies.items() if k == "undamaged")
    print(f"\nzero tails: {len(spec)} undamaged files written by safetensors: {originals['damaged']} called damaged, "
          f"{originals['unproven']} cannot be proven whole, {originals['whole']} whole; "
          f"{n_undamaged} zeroed copies identical to their original (zeros over zeros): "
          f"{copies[('undamaged', 'damaged')]} called damaged, {copies[('undamaged', 'unproven')]} unproven; "
          f"{n_damaged} damaged copies: {copies[('damaged', 'damaged')]} damaged "
          f"({100 * copies[('damaged', 'damaged')] / n_damaged:.1f}%), {copies[('damaged', 'unproven')]} cannot be "
          f"proven whole, {copies[('damaged', 'whole')]} whole; of the {n_long} with a zero tail of 64 bytes or more: "
          f"{copies[('damaged, tail >= 64 B', 'damaged')]} damaged, {copies[('damaged, tail >= 64 B', 'unproven')]} "
          f"unproven, {copies[('damaged, tail >= 64 B', 'whole')]} whole")
    for layout in dict.fromkeys(s["layout"] for s in spec):
        for origin in ("random", "edge"):
            n = sum(v for (lay, o, k, _), v in by_layout.items() if (lay, o, k) == (layout, origin, "damaged"))
            print(f"  {layout}, {origin} offsets: {n} damaged copies: " + ", ".join(
                f"{(c := by_layout[(layout, origin, 'damaged', st)])} {st} ({100 * c / max(1, n):.1f}%)"
                for st in ("damaged", "unproven", "whole")))
    assert not problems, "\n".join(problems[:30]) + f"\n({len(problems)} in all)"
    assert originals["damaged"] == 0 and n_damaged > 1000
    # SpecForge's own layout ends in its bf16 hidden state: every undamaged one is provably whole.
    for s in spec:
        if s["layout"] in ("specforge", "tail-mask", "positions"):
            assert check_path(s["path"], CONTENT).state == "whole", s


def test_unproven_file_counts_done_is_never_moved_and_is_said_every_time(tmp_path):
    """A sample whose last tensor is a mask padded with zeros, its real end zeroed over the padding's
    length and more: cannot be proven whole. diff: ok with a caveat; apply moves nothing; the
    caveat stays on the next runs (the check record keeps it)."""
    from cli_support import reconcile_json
    from extraction_support import resource, state_yaml

    python = ts.need(ts.torch_python(), "torch 2.x interpreter")
    out = tmp_path / "hs" / "rows_0-10"
    out.mkdir(parents=True)
    spec = [{"path": str(out / f"data_{i}.safetensors"), "fmt": "safetensors", "t": 255, "h": 64, "dtype": "bf16",
             "seed": 90 + i, "layout": "padded-bool" if i == 2 else "specforge"} for i in range(3)]
    ts.write(python, spec, tmp_path)
    st = state_yaml(tmp_path / "s.yaml", {"dir": str(tmp_path / "hs"), "total": 3, "verify": "at-risk",
                                          "pattern": "rows_{group}/data_{index}.safetensors"})
    v = check_path(spec[2]["path"], CONTENT)
    assert v.state == "unproven" and "'attention_mask' (BOOL" in v.reason, v
    for command in ("diff", "apply", "diff", "diff"):
        rc, rep, err = reconcile_json(tmp_path, command, str(st))
        r = resource(rep)
        assert rc == 0 and r["status"] == "ok" and r["actions"] == [], (command, r, err)
        assert r["observed"]["done"] == 3 and r["observed"]["unproven"] == 1
        assert any("1 sample cannot be proven whole" in c for c in r["caveats"]), r
    assert Path(spec[2]["path"]).exists() and not (tmp_path / "hs" / ".reconcile-quarantine").exists()
