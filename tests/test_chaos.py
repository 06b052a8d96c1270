"""Chaos, CI-sized: the service killed with kill -9 at random moments and inside launches.

Each run submits jobs that record every start on the nodes, kills the service (half of the
kills aimed at a job being launched) and restarts it at once, then checks what the nodes saw:
nothing lost, nothing run twice, no wrong final state, no GPU held with nothing running. And
the network to the nodes cut for less than the grace now and then: nothing killed or redone.
``bench/chaos.py`` runs 200 jobs on both stores in both windows, and the blips at full size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _fixtures_blip import run_blips
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
        retrying=8,
    )
    print(report.line())
    assert report.retrying is not None and report.retrying.failed == [], report.retrying
    assert report.retrying.clean, report.retrying  # every create made exactly one job
    assert report.kills == 2 and report.kills_in_launch >= 1
    assert report.lost == [] and report.run_twice == [], report
    assert report.not_succeeded == {} and report.overlaps == [], report
    assert report.gpus_held == [], report


def test_network_blips_shorter_than_the_grace_kill_redo_and_lose_nothing(
    tmp_path: Path, nodes: SimNodes
) -> None:
    report = run_blips(
        tmp_path / "chaos",
        store_url=f"sqlite:///{tmp_path / 'blips.db'}",
        store="sqlite",
        nodes=nodes.nodes,
        jobs=6,
        blips=3,
        seed=31,
        grace_s=30.0,
        blip_s=(8.0, 12.0),
        runtime_s=(30.0, 45.0),
        long_cut=False,
    )
    print(report.line())
    assert report.blips == 3
    assert report.lost == [] and report.run_twice == [] and report.killed == [], report
    assert report.not_succeeded == {} and report.overlaps == [], report
