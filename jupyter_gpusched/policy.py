"""Time-of-day policy: windows, quotas, queue order, admission, backfill and preemption.

Pure functions over plain data: ``now`` is always passed in, nothing here reads a clock, a file
or the network, so the scheduler, the tests and the trace replay (``bench/daynight.py``) run the
very same rules. Decisions come back as values with a human-readable ``reason``; nothing is
raised for "not now".

Wall-clock rules and DST
------------------------
A window is written in local wall-clock time of ``PolicyConfig.timezone``. One *occurrence*
starts on each listed day at ``start`` and ends at ``end`` (the next day when ``end <= start``;
``start == end`` means 24 hours). A boundary at local time ``t`` on date ``d`` is the **first
instant at which the local clock reads ``t`` or later on that date**. So:

* an ambiguous time (autumn, clocks go back) means its first occurrence, and
* a time that does not exist (spring, clocks jump forward) means the instant of the jump.

E.g. in Europe/Berlin on 2026-03-29 (02:00 CET -> 03:00 CEST) a window 01:00-03:00 runs from
01:00 CET to 03:00 CEST: one real hour, exactly while the wall clock shows 01:00-03:00. On
2026-10-25 the same window lasts three real hours.

Windows are listed by priority: where occurrences overlap, the first listed wins. Where none
is in force, the last window without ``days``, ``start`` and ``end`` (a catch-all, e.g.
``night``) holds, else the built-in permissive ``open`` window; so exactly one window is in
force at any instant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import NamedTuple
from zoneinfo import ZoneInfo

from .models import Job, JobState, PriorityClass

DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
ALL_DAYS = frozenset(range(7))
_UTC = UTC


@dataclass(frozen=True)
class Window:
    """One time-of-day window and the rules that hold while it is in force."""

    # Name shown to users, e.g. "day".
    name: str
    # Weekdays (0 = Monday) on which an occurrence *starts*; all days when empty.
    days: frozenset[int] = ALL_DAYS
    # Local wall-clock start; with end == start (the default) the occurrence lasts 24 h.
    start: time = time(0, 0)
    # Local wall-clock end; end <= start wraps past midnight into the next day.
    end: time = time(0, 0)
    # Share of all GPUs batch jobs may not take, kept free for interactive leases (0-1).
    interactive_reserved_share: float = 0.0
    # Largest share of all GPUs interactive leases may hold together (0-1).
    interactive_max_share: float = 1.0
    # Batch jobs started in this window are stopped after this long; None = no limit.
    batch_max_runtime_s: float | None = None
    # Leases idle this long are reclaimed; None = never.
    lease_idle_timeout_s: float | None = None
    # Whether running batch jobs may be preempted (checkpoint signal, requeue) for leases.
    preempt_batch: bool = False
    # Whether interactive work is queued ahead of batch; False = one class, fair share only.
    interactive_first: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a window needs a name, e.g. 'day'")
        if not self.days or not self.days <= ALL_DAYS:
            raise ValueError(f"days {sorted(self.days)!r} must be weekdays 0 (Mon) to 6 (Sun)")
        for attr in ("interactive_reserved_share", "interactive_max_share"):
            value = getattr(self, attr)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{attr} {value!r} must be a share between 0 and 1")
        if self.interactive_reserved_share > self.interactive_max_share:
            raise ValueError(
                f"interactive_reserved_share {self.interactive_reserved_share!r} exceeds "
                f"interactive_max_share {self.interactive_max_share!r}"
            )
        for attr in ("batch_max_runtime_s", "lease_idle_timeout_s"):
            value = getattr(self, attr)
            if value is not None and not value > 0:
                raise ValueError(f"{attr} {value!r} must be a positive number of seconds or None")

    @property
    def catch_all(self) -> bool:
        """True for an "otherwise" window: every day, all day."""
        return self.days == ALL_DAYS and self.start == self.end


#: Used when no configured window is in force and none is a catch-all.
OPEN_WINDOW = Window(name="open")

#: The lab default: interactive work first by day, batch fills the cluster by night.
DEFAULT_WINDOWS: tuple[Window, ...] = (
    Window(
        name="day",
        days=frozenset(range(5)),
        start=time(8, 0),
        end=time(20, 0),
        interactive_reserved_share=0.25,
        interactive_max_share=0.75,
        batch_max_runtime_s=4 * 3600.0,
        lease_idle_timeout_s=30 * 60.0,
        preempt_batch=True,
    ),
    Window(
        name="night",
        interactive_max_share=0.5,
        lease_idle_timeout_s=2 * 3600.0,
    ),
)


@dataclass(frozen=True)
class Quota:
    """Per-user limits; None = unlimited."""

    # GPUs one user may hold at once, across all their jobs (share-weighted).
    gpus_at_once: float | None = None
    # GPU-hours one user may start work with per local calendar day.
    gpu_hours_per_day: float | None = None


@dataclass(frozen=True)
class PolicyConfig:
    """Everything the policy needs from configuration (see ``config.GpuSchedPolicy``)."""

    # IANA timezone the windows and "per day" quotas are written in.
    timezone: str = "UTC"
    # Windows in priority order; see the module docstring.
    windows: tuple[Window, ...] = DEFAULT_WINDOWS
    # Quotas by user name; users not listed get default_quota.
    quotas: Mapping[str, Quota] = field(default_factory=dict, hash=False)
    # Quota of users not listed in quotas.
    default_quota: Quota = Quota()
    # Past usage counts half as much after this long, for fair-share order.
    fairshare_half_life_s: float = 7 * 86400.0
    # Runtime assumed for a batch job with no declared runtime and no history.
    default_runtime_s: float = 4 * 3600.0
    # Percentile of a user's past runtimes used as the estimate (0-100).
    runtime_percentile: float = 90.0

    def __post_init__(self) -> None:
        try:
            ZoneInfo(self.timezone)
        except (KeyError, ValueError):
            raise ValueError(
                f"timezone {self.timezone!r} is unknown; use an IANA name like 'Europe/Berlin'"
            ) from None
        if not self.windows:
            raise ValueError("at least one window is needed")
        names = [w.name for w in self.windows]
        if len(set(names)) != len(names):
            raise ValueError(f"window names must be unique, got {names!r}")
        if not self.fairshare_half_life_s > 0:
            raise ValueError(f"fairshare_half_life_s {self.fairshare_half_life_s!r} must be > 0")
        if not 0 <= self.runtime_percentile <= 100:
            raise ValueError(f"runtime_percentile {self.runtime_percentile!r} must be 0-100")

    @property
    def tz(self) -> ZoneInfo:
        """The timezone object."""
        return ZoneInfo(self.timezone)

    def quota_for(self, user: str) -> Quota:
        """The quota that applies to ``user``."""
        return self.quotas.get(user, self.default_quota)


# --------------------------------------------------------------------------------------------
# Which window is in force


@dataclass(frozen=True)
class ActiveWindow:
    """The window in force at an instant, and how long it lasts."""

    # The rules in force.
    window: Window
    # Since when this window has been in force without a break (UTC); None = always.
    since: datetime | None
    # When the next window takes over (UTC); None = this window never ends.
    until: datetime | None
    # Name of the window that takes over at ``until``; None when ``until`` is None.
    next_window_name: str | None


def local_boundary(day: date, at: time, tz: ZoneInfo) -> datetime:
    """First instant (UTC) at which the local clock reads ``at`` or later on ``day``."""
    naive = datetime.combine(day, at)
    first = naive.replace(tzinfo=tz, fold=0).astimezone(_UTC)
    if first.astimezone(tz).replace(tzinfo=None) == naive:
        return first  # exists; fold=0 is the first of two when ambiguous
    # In a spring-forward gap: the answer is the jump, between the two fold readings.
    lo = naive.replace(tzinfo=tz, fold=1).astimezone(_UTC)
    hi = first
    while (hi - lo) > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).replace(tzinfo=None) >= naive:
            hi = mid
        else:
            lo = mid
    return hi.replace(microsecond=0) if hi.microsecond else hi


@lru_cache(maxsize=256)
def _segments(
    windows: tuple[Window, ...], tz_name: str, anchor: date
) -> tuple[tuple[datetime, int], ...]:
    """Piecewise-constant window index from ``anchor - 9 days`` to ``anchor + 9 days``.

    Returns ``(segment_start_utc, window_index)`` sorted, merged where the window repeats;
    index ``len(windows)`` stands for :data:`OPEN_WINDOW`.
    """
    tz = ZoneInfo(tz_name)
    fallback = next(
        (i for i in range(len(windows) - 1, -1, -1) if windows[i].catch_all), len(windows)
    )
    occurrences: list[tuple[datetime, datetime, int]] = []
    for i, w in enumerate(windows):
        if w.catch_all:
            continue
        for offset in range(-10, 11):
            d = anchor + timedelta(days=offset)
            if d.weekday() not in w.days:
                continue
            begin = local_boundary(d, w.start, tz)
            end_day = d + timedelta(days=1) if w.end <= w.start else d
            end = local_boundary(end_day, w.end, tz)
            if end > begin:  # an occurrence swallowed by a DST jump is empty
                occurrences.append((begin, end, i))
    lo = datetime.combine(anchor - timedelta(days=9), time(0), _UTC)
    hi = datetime.combine(anchor + timedelta(days=9), time(0), _UTC)
    points = sorted({lo, hi, *(t for o in occurrences for t in o[:2] if lo < t < hi)})
    segments: list[tuple[datetime, int]] = []
    for t in points[:-1]:
        idx = min((i for b, e, i in occurrences if b <= t < e), default=fallback)
        if not segments or segments[-1][1] != idx:
            segments.append((t, idx))
    segments.append((hi, -1))  # sentinel: end of the computed range
    return tuple(segments)


def resolve_window(config: PolicyConfig, now: datetime) -> ActiveWindow:
    """The window in force at ``now``, since when, until when, and what comes next."""
    now = _aware(now)
    anchor = now.astimezone(config.tz).date()
    segs = _segments(config.windows, config.timezone, anchor)
    k = max(i for i in range(len(segs) - 1) if segs[i][0] <= now)
    idx = segs[k][1]
    window = config.windows[idx] if idx < len(config.windows) else OPEN_WINDOW
    # A window repeats weekly, so 9 days either side either shows a change or there is none.
    since = segs[k][0] if k > 0 else None
    if k + 2 < len(segs):
        nxt = segs[k + 1][1]
        next_window = config.windows[nxt] if nxt < len(config.windows) else OPEN_WINDOW
        return ActiveWindow(window, since, segs[k + 1][0], next_window.name)
    return ActiveWindow(window, since, None, None)


def _aware(now: datetime) -> datetime:
    if now.tzinfo is None:
        raise ValueError(f"now {now!r} must be timezone-aware")
    return now.astimezone(_UTC)


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


def consume_spare(reservation: Reservation, gpus: float) -> Reservation:
    """The reservation after a backfilled job took ``gpus`` of its node's spare GPUs."""
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

    @classmethod
    def from_job(cls, job: Job) -> PreemptCandidate:
        """From a running job; ``handle['checkpoint_at']`` (ISO) marks its last checkpoint."""
        mark = job.handle.get("checkpoint_at")
        checkpoint = datetime.fromisoformat(mark) if isinstance(mark, str) else None
        return cls(job.id, job_gpus(job), job.started_at or job.submitted_at, checkpoint)


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
# Explanation


