"""Mount tables as libmount reads them: util-linux's own samples (tests/data/mounts/util-linux/)
and tables of hostile bytes, each entry compared field by field with what `findmnt --tab-file`
(util-linux's libmount, run at test time) and libmount's expected dumps say; udev's link names
compared with libblkid's own blkid_encode_string (loaded with ctypes at test time).

No root needed: findmnt only reads the files it is given.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from reconcile_host.reconcilers.mounts.options import classify
from reconcile_host.reconcilers.mounts.sources import blkid_encode
from reconcile_host.reconcilers.mounts.tables import find_fstab, parse_fstab, parse_mountinfo, streq_paths

UL = Path(__file__).resolve().parent / "data" / "mounts" / "util-linux"
FILES = sorted(p.relative_to(UL).as_posix() for p in UL.glob("ts/*/files/*"))
MOUNTINFO_COLS = "ID,PARENT,MAJ:MIN,FSROOT,TARGET,SOURCE,FSTYPE,VFS-OPTIONS,FS-OPTIONS,OPT-FIELDS"
FSTAB_COLS = "SOURCE,TARGET,FSTYPE,OPTIONS,VFS-OPTIONS,FS-OPTIONS,FREQ,PASSNO"
ENV = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _need_findmnt() -> str:
    path = shutil.which("findmnt")
    if not path:
        pytest.skip("findmnt (util-linux) not installed")
    return path


def is_mountinfo(name: str) -> bool:
    return Path(name).name.startswith("mountinfo")


def findmnt(path: Path | str, cols: str) -> tuple[list[dict], list[int]]:
    """findmnt's entries for a table file (-J; non-UTF-8 bytes come raw: surrogateescape), and
    the lines it reports as parse errors."""
    r = subprocess.run([_need_findmnt(), "--tab-file", str(path), "-J", "--list", "--nofsroot", "-o", cols],
                       capture_output=True, env=ENV)
    out = r.stdout.decode("utf-8", "surrogateescape")
    entries = json.loads(out)["filesystems"] if out.strip() else []
    bad = [int(n) for n in re.findall(rb"parse error at line (\d+)", r.stderr)]
    return entries, bad


def ours(data: bytes, mountinfo: bool) -> tuple[list[dict], list[int]]:
    """reconcile's parse of a table, in findmnt's JSON terms (an empty source is null there)."""
    bad: list[int] = []
    if mountinfo:
        return [{"id": m.mount_id, "parent": m.parent_id, "maj:min": m.devno, "fsroot": m.root,
                 "target": m.mount_point, "source": m.source or None, "fstype": m.fstype,
                 "vfs-options": ",".join(m.options), "fs-options": ",".join(m.super_options),
                 "opt-fields": " ".join(m.optional_fields) or None}
                for m in parse_mountinfo(data, bad)], bad
    return [{"source": e.source, "target": e.mount_point, "fstype": e.fstype,
             "options": e.optstr or None,
             "vfs-options": ",".join(o for o in e.options if classify(o) == "vfs") or None,
             "fs-options": ",".join(o for o in e.options if classify(o) == "fs") or None,
             "freq": e.freq, "passno": e.passno}
            for e in parse_fstab(data, bad)], bad


def assert_same_as_findmnt(path: Path, mountinfo: bool) -> int:
    want, want_bad = findmnt(path, MOUNTINFO_COLS if mountinfo else FSTAB_COLS)
    got, got_bad = ours(path.read_bytes(), mountinfo)
    assert got_bad == want_bad, f"{path.name}: rejected lines"
    assert len(got) == len(want), f"{path.name}: entries"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for field, value in w.items():
            assert g[field] == value, f"{path.name} entry {i + 1} {field}: reconcile {g[field]!r}, findmnt {value!r}"
    return len(got)


@pytest.mark.parametrize("name", FILES)
def test_util_linux_table_field_by_field_against_findmnt(name: str):
    """Every entry of every util-linux sample table, every field, as findmnt reads it."""
    assert assert_same_as_findmnt(UL / name, is_mountinfo(name)) > 0


# --- libmount's expected dumps (upstream tests/expected/libmount/tabfiles-parse-*) ---------

DUMPS = {"tabfiles-parse-fstab": "fstab", "tabfiles-parse-fstab-full": "fstab.comment",
         "tabfiles-parse-fstab-broken": "fstab.broken", "tabfiles-parse-mtab": "mtab",
         "tabfiles-parse-mountinfo": "mountinfo", "tabfiles-parse-mountinfo-nosrc": "mountinfo_nosrc"}
DUMP_FIELDS = {"source": "source", "target": "target", "fstype": "fstype", "optstr": "options",
               "VFS-optstr": "vfs-options", "FS-opstr": "fs-options", "freq": "freq", "pass": "passno",
               "root": "fsroot", "id": "id", "parent": "parent", "devno": "maj:min",
               "optional-fields": "opt-fields"}


def dump_records(text: str) -> list[dict]:
    """libmount's mnt_fs_print_debug() blocks: `------ fs:` then `key: value` lines; a field it
    does not print is unset (NULL, or 0 for numbers)."""
    records: list[dict] = []
    for line in text.split("\n"):
        if line.startswith("------ fs:"):
            records.append({})
        elif records and ":" in line:
            key, _, value = line.partition(":")
            if key in DUMP_FIELDS:
                records[-1][DUMP_FIELDS[key]] = value.strip(" ").strip("'") if key == "optional-fields" \
                    else value.lstrip(" \t")
    return records


@pytest.mark.parametrize("dump", sorted(DUMPS))
def test_libmount_expected_dump_field_by_field(dump: str):
    table = UL / "ts/libmount/files" / DUMPS[dump]
    expected = dump_records((UL / "expected/libmount" / dump).read_bytes().decode("utf-8", "surrogateescape"))
    mountinfo = is_mountinfo(table.name)
    got, _bad = ours(table.read_bytes(), mountinfo)
    assert len(got) == len(expected) > 0
    for i, (g, want) in enumerate(zip(got, expected, strict=True)):
        for field, value in want.items():
            if field == "options" and mountinfo:
                continue  # the merge of the VFS and FS fields, which are both checked
            have = g[field]
            have = "" if have is None else str(have)
            assert have == value, f"{dump} entry {i + 1} {field}: reconcile {have!r}, libmount {value!r}"
        if "freq" not in want and not mountinfo:
            assert (g["freq"], g["passno"]) == (0, int(want.get("passno", 0)))


@pytest.mark.parametrize("dump, path", [("tabfiles-find-target", "/home/foo"), ("tabfiles-find-target2", "/any/foo"),
                                        ("tabfiles-find-target3", "/any/foo/")])
def test_libmount_find_target(dump: str, path: str):
    """mnt_table_find_target(forward): the line `mount --target PATH` would use."""
    (want,) = dump_records((UL / "expected/libmount" / dump).read_text())
    entry = find_fstab(parse_fstab((UL / "ts/libmount/files/fstab").read_bytes()), path)
    assert entry is not None and (entry.source, entry.mount_point, entry.fstype) == (
        want["source"], want["target"], want["fstype"])


# --- findmnt itself reproduces upstream's expected outputs: the oracle is the one upstream tests

ORACLE = [  # expected file, findmnt arguments (upstream tests/ts/findmnt/outputs, target), rc appended
    ("outputs-default", ["--tab-file", "findmnt/files/mountinfo"], True),
    ("outputs-kernel", ["--kernel", "--tab-file", "findmnt/files/mountinfo"], True),
    ("outputs-submounts", ["/sys", "--submounts", "--kernel", "--tab-file", "findmnt/files/mountinfo"], True),
    ("outputs-messy-mountinfo", ["--tab-file", "findmnt/files/mountinfo-messy"], True),
    ("outputs-nofsroot", ["--nofsroot", "--tab-file", "findmnt/files/mountinfo-messy"], False),
    ("outputs-json", ["--all", "--json", "--tab-file", "findmnt/files/mountinfo"], False),
    ("outputs-list", ["--all", "--list", "--tab-file", "findmnt/files/mountinfo"], False),
    ("outputs-raw", ["--raw", "--tab-file", "findmnt/files/mountinfo"], False),
    ("outputs-pairs", ["--pairs", "--tab-file", "findmnt/files/mountinfo"], False),
    ("target-root", ["--target", "/", "--kernel", "--tab-file", "findmnt/files/mountinfo"], True),
    ("target-non-root", ["--target", "/", "--kernel", "--tab-file", "findmnt/files/mountinfo-nonroot"], True),
]


@pytest.mark.parametrize("expected, args, rc", ORACLE, ids=[o[0] for o in ORACLE])
def test_findmnt_here_reproduces_upstream_expected_output(expected: str, args: list[str], rc: bool):
    """The findmnt the other tests take as the authority prints what upstream's own tests expect."""
    argv = [_need_findmnt()] + [str(UL / "ts" / a) if a.startswith("findmnt/files/") else a for a in args]
    r = subprocess.run(argv, capture_output=True, env=ENV)
    out = r.stdout + r.stderr + (f"rc={r.returncode}\n".encode() if rc else b"")
    assert out == (UL / "expected/findmnt" / expected).read_bytes()


