"""Time-of-day windows: midnight, DST, overlaps, the catch-all, and the explanation."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from _fixtures_policy import T0

from jupyter_gpusched.core.windows import (
    DEFAULT_WINDOWS,
    OPEN_WINDOW,
    PolicyConfig,
    Window,
    explain,
    local_boundary,
    resolve_window,
)

UTC = UTC
BERLIN = ZoneInfo("Europe/Berlin")
DAY = DEFAULT_WINDOWS[0]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def berlin(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=BERLIN, fold=fold).astimezone(UTC)


# ------------------------------------------------------------------ windows


def test_default_config_is_day_on_weekday_mornings_and_night_otherwise() -> None:
    config = PolicyConfig()
    monday = resolve_window(config, utc(2026, 11, 23, 9))
    saturday = resolve_window(config, utc(2026, 11, 21, 9))

    assert (monday.window.name, monday.since, monday.until) == (
        "day",
        utc(2026, 11, 23, 8),
        utc(2026, 11, 23, 20),
    )
    assert monday.next_window_name == "night"
    assert (saturday.window.name, saturday.since, saturday.until) == (
        "night",
        utc(2026, 11, 20, 20),
        utc(2026, 11, 23, 8),
    )


def test_window_boundary_belongs_to_the_window_that_starts_there() -> None:
    config = PolicyConfig()
    assert resolve_window(config, utc(2026, 11, 23, 8)).window.name == "day"
    assert resolve_window(config, utc(2026, 11, 23, 7, 59, 59)).window.name == "night"
    assert resolve_window(config, utc(2026, 11, 23, 20)).window.name == "night"


def test_window_wrapping_midnight_holds_on_both_sides_of_it() -> None:
    late = Window("late", days=frozenset({0}), start=time(22), end=time(6))
    config = PolicyConfig(windows=(late, Window("rest")))

    before = resolve_window(config, utc(2026, 11, 23, 23))
    after = resolve_window(config, utc(2026, 11, 24, 5, 59))
    tuesday_night = resolve_window(config, utc(2026, 11, 24, 23))

    assert before.window is late and after.window is late
    assert before.since == utc(2026, 11, 23, 22) and before.until == utc(2026, 11, 24, 6)
    assert tuesday_night.window.name == "rest"  # only starts on Mondays


def test_night_window_across_spring_forward_lasts_one_hour_less() -> None:
    late = Window("late", start=time(22), end=time(6))
    config = PolicyConfig(timezone="Europe/Berlin", windows=(late, Window("rest")))

    active = resolve_window(config, berlin(2026, 3, 29, 1))

    assert active.window is late
    assert active.since == berlin(2026, 3, 28, 22) == utc(2026, 3, 28, 21)
    assert active.until == berlin(2026, 3, 29, 6) == utc(2026, 3, 29, 4)
    assert active.until - active.since == timedelta(hours=7)


def test_night_window_across_fall_back_lasts_one_hour_more() -> None:
    late = Window("late", start=time(22), end=time(6))
    config = PolicyConfig(timezone="Europe/Berlin", windows=(late, Window("rest")))

    active = resolve_window(config, utc(2026, 10, 25, 1))

    assert active.until - active.since == timedelta(hours=9)
    assert active.until == utc(2026, 10, 25, 5)


def test_window_inside_the_skipped_spring_hour_runs_while_the_clock_shows_its_times() -> None:
    # 2026-03-29 in Berlin: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
    maint = Window("maint", days=frozenset({6}), start=time(1), end=time(3))
    config = PolicyConfig(timezone="Europe/Berlin", windows=(maint, Window("rest")))

    active = resolve_window(config, utc(2026, 3, 29, 0, 30))

    assert active.window is maint
    assert (active.since, active.until) == (utc(2026, 3, 29, 0), utc(2026, 3, 29, 1))


def test_boundary_at_a_skipped_local_time_is_the_instant_of_the_jump() -> None:
    assert local_boundary(date(2026, 3, 29), time(2, 30), BERLIN) == utc(2026, 3, 29, 1)
    late_start = Window("w", days=frozenset({6}), start=time(2, 30), end=time(4))
    config = PolicyConfig(timezone="Europe/Berlin", windows=(late_start, Window("rest")))
    active = resolve_window(config, utc(2026, 3, 29, 1, 10))
    assert active.window is late_start and active.since == utc(2026, 3, 29, 1)


def test_boundary_at_a_repeated_local_time_is_its_first_occurrence() -> None:
    # 2026-10-25 in Berlin: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice.
    assert local_boundary(date(2026, 10, 25), time(2, 30), BERLIN) == utc(2026, 10, 25, 0, 30)


def test_first_listed_window_wins_where_windows_overlap() -> None:
    busy = Window("busy", days=frozenset({0}), start=time(10), end=time(12))
    day = Window("day", days=frozenset(range(5)), start=time(8), end=time(20))
    config = PolicyConfig(windows=(busy, day, Window("night")))

    inside = resolve_window(config, utc(2026, 11, 23, 11))
    before = resolve_window(config, utc(2026, 11, 23, 9))

    assert inside.window is busy and inside.next_window_name == "day"
    assert before.window is day and before.until == utc(2026, 11, 23, 10)


def test_without_a_catch_all_the_open_window_fills_the_gaps() -> None:
    config = PolicyConfig(windows=(DAY,))
    assert resolve_window(config, utc(2026, 11, 21, 9)).window is OPEN_WINDOW


def test_a_single_catch_all_window_never_ends() -> None:
    active = resolve_window(PolicyConfig(windows=(Window("always"),)), T0)
    assert (active.since, active.until, active.next_window_name) == (None, None, None)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        resolve_window(PolicyConfig(), datetime(2026, 11, 23, 9))


def test_explain_names_window_reason_rules_and_next_change() -> None:
    text = explain(PolicyConfig(timezone="Europe/Berlin"), utc(2026, 11, 23, 8))

    assert text.splitlines()[0] == (
        "At Mon 2026-11-23 09:00 CET (Europe/Berlin) the 'day' window is in force."
    )
    assert "why: Mon 09:00 falls in 'day' (Mon-Fri 08:00-20:00)" in text
    assert "25% of GPUs reserved, at most 75% of GPUs" in text
    assert "batch jobs started now: stopped after 4h" in text
    assert "next change: 'night' from Mon 2026-11-23 20:00 CET (in 11h)" in text


def test_explain_at_the_weekend_says_why_day_does_not_apply() -> None:
    text = explain(PolicyConfig(), utc(2026, 11, 21, 9))
    assert "why: Sat 09:00 is outside 'day' (Mon-Fri 08:00-20:00)" in text
    assert "next change: 'day' from Mon 2026-11-23 08:00 UTC (in 1d23h)" in text