def _num(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


def _dur(seconds: float) -> str:
    if seconds % 86400 == 0:
        return f"{seconds / 86400:g}d"
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}min"
    return f"{seconds:g}s"


def _local_time(at: datetime, now: datetime, tz: ZoneInfo) -> str:
    local = at.astimezone(tz)
    if local.date() == now.astimezone(tz).date():
        return local.strftime("%H:%M")
    return local.strftime("%a %Y-%m-%d %H:%M")


def _fmt_local(at: datetime, tz: ZoneInfo) -> str:
    return at.astimezone(tz).strftime("%a %Y-%m-%d %H:%M %Z")


def describe_window(w: Window) -> str:
    """When a window applies, in words: 'Mon-Fri 08:00-20:00'."""
    if w.catch_all:
        return "whenever no other window is in force" if w is not OPEN_WINDOW else "always"
    days = _days_text(w.days)
    hours = "all day" if w.start == w.end else f"{w.start:%H:%M}-{w.end:%H:%M}"
    return f"{days} {hours}"


def _days_text(days: frozenset[int]) -> str:
    if days == ALL_DAYS:
        return "every day"
    ds = sorted(days)
    if ds == list(range(ds[0], ds[-1] + 1)) and len(ds) > 2:
        return f"{DAY_NAMES[ds[0]]}-{DAY_NAMES[ds[-1]]}"
    return ",".join(DAY_NAMES[d] for d in ds)


