"""Is a safetensors file whole? The format has no checksum, so "whole" can only mean
structurally complete with no crash-zeroed pages found.

The rules are those of the safetensors library (huggingface/safetensors, safetensors/src/tensor.rs,
`read_metadata` and `Metadata::validate`, 0.8): 8 bytes little-endian N, N bytes of UTF-8 JSON
(at most 100,000,000), an object of tensors {dtype, shape, data_offsets} and an optional
`__metadata__` of strings; sorted by offsets, each tensor starts where the previous ended and
holds exactly prod(shape) × the dtype's bits / 8 bytes; the file is exactly 8 + N + the last end.

The content check adds what a crash leaves: a 4 KiB file page of zeros (delayed allocation: the
size was committed, the data not) inside a float tensor (F16, BF16, F32, F64: hidden states).
Never inside integer tensors: a `loss_mask` is zero over every prompt token.
"""

from __future__ import annotations

import json
import struct

from .torchzip import Source

MAX_HEADER = 100_000_000  # tensor.rs MAX_HEADER_SIZE
# tensor.rs `Dtype` and `bitsize()`.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
    "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})  # where the zero-page rule applies
U64 = 2**64 - 1


class SafetensorsDamage(Exception):
    pass


def check_safetensors(src: Source, content: bool, on_disk: bool = True) -> None:
    """Raises SafetensorsDamage with the reason."""
    size = src.size
    if size < 8:
        raise SafetensorsDamage(f"truncated: {size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", src.read_at(0, 8))
    if n > MAX_HEADER:
        raise SafetensorsDamage(f"bad header length {n} (more than the format's {MAX_HEADER})")
    if 8 + n > size:
        raise SafetensorsDamage(f"truncated: header of {n} bytes does not fit in {size} bytes")
    raw = src.read_at(8, n)
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError):
        if raw and raw == bytes(len(raw)):
            raise SafetensorsDamage("bad safetensors header: zeros (lost in a crash?)") from None
        raise SafetensorsDamage("bad safetensors header: not JSON") from None
    if not isinstance(header, dict):
        raise SafetensorsDamage("bad safetensors header: not a JSON object")
    tensors = []
    for key, meta in header.items():
        if key == "__metadata__":
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                raise SafetensorsDamage("bad safetensors header: __metadata__ is not a map of strings")
            continue
        tensors.append(_tensor(key, meta))
    tensors.sort(key=lambda t: (t[2], t[3]))
    start = 0
    for name, dtype, begin, end, nbytes in tensors:
        if begin != start or end < begin:
            raise SafetensorsDamage(f"tensor {name!r}: offsets {begin}..{end}, expected to start at {start}")
        if end - begin != nbytes:
            raise SafetensorsDamage(f"tensor {name!r}: {end - begin} bytes for {dtype} of its shape, which needs "
                                    f"{nbytes}")
        start = end
    want = 8 + n + start
    if size < want:
        raise SafetensorsDamage(f"truncated: {size} of {want} bytes")
    if size > want:
        raise SafetensorsDamage(f"{size - want} bytes after the last tensor ({want} expected)")
    if content and on_disk:
        floats = [(8 + n + begin, 8 + n + end, name, dtype) for name, dtype, begin, end, _ in tensors
                  if dtype in FLOAT_DTYPES and end > begin]
        at = src.first_zero_page([(a, b) for a, b, _, _ in floats])
        if at is not None:
            name, dtype = next(((t, d) for a, b, t, d in floats if a < at + 4096 and at < b), ("?", "?"))
            raise SafetensorsDamage(f"tensor {name!r}: a 4 KiB page of zeros at byte {at} in {dtype} data "
                                    "(lost in a crash?)")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # serde_json refuses NaN and Infinity


def _tensor(name: str, meta: object) -> tuple[str, str, int, int, int]:
    if not isinstance(meta, dict):
        raise SafetensorsDamage(f"bad safetensors header: tensor {name!r} is not an object")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise SafetensorsDamage(f"bad safetensors header: tensor {name!r} has dtype {dtype!r:.20}")
    if not isinstance(shape, list) or not all(_u64(x) for x in shape):
        raise SafetensorsDamage(f"bad safetensors header: tensor {name!r} has shape {shape!r:.40}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_u64(x) for x in offsets):
        raise SafetensorsDamage(f"bad safetensors header: tensor {name!r} has data_offsets {offsets!r:.40}")
    elements = 1
    for x in shape:
        elements *= x
    bits = elements * DTYPE_BITS[dtype]
    if bits > U64:
        raise SafetensorsDamage(f"bad safetensors header: tensor {name!r} is too large")
    if bits % 8:
        raise SafetensorsDamage(f"bad safetensors header: tensor {name!r} is not a whole number of bytes")
    return name, dtype, offsets[0], offsets[1], bits // 8


def _u64(x: object) -> bool:
    return type(x) is int and 0 <= x <= U64
