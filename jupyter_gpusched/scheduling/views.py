"""JSON views of jobs and the cluster, shared by the REST API, the widget and the panel.

Pure functions over a :class:`ClusterSnapshot`, so the same meaning (GPU states, colours,
figures) reaches every client.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jupyter_gpusched.cluster.base import NodeInventory
from jupyter_gpusched.core import windows
from jupyter_gpusched.core.models import Job, PriorityClass
from jupyter_gpusched.packing import packer

#: GPU states every client shows, in the order of the legend.
GPU_STATES = ("free", "interactive", "batch", "foreign", "down")


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a cluster view needs, taken at one instant."""

    inventory: list[NodeInventory]
    state: packer.ClusterState
    jobs: list[Job]  # jobs holding GPUs (starting, running)
    queued: int
    window: windows.ActiveWindow
    now: datetime


def job_view(job: Job, position: int | None) -> dict[str, Any]:
    """A job as the API shows it: the model plus its owner and queue position."""
    body = job.model_dump(mode="json")
    body["user"] = job.user
    body["position"] = position
    body["priority_class"] = job.spec.priority_class.value
    return body


def cluster_view(snap: ClusterSnapshot) -> dict[str, Any]:
    """Nodes with per-GPU state and owners, fragmentation figures and the window in force."""
    holders: dict[tuple[str, int], list[Job]] = {}
    for job in snap.jobs:
        if job.placement is not None:
            for g in job.placement.gpu_indices:
                holders.setdefault((job.placement.node, g), []).append(job)
    nodes = []
    for node in snap.inventory:
        gpus = []
        for gpu in node.gpus:
            jobs = holders.get((node.name, gpu.index), [])
            share = min(1.0, sum(j.placement.share_per_gpu for j in jobs if j.placement))
            reserved_mb = share * gpu.mem_total_mb
            gpus.append(
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "model": gpu.model,
                    "mem_total_gb": round(gpu.mem_total_mb / 1024, 2),
                    "mem_used_gb": round(max(gpu.mem_used_mb, reserved_mb) / 1024, 2),
                    "util_pct": gpu.util_pct,
                    "state": _gpu_state(node, any(p.foreign for p in gpu.processes), jobs),
                    "share_used": round(share, 3),
                    "nvlink_peers": list(gpu.nvlink_peers),
                    "jobs": [
                        {
                            "id": j.id,
                            "user": j.user,
                            "kind": j.spec.kind.value,
                            "priority_class": j.spec.priority_class.value,
                            "share": j.placement.share_per_gpu if j.placement else 0.0,
                        }
                        for j in jobs
                    ],
                }
            )
        nodes.append(
            {
                "name": node.name,
                "up": node.up,
                "error": node.error,
                "cpus": node.cpus,
                "mem_gb": node.mem_gb,
                "gpus": gpus,
            }
        )
    figures = packer.metrics(snap.state).to_dict()
    all_gpus = [g for n in nodes for g in n["gpus"]]
    figures["gpus_total"] = len(all_gpus)
    figures["gpus_free"] = sum(1 for g in all_gpus if g["state"] == "free")
    return {
        "nodes": nodes,
        "metrics": figures,
        "window": windows.window_dict(snap.window),
        "queue": {"queued": snap.queued, "running": len(snap.jobs)},
        "at": snap.now.isoformat(),
    }


def _gpu_state(node: NodeInventory, has_foreign: bool, jobs: list[Job]) -> str:
    if not node.up:
        return "down"
    if jobs:
        interactive = any(j.spec.priority_class is PriorityClass.INTERACTIVE for j in jobs)
        return "interactive" if interactive else "batch"
    return "foreign" if has_foreign else "free"
