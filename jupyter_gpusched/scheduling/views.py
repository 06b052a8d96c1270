"""The cluster as the API shows it, shared by the REST API, the widget and the panel.

A pure function over a :class:`ClusterSnapshot`, so the same meaning (GPU states, figures)
reaches every client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from jupyter_gpusched.core import api, windows
from jupyter_gpusched.core.inventory import GpuInfo, NodeInventory
from jupyter_gpusched.core.models import Job, PriorityClass
from jupyter_gpusched.packing import packer


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a cluster view needs, taken at one instant."""

    inventory: list[NodeInventory]
    state: packer.ClusterState
    jobs: list[Job]  # jobs holding GPUs (starting, running)
    queued: int
    window: windows.ActiveWindow
    now: datetime
    # unreachable nodes: name -> (suspect or down, unreachable since, declared down at)
    unreachable: dict[str, tuple[str, datetime, datetime]] = field(default_factory=dict)


def cluster_view(snap: ClusterSnapshot) -> api.Cluster:
    """Nodes with per-GPU state and owners, fragmentation figures and the window in force."""
    holders: dict[tuple[str, int], list[Job]] = {}
    for job in snap.jobs:
        if job.placement is not None:
            for g in job.placement.gpu_indices:
                holders.setdefault((job.placement.node, g), []).append(job)
    nodes = [
        api.Node(
            name=node.name,
            up=node.up,
            error=node.error,
            **_health(snap, node.name),
            cpus=node.cpus,
            mem_gb=node.mem_gb,
            gpus=[
                _gpu_view(node, gpu, holders.get((node.name, gpu.index), [])) for gpu in node.gpus
            ],
        )
        for node in snap.inventory
    ]
    all_gpus = [g for n in nodes for g in n.gpus]
    st = snap.state
    up = st.node_up[:, None] & st.valid
    whole = ((st.gm == packer.MILLI) & up).sum(axis=1)
    partly = up & (st.gm > 0) & (st.gm < packer.MILLI)
    return api.Cluster(
        nodes=nodes,
        metrics=api.Metrics(
            **packer.metrics(st).to_dict(),
            gpus_total=len(all_gpus),
            gpus_free=sum(1 for g in all_gpus if g.state == "free"),
            gpus_stranded=round(float(st.gm[partly].sum()) / packer.MILLI, 3),
            largest_placeable_node=st.node_names[int(whole.argmax())] if whole.max() else None,
        ),
        window=windows.window_view(snap.window),
        queue=api.QueueCounts(queued=snap.queued, running=len(snap.jobs)),
        at=snap.now,
    )


def _health(snap: ClusterSnapshot, name: str) -> dict[str, object]:
    if name not in snap.unreachable:
        return {}
    health, since, down_at = snap.unreachable[name]
    return {"health": health, "unreachable_since": since, "down_at": down_at}


def _gpu_view(node: NodeInventory, gpu: GpuInfo, jobs: list[Job]) -> api.Gpu:
    share = min(1.0, sum(j.placement.share_per_gpu for j in jobs if j.placement))
    reserved_mb = share * gpu.mem_total_mb
    return api.Gpu(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        mem_total_gb=round(gpu.mem_total_mb / 1024, 2),
        mem_used_gb=round(max(gpu.mem_used_mb, reserved_mb) / 1024, 2),
        util_pct=gpu.util_pct,
        power_w=gpu.power_w,
        state=_gpu_state(node, any(p.foreign for p in gpu.processes), jobs),
        share_used=round(share, 3),
        nvlink_peers=list(gpu.nvlink_peers),
        jobs=[
            api.GpuJob(
                id=j.id,
                user=j.user,
                kind=j.spec.kind,
                priority_class=j.spec.priority_class,
                share=j.placement.share_per_gpu if j.placement else 0.0,
            )
            for j in jobs
        ],
    )


def _gpu_state(node: NodeInventory, has_foreign: bool, jobs: list[Job]) -> api.GpuState:
    if jobs:  # on a suspect node too: the job keeps its GPUs until the node is down
        interactive = any(j.spec.priority_class is PriorityClass.INTERACTIVE for j in jobs)
        return "interactive" if interactive else "batch"
    if not node.up:
        return "down"
    return "foreign" if has_foreign else "free"
