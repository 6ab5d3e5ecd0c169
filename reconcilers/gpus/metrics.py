"""The gpus kind's own Prometheus metrics (Reconciler.metrics; views/prometheus.py writes them),
read from the report's JSON form of GpusObserved (observed.py): a report from a remote host
arrives as JSON. tests/test_kind_metrics.py holds every key read here to a field of the
observed dataclasses, so renaming a field cannot drop a metric unnoticed.

Names and labels as docs/prometheus.md lists them; contrib/prometheus/reconcile.rules.yml and
the dashboards join on them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.contract import Metric, Sample

HEALTH = ("healthy", "unhealthy", "unknown")  # health.py's verdicts


def gpu_metrics(resource: Mapping[str, Any], report: Mapping[str, Any]) -> list[Metric]:
    rid, observed = resource["id"], resource["observed"]
    hostname = (report.get("machine") or {}).get("hostname") or report.get("host", "")
    gpus = observed.get("gpus") or []
    health: list[Sample] = []
    used: list[Sample] = []
    total: list[Sample] = []
    temperature: list[Sample] = []
    power: list[Sample] = []
    info: list[Sample] = []
    for g in gpus:
        # `UUID` and `pci_bus_id` as dcgm-exporter spells them (its DCGM_FI_* series carry gpu, UUID,
        # pci_bus_id, device, modelName, Hostname): `* on (UUID) group_left` joins the two without
        # label_replace; `uuid`/`bus_id` stay for the rules and queries written before. The model is
        # `model_name`: promtool's lint refuses camelCase label names, and dcgm's modelName comes
        # with the join (group_left (modelName)).
        labels = {"gpu": g.get("index"), "uuid": g.get("uuid", ""), "bus_id": g.get("bus_id", ""),
                  "UUID": g.get("uuid", ""), "pci_bus_id": g.get("bus_id", "")}
        minor = g.get("minor")
        info.append(Sample(1, {"gpu": g.get("index"), "UUID": g.get("uuid", ""), "pci_bus_id": g.get("bus_id", ""),
                               "device": f"nvidia{minor}" if isinstance(minor, int) else "",
                               "model_name": g.get("name") or "", "Hostname": hostname}))
        verdict = g.get("health", "unknown")
        health += [Sample(int(verdict == value), {**labels, "health": value}) for value in HEALTH]
        used.append(Sample(g.get("memory_used"), labels))
        total.append(Sample(g.get("memory_total"), labels))
        temperature.append(Sample(g.get("temperature_c"), labels))
        power.append(Sample(g.get("power_w"), labels))
    return [
        Metric("reconcile_gpus_visible", "GPUs the driver shows.", (Sample(len(gpus), {"id": rid}),)),
        Metric("reconcile_gpu_health", "1 for the GPU's memory health (DCGM's memory watch: ECC, retired pages, "
                                       "row remapping), 0 for the others.", tuple(health)),
        Metric("reconcile_gpu_memory_used_bytes", "GPU memory in use.", tuple(used)),
        Metric("reconcile_gpu_memory_total_bytes", "GPU memory in all.", tuple(total)),
        Metric("reconcile_gpu_temperature_celsius", "GPU temperature.", tuple(temperature)),
        Metric("reconcile_gpu_power_watts", "GPU power draw.", tuple(power)),
        Metric("reconcile_gpu_info", "One per GPU, 1, labelled as NVIDIA's dcgm-exporter labels its series (gpu, "
                                     "UUID, pci_bus_id, device, Hostname), and its model.", tuple(info)),
    ]
