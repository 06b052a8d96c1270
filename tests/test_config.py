"""Traitlets configuration of the policy: defaults, parsing, and errors that quote the value."""

from __future__ import annotations

from datetime import time
from pathlib import Path
from typing import Any

import pytest
from traitlets import TraitError
from traitlets.config import Config

from jupyter_gpusched.cli.policy import load_config
from jupyter_gpusched.core.windows import DEFAULT_WINDOWS, PolicyConfig, Quota, Window
from jupyter_gpusched.server.config import (
    GpuSchedPolicy,
    parse_days,
    window_from_dict,
    window_to_dict,
)


def policy_from(**traits: Any) -> PolicyConfig:
    config = Config()
    for name, value in traits.items():
        setattr(config.GpuSchedPolicy, name, value)
    return GpuSchedPolicy(config=config).to_policy_config()


def test_no_config_gives_the_lab_default_day_and_night() -> None:
    policy = policy_from()
    assert policy == PolicyConfig()
    assert policy.windows == DEFAULT_WINDOWS
    assert [w.name for w in policy.windows] == ["day", "night"]


def test_windows_quotas_and_durations_are_read_from_config() -> None:
    policy = policy_from(
        timezone="Europe/Berlin",
        windows=[
            {
                "name": "day",
                "days": "Mon-Fri",
                "start": "07:30",
                "end": "19:00",
                "interactive_reserved_share": 0.5,
                "batch_max_runtime_s": "2h",
                "lease_idle_timeout_s": 900,
                "preempt_batch": True,
            },
            {"name": "weekend", "days": ["Sat", "Sun"], "interactive_first": False},
            {"name": "night"},
        ],
        quotas={"alice": {"gpus_at_once": 4, "gpu_hours_per_day": 48}},
        default_quota={"gpus_at_once": 2},
        fairshare_half_life_s=86400,
    )
    day, weekend, night = policy.windows
    assert day == Window(
        "day",
        frozenset(range(5)),
        time(7, 30),
        time(19),
        interactive_reserved_share=0.5,
        batch_max_runtime_s=7200.0,
        lease_idle_timeout_s=900.0,
        preempt_batch=True,
    )
    assert weekend.days == frozenset({5, 6}) and not weekend.interactive_first
    assert night.catch_all
    assert policy.quota_for("alice") == Quota(4, 48)
    assert policy.quota_for("bob") == Quota(gpus_at_once=2)
    assert policy.fairshare_half_life_s == 86400.0


@pytest.mark.parametrize(
    ("text", "days"),
    [
        ("Mon-Fri", {0, 1, 2, 3, 4}),
        ("Fri-Mon", {4, 5, 6, 0}),
        ("sat,sun", {5, 6}),
        (["Monday", 2], {0, 2}),
        (None, set(range(7))),
    ],
)
def test_days_are_read_in_several_spellings(text: object, days: set[int]) -> None:
    assert parse_days(text) == frozenset(days)


def test_windows_round_trip_through_config_dicts() -> None:
    for window in DEFAULT_WINDOWS:
        assert window_from_dict(window_to_dict(window)) == window


@pytest.mark.parametrize(
    ("traits", "quoted"),
    [
        ({"timezone": "Mars/Olympus_Mons"}, "'Mars/Olympus_Mons'"),
        ({"windows": [{"name": "day", "start": "25:99"}]}, "'25:99'"),
        ({"windows": [{"name": "day", "days": "Funday"}]}, "'Funday'"),
        ({"windows": [{"name": "day", "interactive_max_share": 1.5}]}, "1.5"),
        ({"windows": [{"name": "day", "batch_max_runtime_s": "soon"}]}, "'soon'"),
        ({"windows": [{"name": "day", "preempt_batch": "yes"}]}, "'yes'"),
        ({"windows": [{"name": "day", "colour": "blue"}]}, "'colour'"),
        ({"windows": [{"days": "Mon"}]}, "'days': 'Mon'"),
        ({"windows": [{"name": "a"}, {"name": "a"}]}, "['a', 'a']"),
        (
            {
                "windows": [
                    {"name": "a", "interactive_reserved_share": 0.8, "interactive_max_share": 0.5}
                ]
            },
            "0.8",
        ),
        ({"quotas": {"bob": {"gpus_at_once": -1}}}, "-1"),
        ({"quotas": {"bob": {"gpus": 2}}}, "'gpus'"),
        ({"default_quota": {"gpu_hours_per_day": "lots"}}, "'lots'"),
        ({"fairshare_half_life_s": 0.0}, "0.0"),
        ({"runtime_percentile": 120.0}, "120.0"),
    ],
)
def test_bad_values_are_refused_with_the_value_quoted(traits: dict[str, Any], quoted: str) -> None:
    with pytest.raises(TraitError) as info:
        policy_from(**traits)
    assert quoted in str(info.value)
    assert "GpuSchedPolicy." in str(info.value)


def test_config_is_loaded_from_a_python_config_file(tmp_path: Path) -> None:
    path = tmp_path / "jupyter_server_config.py"
    path.write_text(
        "c.GpuSchedPolicy.timezone = 'Asia/Tokyo'\nc.GpuSchedPolicy.windows = [{'name': 'all'}]\n"
    )
    policy = GpuSchedPolicy(config=load_config(str(path))).to_policy_config()
    assert policy.timezone == "Asia/Tokyo"
    assert policy.windows == (Window("all"),)


def test_config_is_loaded_from_the_jupyter_config_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "jupyter_server_config.json").write_text(
        '{"GpuSchedPolicy": {"timezone": "America/Chicago"}}'
    )
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    policy = GpuSchedPolicy(config=load_config()).to_policy_config()
    assert policy.timezone == "America/Chicago"


def test_a_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_config(str(tmp_path / "nope.py"))
