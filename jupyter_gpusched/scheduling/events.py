"""Fan-out of the audit log to live subscribers (the websocket, widgets, the lab panel).

Events live in the store, so a subscriber that reconnects with the id of the last event it
saw misses nothing. New events are read once per change, with their jobs, into a window of
recent messages that every live subscriber reads from: one store read per change, not one
per subscriber and event. A subscriber resuming from before that window replays from the
store on its own. Live ``cluster`` messages (the whole cluster view) follow changes, rate
limited; they are not stored.

Each subscriber gets what its viewer may see: of other users' jobs, no ``progress`` events
(they carry cell sources), event details cut to their public keys
(:func:`~jupyter_gpusched.core.privacy.event_detail_for`, the rule a job's timeline follows
too), and job views built for that viewer (:class:`~jupyter_gpusched.core.api.JobView`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from jupyter_gpusched.core import api
from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.models import Event, Job
from jupyter_gpusched.core.privacy import Viewer, event_detail_for
from jupyter_gpusched.store.store import Store

#: Events read from the store at once (a replay reads in pages of this).
PAGE = 500


class EventHub:
    """Wakes subscribers when the store's events or the cluster view changed.

    Parameters
    ----------
    window
        How many recent messages are kept for live subscribers.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        cluster: Callable[[], api.Cluster],
        job: Callable[[Job, Viewer | None], api.JobView],
        window: int = 10_000,
    ) -> None:
        self._store = store
        self._clock = clock
        self._cluster = cluster
        self._job = job
        self._changed = asyncio.Condition()
        self._version = 0
        self._key: tuple[Any, ...] = ()
        # each message as the server sees it, with its job (to build other viewers' copies)
        self._recent: deque[tuple[api.EventMessage, Job | None]] = deque(maxlen=window)
        self._last_id: int | None = None  # newest event read; None until the first notify
        self._floor = 0  # the window holds every event after this id
        self._subscribers = 0

    async def notify(self, cluster_key: tuple[Any, ...] = ()) -> None:
        """Read new events (with their jobs) once, and wake subscribers if they can see it."""
        self._read_new()
        key = (self._last_id, cluster_key)
        if key == self._key:
            return
        self._key = key
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    def _read_new(self) -> None:
        if not self._subscribers:
            # Nobody listens: building each event's message and job snapshot for nobody was
            # a tenth of a busy server's time, and even asking for the newest id was a read
            # per pass. The window restarts empty where the first subscriber finds it.
            self._last_id = None
            self._recent.clear()
            return
        if self._last_id is None:
            # A subscriber resuming from before the window replays from the store.
            self._last_id = self._floor = self._store.last_event_id()
            return
        while batch := self._store.list_events(after_id=self._last_id, limit=PAGE):
            messages = self._messages(batch)
            overflow = len(self._recent) + len(messages) - (self._recent.maxlen or 0)
            if overflow > 0:  # the oldest leave the window: older replays go to the store
                self._floor = [*self._recent, *messages][overflow - 1][0].id or self._floor
            self._recent.extend(messages)
            self._last_id = batch[-1].id
            if len(batch) < PAGE:
                break

    def _messages(self, events: Sequence[Event]) -> list[tuple[api.EventMessage, Job | None]]:
        """Each event with a snapshot of its job (one query for all of them)."""
        jobs = self._store.get_jobs(e.job_id for e in events if e.job_id is not None)
        out: list[tuple[api.EventMessage, Job | None]] = []
        for event in events:
            if event.job_id is None:
                out.append((api.EventMessage(**dict(event)), None))
            elif (job := jobs.get(event.job_id)) is None:
                # gone meanwhile: say no more than the kind and the ids
                out.append((api.EventMessage(**{**dict(event), "detail": {}}), None))
            else:
                out.append((api.EventMessage(**dict(event), job=self._job(job, None)), job))
        return out

    def _after(self, last: int) -> list[tuple[api.EventMessage, Job | None]]:
        """Messages after id ``last``: from the window, or (older) replayed from the store."""
        if last >= self._floor:
            start = bisect.bisect_right(self._recent, last, key=lambda m: m[0].id or 0)
            return list(itertools.islice(self._recent, start, None))
        return self._messages(self._store.list_events(after_id=last, limit=PAGE))

    async def subscribe(
        self,
        *,
        viewer: Viewer | None,
        after_id: int = 0,
        cluster_every_s: float | None = 1.0,
    ) -> AsyncIterator[api.EventMessage]:
        """Stored events after ``after_id`` (-1: only new ones), then new ones as they happen.

        ``viewer``: whom they are for (None: everything, for the server itself). Unless
        ``cluster_every_s`` is None, a ``cluster`` message with the whole cluster view
        follows changes, at most once per ``cluster_every_s``.
        """
        self._subscribers += 1
        try:
            async with contextlib.aclosing(self._follow(viewer, after_id, cluster_every_s)) as gen:
                async for message in gen:
                    yield message
        finally:
            self._subscribers -= 1

    async def _follow(
        self, viewer: Viewer | None, after_id: int, cluster_every_s: float | None
    ) -> AsyncIterator[api.EventMessage]:
        if self._last_id is None:
            self._read_new()
        last = (self._last_id or 0) if after_id < 0 else after_id
        loop = asyncio.get_running_loop()
        seen_version = -1
        cluster_key: object = None
        cluster_at = -float("inf")
        while True:
            async with self._changed:
                if self._version == seen_version:
                    await self._changed.wait()
                seen_version = self._version
            while batch := self._after(last):
                for message, job in batch:
                    last = message.id or last
                    if (mine := self._for(viewer, message, job)) is not None:
                        yield mine
                if last >= (self._last_id or 0):
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

    def _for(
        self, viewer: Viewer | None, message: api.EventMessage, job: Job | None
    ) -> api.EventMessage | None:
        """``message`` as ``viewer`` may see it; None when it is not theirs to see at all."""
        if job is None or viewer is None or viewer.sees_all_of(job.user):
            return message
        detail = event_detail_for(viewer, job.user, message.kind, message.detail)
        if detail is None:
            return None
        return message.model_copy(update={"detail": detail, "job": self._job(job, viewer)})
