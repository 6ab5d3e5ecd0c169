"""Orbax checkpoints (orbax-checkpoint 0.12.8, `CheckpointManager` with its default step names).
Imported only in the observer child; read through the tree held by fd.

Save: each step is written in `<step>.orbax-checkpoint-tmp-<time>/` and renamed to `<step>/`
when complete (orbax/checkpoint/_src/path/atomicity.py AtomicRenameTemporaryPath; the folder
then holds `_CHECKPOINT_METADATA` and `commit_success.txt`, and per item (`default/` ...)
`_METADATA`, `_sharding`, `array_metadatas/`, `manifest.ocdbt` and the OCDBT data files of
`d/` and `ocdbt.process_N/`).

Pick (CheckpointManager.latest_step(): _load_checkpoint_infos -> step.py _StandardNameFormat
find_all / _build_metadata): the entries of the directory whose name is a step
(`^(0|[1-9]\\d*)$`) and which are finalized (temporary_paths.is_path_finalized: no
`.orbax-checkpoint-tmp` in the name), the highest. A temporary folder left by a killed save is
ignored by Orbax, and here.

Whole (what restore reads): the JSON files parse (`_CHECKPOINT_METADATA`, each item's
`_METADATA`, `_sharding`, `array_metadatas/*`), and every OCDBT file is complete: an encoded
file (manifest, B-tree and version nodes: magic 0x0cdb...., the 8-byte little-endian length of
the whole file, a CRC-32C of all but its last 4 bytes at the end; tensorstore
kvstore/ocdbt/format) has that length, and at the content depth that CRC; a data file of values
stored as zstd frames (the zarr3 zstd codec) walks frame by frame, block by block, to its end
exactly. Values stored raw carry no checksum: their bytes cannot be proven (said so).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable

from ...common.usertree import Tree, UnsafeTree
from .observed import NotCheckable, StepObserved
from .treefiles import tree_mtime_size

RULE = ("the highest finalized step folder (orbax CheckpointManager.latest_step: step names ^(0|[1-9]\\d*)$, "
        "*.orbax-checkpoint-tmp* ignored)")
EMPTY_PICK = "CheckpointManager.latest_step() would return None: the job starts from scratch"
STEP = re.compile(r"^(0|[1-9]\d*)$")  # step.py _StandardNameFormat._build_metadata, no prefix, no fixed length
TMP = ".orbax-checkpoint-tmp"  # atomicity_types.TMP_DIR_SUFFIX
JSON_NAMES = ("_CHECKPOINT_METADATA", "_METADATA", "_sharding")
OCDBT_MAGIC = (b"\x0c\xdb\x3a\x2a", b"\x0c\xdb\x20\xde")  # tensorstore ocdbt: manifest, data/node files
ZSTD_MAGIC = 0xFD2FB528
MOST_FILES = 100_000


def names(tree: Tree) -> list[str]:
    for e in tree.entries():
        if e.kind == "symlink" and STEP.match(e.name):
            raise NotCheckable(f"{tree.path}/{e.name}: a symbolic link Orbax would take as a step; reconcile does "
                               "not follow links in a user's tree")
    return sorted((e.name for e in tree.entries() if e.kind == "dir" and STEP.match(e.name) and TMP not in e.name),
                  key=int)


def resume(found: list[str]) -> str | None:
    return max(found, key=int) if found else None


def steps(tree: Tree, rels: list[str], depth_of: Callable[[str], str]) -> list[StepObserved]:
    return [step(tree, rel, depth_of(rel)) for rel in rels]


def _files(tree: Tree, rel: str) -> list[str]:
    out, todo = [], [rel]
    while todo:
        d = todo.pop()
        for e in tree.entries(d):
            p = f"{d}/{e.name}"
            if e.kind == "dir":
                todo.append(p)
            else:
                out.append(p)
            if len(out) > MOST_FILES:
                return out
    return sorted(out)


def step(tree: Tree, rel: str, depth: str) -> StepObserved:
    mtime, count, size = tree_mtime_size(tree, rel)
    try:
        files = _files(tree, rel)
    except (OSError, UnsafeTree) as exc:
        return StepObserved(int(rel), rel, False, f"unreadable: {exc}", mtime, count, size)
    problem, unproven = "", ""
    have = {f[len(rel) + 1:] for f in files}
    if "_CHECKPOINT_METADATA" not in have:
        problem = "_CHECKPOINT_METADATA missing: Orbax writes it before it renames a save into place"
    items = sorted({h.split("/")[0] for h in have if "/" in h})
    if not problem and not any(f"{i}/_METADATA" in have for i in items):
        problem = "no item folder with _METADATA: restore has nothing to read"
    for f in files:
        if problem:
            break
        short = f[len(rel) + 1:]
        name = short.rsplit("/", 1)[-1]
        try:
            if name in JSON_NAMES or "/array_metadatas/" in f"/{short}":
                json.loads(tree.read_bounded(f, 64 << 20))
                continue
            why, raw = _ocdbt(tree, f, depth)
        except (OSError, UnsafeTree) as exc:
            problem = f"{short}: unreadable: {exc}"
            break
        except ValueError as exc:
            problem = f"{short}: does not parse ({exc}): restore raises"
            break
        if why:
            problem = f"{short}: {why}"
        elif raw:
            unproven = unproven or f"{short}: values stored raw (no checksum): their bytes cannot be proven"
    return StepObserved(int(rel), rel, not problem, problem, mtime, count, size, "" if problem else unproven)


def _ocdbt(tree: Tree, rel: str, depth: str) -> tuple[str, bool]:
    """(why not whole, values stored raw) of one file of an OCDBT store; other files: ("", False).
    A data file is a run of records, each an encoded node (magic, length, ..., CRC-32C) or a value
    compressed as zstd frames; walked record by record to its end exactly."""
    short = rel.rsplit("/", 1)[-1]
    if not ("/d/" in rel or short.startswith("manifest.")):
        return "", False
    fd = tree.open_regular(rel)
    try:
        size = os.fstat(fd).st_size
        at = 0
        while at < size:
            head = os.pread(fd, 12, at)
            if head[:4] in OCDBT_MAGIC:
                if len(head) < 12:
                    return f"{size} bytes: cut inside the header of the record at byte {at}", False
                (length,) = struct.unpack_from("<Q", head, 4)
                if length < 16 or at + length > size:
                    return f"{size} bytes: the record at byte {at} says {length} bytes (cut short)", False
                if depth == "content":
                    data = os.pread(fd, length, at)
                    (want,) = struct.unpack_from("<I", data, length - 4)
                    if crc32c(memoryview(data)[:length - 4]) != want:
                        return f"the record at byte {at}: CRC-32C does not match (damaged)", False
                at += length
            elif len(head) >= 4 and struct.unpack_from("<I", head)[0] == ZSTD_MAGIC:
                at, why = _zstd_frame(fd, size, at)
                if why:
                    return why, False
            elif at == 0 and short.startswith("manifest."):
                return "not an OCDBT manifest (no magic): damaged", False
            else:
                return "", True  # a value stored raw: no length to walk, no checksum
        return "", False
    finally:
        os.close(fd)


def _zstd_frame(fd: int, size: int, at: int) -> tuple[int, str]:
    """The end of the zstd frame at AT (RFC 8878 3.1.1: header, blocks, optional checksum), or why
    it cannot end inside the file."""
    head = os.pread(fd, 18, at)
    if len(head) < 5:
        return at, f"cut at byte {at} (a zstd frame header)"
    fhd = head[4]
    single = (fhd >> 5) & 1
    at += 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + (1 if single else 0, 2, 4, 8)[fhd >> 6]
    while True:
        b = os.pread(fd, 3, at)
        if len(b) < 3:
            return at, f"{size} bytes: cut at byte {at}, inside a zstd block header"
        h = b[0] | b[1] << 8 | b[2] << 16
        last, kind, n = h & 1, (h >> 1) & 3, h >> 3
        if kind == 3:
            return at, f"byte {at}: a reserved zstd block type (damaged)"
        at += 3 + (1 if kind == 1 else n)
        if at > size:
            return at, f"{size} bytes: a zstd block runs to byte {at} (cut short)"
        if last:
            break
    at += 4 if (fhd >> 2) & 1 else 0
    if at > size:
        return at, f"{size} bytes: a zstd frame's checksum runs to byte {at} (cut short)"
    return at, ""


def _table() -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return out


_T = _table()


def crc32c(data: memoryview | bytes) -> int:
    """CRC-32C (Castagnoli), as tensorstore's OCDBT writes it (small files only: nodes, manifests)."""
    c = 0xFFFFFFFF
    t = _T
    for x in bytes(data):
        c = t[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
