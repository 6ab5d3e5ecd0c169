"""Checks operators already run, declared under `gpus.checks` (docs/gpus.md#checks).

What they are taken from: Meta's gcm (`gcm/health_checks/checks/check_nvidia_smi.py`: GPU count,
temperature, ECC corrected/uncorrected volatile totals, retired pages, row remap, VBIOS
mismatch), NVIDIA's own tools (nvidia-smi's clock-event reasons, PCIe link, NVLink status,
persistence mode) and gpud. Each is read-only: reconcile reports drift as `blocked` with the
step a person takes; what reconcile sets is declared separately (`gpus.settings`, settings.py).

A check on a value the GPU or driver does not report is drift with `have: unknown` (blocked:
it cannot be checked), never a pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.contract import Drift
from .observed import Gpu, GpusObserved

CLOCK_EVENTS = ("gpu_idle", "applications_clocks", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal",
                "hw_thermal", "hw_power_brake", "display_clocks")
# `no_slowdown: true`: the reasons that mean the hardware protects itself (heat, power delivery).
# SW power cap is left out: a busy GPU at its power limit is normal (gpud's 8xH100 capture shows it).
DEFAULT_SLOWDOWN = ("hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake")
SLOWDOWN_STEPS = {
    "hw_thermal": "check the GPU's cooling (fans, airflow, inlet temperature)",
    "sw_thermal": "check the GPU's cooling (fans, airflow, inlet temperature)",
    "hw_power_brake": "check the node's power supply (the external power-brake signal is asserted)",
    "hw_slowdown": "check the GPU's cooling and power (the board's hardware protection slowed it)",
    "sw_power_cap": "the GPU is held at its power limit: raise the limit or expect lower clocks",
}
UNKNOWN = "unknown"
_CLAUSE = r"^\s*(>=|<=|==|!=|>|<)?\s*(\d+(?:\.\d+)*)\s*$"  # compiled when a version is checked


def parse_checks(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """The state file's `gpus.checks` -> the normalised spec (schema-validated before)."""
    c = dict(section or {})
    slowdown = c.get("no_slowdown")
    if slowdown is True:
        slowdown = DEFAULT_SLOWDOWN
    elif not slowdown:
        slowdown = ()
    pcie = c.get("pcie") or {}
    return {
        "driver": c.get("driver"), "cuda": c.get("cuda"),
        "max_temperature": c.get("max_temperature"), "no_slowdown": tuple(slowdown),
        "pcie_min_gen": pcie.get("min_gen"), "pcie_min_width": pcie.get("min_width"),
        "max_nvlink_down": c.get("max_nvlink_down"), "max_ecc_corrected": c.get("max_ecc_corrected"),
        "same_vbios": bool(c.get("same_vbios", False)), "persistence_mode": c.get("persistence_mode"),
    }


def version_satisfies(have: str | None, spec: str) -> bool | None:
    """`590.48.01` against `>=590` / `>=580, <600` / `==590.48`; None when HAVE is no version.

    Each clause compares as many numbers as it names: `590.48.01` is `==590` and not `>590`."""
    nums = tuple(int(n) for n in re.findall(r"\d+", have or ""))
    if not nums:
        return None
    for clause in spec.split(","):
        m = re.match(_CLAUSE, clause)
        if not m:
            return None
        op, want = m.group(1) or "==", tuple(int(n) for n in m.group(2).split("."))
        h = (nums + (0,) * len(want))[:len(want)]
        ok = {">=": h >= want, "<=": h <= want, "==": h == want, "!=": h != want, ">": h > want, "<": h < want}[op]
        if not ok:
            return False
    return True


def _idle(g: Gpu) -> bool | None:
    return None if g.clock_events is None else "gpu_idle" in g.clock_events


def check_drift(spec: Mapping[str, Any], observed: GpusObserved) -> list[Drift]:
    c = spec.get("checks") or {}
    out: list[Drift] = []
    for key, have in (("driver", observed.driver_version), ("cuda", observed.cuda_version)):
        if c.get(key) and version_satisfies(have, c[key]) is not True:
            out.append(Drift(key, c[key], have if version_satisfies(have, c[key]) is False else UNKNOWN))
    gpus = [g for g in observed.gpus if not g.lost]  # a lost GPU is unhealthy: its readings are not checks
    for g in gpus:
        out.extend(_gpu_drift(c, g))
    if c.get("same_vbios"):
        versions = {g.vbios for g in gpus}
        if None in versions or len(versions) > 1:
            out.append(Drift("vbios", "the same on every GPU", vbios_spread(gpus)))
    return out