def window_rules(w: Window) -> list[str]:
    """The rules of a window, one human line each."""
    return [
        f"interactive leases: {w.interactive_reserved_share:.0%} of GPUs reserved, "
        f"at most {w.interactive_max_share:.0%} of GPUs",
        "batch jobs started now: "
        + (f"stopped after {_dur(w.batch_max_runtime_s)}" if w.batch_max_runtime_s else "no limit"),
        "idle leases reclaimed after "
        + (_dur(w.lease_idle_timeout_s) if w.lease_idle_timeout_s else "never (no timeout)"),
        "batch jobs "
        + ("may be preempted for waiting leases" if w.preempt_batch else "are not preempted"),
        "queue order: "
        + ("interactive first, then " if w.interactive_first else "one class, ")
        + "fair share, then age",
    ]


def window_dict(active: ActiveWindow) -> dict[str, object]:
    """The window in force as JSON-ready data: name, rules, since, until, next."""
    w = active.window
    return {
        "name": w.name,
        "applies": describe_window(w),
        "since": active.since.isoformat() if active.since else None,
        "until": active.until.isoformat() if active.until else None,
        "next_window": active.next_window_name,
        "interactive_reserved_share": w.interactive_reserved_share,
        "interactive_max_share": w.interactive_max_share,
        "batch_max_runtime_s": w.batch_max_runtime_s,
        "lease_idle_timeout_s": w.lease_idle_timeout_s,
        "preempt_batch": w.preempt_batch,
        "interactive_first": w.interactive_first,
    }


