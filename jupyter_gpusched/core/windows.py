"""Time-of-day windows: which rules hold at an instant, and how that is said in words.

Kept apart from :mod:`.policy` (the queue decisions) because wall-clock and DST arithmetic and
its explanation are a job of their own, shared by the scheduler, ``jupyter gpusched policy``,
notebook scheduling (``tonight``) and the API. Pure functions over plain data: ``now`` is always
passed in, nothing here reads a clock, a file or the network.

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

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from . import api
from .bounds import MAX_NOT_BEFORE_S, MAX_RUNTIME_S, SpecBounds
from .limits import LimitPolicy, UserLimits, describe, limits_view
from .units import format_duration_s

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
    # Whether running batch jobs may be moved (checkpoint signal, requeue, restarted on other
    # nodes) to open one node for a waiting batch job too big for any node's free GPUs.
    migrate_batch: bool = False
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
        migrate_batch=True,
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
    # Longest runtime a job may declare, seconds (submissions past it are refused).
    max_runtime_s: float = 30 * 86400.0
    # Furthest ahead a job may ask to start, seconds (submissions past it are refused).
    max_not_before_s: float = 366 * 86400.0
    # Per-user and per-group limits (:mod:`.limits`); none by default.
    limits: LimitPolicy = LimitPolicy()

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
        if not 0 < self.max_runtime_s <= MAX_RUNTIME_S:
            raise ValueError(f"max_runtime_s {self.max_runtime_s!r} must be in (0, a year]")
        if not 0 < self.max_not_before_s <= MAX_NOT_BEFORE_S:
            raise ValueError(
                f"max_not_before_s {self.max_not_before_s!r} must be in (0, ten years]"
            )

    @property
    def tz(self) -> ZoneInfo:
        """The timezone object."""
        return ZoneInfo(self.timezone)

    def quota_for(self, user: str) -> Quota:
        """The quota that applies to ``user``."""
        return self.quotas.get(user, self.default_quota)

    def spec_bounds(self, now: datetime) -> SpecBounds:
        """What a job submitted at ``now`` may ask for (see :func:`~.models.parse_spec`)."""
        return SpecBounds(
            max_runtime_s=self.max_runtime_s,
            max_not_before_s=self.max_not_before_s,
            now=now,
            runtime_source="GpuSchedPolicy.max_runtime_s",
            not_before_source="GpuSchedPolicy.max_not_before_s",
        )


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
# Explanation


# ``_num`` also words the reasons of :mod:`.policy`.
def _num(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


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
        + (
            f"stopped after {format_duration_s(w.batch_max_runtime_s)}"
            if w.batch_max_runtime_s
            else "no limit"
        ),
        "idle leases reclaimed after "
        + (
            format_duration_s(w.lease_idle_timeout_s)
            if w.lease_idle_timeout_s
            else "never (no timeout)"
        ),
        "batch jobs "
        + ("may be preempted for waiting leases" if w.preempt_batch else "are not preempted"),
        "batch jobs "
        + (
            "may be moved to open a node for a bigger batch job"
            if w.migrate_batch
            else "are not moved"
        ),
        "queue order: "
        + ("interactive first, then " if w.interactive_first else "one class, ")
        + "fair share, then age",
    ]


def window_view(active: ActiveWindow) -> api.Window:
    """The window in force as the API shows it: name, rules, since, until, next."""
    w = active.window
    return api.Window(
        name=w.name,
        applies=describe_window(w),
        since=active.since,
        until=active.until,
        next_window=active.next_window_name,
        rules=window_rules(w),
        **rule_values(w),
    )


def rule_values(w: Window) -> dict[str, Any]:
    """The window's rules by field name: every field but its name and when it applies."""
    return {f.name: getattr(w, f.name) for f in fields(Window) if f.name not in _WHEN_FIELDS}


_WHEN_FIELDS = ("name", "days", "start", "end")


def policy_view(
    config: PolicyConfig, now: datetime, mine: UserLimits | None = None
) -> api.PolicyView:
    """The explanation as the API (and ``jupyter gpusched policy --json``) shows it.

    ``mine``: the caller's limits, when a caller asks (the API).
    """
    return api.PolicyView(
        at=_aware(now),
        timezone=config.timezone,
        local_time=_fmt_local(now, config.tz),
        window=window_view(resolve_window(config, now)),
        limits=limits_view(config.limits, mine),
        explanation=explain(config, now, mine),
    )


def explain(config: PolicyConfig, now: datetime, mine: UserLimits | None = None) -> str:
    """Which window holds at ``now`` and why, its rules, the limits, the next change.

    Multi-line; ``mine``: the caller's limits, shown too.
    """
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
    lines.append(
        f"  - fair share: usage half-life {format_duration_s(config.fairshare_half_life_s)}"
    )
    head, *more = describe(config.limits, mine)
    lines += [f"  - {head}", *(f"      {line}" for line in more)]
    if active.until is None:
        lines.append("next change: none (this window is always in force)")
    else:
        nxt = next((x for x in config.windows if x.name == active.next_window_name), OPEN_WINDOW)
        lines.append(
            f"next change: '{nxt.name}' from {_fmt_local(active.until, tz)} "
            f"(in {format_duration_s(_minutes(active.until - _aware(now)))})"
        )
    return "\n".join(lines)


def _minutes(delta: timedelta) -> int:
    """A time span to the minute below, in seconds: "in 2d3h5m", not "in 2d3h5m17.2s"."""
    return int(delta.total_seconds() // 60) * 60
