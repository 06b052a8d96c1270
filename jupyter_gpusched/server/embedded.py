"""A scheduler put together from its parts: a store, a backend, a policy and a clock.

The server extension composes one from its traits (:mod:`.building`); ``jupyter gpusched
demo`` runs one on the embedded simulated cluster under a clock of its own (:func:`embedded`).
Both compose it here, beside the server, so the CLI keeps to commands and the store, the
scheduler and the cluster are imported by the layer that runs them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.ssh import NodeConfig, SshBackend
from jupyter_gpusched.core.clock import Clock, SystemClock
from jupyter_gpusched.core.windows import PolicyConfig
from jupyter_gpusched.scheduling.scheduler import Scheduler
from jupyter_gpusched.store.store import Store


def compose(
    *,
    store_url: str,
    backend: Any,
    clock: Clock,
    policy: PolicyConfig,
    scheduler_class: type[Any] = Scheduler,
    **options: Any,
) -> Any:
    """A scheduler (not started) on the store at ``store_url``, acting through ``backend``.

    ``options`` are the scheduler's own keyword arguments (intervals, admins, ...).
    """
    return scheduler_class(
        store=Store(store_url, clock=clock), backend=backend, policy=policy, clock=clock, **options
    )


@dataclass(frozen=True)
class Embedded:
    """A started scheduler and the simulated cluster it acts on."""

    scheduler: Scheduler
    sim: SimCluster
    nodes: list[NodeConfig]  # the simulated nodes, as the backend reaches them


@asynccontextmanager
async def embedded(
    base_dir: Path, *, clock: Clock, policy: PolicyConfig | None = None, **options: Any
) -> AsyncIterator[Embedded]:
    """The default simulated cluster and a started scheduler on a SQLite store in ``base_dir``.

    On exit the scheduler stops, its store closes and the simulated nodes stop with their jobs
    killed: nothing outlives the block.
    """
    sim = SimCluster(base_dir=base_dir / "sim")
    nodes = await sim.start()
    try:
        scheduler = compose(
            store_url=f"sqlite:///{base_dir / 'gpusched.db'}",
            # the nodes' processes run in real time, whatever clock the scheduler keeps
            backend=SshBackend(nodes, clock=SystemClock()),
            clock=clock,
            policy=policy or PolicyConfig(),
            **options,
        )
        try:
            await scheduler.start()
            yield Embedded(scheduler, sim, nodes)
        finally:
            await scheduler.stop()
            scheduler.store.close()
    finally:
        await sim.stop(kill_jobs=True)
