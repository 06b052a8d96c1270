"""Chaos, CI-sized: the service killed with kill -9 at random moments and inside launches.

Each run submits jobs that record every start on the nodes, kills the service (half of the
kills aimed at a job being launched) and restarts it at once, then checks what the nodes saw:
nothing lost, nothing run twice, no wrong final state, no GPU held with nothing running.
``bench/chaos.py`` runs 200 jobs on both stores in both windows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _fixtures_chaos import run_chaos
from _fixtures_failover import SimNodes, kill_leftovers

pytestmark = pytest.mark.slow


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[SimNodes]:
    sim = SimNodes(tmp_path / "nodes")
    try:
        yield sim
    finally:
        sim.stop()
        kill_leftovers(tmp_path / "chaos" / "runs")


@pytest.mark.parametrize(
    ("store", "window"),
    [("sqlite", "day"), pytest.param("postgres", "night", marks=pytest.mark.postgres)],
)
def test_kill_9_at_random_moments_loses_repeats_and_leaks_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, nodes: SimNodes, store: str, window: str
) -> None:
    if store == "sqlite":
        url = f"sqlite:///{tmp_path / 'chaos.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    report = run_chaos(
        tmp_path / "chaos",
        store_url=url,
        store=store,
        window=window,
        nodes=nodes.nodes,
        jobs=12,
        kills=2,
        seed=15,
        runtime_s=(0.2, 1.0),
    )
    print(report.line())
    assert report.kills == 2 and report.kills_in_launch >= 1
    assert report.lost == [] and report.run_twice == [], report
    assert report.not_succeeded == {} and report.overlaps == [], report
    assert report.gpus_held == [], report
