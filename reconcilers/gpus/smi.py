"""The nvidia-smi fallback: its `--query-gpu` / `--query-compute-apps` CSV, parsed."""

from __future__ import annotations

from collections.abc import Mapping

from ...pipeline.contract import ObserveError
from .observed import MIB, Gpu, GpuUse, health_of

SMI_GPU_FIELDS = ("index,name,uuid,pci.bus_id,memory.total,memory.used,temperature.gpu,power.draw,"
                  "ecc.errors.uncorrected.volatile.total,retired_pages.pending")


SMI_REMAP_FIELDS = "uuid,remapped_rows.pending,remapped_rows.failure"
SMI_APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"


def _smi_value(v: str) -> str | None:
    v = v.strip()
    return None if not v or v.startswith("[") or v in ("N/A", "Not Supported") else v


def _smi_int(v: str) -> int | None:
    s = _smi_value(v)
    try:
        return int(float(s)) if s is not None else None
    except ValueError:
        return None


def _smi_bool(v: str) -> bool | None:
    s = _smi_value(v)
    if s is None:
        return None
    return s.lower() in ("yes", "1", "true", "enabled")


def parse_smi_gpus(csv: str, remap_csv: str = "") -> list[Gpu]:
    """`nvidia-smi --query-gpu=SMI_GPU_FIELDS --format=csv,noheader,nounits` (MiB, W, C)."""
    remap: dict[str, tuple[bool | None, bool | None]] = {}
    for line in remap_csv.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) == 3:
            remap[cols[0]] = (_smi_bool(cols[1]), _smi_bool(cols[2]))
    gpus = []
    for line in csv.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 10:
            raise ObserveError(f"unexpected nvidia-smi output line: {line.strip()!r}")
        idx, name, uuid, bus, total, used, temp, power, ecc, retired = cols
        power_v = _smi_value(power)
        ecc_v, retired_v = _smi_int(ecc), _smi_bool(retired)
        pend, fail = remap.get(uuid, (None, None))
        health, problems = health_of(ecc_v, retired_v, pend, fail)
        gpus.append(Gpu(
            index=int(idx), name=name, uuid=uuid, bus_id=bus,
            memory_total=(_smi_int(total) or 0) * MIB, memory_used=(_smi_int(used) or 0) * MIB,
            temperature_c=_smi_int(temp), power_w=float(power_v) if power_v else None,
            ecc_uncorrected_volatile=ecc_v, retired_pages_pending=retired_v,
            remapped_rows_pending=pend, remapped_rows_failure=fail, health=health, problems=problems,
            minor=int(idx),
        ))
    return gpus


def parse_smi_apps(csv: str, index_of_uuid: Mapping[str, int]) -> dict[int, list[GpuUse]]:
    """`--query-compute-apps=gpu_uuid,pid,process_name,used_memory` -> PID -> uses."""
    uses: dict[int, list[GpuUse]] = {}
    for line in csv.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 4 or not cols[1].isdigit():
            continue
        gpu = index_of_uuid.get(cols[0])
        if gpu is None:
            continue
        mib = _smi_int(cols[-1])
        uses.setdefault(int(cols[1]), []).append(GpuUse(gpu, mib * MIB if mib is not None else None))
    return uses
