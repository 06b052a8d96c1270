"""Queue decisions: fair share, quotas, queue order, admission, backfill and preemption.

Pure functions over plain data: ``now`` is always passed in, nothing here reads a clock, a file
or the network, so the scheduler, the tests and the trace replay (``bench/daynight.py``) run the
very same rules. Decisions come back as values with a human-readable ``reason``; nothing is
raised for "not now". Which window's rules hold at an instant is :mod:`.windows`' job.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, time, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from .limits import LimitPolicy, running_reason
from .models import Job, JobState, PriorityClass
from .units import format_duration_s
from .windows import PolicyConfig, Quota, Window, _aware, _num, local_boundary

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

#: Where a job goes in the queue: (class, owner's decayed usage, submitted at, id); unique.
OrderKey = tuple[int, float, datetime, int]


def order_key(job: Job, usage: Mapping[str, float], window: Window) -> OrderKey:
    """``job``'s place in the queue: lower goes first (see :func:`order_queue`)."""
    interactive = job.spec.priority_class is PriorityClass.INTERACTIVE
    cls = 0 if (interactive or not window.interactive_first) else 1
    return (cls, usage.get(job.user, 0.0), job.submitted_at, job.id)


@dataclass(frozen=True)
class QueueOrder:
    """The queue as the scheduler should try it."""

    # Jobs eligible now, best first.
    jobs: list[Job]
    # Jobs not eligible now, by id, with the reason shown to their owner.
    skipped: dict[int, str]
    # Each eligible job's place in the order (:func:`order_key`), aligned with ``jobs``.
    keys: list[OrderKey] = field(default_factory=list)


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
    tz = ZoneInfo(timezone_name)
    shown: dict[datetime, str] = {}  # many jobs share a not-before time (an array's)
    for job in queued:
        if job.state is not JobState.QUEUED:
            skipped[job.id] = f"not queued ({job.state.value})"
        elif job.held:
            skipped[job.id] = held_reason(job)
        elif job.spec.not_before is not None and job.spec.not_before > now:
            at = job.spec.not_before
            if (when := shown.get(at)) is None:
                when = shown[at] = _local_time(at, now, tz)
            skipped[job.id] = f"waiting: not before {when}"
        else:
            eligible.append(job)
    # keys are unique (the id is in them): jobs themselves are never compared
    keyed = sorted((order_key(job, usage, window), job) for job in eligible)
    return QueueOrder([job for _, job in keyed], skipped, [key for key, _ in keyed])


def held_reason(job: Job) -> str:
    """Why a held job waits: what whoever held it said, else that its owner held it.

    Its owner, the scheduler when a pass failed on it, a big array's submit while the rest of
    it is written: each sets the reason when it holds the job.
    """
    return job.reason or "waiting: held by its owner"


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
    # Jobs each user has starting or running (for the running_jobs limit).
    user_jobs: Mapping[str, int] = field(default_factory=dict)
    # The per-user limits (:mod:`.limits`); only running_jobs is admission's.
    limits: LimitPolicy = LimitPolicy()
    # Who the users are, for their limits: user -> (groups, admin); others: no groups.
    callers: Mapping[str, tuple[frozenset[str], bool]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        *,
        config: PolicyConfig,
        window: Window,
        now: datetime,
        total_gpus: float,
        running: Iterable[Job],
        hours_today: Mapping[str, float],
        callers: Mapping[str, tuple[frozenset[str], bool]] | None = None,
    ) -> AdmissionContext:
        """Count what running jobs hold.

        ``hours_today``: each user's GPU-hours since local midnight (:func:`gpu_hours_today`,
        or what :class:`~.usage.UsageTally` keeps across passes). ``callers``: who users are,
        as their requests said (their limits may depend on it).
        """
        ctx = cls(
            window=window, now=_aware(now), total_gpus=total_gpus, timezone=config.timezone,
            user_gpu_hours_today=dict(hours_today),
            quotas=dict(config.quotas), default_quota=config.default_quota,
            limits=config.limits, callers=dict(callers or {}),
        )  # fmt: skip
        for job in running:
            ctx = add_to_context(ctx, job)
        return ctx

    def quota_for(self, user: str) -> Quota:
        """The quota that applies to ``user``."""
        return self.quotas.get(user, self.default_quota)

    def running_limit(self, user: str) -> int | None:
        """How many jobs ``user`` may have starting or running at once; None = no limit."""
        if self.limits.off:
            return None
        groups, admin = self.callers.get(user, (frozenset(), False))
        limit = self.limits.for_user(user, groups, admin).limits.running_jobs
        return None if limit is None else int(limit)