def policy_view(config: PolicyConfig, now: datetime) -> dict[str, object]:
    """The explanation as JSON-ready data (for the API and ``--json``)."""
    return {
        "at": _aware(now).isoformat(),
        "timezone": config.timezone,
        "local_time": _fmt_local(now, config.tz),
        "window": window_dict(resolve_window(config, now)),
        "explanation": explain(config, now),
    }


def explain(config: PolicyConfig, now: datetime) -> str:
    """Which window holds at ``now`` and why, its rules, and the next change (multi-line)."""
    tz = config.tz
    active = resolve_window(config, now)
    w = active.window
    lines = [f"At {_fmt_local(now, tz)} ({config.timezone}) the '{w.name}' window is in force."]
    clock = _aware(now).astimezone(tz).strftime("%a %H:%M")
    if not w.catch_all:
        lines.append(f"  why: {clock} falls in '{w.name}' ({describe_window(w)})")
    else:
        others = [f"'{x.name}' ({describe_window(x)})" for x in config.windows if not x.catch_all]
        outside = f"{clock} is outside {', '.join(others)}; " if others else ""
        lines.append(f"  why: {outside}'{w.name}' applies {describe_window(w)}")
    if active.since is not None:
        lines.append(f"  since: {_fmt_local(active.since, tz)}")
    lines.append("rules:")
    lines += [f"  - {r}" for r in window_rules(w)]
    q = config.default_quota
    quota = (
        f"{_num(q.gpus_at_once) if q.gpus_at_once is not None else 'unlimited'} GPUs at once, "
        f"{_num(q.gpu_hours_per_day) if q.gpu_hours_per_day is not None else 'unlimited'} "
        "GPU-hours per day"
    )
    extra = f" ({len(config.quotas)} users with their own quota)" if config.quotas else ""
    lines.append(f"  - default quota: {quota}{extra}")
    lines.append(f"  - fair share: usage half-life {_dur(config.fairshare_half_life_s)}")
    if active.until is None:
        lines.append("next change: none (this window is always in force)")
    else:
        nxt = next((x for x in config.windows if x.name == active.next_window_name), OPEN_WINDOW)
        lines.append(
            f"next change: '{nxt.name}' from {_fmt_local(active.until, tz)} "
            f"(in {_dur_human((active.until - _aware(now)).total_seconds())})"
        )
    return "\n".join(lines)


def _dur_human(seconds: float) -> str:
    minutes = int(seconds // 60)
    d, rem = divmod(minutes, 1440)
    h, m = divmod(rem, 60)
    parts = [f"{d}d" if d else "", f"{h}h" if h else "", f"{m}min" if m or not (d or h) else ""]
    return " ".join(p for p in parts if p)
