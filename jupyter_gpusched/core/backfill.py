"""Backfill: when the head of the queue is expected to start, and who may start before it.

Runtimes are declared (``max_runtime_s``) or estimated from the user's finished jobs; running
jobs' expected ends give the head's reservation, and a job may jump ahead only where it does
not delay that reservation. Pure functions; ``now`` is always passed in.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from .models import Job
from .policy import Admission, job_gpus
from .windows import _aware

# --------------------------------------------------------------------------------------------
# Backfill


def runtime_s(job: Job) -> float | None:
    """How long a finished job ran, None when it never started or has not ended."""
    if job.started_at is None or job.finished_at is None:
        return None
    return max(0.0, (job.finished_at - job.started_at).total_seconds())


def estimate_runtime_s(
    job: Job,
    history: Iterable[Job | float],
    *,
    percentile: float = 90.0,
    default_s: float = 4 * 3600.0,
) -> float:
    """Declared ``max_runtime_s``, else a percentile of the owner's past runtimes, else default.

    ``history`` holds the owner's finished jobs (or their runtimes in seconds).
    """
    if job.spec.max_runtime_s is not None:
        return job.spec.max_runtime_s
    past = sorted(
        x for x in (h if isinstance(h, (int, float)) else runtime_s(h) for h in history) if x
    )
    if not past:
        return default_s
    rank = max(1, math.ceil(percentile / 100.0 * len(past)))  # nearest-rank percentile
    return float(past[rank - 1])


@dataclass(frozen=True)
class Release:
    """GPUs a running job will free, and when it is expected to."""

    # Node the GPUs are on ("*" when placement is count-based).
    node: str
    # GPUs freed.
    gpus: float
    # Expected end (UTC): start + declared or estimated runtime.
    at: datetime


@dataclass(frozen=True)
class Reservation:
    """Where and when the head of the queue is expected to start."""

    # Earliest expected start (UTC); None = not even all running jobs ending would do.
    start: datetime | None
    # Node reserved for it ("*" when placement is count-based).
    node: str | None
    # GPUs still free on that node at ``start`` beyond what the head needs.
    spare_gpus: float


def releases_of(
    running: Iterable[Job], estimate: Callable[[Job], float], now: datetime
) -> list[Release]:
    """Expected releases of running jobs: start + estimated runtime, never before ``now``."""
    out = []
    for job in running:
        start = job.started_at or now
        end = max(_aware(now), start + timedelta(seconds=estimate(job)))
        node = job.placement.node if job.placement is not None else "*"
        out.append(Release(node, job_gpus(job), end))
    return out


def reserved_start(
    head: Job | float,
    running: Iterable[Job | Release],
    free_gpus: float | Mapping[str, float],
    now: datetime,
    *,
    estimate: Callable[[Job], float] | None = None,
) -> Reservation:
    """Earliest time some node has the head's GPUs free, from running jobs' expected ends.

    ``free_gpus`` is per node, or one number for count-based placement (node "*").
    ``estimate`` gives a running job's expected runtime (default: declared, else 4 h).
    """
    now = _aware(now)
    need = job_gpus(head) if isinstance(head, Job) else float(head)
    free = dict(free_gpus) if isinstance(free_gpus, Mapping) else {"*": float(free_gpus)}
    guess = estimate or (lambda j: estimate_runtime_s(j, ()))
    rels = [r for r in running if isinstance(r, Release)]
    rels += releases_of((j for j in running if isinstance(j, Job)), guess, now)
    if not isinstance(free_gpus, Mapping):
        rels = [replace(r, node="*") for r in rels]
    best = _first_fit(free, need)
    if best is not None:
        return Reservation(now, best, free[best] - need)
    for rel in sorted(rels, key=lambda r: (r.at, r.node)):
        free[rel.node] = free.get(rel.node, 0.0) + rel.gpus
        if free[rel.node] + 1e-9 >= need:
            return Reservation(max(now, rel.at), rel.node, free[rel.node] - need)
    return Reservation(None, None, 0.0)


def _first_fit(free: Mapping[str, float], gpus: float) -> str | None:
    fitting = [n for n, f in free.items() if f + 1e-9 >= gpus]
    return min(fitting, key=lambda n: (free[n], n)) if fitting else None


def backfill_allowed(
    candidate: Job,
    reservation: Reservation | datetime | None,
    now: datetime,
    runtime_estimate_s: float,
    node: str | None = None,
) -> Admission:
    """Whether starting ``candidate`` (on ``node``, if known) cannot delay the reserved head.

    Allowed when there is no reservation, the job lands on another node, fits in the reserved
    node's spare GPUs, or is expected to end by the reserved start. A bare datetime stands for
    a reservation with no spare GPUs on an unknown node (the conservative reading).
    """
    if isinstance(reservation, datetime):
        reservation = Reservation(reservation, None, 0.0)
    if reservation is None or reservation.start is None:
        return Admission(True)
    if node is not None and reservation.node not in (None, "*", node):
        return Admission(True)
    if job_gpus(candidate) <= reservation.spare_gpus + 1e-9:
        return Admission(True)
    if _aware(now) + timedelta(seconds=runtime_estimate_s) <= reservation.start:
        return Admission(True)
    return Admission(
        False,
        "waiting: would delay the queue's head, due to start at "
        f"{reservation.start.isoformat(timespec='minutes')}",
    )


def consume_spare(
    reservation: Reservation,
    gpus: float,
    *,
    node: str | None = None,
    ends_at: datetime | None = None,
) -> Reservation:
    """The reservation after a job started beside it (on ``node``, expected to end ``ends_at``).

    Only a job that still holds the reserved node's GPUs at the reserved start takes from its
    spare GPUs: one on another node, or expected to end by then, leaves them alone. Unknown
    node or end count against the spare (the conservative reading).
    """
    if reservation.start is None:
        return reservation
    if node is not None and reservation.node not in (None, "*", node):
        return reservation
    if ends_at is not None and _aware(ends_at) <= reservation.start:
        return reservation
    return replace(reservation, spare_gpus=max(0.0, reservation.spare_gpus - gpus))


# --------------------------------------------------------------------------------------------
# Expected starts of the whole queue

#: Waiting jobs given an expected start, at most (the rest: None); keeps a pass cheap.
MAX_EXPECTED = 200


def expected_starts(
    queue: Sequence[Job],
    running: Iterable[Job | Release],
    free_gpus: Mapping[str, float],
    now: datetime,
    *,
    estimate: Callable[[Job], float],
    not_before: Mapping[int, datetime] | None = None,
) -> dict[int, datetime | None]:
    """When each waiting job is expected to start, in queue order (None: cannot tell).

    The head gets :func:`reserved_start`'s answer; each later job starts at the earliest
    instant some node has its GPUs free for its whole estimated runtime, once the running
    jobs end as estimated and the jobs ahead of it have taken theirs (a conservative
    backfill profile). ``not_before`` holds a lower bound per job id (a window that opens, a
    not-before time). ``estimate`` is the backfill's runtime estimate.
    """
    placed = expected_placements(
        queue, running, free_gpus, now, estimate=estimate, not_before=not_before
    )
    return {job_id: start for job_id, (start, _) in placed.items()}


def expected_placements(
    queue: Sequence[Job],
    running: Iterable[Job | Release],
    free_gpus: Mapping[str, float],
    now: datetime,
    *,
    estimate: Callable[[Job], float],
    not_before: Mapping[int, datetime] | None = None,
) -> dict[int, tuple[datetime | None, str | None]]:
    """:func:`expected_starts` with the node each start is expected on (what it waits for)."""
    now = _aware(now)
    running = list(running)
    rels = [r for r in running if isinstance(r, Release)]
    rels += releases_of((j for j in running if isinstance(j, Job)), estimate, now)
    # Free GPUs per node as a step function: node -> [(instant, net change)], by instant.
    steps: dict[str, list[tuple[datetime, float]]] = {n: [] for n in free_gpus}
    for rel in rels:
        _add_step(steps.setdefault(rel.node, []), rel.at, rel.gpus)
    out: dict[int, tuple[datetime | None, str | None]] = {}
    for i, job in enumerate(queue):
        if i >= MAX_EXPECTED:
            out[job.id] = (None, None)
            continue
        need, runtime_s = job_gpus(job), estimate(job)
        floor = max(now, (not_before or {}).get(job.id, now))
        if i == 0 and floor == now:
            res = reserved_start(job, running, free_gpus, now, estimate=estimate)
            start, node = res.start, res.node
        else:
            start, node = _profile_fit(need, runtime_s, steps, free_gpus, floor)
        out[job.id] = (start, node)
        if start is not None and node in steps and need > 0:
            _add_step(steps[node], start, -need)
            _add_step(steps[node], start + timedelta(seconds=runtime_s), need)
    return out


def _add_step(seq: list[tuple[datetime, float]], at: datetime, change: float) -> None:
    """Add ``change`` to the node's free GPUs from ``at`` on, netted with others at ``at``.

    One entry per instant: a job that ends as another starts leaves the level as it was (not
    a dip to both held), and many jobs expected at one instant (a not-before time they
    share) keep the profile short instead of one step each to walk for every later job.
    """
    i = bisect_left(seq, (at, -math.inf))
    if i < len(seq) and seq[i][0] == at:
        seq[i] = (at, seq[i][1] + change)
    else:
        seq.insert(i, (at, change))


def _profile_fit(
    need: float,
    runtime_s: float,
    steps: Mapping[str, Sequence[tuple[datetime, float]]],
    free: Mapping[str, float],
    floor: datetime,
) -> tuple[datetime | None, str | None]:
    """Earliest instant >= ``floor`` some node keeps ``need`` GPUs free for ``runtime_s``.

    Ties go to the node with the fewest GPUs free now (best fit), then by name. Each node's
    candidate starts are walked in time order and only until one fits or passes the best so
    far: the profile grows by two steps per job placed in it, and building every candidate
    first made a queue of waiting jobs cost the square of its length.
    """
    best: tuple[datetime, float, str] | None = None
    span = timedelta(seconds=runtime_s)
    for node, seq in steps.items():
        k = bisect_right(seq, (floor, math.inf))  # the steps at or before the floor
        level = free.get(node, 0.0) + math.fsum(change for _, change in seq[:k])
        for t, at_t, after in _starts(seq, floor, level, k):
            if best is not None and t > best[0]:
                break
            if at_t + 1e-9 < need:
                continue
            lowest, lvl, end = at_t, at_t, t + span
            for m in range(after, len(seq)):
                at, change = seq[m]
                if at >= end:
                    break
                lvl += change
                lowest = min(lowest, lvl)
            if lowest + 1e-9 >= need:
                key = (t, free.get(node, 0.0), node)
                best = key if best is None or key < best else best
                break
    return (best[0], best[2]) if best is not None else (None, None)


def _starts(
    seq: Sequence[tuple[datetime, float]], floor: datetime, level: float, k: int
) -> Iterator[tuple[datetime, float, int]]:
    """A node's possible starts from ``floor``: (instant, GPUs free then, next step's index).

    A start can only be at the floor or where the node's level changes (after all the steps
    of one instant).
    """
    yield floor, level, k
    for m in range(k, len(seq)):
        level += seq[m][1]
        if m + 1 == len(seq) or seq[m + 1][0] > seq[m][0]:
            yield seq[m][0], level, m + 1
