"""Durations and sizes: what is printed reads back as the same value."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpusched.core.units import (
    format_duration_s,
    format_size_gb,
    parse_duration_s,
    parse_size_gb,
)
from jupyter_gpusched.core.windows import PolicyConfig, explain, window_rules

AMOUNTS = st.floats(min_value=0, max_value=2**50, allow_nan=False, allow_infinity=False)


@given(AMOUNTS)
def test_a_formatted_duration_parses_back_to_the_same_seconds(seconds: float) -> None:
    assert parse_duration_s(format_duration_s(seconds)) == seconds


@given(AMOUNTS)
def test_a_formatted_size_parses_back_to_the_same_gb(gb: float) -> None:
    assert parse_size_gb(format_size_gb(gb)) == gb


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.5, "0.5s"), (90, "1m30s"), (1800, "30m"), (5400, "1h30m"), (4 * 3600, "4h"),
     (86400 + 7200, "1d2h"), (1e-5, "0.00001s")],
)  # fmt: skip
def test_durations_are_written_as_a_user_writes_them(seconds: float, text: str) -> None:
    assert format_duration_s(seconds) == text


def test_parts_keeps_the_leading_units() -> None:
    assert format_duration_s(3 * 3600 + 25 * 60 + 7, parts=1) == "3h"
    assert format_duration_s(3 * 3600 + 25 * 60 + 7, parts=2) == "3h25m"


@pytest.mark.parametrize(
    ("gb", "text"),
    [(0, "0G"), (16, "16G"), (16.5, "16.5G"), (0.5, "512M"), (1536, "1.5T"), (2**-20, "1K")],
)
def test_sizes_take_the_largest_unit_they_reach(gb: float, text: str) -> None:
    assert format_size_gb(gb) == text


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_negative_or_infinite_amounts_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite number >= 0"):
        format_duration_s(bad)
    with pytest.raises(ValueError, match="finite number >= 0"):
        format_size_gb(bad)


@pytest.mark.parametrize(
    ("text", "gb"),
    [("16G", 16), ("16GB", 16), ("16GiB", 16), ("512M", 0.5), ("1T", 1024), ("24", 24), (8, 8)],
)
def test_sizes(text: str, gb: float) -> None:
    assert parse_size_gb(text) == gb


@pytest.mark.parametrize(
    ("text", "s"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("1h30m", 5400), ("1h 30m", 5400), ("1d", 86400),
     ("45", 45)],
)  # fmt: skip
def test_durations(text: str, s: float) -> None:
    assert parse_duration_s(text) == s


@pytest.mark.parametrize("bad", ["2x", "h", "1h foo", "", "30min"])
def test_bad_durations_say_how_to_write_one(bad: str) -> None:
    with pytest.raises(ValueError, match="write it like"):
        parse_duration_s(bad)


def test_every_duration_the_policy_explanation_prints_reads_back() -> None:
    from datetime import UTC, datetime

    config = PolicyConfig()
    text = explain(config, datetime(2026, 11, 23, 10, 0, tzinfo=UTC))
    text += "\n".join(r for w in config.windows for r in window_rules(w))
    said = re.findall(r"(?:after|half-life|in|most) ((?:\d+[dhms])+)\b", text)
    assert "30m" in said and len(said) >= 4, text
    for amount in said:
        assert parse_duration_s(amount) > 0
