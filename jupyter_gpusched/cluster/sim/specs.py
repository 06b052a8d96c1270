"""Shapes of simulated nodes and the GPU state file their simulated NVML reads.

The default lab: 2 x 8 A100-80GB in NVLink pairs, 4 x V100-32GB and 2 x T4.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SimNodeSpec:
    """One simulated node: its GPUs and host resources."""

    name: str
    gpu_model: str  # short model name, a key of GPU_MODELS, e.g. "A100-80GB"
    gpu_mem_gb: float  # memory of each GPU
    gpus: int
    cpus: int
    mem_gb: float  # host memory
    nvlink_pairs: bool = False  # GPUs 0-1, 2-3, ... joined by NVLink


@dataclass(frozen=True)
class _GpuModel:
    nvml_name: str  # what nvmlDeviceGetName answers
    nvlink_links: int  # NVLink links per GPU when the node has NVLink
    power_idle_mw: int
    power_max_mw: int


GPU_MODELS: dict[str, _GpuModel] = {
    "A100-80GB": _GpuModel("NVIDIA A100-SXM4-80GB", 12, 55_000, 400_000),
    "A100-40GB": _GpuModel("NVIDIA A100-SXM4-40GB", 12, 50_000, 400_000),
    "H100-80GB": _GpuModel("NVIDIA H100 80GB HBM3", 18, 70_000, 700_000),
    "V100-32GB": _GpuModel("Tesla V100-SXM2-32GB", 6, 40_000, 300_000),
    "T4": _GpuModel("Tesla T4", 0, 10_000, 70_000),
}
"""NVML names and power range of the models the simulator knows; others get a generic entry."""

DEFAULT_SIM_NODES: tuple[SimNodeSpec, ...] = (
    SimNodeSpec("a100-0", "A100-80GB", 80, 8, cpus=64, mem_gb=512, nvlink_pairs=True),
    SimNodeSpec("a100-1", "A100-80GB", 80, 8, cpus=64, mem_gb=512, nvlink_pairs=True),
    SimNodeSpec("v100-0", "V100-32GB", 32, 4, cpus=32, mem_gb=256),
    SimNodeSpec("t4-0", "T4", 16, 2, cpus=16, mem_gb=64),
)
"""The cluster a fresh install runs on: 2 x 8 A100-80GB (NVLink pairs), 4 V100, 2 T4."""

# Buses of the eight GPUs of a DGX A100; further GPUs continue in steps of 8.
_PCI_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


def gpu_state(spec: SimNodeSpec) -> dict[str, Any]:
    """The initial ``gpus.json`` content of a node: static GPU facts, no foreign processes."""
    model = GPU_MODELS.get(
        spec.gpu_model,
        _GpuModel(f"NVIDIA {spec.gpu_model}", 12 if spec.nvlink_pairs else 0, 50_000, 300_000),
    )
    gpus = []
    for i in range(spec.gpus):
        peer = i ^ 1 if spec.nvlink_pairs and (i ^ 1) < spec.gpus else None
        bus = _PCI_BUSES[i] if i < len(_PCI_BUSES) else 0xC0 + 8 * (i - len(_PCI_BUSES))
        gpus.append(
            {
                "index": i,
                # Stable per node name and index, so a restarted sim reports the same UUIDs.
                "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpusched-sim/{spec.name}/{i}')}",
                "name": model.nvml_name,
                "mem_total_mb": spec.gpu_mem_gb * 1024,
                "pci_bus_id": f"00000000:{bus % 256:02X}:00.0",
                "nvlink_links": model.nvlink_links if spec.nvlink_pairs else 0,
                "nvlink_peer": peer,
                "power_idle_mw": model.power_idle_mw,
                "power_max_mw": model.power_max_mw,
            }
        )
    return {
        "version": 1,
        "node": spec.name,
        "cpus": spec.cpus,
        "mem_gb": spec.mem_gb,
        "gpus": gpus,
        "foreign": [],
    }
