"""Hypothesis properties of the windows: exactly the wall-clock window, since and until agree."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpusched.core.windows import OPEN_WINDOW, PolicyConfig, Window, resolve_window

UTC = UTC
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]

times = st.builds(time, st.integers(0, 23), st.sampled_from([0, 15, 30, 45]))
windows = st.builds(
    Window,
    name=st.just("w"),
    days=st.frozensets(st.integers(0, 6), min_size=1),
    start=times,
    end=times,
)
configs = st.builds(
    lambda ws, tz, catch_all: PolicyConfig(
        timezone=tz,
        windows=tuple(Window(f"w{i}", w.days, w.start, w.end) for i, w in enumerate(ws))
        + ((Window("rest"),) if catch_all else ()),
    ),
    st.lists(windows, min_size=1, max_size=3),
    st.sampled_from(ZONES),
    st.booleans(),
)
# Instants around both 2026 European DST changes and ordinary weeks.
instants = st.one_of(
    st.datetimes(datetime(2026, 3, 26), datetime(2026, 4, 2)),
    st.datetimes(datetime(2026, 10, 22), datetime(2026, 10, 29)),
    st.datetimes(datetime(2026, 11, 1), datetime(2026, 12, 31)),
).map(lambda d: d.replace(tzinfo=UTC, microsecond=0))


def wall_clock_oracle(config: PolicyConfig, now: datetime) -> Window:
    """The window in force read off the local wall clock, independently of the code."""
    local = now.astimezone(config.tz).replace(tzinfo=None)
    clock, today, yesterday = local.time(), local.weekday(), (local.weekday() - 1) % 7
    for w in config.windows:
        if w.catch_all:
            continue
        if w.start < w.end:
            hit = today in w.days and w.start <= clock < w.end
        else:  # wraps past midnight; start == end lasts 24 hours
            hit = (today in w.days and clock >= w.start) or (yesterday in w.days and clock < w.end)
        if hit:
            return w
    return next((w for w in reversed(config.windows) if w.catch_all), OPEN_WINDOW)


def is_repeated_local_time(now: datetime, tz: ZoneInfo) -> bool:
    local = now.astimezone(tz).replace(tzinfo=None)
    return (
        local.replace(tzinfo=tz, fold=0).utcoffset() != local.replace(tzinfo=tz, fold=1).utcoffset()
    )


@settings(max_examples=300, deadline=None)
@given(configs, instants)
def test_exactly_the_wall_clock_window_is_in_force(config: PolicyConfig, now: datetime) -> None:
    active = resolve_window(config, now)
    assert active.window in (*config.windows, OPEN_WINDOW)
    # In a repeated autumn hour the wall clock is ambiguous; the first occurrence rules there.
    if not is_repeated_local_time(now, config.tz):
        assert active.window == wall_clock_oracle(config, now)


@settings(max_examples=200, deadline=None)
@given(configs, instants)
def test_resolve_is_consistent_with_since_and_until(config: PolicyConfig, now: datetime) -> None:
    active = resolve_window(config, now)
    second = timedelta(seconds=1)
    if active.until is not None:
        assert active.until > now
        assert resolve_window(config, active.until - second).window == active.window
        after = resolve_window(config, active.until)
        assert after.window.name == active.next_window_name != active.window.name
        assert after.since == active.until
    if active.since is not None:
        assert active.since <= now
        assert resolve_window(config, active.since).window == active.window
        assert resolve_window(config, active.since - second).window != active.window
