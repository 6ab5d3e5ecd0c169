#!/usr/bin/env python3
"""A FUSE filesystem whose one file answers every read with EIO, as a bad sector under it would.

    python fuse_eio.py MOUNTPOINT READY_FILE BAD_NAME NAME=SOURCE_FILE...

It opens /dev/fuse, mounts it on MOUNTPOINT (mount -i, no helper; run it in a private mount
namespace), serves one read-only directory holding the named files with the bytes of their
source files, touches READY_FILE and answers requests until /dev/fuse is closed. Reading
BAD_NAME (opening and stat-ing it work) gives EIO; with BAD_NAME `hang:NAME`, a read of NAME
is never answered (the reader waits until the server goes). Only what a listing, a stat, a statfs and a read
need is implemented (include/uapi/linux/fuse.h, protocol 7.31); anything else gets ENOSYS.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
INIT_IN = struct.Struct("<IIII")
INIT_OUT = struct.Struct("<IIIIHHIIHHI28x")
# ino, size, blocks, atime, mtime, ctime, their 3 nsec, mode, nlink, uid, gid, rdev, blksize, flags
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
READ_IN = struct.Struct("<QQII")  # fh, offset, size, read_flags (the rest unused)
LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, BATCH_FORGET = (
    1, 2, 3, 14, 15, 17, 18, 25, 26, 27, 28, 29, 42)
# fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6]
STATFS_OUT = struct.Struct("<QQQQQIIII24x")
NO_REPLY = {FORGET, BATCH_FORGET}


def attr(ino: int, size: int, mode: int) -> bytes:
    return ATTR.pack(ino, size, (size + 511) // 512, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def serve(mountpoint: str, ready: str, bad: str, files: dict[str, bytes]) -> None:
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"
    subprocess.run(["mount", "-i", "-t", "fuse.eio", "-o", opts, "eio", mountpoint], pass_fds=(fd,), check=True)
    names = sorted(files)
    ino = {n: i + 2 for i, n in enumerate(names)}  # 1 is the directory itself
    by_ino = {i: n for n, i in ino.items()}
    while True:
        try:
            buf = os.read(fd, 1 << 21)
        except OSError as exc:
            if exc.errno in (errno.ENODEV, errno.EBADF):
                return  # unmounted
            if exc.errno in (errno.EINTR, errno.ENOENT):
                continue
            raise
        _len, op, unique, node, *_ = IN_HEADER.unpack_from(buf)
        body = buf[IN_HEADER.size:]
        err, out = 0, b""
        if op == INIT:
            _major, minor, readahead, _flags = INIT_IN.unpack_from(body)
            out = INIT_OUT.pack(7, min(minor, 31), readahead, 0, 1, 1, 1 << 20, 1, 256, 0, 0)
        elif op == LOOKUP:
            name = body.split(b"\0", 1)[0].decode()
            if node != 1 or name not in ino:
                err = -errno.ENOENT
            else:
                out = struct.pack("<QQQQII", ino[name], 0, 1, 1, 0, 0) + attr(ino[name], len(files[name]),
                                                                              stat.S_IFREG | 0o644)
        elif op == GETATTR:
            a = attr(1, 0, stat.S_IFDIR | 0o755) if node == 1 else attr(node, len(files[by_ino[node]]),
                                                                        stat.S_IFREG | 0o644)
            out = struct.pack("<QII", 1, 0, 0) + a
        elif op in (OPEN, OPENDIR):
            out = struct.pack("<QII", node, 0, 0)
        elif op == READ:
            _fh, offset, size, _ = READ_IN.unpack_from(body)
            name = by_ino[node]
            if name == bad:
                err = -errno.EIO
            elif bad.startswith("hang:") and name == bad[5:]:
                continue  # never answered: the reader waits in the kernel, as on a server gone away
            else:
                out = files[name][offset:offset + size]
        elif op == READDIR:
            _fh, offset, size, _ = READ_IN.unpack_from(body)
            entries = [(".", 1, stat.S_IFDIR), ("..", 1, stat.S_IFDIR)] + [(n, ino[n], stat.S_IFREG) for n in names]
            for k, (name, i, mode) in enumerate(entries[offset:], start=offset + 1):
                raw = name.encode()
                rec = struct.pack("<QQII", i, k, len(raw), mode >> 12) + raw
                rec += b"\0" * (-len(rec) % 8)
                if len(out) + len(rec) > size:
                    break
                out += rec
        elif op == STATFS:  # statfs(2) on the mount (its f_type, FUSE_SUPER_MAGIC, comes from the kernel)
            out = STATFS_OUT.pack(0, 0, 0, len(names) + 1, 0, 4096, 255, 4096, 0)
        elif op in (RELEASE, RELEASEDIR, FLUSH):
            pass
        elif op in NO_REPLY:
            continue
        else:
            err = -errno.ENOSYS
        if op == INIT:
            Path(ready).write_text(str(os.getpid()))
        os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(out), err, unique) + out)


if __name__ == "__main__":
    mp, ready, bad_name, *pairs = sys.argv[1:]
    serve(mp, ready, bad_name, {n: Path(src).read_bytes() for n, src in (p.split("=", 1) for p in pairs)})
