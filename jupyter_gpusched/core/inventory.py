"""What a node reports it has: its GPUs, the processes on them, its CPUs and memory.

Plain frozen dataclasses that cluster backends fill in and the scheduler and the pure packer
read; they live in ``core`` so that neither of those imports the cluster layer for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class GpuProcess:
    """A compute process seen on a GPU by NVML / nvidia-smi."""

    pid: int
    used_mem_mb: float
    name: str = ""
    job_id: int | None = None  # the gpusched job it belongs to; None = someone else's
    user: str | None = None  # the account it runs as, when its job could not be read

    @property
    def foreign(self) -> bool:
        """True when the scheduler did not start this process: its GPU counts as occupied."""
        return self.job_id is None


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the node's agent reports it."""

    index: int
    uuid: str
    model: str  # short model name, e.g. "A100-80GB", "V100-32GB", "T4"
    mem_total_mb: float
    mem_used_mb: float = 0.0
    util_pct: float = 0.0
    power_w: float | None = None
    nvlink_peers: tuple[int, ...] = ()  # indices of GPUs reachable over NVLink
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class NodeInventory:
    """What one node has, as of ``probed_at``."""

    name: str
    gpus: tuple[GpuInfo, ...]
    cpus: float
    mem_gb: float
    up: bool = True
    error: str | None = None  # why the node is down / the probe failed
    probed_at: datetime | None = None