def add_to_context(ctx: AdmissionContext, job: Job) -> AdmissionContext:
    """``ctx`` with ``job`` counted as holding its GPUs (after the scheduler starts it)."""
    gpus = job_gpus(job)
    interactive = job.spec.priority_class is PriorityClass.INTERACTIVE
    users = dict(ctx.user_gpus)
    users[job.user] = users.get(job.user, 0.0) + gpus
    counts = dict(ctx.user_jobs)
    counts[job.user] = counts.get(job.user, 0) + 1
    return replace(
        ctx,
        interactive_gpus=ctx.interactive_gpus + (gpus if interactive else 0.0),
        batch_gpus=ctx.batch_gpus + (0.0 if interactive else gpus),
        user_gpus=users,
        user_jobs=counts,
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
    # What holds it back: "held", "not_before", "quota", "limit" or "window" (None when ok).
    blocked_by: str | None = None

    def __bool__(self) -> bool:
        return self.ok


def admit(job: Job, ctx: AdmissionContext) -> Admission:
    """Check held / not-before / quotas / running jobs / the window's class shares, in order.

    Placement is not checked: that is the packer's; this says whether the rules allow it.
    """
    w, now, gpus = ctx.window, _aware(ctx.now), job_gpus(job)
    tz = ZoneInfo(ctx.timezone)
    if job.held:
        return Admission(False, held_reason(job), blocked_by="held")
    if job.spec.not_before is not None and job.spec.not_before > now:
        when = _local_time(job.spec.not_before, now, tz)
        return Admission(False, f"waiting: not before {when}", blocked_by="not_before")
    q = ctx.quota_for(job.user)
    held = ctx.user_gpus.get(job.user, 0.0)
    if q.gpus_at_once is not None and held + gpus > q.gpus_at_once + 1e-9:
        return Admission(
            False,
            f"waiting: quota ({_num(held)} of {_num(q.gpus_at_once)} GPUs in use)",
            blocked_by="quota",
        )
    used_h = ctx.user_gpu_hours_today.get(job.user, 0.0)
    if q.gpu_hours_per_day is not None and gpus > 0 and used_h >= q.gpu_hours_per_day:
        return Admission(
            False,
            f"waiting: quota ({used_h:.1f} of {_num(q.gpu_hours_per_day)} GPU-hours used today)",
            blocked_by="quota",
        )
    running_limit = ctx.running_limit(job.user)
    if running_limit is not None:
        running = ctx.user_jobs.get(job.user, 0)
        if running >= running_limit:
            reason = running_reason(job.user, running, running_limit)
            return Admission(False, reason, blocked_by="limit")
    if job.spec.priority_class is PriorityClass.INTERACTIVE:
        cap = w.interactive_max_share * ctx.total_gpus
        if ctx.interactive_gpus + gpus > cap + 1e-9:
            return Admission(
                False,
                f"waiting: {w.name} window lets interactive work take at most "
                f"{w.interactive_max_share:.0%} of GPUs ({_num(ctx.interactive_gpus)} of "
                f"{_num(cap)} in use)",
                blocked_by="window",
            )
        return Admission(True, runtime_limit_s=job.spec.max_runtime_s)
    reserved = reserved_gpus(w, ctx.total_gpus)
    free = ctx.total_gpus - ctx.batch_gpus - ctx.interactive_gpus
    # The window is the cause only where the GPUs are free but kept for interactive work;
    # where they are not free at all, the packer's reason (which GPUs, on which nodes) is.
    if ctx.batch_gpus + gpus > ctx.total_gpus - reserved + 1e-9 and gpus <= free + 1e-9:
        return Admission(
            False,
            f"waiting: the {w.name} window reserves {w.interactive_reserved_share:.0%} of GPUs "
            f"({reserved}) for interactive work; batch jobs hold {_num(ctx.batch_gpus)} of the "
            f"other {_num(ctx.total_gpus - reserved)}",
            blocked_by="window",
        )
    limit = w.batch_max_runtime_s
    declared = job.spec.max_runtime_s
    if limit is not None and declared is not None and declared > limit:
        return Admission(
            False,
            f"waiting: declares {format_duration_s(declared)} runtime, {w.name} window starts "
            f"batch jobs of at most {format_duration_s(limit)}",
            blocked_by="window",
        )
    limits = [x for x in (limit, declared) if x is not None]
    return Admission(True, runtime_limit_s=min(limits) if limits else None)


def reserved_gpus(window: Window, total_gpus: float) -> int:
    """Whole GPUs batch may not take in ``window`` (the reserved share, rounded up)."""
    return math.ceil(window.interactive_reserved_share * total_gpus - 1e-9)


def batch_runtime_limit_s(window: Window) -> float | None:
    """Runtime limit of batch jobs started in ``window``; None = no limit."""
    return window.batch_max_runtime_s


#: How long a lease's kernel may take to first answer (a start over SSH on a busy node) before
#: its idle time counts anyway: a lease nobody ever reached is still reclaimed.
LEASE_START_GRACE_S = 300.0


def lease_idle_expired(lease: Job, window: Window, now: datetime) -> bool:
    """True when a running lease has been idle longer than the window allows.

    Idle time counts from the last activity, the first being its kernel's first answer, not
    from the grant: a kernel still starting is not idle. A lease whose kernel never answered
    counts from its start plus :data:`LEASE_START_GRACE_S`.
    """
    if window.lease_idle_timeout_s is None or lease.state is not JobState.RUNNING:
        return False
    last = lease.last_activity_at
    if last is None and lease.started_at is not None:
        last = lease.started_at + timedelta(seconds=LEASE_START_GRACE_S)
    if last is None:
        return False
    return (_aware(now) - last).total_seconds() >= window.lease_idle_timeout_s


# --------------------------------------------------------------------------------------------
# Times in reasons


def not_before_reason(at: datetime, now: datetime, timezone_name: str) -> str:
    """What a job waiting for its ``not_before`` is told: ``waiting: not before 22:00``."""
    return f"waiting: not before {_local_time(at, _aware(now), ZoneInfo(timezone_name))}"


def _local_time(at: datetime, now: datetime, tz: ZoneInfo) -> str:
    local = at.astimezone(tz)
    if local.date() == now.astimezone(tz).date():
        return local.strftime("%H:%M")
    return local.strftime("%a %Y-%m-%d %H:%M")
