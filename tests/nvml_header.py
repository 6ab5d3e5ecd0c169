"""NVIDIA's nvml.h, which the fake driver (tests/fakenvml/) is compiled against and the ABI check
(tests/test_fakenvml_abi.py) reads: fetched from PyPI, never committed.

Where it comes from: the `nvidia-nvml-dev` wheel (NVIDIA, "NVML native dev links, headers"), whose only
file besides its metadata is `nvidia/cu13/include/nvml.h`. Its licence (the wheel's License.txt, the CUDA
Toolkit EULA, "License Agreement for NVIDIA Software Development Kits") lets a user install and use it, and
distribute only the portions its Attachment A lists, as object code; nvml.h is not among them. So it is
downloaded with pip where it is used (the wheel's version pinned, the header's SHA-256 checked), never
copied into this repository.

Found, in this order:
1. `$RECONCILE_NVML_INCLUDE`: a directory holding nvml.h (a CUDA toolkit's include/, an offline copy);
2. the cache `.ci/run` fills, `.cache/nvidia-nvml-dev-VERSION/` at the repository's root (ignored by git;
   `python3 tests/nvml_header.py` fills it by hand);
3. pip-downloaded into a scratch directory the caller gives (a test's temporary directory: a test
   writes nowhere else).
Otherwise NvmlHeaderUnavailable (an OSError), saying how to get it: the GPU tests then skip, and under
CI=true a skip without "[ci-ok]" fails the run (tests/conftest.py).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "nvidia-nvml-dev"
VERSION = "13.5.37"  # NVML API 13 (nvml.h: NVML_API_VERSION 13)
# The x86-64 wheel whatever this machine is: the header is the same text; one pinned file.
PLATFORM = "manylinux2014_x86_64"
MEMBER = "nvidia/cu13/include/nvml.h"
NVML_H_SHA256 = "2b404c6e6e22d0098031a15352d888a3ab92238cad9980e962907795662c4be7"
CACHE = ROOT / ".cache" / f"{PACKAGE}-{VERSION}"
ENV = "RECONCILE_NVML_INCLUDE"
_fetched: list[Path] = []  # where this process already downloaded it (one download a test session)


class NvmlHeaderUnavailable(FileNotFoundError):
    pass


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checked(directory: Path) -> Path | None:
    header = directory / "nvml.h"
    if header.is_file() and _sha256(header) == NVML_H_SHA256:
        return directory
    return None


def fetch(into: Path) -> Path:
    """Download the pinned wheel with pip, extract nvml.h into INTO (made atomically: a reader never sees
    a half-written header) and return INTO. Raises NvmlHeaderUnavailable."""
    if _checked(into):
        return into
    into.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into.parent, prefix=".nvml-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--platform", PLATFORM, "--dest", tmp, f"{PACKAGE}=={VERSION}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NvmlHeaderUnavailable(f"pip download {PACKAGE}=={VERSION}: {exc}") from None
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise NvmlHeaderUnavailable(f"pip download {PACKAGE}=={VERSION} failed: {last}")
        staged = Path(tmp) / "include"
        staged.mkdir()
        with zipfile.ZipFile(wheels[0]) as whl:
            (staged / "nvml.h").write_bytes(whl.read(MEMBER))
        if not _checked(staged):
            raise NvmlHeaderUnavailable(f"{wheels[0].name}: {MEMBER} is not the pinned header "
                                        f"(SHA-256 {_sha256(staged / 'nvml.h')}, expected {NVML_H_SHA256})")
        try:
            staged.rename(into)
        except OSError:
            if not _checked(into):  # another process made it first: theirs is as good
                raise
    return into


def include_dir(scratch: Path | None = None) -> Path:
    """The directory holding the pinned nvml.h (see the module's docstring for the order)."""
    given = os.environ.get(ENV)
    if given:
        if not (Path(given) / "nvml.h").is_file():
            raise NvmlHeaderUnavailable(f"${ENV}={given} holds no nvml.h")
        return Path(given)
    if _checked(CACHE):
        return CACHE
    for earlier in _fetched:
        if _checked(earlier):
            return earlier
    if scratch is None:
        raise NvmlHeaderUnavailable(f"nvml.h not found: run `python3 tests/nvml_header.py` (downloads "
                                    f"{PACKAGE}=={VERSION} from PyPI into {CACHE}) or set ${ENV}")
    try:
        _fetched.append(fetch(scratch / "nvml-include"))
        return _fetched[-1]
    except NvmlHeaderUnavailable as exc:
        raise NvmlHeaderUnavailable(f"{exc}; without PyPI, set ${ENV} to a directory holding nvml.h "
                                    f"(or fill {CACHE} with `python3 tests/nvml_header.py` where PyPI is "
                                    "reachable)") from None


def main() -> int:
    """`python3 tests/nvml_header.py [DIR]`: fill the cache (or DIR) and print where nvml.h is."""
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE
    try:
        print(fetch(target) / "nvml.h")
    except NvmlHeaderUnavailable as exc:
        print(f"nvml_header: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
