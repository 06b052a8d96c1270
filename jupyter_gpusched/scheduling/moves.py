"""Which running batch jobs to stop, and where things then go: the policy asks, the packer answers.

Two moves, both pure (no I/O; the scheduler stops the jobs):

* preemption by day: the cheapest set of batch jobs whose GPUs let a waiting lease start;
* migration by night: batch jobs moved off one node (stopped at their checkpoints, requeued,
  restarted on GPUs idle elsewhere) so a batch job too big for any node's free GPUs starts
  now instead of when enough work happens to end on one node.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from jupyter_gpusched.core import policy, preemption
from jupyter_gpusched.core.models import Job, PriorityClass
from jupyter_gpusched.core.windows import Window
from jupyter_gpusched.packing import packer
from jupyter_gpusched.packing.inventory import pack_request


def _without(state: packer.ClusterState, jobs: Sequence[Job]) -> packer.ClusterState:
    """A copy of ``state`` with ``jobs``' GPUs, CPUs and memory given back."""
    trial = state.copy()
    for job in jobs:
        p = job.placement
        if p is not None and p.node in trial.index:
            trial.release(p.node, p.gpu_indices, p.share_per_gpu,
                          cpus=job.spec.cpus, mem_gb=job.spec.mem_gb)  # fmt: skip
    return trial


def batch_of(running: Sequence[Job]) -> list[Job]:
    """The running batch jobs (the only ones a move may stop)."""
    return [j for j in running if j.spec.priority_class is PriorityClass.BATCH]


def plan_preemption(
    state: packer.ClusterState,
    lease: Job,
    running: Sequence[Job],
    now: datetime,
    *,
    packer_policy: str,
) -> list[int] | None:
    """Batch jobs to preempt so ``lease`` fits (cheapest in work lost), or None."""
    batch = batch_of(running)
    by_id = {j.id: j for j in batch}
    request = pack_request(lease.spec)

    def fits(freed: frozenset[int]) -> bool:
        trial = _without(state, [by_id[i] for i in freed])
        return packer.pack(trial, request, policy=packer_policy).node is not None

    return preemption.choose_preemptions(policy.job_gpus(lease), batch, now, fits)


def plan_migration(
    state: packer.ClusterState,
    waiting: Job,
    running: Sequence[Job],
    now: datetime,
    reserved: datetime | None,
    *,
    window: Window,
    packer_policy: str,
) -> preemption.Migration | None:
    """Batch jobs to move off one node so ``waiting`` starts there now, or None.

    A plan holds when, with the moved jobs gone, ``waiting`` fits on the node and then every
    moved job fits somewhere (largest first, where the packer would put it).
    """
    batch = [j for j in batch_of(running) if j.placement is not None]
    by_id = {j.id: j for j in batch}
    request = pack_request(waiting.spec)
    whole = (state.gm == packer.MILLI) & state.valid & state.node_up[:, None]
    free = {name: float(n) for name, n in zip(state.node_names, whole.sum(axis=1), strict=True)}

    def plan(node: str, ids: frozenset[int]) -> bool:
        moved = sorted((by_id[i] for i in ids), key=lambda j: -policy.job_gpus(j))
        trial = _without(state, moved)
        reply = packer.pack(trial, request, policy=packer_policy, only=node)
        if reply.node is None:
            return False
        trial.allocate(reply, cpus=waiting.spec.cpus, mem_gb=waiting.spec.mem_gb)
        for job in moved:
            again = packer.pack(trial, pack_request(job.spec), policy=packer_policy)
            if again.node is None:
                return False
            trial.allocate(again, cpus=job.spec.cpus, mem_gb=job.spec.mem_gb)
        return True

    return preemption.choose_migration(
        policy.job_gpus(waiting), free, batch, now, reserved, plan, window=window
    )
