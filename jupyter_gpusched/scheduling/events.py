"""Fan-out of the audit log to live subscribers (the websocket, widgets, the lab panel).

Events live in the store, so a subscriber that reconnects with the id of the last event it
saw misses nothing. Live ``cluster`` messages (the whole cluster view) follow changes, rate
limited; they are not stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from jupyter_gpusched.core import api
from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.models import Job
from jupyter_gpusched.store.store import Store


class EventHub:
    """Wakes subscribers when the store's events or the cluster view changed."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        cluster: Callable[[], api.Cluster],
        job: Callable[[Job], api.JobView],
    ) -> None:
        self._store = store
        self._clock = clock
        self._cluster = cluster
        self._job = job
        self._changed = asyncio.Condition()
        self._version = 0
        self._key: tuple[Any, ...] = ()

    async def notify(self, cluster_key: tuple[Any, ...] = ()) -> None:
        """Wake subscribers, but only when something they can see changed."""
        key = (self._store.last_event_id(), cluster_key)
        if key == self._key:
            return
        self._key = key
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    async def subscribe(
        self, *, after_id: int = 0, cluster_every_s: float | None = 1.0
    ) -> AsyncIterator[api.EventMessage]:
        """Stored events after ``after_id`` (-1: only new ones), then new ones as they happen.

        Unless ``cluster_every_s`` is None, a ``cluster`` message with the whole cluster view
        follows changes, at most once per ``cluster_every_s``.
        """
        last = self._store.last_event_id() if after_id < 0 else after_id
        loop = asyncio.get_running_loop()
        seen_version = -1
        cluster_key: object = None
        cluster_at = -float("inf")
        while True:
            async with self._changed:
                if self._version == seen_version:
                    await self._changed.wait()
                seen_version = self._version
            while True:
                batch = self._store.list_events(after_id=last, limit=500)
                for event in batch:
                    last = event.id
                    job = None
                    if event.job_id is not None:
                        with contextlib.suppress(GpuSchedError):
                            job = self._job(self._store.get_job(event.job_id))
                    yield api.EventMessage(**dict(event), job=job)
                if len(batch) < 500:
                    break
            if cluster_every_s is not None and cluster_key != self._key:
                wait_s = cluster_at + cluster_every_s - loop.time()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                cluster_key, cluster_at = self._key, loop.time()
                yield api.EventMessage(
                    id=None,
                    kind="cluster",
                    at=self._clock.now(),
                    job_id=None,
                    cluster=self._cluster(),
                )
