"""Queue decisions: fair share, quotas, queue order, admission, backfill and preemption.

Pure functions over plain data: ``now`` is always passed in, nothing here reads a clock, a file
or the network, so the scheduler, the tests and the trace replay (``bench/daynight.py``) run the
very same rules. Decisions come back as values with a human-readable ``reason``; nothing is
raised for "not now". Which window's rules hold at an instant is :mod:`.windows`' job.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, time, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from .models import Job, JobState, PriorityClass
from .windows import PolicyConfig, Quota, Window, _aware, _dur, _num, local_boundary

# --------------------------------------------------------------------------------------------
# Fair share and quotas


class UsageRecord(NamedTuple):
    """GPUs one user held over an interval (past or still running); plain tuples work too."""

    # Owner.
    user: str
    # GPUs held (share-weighted: half a GPU counts 0.5).
    gpus: float
    # When the job started (UTC).
    start: datetime
    # When it ended; None = still running.
    end: datetime | None = None


#: What usage functions read: records, or the store's plain ``(user, gpus, start, end)`` tuples.
UsageLike = UsageRecord | tuple[str, float, datetime, datetime | None]


def job_gpus(job: Job) -> float:
    """GPUs a job occupies, share-weighted; memory-sized requests count whole GPUs."""
    return job.spec.gpus * (job.spec.share_per_gpu or 1.0)


def usage_records(jobs: Iterable[Job]) -> list[UsageRecord]:
    """Usage records of every job that ever started."""
    return [
        UsageRecord(j.user, job_gpus(j), j.started_at, j.finished_at)
        for j in jobs
        if j.started_at is not None and j.spec.gpus > 0
    ]


def fair_share_usage(
    records: Iterable[UsageLike], half_life_s: float, now: datetime
) -> dict[str, float]:
    """Decayed GPU-hours per user: each GPU-second counts ``2 ** (-age / half_life_s)``."""
    now = _aware(now)
    rate = math.log(2) / half_life_s
    usage: dict[str, float] = {}
    for user, gpus, r_start, r_end in records:
        end = min(now, r_end or now)
        start = min(r_start, end)
        age_end = (now - end).total_seconds()
        age_start = (now - start).total_seconds()
        # Integral of exp(-rate * age) over the interval, in closed form.
        gpu_s = gpus * (math.exp(-rate * age_end) - math.exp(-rate * age_start)) / rate
        usage[user] = usage.get(user, 0.0) + gpu_s / 3600.0
    return usage


def local_day_start(config: PolicyConfig, now: datetime) -> datetime:
    """Start of ``now``'s local calendar day (UTC), where per-day quotas restart."""
    return local_boundary(now.astimezone(config.tz).date(), time(0), config.tz)


def gpu_hours_today(
    records: Iterable[UsageLike], config: PolicyConfig, now: datetime
) -> dict[str, float]:
    """GPU-hours each user has used since local midnight (running jobs count up to ``now``)."""
    now = _aware(now)
    since = local_day_start(config, now)
    out: dict[str, float] = {}
    for user, gpus, start, end in records:
        lo, hi = max(start, since), min(end or now, now)
        if hi > lo:
            out[user] = out.get(user, 0.0) + gpus * (hi - lo).total_seconds() / 3600.0
    return out


# --------------------------------------------------------------------------------------------
# Queue order and admission


@dataclass(frozen=True)
class QueueOrder:
    """The queue as the scheduler should try it."""

    # Jobs eligible now, best first.
    jobs: list[Job]
    # Jobs not eligible now, by id, with the reason shown to their owner.
    skipped: dict[int, str]


def order_queue(
    queued: Iterable[Job],
    usage: Mapping[str, float],
    now: datetime,
    window: Window,
    *,
    timezone_name: str = "UTC",
) -> QueueOrder:
    """Order queued jobs by (class, decayed usage of their owner, age, id).

    Interactive work goes first when ``window.interactive_first``; held jobs and jobs whose
    ``not_before`` lies ahead are set aside with a reason (times in ``timezone_name``).
    """
    now = _aware(now)
    eligible: list[Job] = []
    skipped: dict[int, str] = {}
    for job in queued:
        if job.state is not JobState.QUEUED:
            skipped[job.id] = f"not queued ({job.state.value})"
        elif job.held:
            skipped[job.id] = "waiting: held by its owner"
        elif job.spec.not_before is not None and job.spec.not_before > now:
            when = _local_time(job.spec.not_before, now, ZoneInfo(timezone_name))
            skipped[job.id] = f"waiting: not before {when}"
        else:
            eligible.append(job)

    def score(job: Job) -> tuple[int, float, datetime, int]:
        interactive = job.spec.priority_class is PriorityClass.INTERACTIVE
        cls = 0 if (interactive or not window.interactive_first) else 1
        return (cls, usage.get(job.user, 0.0), job.submitted_at, job.id)

    return QueueOrder(sorted(eligible, key=score), skipped)


