"""Print reconcile's own observation of this host's GPUs as JSON, through NVML (`nvml`) or through
its nvidia-smi fallback (`smi`), for the hardware suite (hwsuite.py).

It runs in a process of its own so that the environment (LD_LIBRARY_PATH of a fake driver in the
suite's self-test, PATH of a stand-in nvidia-smi) is the one pynvml loads the library with. The
fallback is chosen by making reconcile's NVML reader say "unavailable", as it does on a host without
libnvidia-ml: everything after that point is reconcile's own nvidia-smi path.
"""

from __future__ import annotations

import dataclasses
import json
import sys

# Every setting nvml_settings/smi read (persistence is the Gpu's own field; locked_clocks reads the
# graphics clock now, and reconcile's own record from RECONCILE_STATE_DIR, a temporary directory).
SETTINGS = frozenset({"power_limit", "compute_mode", "application_clocks", "locked_clocks", "mig", "ecc"})


def main(path: str) -> int:
    from reconcile_host.local.host import LocalHost
    from reconcile_host.reconcilers import gpus as kind
    from reconcile_host.reconcilers.gpus.nvml import NvmlUnavailable

    if path == "smi":
        def unavailable(settings=()):
            raise NvmlUnavailable("not used: the hardware suite reads the nvidia-smi fallback")
        kind.nvml_observe = unavailable
    obs = kind.GpusReconciler()._observe(LocalHost(), {}, SETTINGS)
    print(json.dumps(dataclasses.asdict(obs), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "nvml"))
