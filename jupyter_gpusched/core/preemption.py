"""Which running batch jobs to stop: for interactive work by day, to open a node by night.

Pure functions over plain data, like :mod:`.policy`: a job is charged the GPU-seconds of work it
would lose (since its last checkpoint) plus the restart, and the cheapest set that makes room
wins. The packer-facing planning that calls these lives in :mod:`jupyter_gpusched.scheduling.moves`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from .models import Job
from .policy import job_gpus
from .windows import Window, _aware

# --------------------------------------------------------------------------------------------
# Moving batch jobs to open a node


@dataclass(frozen=True)
class Migration:
    """Batch jobs to move off one node so a waiting batch job can start there now."""

    # Node opened for the waiting job.
    node: str
    # Jobs to stop and requeue (they restart on other nodes).
    job_ids: tuple[int, ...]
    # What they lose (GPU-seconds since their last checkpoints, plus restarting).
    lost_gpu_s: float


def choose_migration(
    waiting_gpus: float,
    free_gpus: Mapping[str, float],
    running_batch: Sequence[PreemptCandidate | Job],
    now: datetime,
    reserved: datetime | None,
    plan: Callable[[str, frozenset[int]], bool],
    *,
    window: Window | None = None,
    restart_s: float = 300.0,
    max_nodes: int = 16,
    max_plans: int = 2000,
) -> Migration | None:
    """The cheapest move of batch jobs off one node that lets a waiting job start now, or None.

    Worth it only when what the moved jobs lose (their work since their checkpoints, plus
    ``restart_s`` on each of their GPUs to start again and load the checkpoint) is less than
    the GPU time the move puts to work: the waiting job's GPUs from now until ``reserved``,
    when it would otherwise start (the moved jobs restart at once on GPUs idle now, so the
    cluster runs the waiting job's GPUs more, not fewer). ``plan(node, ids)`` says whether,
    with ``ids`` stopped, the waiting job fits on ``node`` and every stopped job still fits
    somewhere else (the caller asks the packer). Nodes are tried in order of how few GPUs
    must move; at most ``max_nodes`` of them and ``max_plans`` calls of ``plan``.
    """
    if (window is not None and not window.migrate_batch) or reserved is None or waiting_gpus <= 0:
        return None
    now = _aware(now)
    gain = waiting_gpus * (reserved - now).total_seconds()
    if gain <= 0:
        return None
    cands = [c if isinstance(c, PreemptCandidate) else PreemptCandidate.from_job(c)
             for c in running_batch]  # fmt: skip
    by_node: dict[str, list[PreemptCandidate]] = {}
    for c in cands:
        if c.node is not None:
            by_node.setdefault(c.node, []).append(c)
    need = {n: waiting_gpus - free_gpus.get(n, 0.0) for n in by_node}
    nodes = sorted(
        (n for n in by_node if 0 < need[n] <= sum(c.gpus for c in by_node[n]) + 1e-9),
        key=lambda n: (need[n], n),
    )[:max_nodes]
    best: Migration | None = None
    plans = 0
    for node in nodes:
        # The cheapest dozen per node: subsets of more would rarely be cheap enough anyway.
        on = sorted(by_node[node], key=lambda c: (preemption_cost_gpu_s(c, now), c.job_id))[:12]
        for k in range(1, len(on) + 1):
            for group in itertools.combinations(on, k):
                if sum(c.gpus for c in group) + 1e-9 < need[node]:
                    continue
                lost = sum(preemption_cost_gpu_s(c, now) + c.gpus * restart_s for c in group)
                if lost >= gain or (best is not None and lost >= best.lost_gpu_s):
                    continue
                if plans >= max_plans:
                    return best
                plans += 1
                ids = frozenset(c.job_id for c in group)
                if plan(node, ids):
                    best = Migration(node, tuple(sorted(ids)), lost)
    return best


# --------------------------------------------------------------------------------------------
# Preemption


@dataclass(frozen=True)
class PreemptCandidate:
    """A running batch job that could be preempted."""

    # Job id.
    job_id: int
    # GPUs it holds (share-weighted).
    gpus: float
    # When it started (UTC).
    started_at: datetime
    # Last checkpoint it reported (UTC); None = work since start is lost.
    checkpoint_at: datetime | None = None
    # Node it runs on (for moves); None = unknown.
    node: str | None = None

    @classmethod
    def from_job(cls, job: Job) -> PreemptCandidate:
        """From a running job; ``handle['checkpoint_at']`` (ISO) marks its last checkpoint."""
        mark = job.handle.get("checkpoint_at")
        checkpoint = datetime.fromisoformat(mark) if isinstance(mark, str) else None
        node = job.placement.node if job.placement is not None else None
        return cls(job.id, job_gpus(job), job.started_at or job.submitted_at, checkpoint, node)


def preemption_cost_gpu_s(c: PreemptCandidate, now: datetime) -> float:
    """GPU-seconds of work lost by preempting ``c`` now: since its last checkpoint or start."""
    since = max(c.started_at, c.checkpoint_at or c.started_at)
    return c.gpus * max(0.0, (_aware(now) - since).total_seconds())


def choose_preemptions(
    need_gpus: float,
    running_batch: Sequence[PreemptCandidate | Job],
    now: datetime,
    fits: Callable[[frozenset[int]], bool] | None = None,
    *,
    window: Window | None = None,
    max_checks: int = 20000,
) -> list[int] | None:
    """Cheapest set of batch jobs whose release lets the waiting lease fit, or None.

    Cost is the work lost (GPU-seconds), then the number of jobs. ``fits(freed_ids)`` says
    whether the lease could be placed once those jobs are gone (the caller asks the packer);
    the default counts GPUs against ``need_gpus``. ``fits`` must be monotone (freeing more
    never hurts). The search is exact branch-and-bound; past ``max_checks`` calls of ``fits``
    it keeps the best set found or falls back to greedy. None when ``window`` forbids
    preemption or no set helps.
    """
    if (window is not None and not window.preempt_batch) or need_gpus <= 0:
        return None
    cands = [c if isinstance(c, PreemptCandidate) else PreemptCandidate.from_job(c)
             for c in running_batch]  # fmt: skip

    def count_fits(ids: frozenset[int]) -> bool:
        return sum(c.gpus for c in cands if c.job_id in ids) + 1e-9 >= need_gpus

    check = fits or count_fits
    if not cands or not check(frozenset(c.job_id for c in cands)):
        return None
    now = _aware(now)
    cands.sort(key=lambda c: (preemption_cost_gpu_s(c, now), -c.gpus, c.job_id))
    costs = [preemption_cost_gpu_s(c, now) for c in cands]
    best: tuple[float, int, tuple[int, ...]] | None = None
    checks = 0

    def search(i: int, chosen: tuple[int, ...], cost: float) -> None:
        nonlocal best, checks
        if best is not None and (cost, len(chosen)) >= best[:2]:
            return
        if chosen:
            checks += 1
            if check(frozenset(chosen)):
                best = (cost, len(chosen), chosen)
                return  # supersets cost more
        if i >= len(cands) or checks >= max_checks:
            return
        # Remaining candidates together must be able to make it fit at all.
        checks += 1
        if not check(frozenset(chosen) | frozenset(c.job_id for c in cands[i:])):
            return
        search(i + 1, (*chosen, cands[i].job_id), cost + costs[i])
        search(i + 1, chosen, cost)

    search(0, (), 0.0)
    if best is not None:
        return sorted(best[2])
    greedy: list[int] = []
    for c in sorted(cands, key=lambda c: preemption_cost_gpu_s(c, now) / max(c.gpus, 1e-9)):
        greedy.append(c.job_id)
        if check(frozenset(greedy)):
            return sorted(greedy)
    return None
