"""Jobs read before, kept while their row's version is unchanged.

Every scheduling pass reads the whole queue, and rebuilding thousands of jobs from their rows
(JSON columns decoded, models built) was most of a pass. Every change to a job row bumps its
``version`` (compare-and-swap: the ORM's counter, or explicitly in bulk Core updates), from this
process or any other on the same store: a read first asks for ids and versions only, and
rebuilds just the rows whose version it has not seen.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from jupyter_gpusched.core.models import TERMINAL_STATES, Job, JobSpec, replaced

from .orm import JobRow
from .rows import job_from_row


class JobCache:
    """Bounded maps of job id to (version, job); least recently read go first.

    Live jobs (every pass reads them) up to ``size``; ended jobs in a small map of their own,
    ``ended_size``: the pages of history people look at again (the panel's newest jobs, a
    job page) without the server growing with the store.
    """

    def __init__(self, size: int = 20_000, ended_size: int = 2_000) -> None:
        self._size = size
        self._ended_size = ended_size
        self._jobs: OrderedDict[int, tuple[int, Job, dict[str, Any]]] = OrderedDict()
        self._ended: OrderedDict[int, tuple[int, Job, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()  # the API reads from worker threads too

    def get_many(
        self, keys: Iterable[tuple[int, int]], *, shared: bool = False
    ) -> tuple[dict[int, Job], list[int]]:
        """The jobs kept as of these (id, version) pairs, and the ids of those not kept.

        Copies the caller may change, or with ``shared`` the kept objects themselves (read
        only). One lock for all: a pass reads the whole queue, and locking per job was half
        of that read.
        """
        found: dict[int, Job] = {}
        missing: list[int] = []
        with self._lock:
            live, ended = self._jobs, self._ended
            for job_id, version in keys:
                jobs = live
                known = live.get(job_id)
                if known is None:
                    jobs, known = ended, ended.get(job_id)
                if known is None or known[0] != version:
                    missing.append(job_id)
                    continue
                jobs.move_to_end(job_id)
                found[job_id] = known[1]
        if not shared:
            found = {job_id: copy_job(job) for job_id, job in found.items()}
        return found, missing

    def put(self, row: JobRow, *, shared: bool = False) -> Job:
        """The job of ``row``, kept for the next read (its spec re-used when unchanged).

        An ended job goes to the small map of ended jobs: keeping every one read would grow
        the server with the store (a year of a lab's jobs).
        """
        with self._lock:
            known = self._jobs.get(row.id)
        spec: JobSpec | None = known[1].spec if known is not None and known[2] == row.spec else None
        job = job_from_row(row, spec)
        if job.state in TERMINAL_STATES:
            with self._lock:
                self._jobs.pop(row.id, None)
                self._ended[row.id] = (row.version, job, row.spec)
                self._ended.move_to_end(row.id)
                while len(self._ended) > self._ended_size:
                    self._ended.popitem(last=False)
        else:
            self.keep(job, row.version, row.spec)
        return job if shared else copy_job(job)

    def drop(self, job_id: int) -> None:
        """Forget a live job (it ended: the next read keeps it with the ended ones, if any)."""
        with self._lock:
            self._jobs.pop(job_id, None)

    def advance(self, job_id: int, version: int, **fields: Any) -> None:
        """A committed write took the job from ``version`` to the next with these fields.

        Only for writes that change none of the row's JSON columns (a waiting reason).
        """
        with self._lock:
            known = self._jobs.get(job_id)
            if known is not None and known[0] == version:
                self._jobs[job_id] = (version + 1, replaced(known[1], **fields), known[2])

    def keep(self, job: Job, version: int, spec_json: dict[str, Any]) -> None:
        """Keep ``job``, as of its row's ``version`` holding ``spec_json``.

        For a submit: the next pass reads the new jobs from here.
        """
        with self._lock:
            self._jobs[job.id] = (version, job, spec_json)
            self._jobs.move_to_end(job.id)
            while len(self._jobs) > self._size:
                self._jobs.popitem(last=False)


def copy_job(job: Job) -> Job:
    """A copy callers may change: the handle is its one mutable part (spec, placement frozen).

    What ``model_copy(update={"handle": ...})`` makes, a third of its cost: a page of jobs
    copies each. Kept jobs are never changed in place (a change keeps a new object), so a
    shared read stays as it was read.
    """
    return replaced(job, handle=copy.deepcopy(job.handle) if job.handle else {})