@dataclass(frozen=True)
class AdmissionContext:
    """What admission needs to know about the cluster and its users right now."""

    # The window in force.
    window: Window
    # The current instant (UTC).
    now: datetime
    # GPUs of the cluster (up nodes).
    total_gpus: float
    # Timezone name used to write times in reasons.
    timezone: str = "UTC"
    # GPUs held by interactive leases (share-weighted).
    interactive_gpus: float = 0.0
    # GPUs held by batch jobs (share-weighted).
    batch_gpus: float = 0.0
    # GPUs each user holds now.
    user_gpus: Mapping[str, float] = field(default_factory=dict)
    # GPU-hours each user has used since local midnight.
    user_gpu_hours_today: Mapping[str, float] = field(default_factory=dict)
    # Quotas by user; users not listed get default_quota.
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    # Quota of users not in quotas.
    default_quota: Quota = Quota()

    @classmethod
    def build(
        cls,
        *,
        config: PolicyConfig,
        window: Window,
        now: datetime,
        total_gpus: float,
        running: Iterable[Job],
        usage_records: Iterable[UsageLike],
    ) -> AdmissionContext:
        """Count what running jobs hold and what each user used today."""
        ctx = cls(
            window=window, now=_aware(now), total_gpus=total_gpus, timezone=config.timezone,
            user_gpu_hours_today=gpu_hours_today(usage_records, config, now),
            quotas=dict(config.quotas), default_quota=config.default_quota,
        )  # fmt: skip
        for job in running:
            ctx = add_to_context(ctx, job)
        return ctx

    def quota_for(self, user: str) -> Quota:
        """The quota that applies to ``user``."""
        return self.quotas.get(user, self.default_quota)


def add_to_context(ctx: AdmissionContext, job: Job) -> AdmissionContext:
    """``ctx`` with ``job`` counted as holding its GPUs (after the scheduler starts it)."""
    gpus = job_gpus(job)
    interactive = job.spec.priority_class is PriorityClass.INTERACTIVE
    users = dict(ctx.user_gpus)
    users[job.user] = users.get(job.user, 0.0) + gpus
    return replace(
        ctx,
        interactive_gpus=ctx.interactive_gpus + (gpus if interactive else 0.0),
        batch_gpus=ctx.batch_gpus + (0.0 if interactive else gpus),
        user_gpus=users,
    )


@dataclass(frozen=True)
class Admission:
    """A yes/no decision with the reason shown to the user; truthy when ok."""

    # True when the policy lets the job start.
    ok: bool
    # Why it waits ("waiting: ..."), None when ok.
    reason: str | None = None
    # Stop the job after this long (the window's batch limit or its declared runtime).
    runtime_limit_s: float | None = None

    def __bool__(self) -> bool:
        return self.ok


def admit(job: Job, ctx: AdmissionContext) -> Admission:
    """Check held / not-before / quotas / the window's class shares, in that order.

    Placement is not checked: that is the packer's; this says whether the rules allow it.
    """
    w, now, gpus = ctx.window, _aware(ctx.now), job_gpus(job)
    tz = ZoneInfo(ctx.timezone)
    if job.held:
        return Admission(False, "waiting: held by its owner")
    if job.spec.not_before is not None and job.spec.not_before > now:
        return Admission(False, f"waiting: not before {_local_time(job.spec.not_before, now, tz)}")
    q = ctx.quota_for(job.user)
    held = ctx.user_gpus.get(job.user, 0.0)
    if q.gpus_at_once is not None and held + gpus > q.gpus_at_once + 1e-9:
        return Admission(
            False, f"waiting: quota ({_num(held)} of {_num(q.gpus_at_once)} GPUs in use)"
        )
    used_h = ctx.user_gpu_hours_today.get(job.user, 0.0)
    if q.gpu_hours_per_day is not None and gpus > 0 and used_h >= q.gpu_hours_per_day:
        return Admission(
            False,
            f"waiting: quota ({used_h:.1f} of {_num(q.gpu_hours_per_day)} GPU-hours used today)",
        )
    if job.spec.priority_class is PriorityClass.INTERACTIVE:
        cap = w.interactive_max_share * ctx.total_gpus
        if ctx.interactive_gpus + gpus > cap + 1e-9:
            return Admission(
                False,
                f"waiting: {w.name} window lets interactive work take at most "
                f"{w.interactive_max_share:.0%} of GPUs ({_num(ctx.interactive_gpus)} of "
                f"{_num(cap)} in use)",
            )
        return Admission(True, runtime_limit_s=job.spec.max_runtime_s)
    if ctx.batch_gpus + gpus > ctx.total_gpus - reserved_gpus(w, ctx.total_gpus) + 1e-9:
        return Admission(
            False,
            f"waiting: {w.name} window reserves {w.interactive_reserved_share:.0%} of GPUs "
            "for interactive work",
        )
    limit = w.batch_max_runtime_s
    declared = job.spec.max_runtime_s
    if limit is not None and declared is not None and declared > limit:
        return Admission(
            False,
            f"waiting: declares {_dur(declared)} runtime, {w.name} window starts batch jobs "
            f"of at most {_dur(limit)}",
        )
    limits = [x for x in (limit, declared) if x is not None]
    return Admission(True, runtime_limit_s=min(limits) if limits else None)


def reserved_gpus(window: Window, total_gpus: float) -> int:
    """Whole GPUs batch may not take in ``window`` (the reserved share, rounded up)."""
    return math.ceil(window.interactive_reserved_share * total_gpus - 1e-9)


def batch_runtime_limit_s(window: Window) -> float | None:
    """Runtime limit of batch jobs started in ``window``; None = no limit."""
    return window.batch_max_runtime_s


def lease_idle_expired(lease: Job, window: Window, now: datetime) -> bool:
    """True when a running lease has been idle longer than the window allows."""
    if window.lease_idle_timeout_s is None or lease.state is not JobState.RUNNING:
        return False
    last = lease.last_activity_at or lease.started_at
    if last is None:
        return False
    return (_aware(now) - last).total_seconds() >= window.lease_idle_timeout_s


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


# --------------------------------------------------------------------------------------------
# Times in reasons


def _local_time(at: datetime, now: datetime, tz: ZoneInfo) -> str:
    local = at.astimezone(tz)
    if local.date() == now.astimezone(tz).date():
        return local.strftime("%H:%M")
    return local.strftime("%a %Y-%m-%d %H:%M")


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