def _gpu_drift(c: Mapping[str, Any], g: Gpu) -> list[Drift]:
    out = []
    f = f"gpu{g.index}"
    limit = c.get("max_temperature")
    if limit is not None and (g.temperature_c is None or g.temperature_c > limit):
        out.append(Drift(f"{f}.temperature", f"<= {limit}C", UNKNOWN if g.temperature_c is None else
                         f"{g.temperature_c}C"))
    if c.get("no_slowdown"):
        if g.clock_events is None:
            out.append(Drift(f"{f}.slowdown", "none of " + ", ".join(c["no_slowdown"]), UNKNOWN))
        else:
            active = [r for r in g.clock_events if r in c["no_slowdown"]]
            if active:
                out.append(Drift(f"{f}.slowdown", "none of " + ", ".join(c["no_slowdown"]), ", ".join(active)))
    width = c.get("pcie_min_width")
    if width is not None:
        want = g.pcie_width_max if width == "max" else width
        if g.pcie_width is None or want is None or g.pcie_width < want:
            out.append(Drift(f"{f}.pcie_width", f">= x{want if want is not None else '?'}",
                             UNKNOWN if g.pcie_width is None or want is None else f"x{g.pcie_width}"))
    gen = c.get("pcie_min_gen")
    if gen is not None:
        want = g.pcie_gen_gpu_max if gen == "max" else gen
        # The link drops its generation when idle (power saving): the current one is judged only when the
        # GPU is not idle; what the link can reach (GPU and slot) always.
        have = g.pcie_gen if _idle(g) is False else g.pcie_gen_max
        if have is None or want is None or have < want:
            out.append(Drift(f"{f}.pcie_gen", f">= {want if want is not None else '?'}",
                             UNKNOWN if have is None or want is None else
                             (f"{have} (under load)" if _idle(g) is False else f"{have} (the most this slot reaches)")))
    down = c.get("max_nvlink_down")
    if down is not None and g.nvlink_down is not None and len(g.nvlink_down) > down:
        out.append(Drift(f"{f}.nvlink_down", f"<= {down}",
                         f"{len(g.nvlink_down)} of {g.nvlink_links} (links {', '.join(map(str, g.nvlink_down))})"))
    ecc = c.get("max_ecc_corrected")
    if ecc is not None and (g.ecc_corrected_volatile is None or g.ecc_corrected_volatile > ecc):
        out.append(Drift(f"{f}.ecc_corrected", f"<= {ecc}",
                         UNKNOWN if g.ecc_corrected_volatile is None else g.ecc_corrected_volatile))
    pm = c.get("persistence_mode")
    if pm is not None:
        have_pm = None if g.persistence_mode is None else ("enabled" if g.persistence_mode else "disabled")
        if have_pm != pm:
            out.append(Drift(f"{f}.persistence_mode", pm, have_pm or UNKNOWN))
    return out


def vbios_spread(gpus: Sequence[Gpu]) -> str:
    by: dict[str, list[int]] = {}
    for g in gpus:
        by.setdefault(g.vbios or UNKNOWN, []).append(g.index)
    return "; ".join(f"{v} on GPU{'s' if len(ix) > 1 else ''} {','.join(map(str, ix))}" for v, ix in sorted(by.items()))


def check_blocked(drift: Sequence[Drift]) -> list[str]:
    """One line per check drift: what is wrong and the step a person takes."""
    lines = []
    for d in drift:
        head, _, what = d.field.partition(".")
        if d.have == UNKNOWN:
            where = f"GPU {head[3:]}" if what else "the driver"
            lines.append(f"{where}: `{what or head}` cannot be checked: not reported by this GPU or driver")
            continue
        if d.field == "driver":
            lines.append(f"driver {d.have} does not satisfy {d.want}: install a driver that does (then reboot)")
        elif d.field == "cuda":
            lines.append(f"the driver supports CUDA {d.have}, the state needs {d.want}: install a newer driver")
        elif d.field == "vbios":
            lines.append(f"the GPUs' VBIOS versions differ ({d.have}): flash the same VBIOS on all of them")
        elif what == "temperature":
            lines.append(f"GPU {head[3:]} is at {d.have}, above {d.want[3:]}: check its cooling")
        elif what == "slowdown":
            steps = dict.fromkeys(SLOWDOWN_STEPS.get(r.strip(), "see nvidia-smi -q -d PERFORMANCE")
                                  for r in str(d.have).split(","))
            lines.append(f"GPU {head[3:]} is slowed down ({d.have}): {'; '.join(steps)}")
        elif what in ("pcie_width", "pcie_gen"):
            kind = "width" if what == "pcie_width" else "generation"
            lines.append(f"GPU {head[3:]}'s PCIe link {kind} is {d.have}, wanted {d.want}: reseat the GPU, "
                         "check its riser and slot (and the BIOS's PCIe settings)")
        elif what == "nvlink_down":
            lines.append(f"GPU {head[3:]} has NVLink links down ({d.have}): check the NVLink/NVSwitch fabric "
                         "(nvidia-smi nvlink -s, Fabric Manager), then reset the GPU")
        elif what == "ecc_corrected":
            lines.append(f"GPU {head[3:]} has {d.have} corrected ECC errors since the driver loaded ({d.want}): "
                         "its memory is degrading: drain it and reset it, and watch for Xid 63/64/92")
        elif what == "persistence_mode":
            lines.append(f"GPU {head[3:]} has persistence mode {d.have}: set it {d.want} "
                         "(nvidia-persistenced, or nvidia-smi -pm)")
    return lines