def test_findmnt_empty_file(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    r = subprocess.run([_need_findmnt(), "--tab-file", str(empty)], capture_output=True, env=ENV)
    expected = (UL / "expected/findmnt/outputs-empty-file").read_bytes()
    assert r.stdout + r.stderr + f"rc={r.returncode}\n".encode() == expected
    assert parse_mountinfo(b"") == [] and parse_fstab(b"") == []


# --- hostile bytes: every byte value in every field, against findmnt --------------------------

KERNEL_ESCAPES = {0x20: b"\\040", 0x09: b"\\011", 0x0A: b"\\012", 0x5C: b"\\134"}  # fs/proc_namespace.c mangle()
UNICODE = ["\u0085", "\u2028", "\u2029", "\u00a0", "\u3000", "\ufeff", "\u200b", "\u1680", "é", "\U0001f600"]


def _hostile_pieces() -> list[bytes]:
    pieces = [KERNEL_ESCAPES.get(b, bytes([b])) for b in range(1, 256)]
    pieces += [u.encode() for u in UNICODE]
    pieces += [b"\\777", b"\\x", b"\\0400", b"\\", b"\\04", b"a\\", b"\\101", b" - ".replace(b" ", b"\\040")]
    return pieces


def test_hostile_mountinfo_against_findmnt(tmp_path: Path):
    """A mount point, root, source and type holding each byte the kernel writes raw (all but
    space, tab, newline and backslash), UTF-8 line and paragraph separators, non-UTF-8 bytes,
    escapes libmount decodes (\\777 -> 0xff) and ones it leaves; empty sources; a CRLF line, a
    15 KB line, optional fields, a NUL byte, comments, a last line without a newline."""
    lines = []
    for i, p in enumerate(_hostile_pieces(), 100):
        lines.append(b"%d 1 0:%d /r%s /mnt/a%sb rw,relatime shared:%d master:2 - tmpfs src%s rw,size=1k" % (
            i, i, p, p, i, p))
        lines.append(b"%d 1 0:%d / /e%s rw - fuse.x%s  rw,user_id=0" % (i + 1000, i, p, p))  # empty source
    lines += [b"# a comment", b"   ", b"7 1 0:7 / /crlf rw - tmpfs t rw\r",
              b"8 1 0:8 / /" + b"d" * 15000 + b" rw - tmpfs long rw", b"9 1 0:9 / /nul\0x rw - tmpfs t rw",
              b"10 1 0:10 / /nosep rw tmpfs t rw", b"11 1 0:11 / /extra rw - tmpfs t rw extra fields",
              b"12\t1\t0:12\t/\t/tabs\trw\t-\ttmpfs\tt\trw", b"13 1 0:13 / /last rw - tmpfs t rw"]
    table = tmp_path / "mountinfo"
    table.write_bytes(b"\n".join(lines))
    assert assert_same_as_findmnt(table, True) == len(lines) - 5  # comment, blank, NUL, no ` - ` (2)


FSTAB_CASES = b"""# comment
   # indented comment
src1 /data tmpfs size=1m 0 0 # a comment after passno is ignored
src2 /x#y tmpfs size=1m 0 0
src3 /x tmpfs size=1m,#opt 0 0
src4 /y tmpfs size=1m # a comment where freq belongs rejects the line
src5 /d tmpfs size=1m x 0
src6 /d tmpfs size=1m 0 y
src7 /d tmpfs size=1m 1a 0
src8 /d tmpfs size=1m -1 +2
src9 /d tmpfs size=1m 0x1 0
src10 /d tmpfs size=1m 99999999999 0
src11 /d tmpfs size=1m 0 99999999999999999999
src12 /d tmpfs size=1m 99999999999999999999
src13 /d tmpfs size=1m 99999999999999999999 0
src14 /d tmpfs size=1m 0 99999999999999999999 trailing
src15 /d tmpfs
src16 /d
src17
src\\0401 /a\\040b tmpfs size=1m 0 0
src18 /h\\043 tmpfs size=1m 0 0
src19 /t\\011 tmpfs defaults,nofail,x-systemd.automount,ro,noatime,mode=755,ro=1,nofail=2,comment=x,comment,user 0 0
src20 /o\\777 tmpfs size=1m 0 0
src21 /lone\\x tmpfs size=1m 0 0
src22 /crlf tmpfs size=1m 0 0\r
src23 /x\ry tmpfs size=1m 0 0
src24 /v\x0b tmpfs size=1m 0 0
src25 /nbsp\xc2\xa0 tmpfs size=1m 0 0
src26 /ls\xe2\x80\xa8 tmpfs size=1m 0 0
src27 /ff\xff tmpfs size=1m 0 0
src28 /nul\x00 tmpfs size=1m 0 0
src29\t\t/tabs\ttmpfs\tsize=1m\t0\t0
LABEL="my data" /q tmpfs defaults 0 0
src30 //B//data/ tmpfs size=1m 0 0
src31 /d tmpfs context="a,b",size=1m 0 0
src32 /d tmpfs size=1m 0 0 \v
src33 /d tmpfs size=1m \v1 0
src34 /last tmpfs size=1m 0 0"""


def test_fstab_rules_against_findmnt(tmp_path: Path):
    """Where `#` is a comment and where it is data, freq/passno that are not numbers (the line
    is rejected, the next ones are read), numbers strtol takes, missing fields, escapes, CRLF,
    raw control and Unicode bytes inside a field, a NUL byte, no final newline."""
    table = tmp_path / "fstab"
    table.write_bytes(FSTAB_CASES)
    assert assert_same_as_findmnt(table, False) > 20


def test_hostile_fstab_every_byte_against_findmnt(tmp_path: Path):
    lines = []
    for p in _hostile_pieces():
        p = {0x23: b"\\043"}.get(p[0], p) if len(p) == 1 else p  # a leading # would make it a comment
        lines.append(b"s%s /m/a%sb fs%s o%s,k=v%s 1 2" % (p, p, p, p, p))
    table = tmp_path / "fstab"
    table.write_bytes(b"\n".join(lines) + b"\n")
    assert assert_same_as_findmnt(table, False) > 250


@pytest.mark.parametrize("a, b, same", [
    ("/data", "/data/", True), ("//data", "/data", True), ("/a//b///", "/a/b", True), ("/any/foo", "/any/foo/", True),
    ("/a/./b", "/a/b", False), ("/a/../b", "/b", False), ("data", "/data", False), ("/data", "/data2", False),
])
def test_streq_paths(a: str, b: str, same: bool):
    assert streq_paths(a, b) is same and streq_paths(b, a) is same


# --- udev's link names: libblkid's blkid_encode_string ----------------------------------------

def _libblkid():
    name = ctypes.util.find_library("blkid") or "libblkid.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        pytest.skip("libblkid.so.1 not installed")
    lib.blkid_encode_string.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    return lib


def _encode_inputs() -> list[bytes]:
    interesting = [bytes([b]) for b in range(1, 256)]
    lead = [b"\xc2", b"\xdf", b"\xe0", b"\xe2", b"\xed", b"\xef", b"\xf0", b"\xf4", b"\xf5", b"\xf8", b"\xfc"]
    cont = [b"\x80", b"\x9f", b"\xa0", b"\xbf", b"\xc0", b"a"]
    seqs = [x + y for x in lead for y in cont] + [x + y + z for x in lead for y in cont for z in cont]
    seqs += [x + y + z + w for x in (b"\xf0", b"\xf4", b"\xf8") for y in cont[:4] for z in cont[:4] for w in cont[:4]]
    labels = [b"data(1)", b"a b", b"x/y", b"back\\slash", "café".encode(), b"bad\xff", b"tab\tx", b"#+-.:=@_",
              b"q\"u'o", "\ufdd0\ufdef\ufdcf\ufdf0\uffff\ufffe".encode(), "\U0001ffff\U0010ffff".encode(),
              b"\xed\xa0\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80"]
    return interesting + seqs + [b"x" + s + b"y" for s in seqs] + labels


def test_blkid_encode_equals_libblkid():
    lib = _libblkid()
    inputs = _encode_inputs()
    for value in inputs:
        buf = ctypes.create_string_buffer(4 * len(value) + 8)
        assert lib.blkid_encode_string(value, buf, len(buf)) == 0
        assert blkid_encode(value) == buf.value, value
    assert len(inputs) > 1000
