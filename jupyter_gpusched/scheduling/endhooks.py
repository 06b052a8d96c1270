"""End hooks: what features do once a job that ran has ended (a notebook's outputs fetched).

Each ended job's hooks run once: the store records it in the job's handle, so a restart (or a
new leader) runs the hooks of jobs that ended meanwhile, and never again those that ran. A
store outage stops a round and leaves its jobs for the next; a hook that fails otherwise is
logged and counts as run, so one bad hook cannot stop the loop or the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

from jupyter_gpusched.core.errors import UnavailableError
from jupyter_gpusched.core.models import TERMINAL_STATES, Job
from jupyter_gpusched.store.store import Store

log = logging.getLogger(__name__)

#: Called once per job that ran and ended, with that job.
EndHook = Callable[[Job], Awaitable[None]]
#: The handle flag that says a job's end hooks ran.
DONE_FLAG = "ended_hooks_done"
#: How far back a start looks for jobs whose hooks did not run (no server ran when they
#: ended): a longer outage than this leaves older jobs' hooks unrun (their outputs stay on
#: the node). Bounded so that a start reads the recent past, not the whole history.
CATCH_UP = timedelta(days=30)


class EndHooks:
    """The hooks, and the ended jobs whose hooks are still to run."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.hooks: list[EndHook] = []
        self._backlog: set[int] | None = None  # None: find them in the store first

    def forget(self) -> None:
        """Find the pending jobs in the store again (a new leader: the last one ended some)."""
        self._backlog = None

    def ended(self, job_id: int) -> None:
        """A job ended here: its hooks run in the next round."""
        if self._backlog is not None:  # before the first round the store's catch-up finds it
            self._backlog.add(job_id)

    async def run(self) -> None:
        """Run the hooks of every job ended since the last round (the first: since ever)."""
        if not self.hooks:
            return
        if self._backlog is None:  # first round after a start: catch up on a crash
            # a month of ended jobs: read off the loop, so the API answers meanwhile; jobs
            # that end while it reads join the backlog as they end
            since = self.store.clock.now() - CATCH_UP
            backlog = self._backlog = set()
            try:
                found = await asyncio.to_thread(self.store.ended_without, DONE_FLAG, since=since)
            except BaseException:
                self._backlog = None  # read again next round
                raise
            if self._backlog is not backlog:
                return  # forgotten meanwhile (leadership changed): the next round reads again
            backlog.update(found)
        pending, self._backlog = self._backlog, set()
        todo = sorted(pending)
        for n, job_id in enumerate(todo):
            try:
                await self._run_for(job_id)
            except UnavailableError:
                # The store went away: these jobs' hooks run once it is back, not never.
                self._backlog.update(todo[n:])
                raise

    async def _run_for(self, job_id: int) -> None:
        job = self.store.get_job(job_id)
        if job.state not in TERMINAL_STATES:
            return
        if job.handle.get(DONE_FLAG) or not job.started_at:
            return
        for hook in self.hooks:
            try:
                await hook(job)
            except UnavailableError:
                raise  # not the hook's fault: it runs again when the store is back
            except Exception:  # one bad hook must not stop the loop or the others
                log.exception("gpusched: end hook failed for job %s", job.id)
        handle = self.store.get_job(job.id).handle  # as the hooks left it (outputs...)
        self.store.update_job(job.id, handle={**handle, DONE_FLAG: True}, event=None)
