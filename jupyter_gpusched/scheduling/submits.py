"""Group commit of submissions: those that arrive while one commit runs share the next.

A submit's cost is mostly its commit's fsync. Written on the event loop, each waited for the
one before and stalled every other request meanwhile; here the submissions that arrive during
one commit are written together in the next transaction (one fsync for all of them), each
answered with its own job once that commit is done.

The transaction runs in a store writer process (:mod:`jupyter_gpusched.store.writer`) when
the store can be opened from a second one, so its work does not hold the GIL the server's
requests need; otherwise in a worker thread: for an in-memory store, with
``GpuSchedApp.store_writer_process`` off, and while the child starts.

A submission's idempotency key (:mod:`jupyter_gpusched.store.idempotency`) goes into the same
transaction as its job. A key another server wrote meanwhile fails that transaction
(:class:`~jupyter_gpusched.core.errors.KeyTakenError`): its submissions are then written one
transaction each, so only the one whose key was taken fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from jupyter_gpusched.core.errors import KeyTakenError
from jupyter_gpusched.core.models import Job, JobSpec
from jupyter_gpusched.store.availability import off_the_loop
from jupyter_gpusched.store.idempotency import KeyClaim
from jupyter_gpusched.store.leader import current_fence
from jupyter_gpusched.store.store import Store
from jupyter_gpusched.store.writer import StoreWriter

#: A submission waiting for the next commit: its spec, its key, and its submitter's answer.
_Pending = tuple[JobSpec, KeyClaim | None, asyncio.Future[Job]]


class GroupCommit:
    """Queues single submissions into shared transactions, in arrival order."""

    def __init__(
        self, store: Store, written: Callable[[], None], *, writer: StoreWriter | None
    ) -> None:
        self._store = store
        self._written = written  # after each commit (the scheduler's wake)
        self._writer = writer  # the store writer process (its owner closes it), else a thread
        self._pending: list[_Pending] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, spec: JobSpec, claim: KeyClaim | None = None) -> Job:
        """The queued job, once the transaction holding it (and ``claim``) committed."""
        answer: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self._pending.append((spec, claim, answer))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._write_pending())
        return await answer

    async def close(self) -> None:
        """Write what is pending."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def write_held(
        self, specs: list[JobSpec], reason: str, values: list[dict[str, Any]] | None = None
    ) -> list[Job]:
        """``specs`` queued held with ``reason``, in one transaction of their own (no group).

        For the tasks of a big array (:meth:`~.actions.JobActions.submit_bulk`): by the store
        writer process too, when it is up. ``values``: their rows' columns, when made already.
        """
        return await self._write(specs, reason, values)

    async def _write(
        self,
        specs: list[JobSpec],
        held: str | None = None,
        values: list[dict[str, Any]] | None = None,
        claims: list[KeyClaim | None] | None = None,
    ) -> list[Job]:
        """All or none of ``specs``, in one transaction; ``held``: held with this reason.

        ``claims``: each job's idempotency key or None, committed with it.
        """
        if values is None:
            values = self._store.queued_values(specs, held=held is not None, reason=held)
        if claims is not None and not any(claims):
            claims = None
        if self._writer is None or not self._writer.ready():
            ids = await off_the_loop(self._store.insert_queued, values, claims)
        else:
            ids = await self._writer.insert_queued(values, claims, current_fence())
        if held is not None:  # a big array's chunk: its jobs made in a thread, as its values
            return await off_the_loop(self._store.queued, specs, values, ids)
        return self._store.queued(specs, values, ids)

    async def _write_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            await self._write_batch(batch)

    async def _write_batch(self, batch: list[_Pending]) -> None:
        try:
            jobs = await self._write(
                [spec for spec, _, _ in batch], claims=[claim for _, claim, _ in batch]
            )
        except KeyTakenError as exc:
            if len(batch) == 1:
                _fail(batch, exc)
            else:  # whose key was taken is told apart by writing each on its own
                for one in batch:
                    await self._write_batch([one])
            return
        except Exception as exc:  # the store's error is each submitter's answer
            _fail(batch, exc)
            return
        for (_, _, answer), job in zip(batch, jobs, strict=True):
            if not answer.done():
                answer.set_result(job)
        self._written()


def _fail(batch: list[_Pending], exc: Exception) -> None:
    for _, _, answer in batch:
        if not answer.done():
            answer.set_exception(exc)
