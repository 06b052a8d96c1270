"""Nodes that come and go: a small simulated lab, and a scheduler quick to notice a node leave.

A plugin of every session (``conftest.py``), for the tests of unreachable nodes
(``test_node_faults``, ``test_node_grace``, ``test_sshd_grace``): real SSH (to simulated
nodes or Debian's sshd), a manual clock for the scheduler's time (the grace, the probes) and a
backend that counts a node unreachable after two failed connects and retries every 0.05-0.2 s
of real time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest_asyncio

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.sim.specs import SimNodeSpec
from jupyter_gpusched.cluster.ssh import NodeConfig, SshBackend
from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.windows import OPEN_WINDOW, PolicyConfig
from jupyter_gpusched.scheduling.scheduler import Scheduler
from jupyter_gpusched.store.store import Store

T4 = SimNodeSpec("t4-0", "T4", 16, 2, cpus=16, mem_gb=64)
V100 = SimNodeSpec("v100-0", "V100-32GB", 32, 4, cpus=32, mem_gb=256)


@pytest_asyncio.fixture
async def two_nodes(tmp_path: Path) -> AsyncIterator[SimCluster]:
    """A T4 node and a V100 node over real SSH; their jobs are killed at the end."""
    cluster = SimCluster((T4, V100), base_dir=tmp_path / "sim")
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop(kill_jobs=True)


def node_scheduler(configs: list[NodeConfig], db: Path, **options: object) -> Scheduler:
    """A scheduler on a manual clock (Monday 22:00), polling every pass, probing every 30 s."""
    clock = ManualClock(datetime(2026, 11, 23, 22, 0, tzinfo=UTC))
    backend = SshBackend(
        configs,
        clock=SystemClock(),
        inventory_interval_s=30.0,
        down_after_failures=2,
        backoff_base_s=0.05,
        backoff_max_s=0.2,
    )
    settings: dict[str, object] = {"poll_interval_s": 0, "inventory_interval_s": 30.0}
    return Scheduler(
        store=Store(f"sqlite:///{db}", clock=clock),
        backend=backend,
        policy=PolicyConfig(windows=(OPEN_WINDOW,)),
        clock=clock,
        cancel_grace_s=1,
        **{**settings, **options},  # type: ignore[arg-type]
    )
