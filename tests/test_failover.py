"""Two services on one PostgreSQL store: the leader killed with kill -9 while jobs run.

Nothing is lost, nothing runs twice, no GPU is used by two jobs at once, no cron firing is
doubled, and a standby leads again within seconds. (bench/failover.py runs the full size.)
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fixtures_failover import (
    SimNodes,
    audit,
    job_spec,
    kill_leftovers,
    start_pair,
)
from _fixtures_polling import Deadline
from _fixtures_postgres import postgres_server_url, postgres_url  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

JOBS = 40
KILLS = 2


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[SimNodes]:
    sim = SimNodes(tmp_path / "nodes")
    try:
        yield sim
    finally:
        sim.stop()


def test_killing_the_leader_loses_repeats_and_overlaps_nothing(
    tmp_path: Path,
    postgres_url: str,  # noqa: F811
    nodes: SimNodes,
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    pair = start_pair(tmp_path, postgres_url, nodes.nodes)
    rng = random.Random(7)
    try:
        api = pair.services[0]
        token = api.admin_token
        ids = [
            api.api("POST", "jobs", job_spec(runs, rng.uniform(0.5, 2.5), rng.choice((1, 1, 2, 4))),
                    token=token)["id"]
            for _ in range(JOBS)
        ]  # fmt: skip
        cron = api.api(
            "POST",
            "definitions",
            {"notebook": "cron.ipynb", "schedule": "* * * * *", "content": _notebook()},
            token=token,
        )
        takeovers = []
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.0, 3.0))
            _, took_s = pair.kill_leader()
            takeovers.append(took_s)
        # a hung leader: only its lease's expiry (3 s here) frees the queue; once it wakes up
        # it must stand by, its late writes refused
        frozen_s = pair.freeze_leader()
        deadline = Deadline(240)
        while True:
            live = pair.leader()
            jobs = {j["id"]: j for j in live.api("GET", "jobs?limit=1000", token=token)["jobs"]}
            if all(jobs[i]["state"] in ("succeeded", "failed", "cancelled", "lost") for i in ids):
                break
            assert not deadline.expired(), {i: jobs[i]["state"] for i in ids}
            time.sleep(0.5)
        seen = audit(runs)
        states = {i: jobs[i]["state"] for i in ids}
        assert [i for i, s in states.items() if s != "succeeded"] == [], states
        assert {i: n for i, n in seen.starts.items() if n != 1} == {}
        assert sorted(seen.starts) == sorted(ids)
        assert seen.overlaps == []
        fired = live.api("GET", f"definitions/{cron['id']}", token=token)
        times = [r["fire_at"] for r in fired["runs"]]
        assert len(times) == len(set(times))
        assert all(t < 10.0 for t in takeovers), takeovers
        assert frozen_s < 15.0, frozen_s
        print(f"takeover after kill -9: {', '.join(f'{t:.1f} s' for t in takeovers)}; "
              f"after SIGSTOP: {frozen_s:.1f} s")  # fmt: skip
    finally:
        for service in pair.services:
            service.stop()
        kill_leftovers(runs)


def _notebook() -> dict[str, object]:
    return {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": "print('tick')", "outputs": [],
             "execution_count": None},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }  # fmt: skip
