"""When a definition fires: cron expressions evaluated in a timezone, across DST.

Schedules are evaluated in local wall-clock time (croniter on naive local times); each matching
local time fires once, at the first instant the local clock reads it -- the rule the policy
windows use (:func:`jupyter_gpusched.core.windows.local_boundary`). So in spring a time inside the
skipped hour fires at the jump (02:30 on 2026-03-29 in Europe/Berlin fires at 03:00 CEST), and
in autumn an ambiguous time fires once, at its first occurrence (hourly jobs get no second
02:00 on 2026-10-25).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from jupyter_gpusched.core.errors import InvalidSpecError
from jupyter_gpusched.core.windows import local_boundary

#: Most missed firings counted when catching up (an every-minute job down for a week is 10k).
MAX_MISSED = 100_000


def check_schedule(schedule: str, tz_name: str) -> None:
    """Raise :class:`InvalidSpecError` unless ``schedule`` is a 5-field cron or an @-macro."""
    from croniter import croniter

    text = schedule.strip()
    if not (text.startswith("@") or len(text.split()) == 5) or not croniter.is_valid(text):
        raise InvalidSpecError(
            "schedule",
            f"{schedule!r} is not a cron expression; write 5 fields like "
            "'0 2 * * *' (02:00 daily) or '*/30 * * * 1-5', or @hourly/@daily/@weekly",
        )
    check_timezone(tz_name)


def check_timezone(tz_name: str) -> ZoneInfo:
    """The zone, or :class:`InvalidSpecError` naming the field."""
    try:
        return ZoneInfo(tz_name)
    except (KeyError, ValueError):
        raise InvalidSpecError(
            "timezone", f"{tz_name!r} is unknown; use an IANA name like 'Europe/Berlin'"
        ) from None


def next_fire_time(schedule: str, tz_name: str, after: datetime) -> datetime:
    """The first firing strictly after ``after`` (UTC in, UTC out); see the module docstring."""
    from croniter import croniter

    tz = ZoneInfo(tz_name)
    local = after.astimezone(tz).replace(tzinfo=None, microsecond=0)
    # In the repeated autumn hour the local reading lies behind times that already fired
    # (their first occurrence); the comparison below skips those.
    it = croniter(schedule.strip(), local)
    for _ in range(MAX_MISSED):
        candidate: datetime = it.get_next(datetime)
        at = local_boundary(candidate.date(), candidate.time(), tz)
        if at > after:
            return at
    raise InvalidSpecError("schedule", f"{schedule!r} never fires")  # pragma: no cover


def fire_times(schedule: str, tz_name: str, start: datetime, end: datetime) -> list[datetime]:
    """Every firing in ``[start, end]`` (UTC); for previews and tests."""
    out: list[datetime] = []
    t = next_fire_time(schedule, tz_name, start - timedelta(microseconds=1))
    while t <= end:
        out.append(t)
        t = next_fire_time(schedule, tz_name, t)
    return out
