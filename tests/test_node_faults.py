"""Nodes that are not there: a wrong host key, the only node off, a dropped connection.

Issue #15's scenarios on real SSH to simulated nodes: every route answered 422 "a cluster needs
at least one node" and the log said nothing; a job was marked lost ~10 s before its node
showed down; a requeued job's reason no longer said why.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

import asyncssh
import pytest
from _fixtures_nodes import node_scheduler
from _fixtures_scheduler import tick_until

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.ssh import NodeConfig
from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.models import JobState, parse_spec
from jupyter_gpusched.scheduling.scheduler import Scheduler

pytestmark = pytest.mark.asyncio


@pytest.fixture
def sim(two_nodes: SimCluster) -> SimCluster:
    """A T4 node and a V100 node (``_fixtures_nodes``)."""
    return two_nodes


def scheduler(configs: list[NodeConfig], db: Path, **kwargs: object) -> Scheduler:
    # down as soon as unreachable: the grace has tests of its own (test_node_grace.py)
    return node_scheduler(configs, db, **{"node_down_after_s": 0.0, **kwargs})


def wrong_key_file(path: Path, cfg: NodeConfig) -> Path:
    """A known_hosts file holding another key for the node's address (a reinstalled node)."""
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    path.write_text(f"[{cfg.host}]:{cfg.port} {other}\n")
    return path


def submit(sched: Scheduler, code: str = "pass", **spec: object) -> int:
    body = {"kind": "script", "command": [sys.executable, "-c", code], "gpus": 1, **spec}
    return sched.submit(parse_spec(body, user="ann")).id


async def test_the_only_node_with_a_wrong_host_key_is_shown_down_with_why_and_jobs_queue(
    sim: SimCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t4 = sim.node_configs()[0]
    known = wrong_key_file(tmp_path / "known_hosts", t4)
    sched = scheduler([dataclasses.replace(t4, known_hosts=str(known))], tmp_path / "s.db")
    with caplog.at_level(logging.WARNING, logger="jupyter_gpusched"):
        await sched.start()
    try:
        said = [r.getMessage() for r in caplog.records if "t4-0" in r.getMessage()]
        assert said and str(known) in said[0] and "host key" in said[0], caplog.text
        assert "update that file" in said[0]  # what to do
        (node,) = sched.cluster_view().nodes
        assert (node.name, node.up) == ("t4-0", False)
        assert str(known) in str(node.error) and "host key" in str(node.error)
        job_id = submit(sched)  # queues: no 422 "a cluster needs at least one node"
        await sched.tick()
        waiting = sched.get_job(job_id)
        assert waiting.state is JobState.QUEUED
        assert "no node is up" in str(waiting.reason) and "t4-0" in str(waiting.reason)
    finally:
        await sched.stop()


async def test_the_only_node_off_at_start_is_shown_down_and_runs_the_queue_once_back(
    sim: SimCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t4 = sim.node_configs()[0]
    await sim.stop_node("t4-0")
    sched = scheduler([t4], tmp_path / "s.db")
    with caplog.at_level(logging.WARNING, logger="jupyter_gpusched"):
        await sched.start()
    try:
        assert any("t4-0" in r.getMessage() for r in caplog.records), caplog.text
        (node,) = sched.cluster_view().nodes
        assert not node.up and "unreachable" in str(node.error)
        job_id = submit(sched)
        await sched.tick()
        assert sched.get_job(job_id).state is JobState.QUEUED
        await sim.start_node("t4-0")
        clock = sched.clock
        assert isinstance(clock, ManualClock)

        def ran() -> bool:
            clock.advance(1.0)  # the next probe of the node comes due
            return sched.get_job(job_id).state is JobState.SUCCEEDED

        await tick_until(sched, ran)
        assert sched.cluster_view().nodes[0].up
    finally:
        await sched.stop()


async def test_a_dropped_node_shows_down_when_its_job_is_lost_and_the_requeue_says_why(
    sim: SimCluster, tmp_path: Path
) -> None:
    sched = scheduler(sim.node_configs(), tmp_path / "s.db")  # inventory every 30 s
    await sched.start()
    try:
        job_id = submit(sched, "import time; time.sleep(60)", gpu_models=["T4"], retries=1)
        await tick_until(sched, lambda: sched.get_job(job_id).state is JobState.RUNNING)
        await sim.stop_node("t4-0")
        seen: list[tuple[str, bool]] = []

        def settled() -> bool:
            job = sched.get_job(job_id)
            t4 = next(n for n in sched.cluster_view().nodes if n.name == "t4-0")
            seen.append((job.state.value, t4.up))
            return job.state is not JobState.RUNNING

        await tick_until(sched, settled)
        # never a lost or requeued job on a node still shown up
        assert [s for s in seen if s[0] != "running" and s[1]] == [], seen
        t4 = next(n for n in sched.cluster_view().nodes if n.name == "t4-0")
        assert all(g.state == "down" for g in t4.gpus)
        await sched.tick()  # a pass over the queue: the job waits (T4 only)...
        requeued = sched.get_job(job_id)
        assert requeued.state is JobState.QUEUED
        assert "requeued" in str(requeued.reason) and "t4-0" in str(requeued.reason)
        assert str(requeued.reason).startswith("waiting"), requeued.reason  # ...and says so
    finally:
        for job in sched.list_jobs()[0]:
            if job.state not in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
                await sched.cancel(job.id, user="ann")
        await sched.stop()
