"""Group commit of submissions: those that arrive while one commit runs share the next.

A submit's cost is mostly its commit's fsync. Written on the event loop, each waited for the
one before and stalled every other request meanwhile; here commits run in a worker thread, and
the submissions that arrive during one are written together in the next transaction (one fsync
for all of them), each answered with its own job once that commit is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from jupyter_gpusched.core.models import Job, JobSpec
from jupyter_gpusched.store.availability import off_the_loop


class GroupCommit:
    """Queues single submissions into shared transactions, in arrival order."""

    def __init__(
        self, write: Callable[[Sequence[JobSpec]], list[Job]], written: Callable[[], None]
    ) -> None:
        self._write = write  # all or none, in one transaction (Store.add_jobs)
        self._written = written  # after each commit (the scheduler's wake)
        self._pending: list[tuple[JobSpec, asyncio.Future[Job]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def submit(self, spec: JobSpec) -> Job:
        """The queued job, once the transaction holding it committed."""
        answer: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self._pending.append((spec, answer))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_pending())
        return await answer

    async def _write_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                jobs = await off_the_loop(self._write, [spec for spec, _ in batch])
            except Exception as exc:  # the store's error is each submitter's answer
                for _, answer in batch:
                    if not answer.done():
                        answer.set_exception(exc)
                continue
            for (_, answer), job in zip(batch, jobs, strict=True):
                if not answer.done():
                    answer.set_result(job)
            self._written()
