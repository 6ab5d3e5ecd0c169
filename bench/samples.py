"""Sample files in SpecForge's layout, for the extraction of the scenario and the growth table."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from common import ROOT


def _ckpt_maker():
    """A maker of small valid torch.save-layout ZIPs (tests/fake_extract.py's, when there)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    try:
        from fake_extract import ckpt_bytes

        return lambda stem, idx: ckpt_bytes(stem, idx, 64)
    except ImportError:
        import io
        import zipfile

        def make(stem: str, idx: int) -> bytes:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
                z.writestr(f"{stem}/data.pkl", b"\x80\x02}q\x00.")
                z.writestr(f"{stem}/data/0", bytes(64))
                z.writestr(f"{stem}/version", b"3\n")
            return buf.getvalue()

        return make


def generate_files(root: Path, n: int, group: int = 2000, recent: int = 2000) -> None:
    """SpecForge layout rows_{g}-{g+group}/data_{i}.ckpt, as a running job leaves it: the last
    `recent` files written one second apart up to now, each with its own content; the older ones
    a day old and sharing one valid archive's bytes (the integrity check reads the ZIP structure,
    not the names inside), so that 1,000,000 files take seconds, not minutes, to write."""
    now = time.time()
    ckpt = _ckpt_maker()
    old = ckpt("data_0", 0)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    for g in range(0, n, group):
        d = root / f"rows_{g}-{g + group}"
        d.mkdir(parents=True, exist_ok=True)
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(g, min(n, g + group)):
                is_recent = i >= n - recent
                fd = os.open(f"data_{i}.ckpt", flags, 0o644, dir_fd=dfd)
                try:
                    os.write(fd, ckpt(f"data_{i}", i) if is_recent else old)
                    t = now - (n - i) if is_recent else now - 86400
                    os.utime(fd, (t, t))
                finally:
                    os.close(fd)
        finally:
            os.close(dfd)
