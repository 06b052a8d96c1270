"""From what the nodes report to what the packer works on.

The scheduler's inventory (``NodeInventory``) and its running jobs' placements become the
packer's dense arrays here: node shapes, NVLink islands, GPUs held by our jobs, and GPUs
taken by processes we did not start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.models import Job, JobSpec

from . import packer

log = logging.getLogger(__name__)


def attribute_processes(
    inventory: Sequence[NodeInventory], jobs: Sequence[Job]
) -> list[NodeInventory]:
    """The inventory with unmarked GPU processes given to the job their owner holds there.

    A node's probe marks a process with its job from the process's environment; when jobs run
    as their owners it cannot read that (it runs as the scheduler's account) and reports the
    process's user instead. A process of alice's on a GPU that a job of alice's holds is that
    job's, not a foreign one that would take the GPU (or its memory) a second time.
    """
    holders: dict[tuple[str, int, str], int] = {}
    for job in jobs:
        if job.placement is not None:
            for g in job.placement.gpu_indices:
                holders.setdefault((job.placement.node, g, job.user), job.id)
    if not holders:
        return list(inventory)
    out = []
    for node in inventory:
        gpus = []
        for gpu in node.gpus:
            procs = tuple(
                replace(p, job_id=holders[(node.name, gpu.index, p.user)])
                if p.job_id is None and p.user and (node.name, gpu.index, p.user) in holders
                else p
                for p in gpu.processes
            )
            gpus.append(replace(gpu, processes=procs) if procs != gpu.processes else gpu)
        out.append(replace(node, gpus=tuple(gpus)))
    return out


def build_state(
    empty: packer.ClusterState,
    inventory: Sequence[NodeInventory],
    jobs: Sequence[Job],
    node_down: Callable[[str], bool],
) -> packer.ClusterState:
    """The cluster as the packer should see it now.

    ``jobs`` are those holding GPUs (starting, running). A GPU with a process we did not
    start is taken whole when none of our jobs is on it, and by the memory those processes
    use when we share it with them.
    """
    state = empty.copy()
    ours: set[tuple[str, int]] = set()
    for job in jobs:
        p = job.placement
        if p is None or p.node not in state.index:
            continue
        try:
            state.allocate(p, cpus=job.spec.cpus, mem_gb=job.spec.mem_gb)
        except GpuSchedError:  # inventory shrank under a running job; keep counting it
            log.warning("gpusched: job %s no longer fits its recorded placement", job.id)
        ours.update((p.node, g) for g in p.gpu_indices)
    for node in inventory:
        if node.name not in state.index:
            continue
        state.set_node_up(node.name, node.up and not node_down(node.name))
        for gpu in node.gpus:
            foreign = [proc for proc in gpu.processes if proc.foreign]
            if not foreign:
                continue
            if (node.name, gpu.index) not in ours:
                state.occupy_foreign(node.name, gpu.index, 1.0)
            elif gpu.mem_total_mb > 0:
                used_mb = sum(proc.used_mem_mb for proc in foreign)
                state.occupy_foreign(node.name, gpu.index, used_mb / gpu.mem_total_mb)
    return state


def node_shape(node: NodeInventory) -> packer.NodeShape:
    """A node's shape for the packer (its first GPU stands for all: nodes are uniform)."""
    first = node.gpus[0] if node.gpus else None
    return packer.NodeShape(
        name=node.name,
        gpu_model=first.model if first else "",
        gpu_mem_gb=round(first.mem_total_mb / 1024, 3) if first else 0.0,
        gpus=len(node.gpus),
        cpus=node.cpus,
        mem_gb=node.mem_gb,
        nvlink_groups=nvlink_groups(node),
    )


def nvlink_groups(node: NodeInventory) -> tuple[int, ...]:
    """Islands of GPUs joined by NVLink (connected components), one id per GPU."""
    group = {g.index: g.index for g in node.gpus}

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for gpu in node.gpus:
        for peer in gpu.nvlink_peers:
            if peer in group:
                group[root(peer)] = root(gpu.index)
    if all(not g.nvlink_peers for g in node.gpus):
        return ()
    return tuple(root(g.index) for g in node.gpus)


def pack_request(spec: JobSpec) -> packer.PackRequest:
    """What the packer needs to know of a job spec."""
    return packer.PackRequest(
        gpus=spec.gpus,
        gpu_share=spec.gpu_share if spec.gpu_share is not None else 1.0,
        gpu_mem_gb=spec.gpu_mem_gb,
        cpus=spec.cpus,
        mem_gb=spec.mem_gb,
        models=tuple(spec.gpu_models),
    )
