r"""What a source names, found as mount(8) finds it (libblkid's blkid_evaluate_tag).

`UUID=`, `LABEL=`, `PARTUUID=`, `PARTLABEL=` and `ID=` are first looked up as udev's link
`/dev/disk/by-*/NAME`, where NAME is the value encoded by libblkid's `blkid_encode_string`
(libblkid/src/encode.c; udev names the links with the same function: ID_FS_LABEL_ENC and
friends). When there is no such link, which is the case on hosts without udev and for a while
after a device appears, libblkid scans the devices: reconcile then asks libblkid itself
(`blkid -l -o device -t TAG=VALUE`, with `-c /dev/null` so that observing writes no cache file).

Runs in the probe child (it touches devices).
"""

from __future__ import annotations

import os
import stat
import subprocess
from typing import Any

TAG_DIRS = {"UUID": "by-uuid", "LABEL": "by-label", "PARTUUID": "by-partuuid", "PARTLABEL": "by-partlabel",
            "ID": "by-id"}  # libmount/src/utils.c mnt_valid_tagname, libblkid/src/evaluate.c
_SAFE = frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz#+-.:=@_")
BLKID_TIMEOUT = 30.0


def parse_tag(source: str) -> tuple[str, str] | None:
    """(TAG, value) for a tag source, as libblkid's blkid_parse_tag_string reads it: the value
    may be in double or single quotes (`LABEL="my data"` names `my data`)."""
    name, eq, value = source.partition("=")
    if not eq or name not in TAG_DIRS:
        return None
    if value[:1] in ("'", '"'):
        quote, value = value[0], value[1:]
        end = value.rfind(quote)
        if end < 0:
            return None  # missing closing quote: not a tag
        value = value[:end]
    return (name, value) if value else None


def _utf8_len(b: bytes, i: int) -> int:
    """libblkid's utf8_encoded_valid_unichar(): the length of a valid multi-byte UTF-8 sequence
    at b[i] (not overlong, <= U+10FFFF, no surrogates, no U+FDD0..U+FDEF, no U+xFFFF), or 1 or less."""
    c = b[i]
    n = 1 if c < 0x80 else 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 \
        else 5 if c & 0xFC == 0xF8 else 6 if c & 0xFE == 0xFC else 0
    if n <= 1:
        return n
    seq = b[i:i + n]
    if len(seq) < n or any(x & 0x80 != 0x80 for x in seq):
        return -1
    if any(x & 0xC0 != 0x80 for x in seq[1:]):
        return -1
    u = c & ((1 << (7 - n)) - 1)
    for x in seq[1:]:
        u = (u << 6) | (x & 0x3F)
    need = 1 if u < 0x80 else 2 if u < 0x800 else 3 if u < 0x10000 else 4 if u < 0x200000 else 5 if u < 0x4000000 else 6
    if need != n or u > 0x10FFFF or u & 0xFFFFF800 == 0xD800 or 0xFDCF < u < 0xFDF0 or u & 0xFFFF == 0xFFFF:
        return -1
    return n


def blkid_encode(value: bytes) -> bytes:
    r"""libblkid's blkid_encode_string(): valid multi-byte UTF-8 is kept, `\` and every byte
    outside 0-9 A-Z a-z # + - . : = @ _ becomes \xHH (lower-case hex): `data(1)` -> `data\x281\x29`."""
    out, i = bytearray(), 0
    while i < len(value):
        n = _utf8_len(value, i)
        if n > 1:
            out += value[i:i + n]
            i += n
            continue
        c = value[i]
        out += b"\\x%02x" % c if c == 0x5C or c not in _SAFE else bytes([c])
        i += 1
    return bytes(out)


def udev_link(tag: str, value: str) -> str:
    return os.fsdecode(b"/dev/disk/" + TAG_DIRS[tag].encode() + b"/" + blkid_encode(os.fsencode(value)))


def _device(path: str) -> tuple[str, str | None]:
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, (f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" if stat.S_ISBLK(st.st_mode) else None)


def resolve_source(src: str) -> dict[str, Any]:
    """A ResolvedSource's fields for `src`."""
    tag = parse_tag(src)
    if tag is None:
        if not src.startswith("/dev/"):
            return {"given": src, "path": src, "devno": None, "note": ""}
        if not os.path.exists(src):
            return {"given": src, "path": None, "devno": None, "note": f"{src} does not exist"}
        real, devno = _device(src)
        return {"given": src, "path": real, "devno": devno, "note": ""}
    name, value = tag
    link = udev_link(name, value)
    try:
        st = os.stat(link)
    except OSError:
        st = None
    if st is not None and stat.S_ISBLK(st.st_mode):
        real, devno = _device(link)
        return {"given": src, "path": real, "devno": devno, "note": ""}
    if name == "ID":  # libblkid knows ID= only from udev's links
        return {"given": src, "path": None, "devno": None, "note": f"{link} does not exist"}
    return _ask_libblkid(src, name, value, link)


def _ask_libblkid(src: str, name: str, value: str, link: str) -> dict[str, Any]:
    argv = ["blkid", "-c", "/dev/null", "-l", "-o", "device", "-t", f"{name}={value}"]
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=BLKID_TIMEOUT)
    except FileNotFoundError:
        return {"given": src, "path": None, "devno": None,
                "note": f"{link} does not exist and blkid (util-linux) is not installed to scan the devices"}
    except subprocess.TimeoutExpired:
        return {"given": src, "path": None, "devno": None,
                "note": f"{link} does not exist and blkid did not answer within {BLKID_TIMEOUT:g}s"}
    device = os.fsdecode(res.stdout.strip())
    if res.returncode == 0 and device:
        real, devno = _device(device)
        return {"given": src, "path": real, "devno": devno, "note": f"found by blkid (no {link})"}
    if res.returncode == 2:
        return {"given": src, "path": None, "devno": None,
                "note": f"no device has {name}={value} ({link} does not exist, blkid finds none)"}
    why = os.fsdecode(res.stderr.strip()) or f"exit {res.returncode}"
    return {"given": src, "path": None, "devno": None, "note": f"{link} does not exist; blkid: {why}"}
