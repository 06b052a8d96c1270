"""Probing the nodes and acting on what a probe says: who answers, who is suspect, who is down.

A mixin of :class:`~jupyter_gpusched.scheduling.scheduler.Scheduler`. The periodic probe runs
beside the passes; a node that stops answering is suspect at once (its jobs say so) and
declared down only once its grace ran out and a last probe still finds no answer
(:class:`.health.NodeHealth`); a node back after it was down is reconciled before it takes
work again.
"""

from __future__ import annotations

import asyncio

from jupyter_gpusched.cluster.base import Backend
from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.models import ACTIVE_STATES
from jupyter_gpusched.packing.inventory import attribute_processes
from jupyter_gpusched.store.store import Store

from .health import NodeHealth, NodeWatch
from .history import GpuHistory
from .tracking import JobTracker


class Inventorying:
    """The scheduler's view of its nodes, kept fresh by probes."""

    store: Store
    backend: Backend
    clock: Clock
    tracker: JobTracker
    health: NodeHealth
    gpu_history: GpuHistory
    inventory_interval_s: float
    _watch: NodeWatch
    _inventory: list[NodeInventory]
    _inventory_at: float | None
    _probing: asyncio.Task[list[NodeInventory]] | None
    _tick_lock: asyncio.Lock

    def wake(self) -> None:
        """Ask for a pass soon (the scheduler's)."""
        raise NotImplementedError

    async def notify(self) -> None:
        """Tell event subscribers now (the scheduler's)."""
        raise NotImplementedError

    async def _declare_down(self) -> None:
        """Declare down the nodes whose grace ran out and that a last probe cannot reach."""
        if not self.health.expired(n.name for n in self._inventory):
            return
        retry_now = getattr(self.backend, "retry_now", None)
        for name in self.health.expired(n.name for n in self._inventory):
            if retry_now is not None:
                retry_now(name)  # past its reconnect backoff: the node may be back already
        await self._refresh_inventory(force=True)
        for name in self.health.expired(n.name for n in self._inventory):
            self.store.add_event("node", detail=self.health.declare(name))

    async def _refresh_inventory(self, *, force: bool = False) -> None:
        """Probe the nodes when due; apply a probe's answer.

        The periodic probe (a few hundred ms of SSH round trips) runs beside the passes, and
        the pass after it finished applies it: a submit that lands meanwhile does not wait for
        it. The first probe, an asked-for one, one after a node's state changed and, with an
        interval of 0, every pass's (the simulator, tests) are waited for.
        """
        mono = self.clock.monotonic()
        due = self._inventory_at is None or mono - self._inventory_at >= self.inventory_interval_s
        now = force or self._inventory_at is None or self._watch.changed(self._inventory)
        if now or (due and self.inventory_interval_s <= 0):
            probed = await self.backend.inventory(refresh=True)
        elif self._probing is not None and self._probing.done():
            task, self._probing = self._probing, None
            probed = task.result()
        else:
            if due and self._probing is None:
                self._probing = asyncio.create_task(self.backend.inventory(refresh=True))
                self._probing.add_done_callback(lambda _: self.wake())
                self._inventory_at = mono
            return
        before = {n.name: n.up for n in self._inventory}
        holding, _ = self.store.list_jobs(states=list(ACTIVE_STATES), limit=None)
        self._inventory = attribute_processes(probed, holding)
        self._inventory_at = mono
        self._watch.probed(self._inventory)
        self._watch.say(self._inventory)
        self.gpu_history.record(self._inventory, holding, self.clock.now())
        for node in self._inventory:
            if node.up and self.health.was_down(node.name):
                await self.tracker.reconcile_node(node.name)
                self.health.reconciled(node.name)
            if before.get(node.name, True) != node.up:  # suspect now (its jobs say so), or back
                self.store.add_event("node", detail=self.health.detail(node))
                since, down_at = self.health.since(node.name), self.health.down_at(node.name)
                await self.tracker.mark_reachability(node.name, since, down_at)

    async def refresh_inventory(self) -> list[NodeInventory]:
        """Probe every node now (the API's on-demand refresh)."""
        async with self._tick_lock:
            await self._refresh_inventory(force=True)
        await self.notify()
        return self._inventory

    def _unreachable(self, name: str) -> bool:
        node_down = getattr(self.backend, "node_down", None)
        if node_down is not None:
            return bool(node_down(name))
        return any(n.name == name and not n.up for n in self._inventory)
