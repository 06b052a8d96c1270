"""Jobs a pass fails on: held, with the reason, so that one job never stops everyone's.

Every number and time a job carries is bounded by the contract (:mod:`..core.models`), so a
pass should never fail on a job. This is the defence behind the bounds, for what they miss (a
job stored before a bound existed, a bug): the pass holds *that* job -- it stays queued, held,
its reason saying why, its handle counting the failures -- and goes on with the others.
Releasing it tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from jupyter_gpusched.core.errors import UnavailableError
from jupyter_gpusched.core.models import Job
from jupyter_gpusched.store.leader import NotLeaderError
from jupyter_gpusched.store.store import Store

log = logging.getLogger(__name__)

#: Failures of the store or of leadership: never a job's fault, so never held against one.
NOT_THE_JOBS = (UnavailableError, NotLeaderError)

T = TypeVar("T")


def hold(store: Store, job: Job, exc: Exception) -> None:
    """Hold ``job``, which the pass failed on with ``exc``; log it for the admins."""
    error = f"{type(exc).__name__}: {exc}"[:500]
    log.error(
        "gpusched: the scheduler could not handle job %s of %s; held it (see its reason)",
        job.id,
        job.user,
        exc_info=exc,
    )

    def reason(count: int) -> str:
        times = "" if count == 1 else f" ({count} times)"
        return (
            f"held: the scheduler could not handle this job{times}: {error}; "
            "cancel it, or release it to try again"
        )

    store.hold_faulted(job.id, error, reason)


def sift(
    jobs: Sequence[Job],
    run: Callable[[Sequence[Job]], T],
    on_fault: Callable[[Job, Exception], None],
) -> T:
    """``run(jobs)``; if it fails, ``run`` each job alone to find those it fails on.

    Those go to ``on_fault``; the answer is ``run`` of the others. For pure, per-job work
    (ordering the queue, expected starts) that failed as a whole: the search costs only then.
    """
    try:
        return run(jobs)
    except NOT_THE_JOBS:
        raise
    except Exception:
        fine = []
        for job in jobs:
            try:
                run([job])
            except NOT_THE_JOBS:
                raise
            except Exception as exc:
                on_fault(job, exc)
            else:
                fine.append(job)
        return run(fine)
