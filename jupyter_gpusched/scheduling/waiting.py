"""What a waiting job is told: the binding reason in plain words, and when it should start.

The placing pass (:mod:`.placing`) asks the packer, which names what is short on the node
with the most room; this adds what only the scheduler knows: the free GPUs of every node that
could hold the job (so "8 free in all, but split across nodes" is visible), the processes the
scheduler did not start that hold GPUs of those nodes, and with whom a placed job shares its
GPUs. Expected starts are the backfill's, with what they rest on
(:func:`~jupyter_gpusched.core.estimates.start_estimates`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import numpy as np

from jupyter_gpusched.core import estimates
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.models import Job, JobSpec, Placement
from jupyter_gpusched.core.units import format_size_gb
from jupyter_gpusched.packing import packer
from jupyter_gpusched.packing.inventory import pack_request
from jupyter_gpusched.packing.scoring import hosts

#: Nodes and processes named in one reason, at most.
NAMED = 4


def no_room(
    packer_reason: str | None,
    spec: JobSpec,
    state: packer.ClusterState,
    inventory: Sequence[NodeInventory],
) -> str:
    """The reason a job that fits no node now waits, in plain words.

    The packer's (what is short on the node with the most room), then the whole GPUs free on
    each node that could hold it, and the outside processes on those nodes.
    """
    parts = [f"waiting: {packer_reason or 'no room now'}"]
    request = pack_request(spec)
    cand, _, never = hosts(state, request)
    if never is None and request.gpus:
        up = cand & state.node_up
        whole = ((state.gm == packer.MILLI) & state.valid).sum(axis=1)
        rows = sorted(np.flatnonzero(up), key=lambda i: (-int(whole[i]), state.node_names[i]))
        if len(rows) > 1:
            free = ", ".join(f"{state.node_names[i]} {int(whole[i])}" for i in rows[:NAMED])
            more = f", {len(rows) - NAMED} more" if len(rows) > NAMED else ""
            total = int(whole[up].sum())
            split = (
                f"; {total} in all, split across nodes"
                if total >= request.gpus and request.gpu_mem_gb is None and request.gpu_share >= 1
                else ""
            )
            parts.append(f"whole GPUs free now: {free}{more}{split}")
        names = {state.node_names[i] for i in np.flatnonzero(cand)}
        foreign = foreign_use(inventory, names)
        if foreign:
            parts.append(foreign)
    return "; ".join(parts)


def foreign_use(inventory: Sequence[NodeInventory], nodes: set[str]) -> str:
    """``a100-1 GPU 1 is used by pid 4242 (python, 20G), which the scheduler did not start``."""
    seen = []
    for node in inventory:
        if node.name not in nodes or not node.up:
            continue
        for gpu in node.gpus:
            for proc in gpu.processes:
                if proc.foreign:
                    what = ", ".join(
                        x
                        for x in (proc.name, format_size_gb(round(proc.used_mem_mb / 1024, 1)))
                        if x
                    )
                    seen.append(f"{node.name} GPU {gpu.index} by pid {proc.pid} ({what})")
    if not seen:
        return ""
    more = f" and {len(seen) - NAMED} more" if len(seen) > NAMED else ""
    return "in use by processes the scheduler did not start: " + ", ".join(seen[:NAMED]) + more


def largest(inventory: Sequence[NodeInventory], field: str) -> str | None:
    """What the largest node offers for a capped ``field``, and what to ask instead.

    ``the largest node here has 8 GPUs (a100-0): ask for 8 or fewer`` — said beside a
    per-job cap (64 GPUs) that means nothing on a lab of 8-GPU nodes. None: not a size field,
    or no node known.
    """
    nodes = [n for n in inventory if n.gpus or n.cpus or n.mem_gb]
    if not nodes:
        return None
    if field == "gpus":
        n = max(nodes, key=lambda n: len(n.gpus))
        most = len(n.gpus)
        return f"the largest node here has {most} GPUs ({n.name}): ask for {most} or fewer"
    if field == "gpu_mem_gb":
        gpus = [(g.mem_total_mb / 1024, g.model, n.name) for n in nodes for g in n.gpus]
        if not gpus:
            return None
        gb, model, name = max(gpus, key=lambda g: g[0])
        size = format_size_gb(round(gb, 1))
        return f"the largest GPU here has {size} ({model} on {name}): ask for {size} or less"
    if field == "cpus":
        n = max(nodes, key=lambda n: n.cpus)
        most = f"{n.cpus:g}"
        return f"the largest node here has {most} CPU cores ({n.name}): ask for {most} or fewer"
    if field == "mem_gb":
        n = max(nodes, key=lambda n: n.mem_gb)
        size = format_size_gb(n.mem_gb)
        return f"the largest node here has {size} of host memory ({n.name}): ask for {size} or less"
    return None


def placed(placement: Placement, others: Sequence[Job]) -> str:
    """``placed on a100-0 GPU 0,1`` — and, for a share, how much and with which jobs."""
    if not placement.gpu_indices:  # a CPU-only job: no GPU list, no "0 GPU of each"
        return f"placed on {placement.node}, no GPU"
    text = f"placed on {placement.node} GPU {','.join(map(str, placement.gpu_indices))}"
    if placement.share_per_gpu >= 1:
        return text
    each = (
        format_size_gb(placement.gpu_mem_gb)
        if placement.gpu_mem_gb
        else f"{placement.share_per_gpu:g} GPU"
    )
    text += f", {each} of each"
    mine = set(placement.gpu_indices)
    sharing = sorted(
        {
            (j.id, j.user)
            for j in others
            if j.placement is not None
            and j.placement.node == placement.node
            and mine & set(j.placement.gpu_indices)
        }
    )
    if sharing:
        text += ", sharing them with " + ", ".join(f"job {i} ({u})" for i, u in sharing)
    return text


def expected_starts(
    queue: Sequence[Job],
    floors: Mapping[int, datetime],
    running: Sequence[Job],
    state: packer.ClusterState,
    now: datetime,
    runtime_of: Callable[[Job], estimates.Runtime],
) -> dict[int, estimates.StartEstimate | None]:
    """Expected starts of the jobs left waiting, from the state after this pass's placements.

    Each with its range and what it rests on (:func:`~.estimates.start_estimates`).
    """
    if not queue:
        return {}
    whole = ((state.gm == packer.MILLI) & state.valid & state.node_up[:, None]).sum(axis=1)
    free = {name: float(n) for name, n in zip(state.node_names, whole, strict=True)}
    return estimates.start_estimates(
        queue, running, free, now, runtime_of=runtime_of, not_before=floors
    )
