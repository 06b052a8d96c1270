"""One vocabulary: every figure written by one formatter, the lab panel's agreeing with it."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpusched.core import figures
from jupyter_gpusched.core.inventory import GpuInfo, NodeInventory
from jupyter_gpusched.core.models import Job, JobSpec, Placement
from jupyter_gpusched.core.schedules import cron_words
from jupyter_gpusched.core.units import format_duration_s, format_size_gb
from jupyter_gpusched.scheduling.history import GpuHistory

#: The table labextension/test/format.test.ts checks format.ts against, too.
TABLE = json.loads(
    (Path(__file__).resolve().parents[1] / "labextension/test/figures.json").read_text()
)
NOW = datetime.fromisoformat(TABLE["now"])


def _at(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


FORMATTERS: dict[str, Callable[..., str]] = {
    "duration": format_duration_s,
    "size": format_size_gb,
    "gpus_label": figures.gpus_label,
    "percent": figures.percent,
    "gpu_count": figures.gpu_count,
    "position_label": figures.position_label,
    "runtime_label": figures.runtime_label,
    "memory_label": figures.memory_label,
    "clock_label": lambda at: figures.clock_label(_at(at), NOW, UTC),  # type: ignore[arg-type]
    "eta_label": lambda at: figures.eta_label(_at(at), NOW, UTC),
    "start_label": lambda est, at: figures.start_label(est, _at(at), NOW, UTC),
    "fragmentation_text": figures.fragmentation_text,
    "window_line": lambda w: figures.window_line(w, NOW, UTC),
    "schedule_line": lambda words, at: figures.schedule_line(words, _at(at), NOW, UTC),
}


@pytest.mark.parametrize(("name", "args", "expected"), TABLE["cases"])
def test_python_writes_each_figure_as_the_shared_table_says(
    name: str, args: list[Any], expected: str
) -> None:
    assert FORMATTERS[name](*args) == expected


def test_the_table_covers_every_formatter() -> None:
    assert {case[0] for case in TABLE["cases"]} == set(FORMATTERS)


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("0 22 * * 1-5", "weekdays at 22:00"),
        ("0 2 * * *", "every day at 02:00"),
        ("@daily", "every day at 00:00"),
        ("@hourly", "every hour at :00"),
        ("*/15 * * * *", "every 15 minutes"),
        ("30 9 * * mon,wed,fri", "Mondays, Wednesdays and Fridays at 09:30"),
        ("0 6,18 * * 0,6", "weekends at 06:00 and 18:00"),
        ("5 4 * * 1-3", "Monday to Wednesday at 04:05"),
        ("15 3 * * 7", "Sundays at 03:15"),
        ("0 0 1 * *", "on day 1 of the month at 00:00"),
        ("0 9-17 * * 1-5", "every hour from 09:00 to 17:00, weekdays"),
        ("0 */2 * * *", "every 2 hours at :00"),
        ("0 0 1 1 *", "on day 1 of the month at 00:00 in Jan"),
        # shapes without words are shown as they are, never described wrongly
        ("0 22 1 * 1-5", "cron '0 22 1 * 1-5'"),
        ("*/7 3 * * *", "cron '*/7 3 * * *'"),
        ("61 3 * * *", "cron '61 3 * * *'"),
        ("nonsense", "cron 'nonsense'"),
    ],
)
def test_cron_schedules_read_in_words(expr: str, words: str) -> None:
    assert cron_words(expr) == words


def _node(util: float, mem_mb: float, at: datetime, up: bool = True) -> NodeInventory:
    gpus = tuple(
        GpuInfo(i, f"GPU-{i}", "A100-80GB", 81920, mem_mb, util, 100.0 + util) for i in range(2)
    )
    return NodeInventory("a100-0", gpus, 64, 512, up=up, probed_at=at)


def _job(job_id: int, gpus: list[int]) -> Job:
    spec = JobSpec(kind="script", command=["x"], user="alice", gpus=len(gpus))
    return Job(
        id=job_id,
        spec=spec,
        submitted_at=NOW,
        placement=Placement(node="a100-0", gpu_indices=gpus),
    )


def test_gpu_history_keeps_a_bounded_ring_per_gpu_with_the_jobs_holding_it() -> None:
    history = GpuHistory(keep=3)
    for i in range(5):
        at = NOW + timedelta(seconds=30 * i)
        history.record([_node(10.0 * i, 1024.0 * i, at)], [_job(7, [1])] if i >= 3 else [], at)
        history.record([_node(99, 99, at)], [], at)  # the same probe again: no new sample
    first, second = history.series()
    assert first.util_pct == [20.0, 30.0, 40.0] and first.mem_used_gb == [2.0, 3.0, 4.0]
    assert first.power_w == [120.0, 130.0, 140.0] and first.jobs == [[], [], []]
    assert second.jobs == [[], [7], [7]]
    (mine,) = history.series(job_id=7)
    assert (mine.index, mine.util_pct) == (1, [30.0, 40.0])
    assert history.series(job_id=8) == []


def test_gpu_history_merges_long_ranges_keeping_peaks_and_skips_down_nodes() -> None:
    history = GpuHistory()
    for i in range(10):
        at = NOW + timedelta(seconds=i)
        history.record([_node(float(i), 1024.0 * i, at, up=i != 9)], [], at)
    series = history.series(node="a100-0", gpus=[0], points=3)[0]
    assert series.at == [NOW + timedelta(seconds=s) for s in (2, 5, 8)]
    assert series.util_pct == [1.0, 4.0, 7.0] and series.mem_used_gb == [2.0, 5.0, 8.0]
    since = history.series(gpus=[0], since=NOW + timedelta(seconds=7))[0]
    assert since.util_pct == [7.0, 8.0]
