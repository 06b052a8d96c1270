"""Arrays as one record: submitted in O(1) rows, their tasks made jobs as they can start.

A mixin of :class:`~jupyter_gpusched.scheduling.scheduler.Scheduler`, as :mod:`.actions` is.
``array: N`` stores task 0 as a queued job and the rest as one row (:mod:`..store.arrays`).
Each placing pass first makes from every array with pending tasks only as many jobs as could
start now (:meth:`ArrayWork._expand_arrays`): what the free capacity holds of the task's
shape, plus one so that a task always waits in line for the array (its place, reason and
expected start are the pending part's), at most :data:`EXPAND_PER_PASS`. The pass then weighs
and places them as any queued job, in fair-share order with everyone else's: an array's tasks
place as fast as single jobs, and a queue of 100,000 pending tasks costs a pass a few rows.
Each array is weighed against the whole free capacity, not what the arrays before it would
take: with several arrays waiting, each has enough tasks in line for the pass's fair-share
order (not the arrays' ids) to pick whose tasks start.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager as ContextManager
from datetime import datetime

from jupyter_gpusched.core import api
from jupyter_gpusched.core.errors import ForbiddenError, NotFoundError
from jupyter_gpusched.core.models import ACTIVE_STATES, Job, JobSpec, JobState
from jupyter_gpusched.core.privacy import Viewer, public_spec
from jupyter_gpusched.packing import packer
from jupyter_gpusched.packing.inventory import pack_request
from jupyter_gpusched.store.arrays import ArrayRecord, range_label
from jupyter_gpusched.store.availability import off_the_loop
from jupyter_gpusched.store.idempotency import KeyClaim
from jupyter_gpusched.store.store import Store

#: Most tasks one pass makes jobs of, over all arrays (a pass places at most so many anyway).
EXPAND_PER_PASS = 256
#: Tasks made beyond what fits now: one waits in line for the array's pending part.
EXPAND_MARGIN = 1
#: The states in which a made task is still live (cancelled with its array).
LIVE_STATES = [JobState.QUEUED, *ACTIVE_STATES, JobState.PREEMPTED, JobState.LOST]


class ArrayWork:
    """Submitting, expanding, viewing and cancelling arrays; mixed into the scheduler."""

    # Set by the scheduler.
    store: Store
    packer_policy: str
    admins: frozenset[str]

    def _admit(self, spec: JobSpec) -> None:
        raise NotImplementedError  # the scheduler's (JobActions)

    def _incoming(self, specs: Sequence[JobSpec], copies: int = 1) -> ContextManager[None]:
        raise NotImplementedError  # the scheduler's (JobActions)

    def _cluster_state(
        self, active_jobs: Sequence[Job] | None = None
    ) -> tuple[packer.ClusterState, dict[str, int]]:
        raise NotImplementedError  # the scheduler's

    def wake(self) -> None:
        """Ask for a full pass soon (the scheduler's)."""
        raise NotImplementedError

    def wake_for_new(self) -> None:
        """Ask for a pass soon after only queueing jobs (the scheduler's)."""
        raise NotImplementedError

    def job_view(self, job: Job, viewer: Viewer | None = None) -> api.JobView:
        """The scheduler's view of a job."""
        raise NotImplementedError

    async def cancel(
        self, job_id: int, *, user: str, admin: bool = False, reason: str | None = None
    ) -> Job:
        """Cancel one job (the scheduler's)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ submit
    async def submit_array(
        self, spec: JobSpec, size: int, claim: KeyClaim | None = None
    ) -> tuple[ArrayRecord, Job]:
        """Queue ``size`` copies of ``spec`` as one array: one transaction, two rows.

        Admitted once, as one job of it; ``claim``: the request's idempotency key.
        """
        self._admit(spec)
        with self._incoming([spec], size):  # counted by the queued-job limit meanwhile
            made = await off_the_loop(self.store.add_array, spec, size, claim)
        self.wake_for_new()
        return made

    # ------------------------------------------------------------------ expansion
    async def _expand_arrays(self, now: datetime) -> None:
        """Make jobs of the pending tasks that could start now (see the module's note)."""
        arrays = self.store.list_arrays(pending_only=True)
        if not arrays:
            return
        waiting = self.store.queued_tasks([a.id for a in arrays])
        state: packer.ClusterState | None = None
        budget = EXPAND_PER_PASS
        for record in arrays:
            queued = waiting.get(record.id, 0)
            if record.spec.not_before is not None and record.spec.not_before > now:
                fits = 0  # none starts before its time: one waits in line for it
            else:
                if state is None:
                    state = self._cluster_state()[0]
                fits = self._fits(state, record.spec, min(budget, record.pending) + queued)
            count = min(fits + EXPAND_MARGIN - queued, record.pending, budget)
            if count <= 0:
                continue
            await off_the_loop(self.store.expand_array, record.id, count)
            budget -= count
            if budget <= 0:
                return

    def _fits(self, state: packer.ClusterState, spec: JobSpec, most: int) -> int:
        """How many tasks of ``spec`` the free capacity of ``state`` holds, up to ``most``.

        Whole GPUs on any node, nothing else asked: counted from the free GPUs per node at
        once (at most a few too many, when CPUs or memory run out first: those wait in line).
        Else packed one by one, as the pass would.
        """
        request = pack_request(spec)
        if request.gpus and request.gpu_share == 1.0 and request.gpu_mem_gb is None:
            if not request.models and not request.cpus and not request.mem_gb:
                whole = (state.gm == packer.MILLI) & state.valid & state.node_up[:, None]
                return min(most, int((whole.sum(axis=1) // request.gpus).sum()))
        state = state.copy()  # taken from a copy: the next array weighs the same capacity
        fits = 0
        while fits < most:
            reply = packer.pack(state, request, policy=self.packer_policy)
            if reply.node is None:
                break
            state.allocate(reply, cpus=spec.cpus, mem_gb=spec.mem_gb)
            fits += 1
        return fits

    # ------------------------------------------------------------------ views
    def array_record(self, array_id: int) -> ArrayRecord:
        """The array with this id; :class:`NotFoundError` when there is none."""
        record = self.store.get_array(array_id)
        if record is None:
            raise NotFoundError(
                f"no array {array_id} (an array's id is its task 0's job id; "
                "list yours with jupyter gpusched queue)"
            )
        return record

    def array_views(
        self, records: Sequence[ArrayRecord], viewer: Viewer | None = None
    ) -> list[api.ArrayView]:
        """The API's views of these arrays, with their tasks' counts and waiting reason."""
        counts = self.store.array_counts([r.id for r in records])
        views = []
        for record in records:
            queued, _ = self.store.list_jobs(
                states=[JobState.QUEUED], array_id=record.id, limit=1, order="-id"
            )
            waiting = self.job_view(queued[0], viewer) if queued else None
            hidden = viewer is not None and not viewer.sees_all_of(record.user)
            views.append(
                api.ArrayView(
                    id=record.id,
                    user=record.user,
                    spec=public_spec(record.spec) if hidden else record.spec,
                    submitted_at=record.submitted_at,
                    size=record.size,
                    pending=record.pending,
                    pending_range=range_label(record.pending_indices(limit=20)),
                    counts=counts.get(record.id, {}),
                    cancelled=_cancelled_before_start(record),
                    reason=waiting.reason if waiting is not None else None,
                    estimated_start=waiting.estimated_start if waiting is not None else None,
                )
            )
        return views

    def array_task(self, array_id: int, index: int, viewer: Viewer | None = None) -> api.ArrayTask:
        """Task ``index`` of the array: its job once made, else one line saying why none."""
        record = self.array_record(array_id)
        if not 0 <= index < record.size:
            raise NotFoundError(
                f"array {array_id} has tasks 0 to {record.size - 1}; there is no task {index}"
            )
        label = f"{array_id}_{index}"
        job_id = self.store.array_task_id(array_id, index)
        if job_id is not None:
            job = self.job_view(self.store.get_job(job_id), viewer)
            detail = f"task {label} is job {job_id} ({job.state.value})"
            return api.ArrayTask(
                array_id=array_id, index=index, state=job.state.value, job=job, detail=detail
            )
        if record.task_cancelled(index):
            state, detail = "cancelled", f"task {label} was cancelled before it started"
        else:
            ahead = (
                index
                - record.next_index
                - sum(1 for i in record.cancelled if record.next_index <= i < index)
            )
            state = "pending"
            detail = (
                f"task {label} has not started: it waits with its array's pending tasks "
                f"({ahead} of them before it); it becomes a job when the scheduler can place it"
            )
        return api.ArrayTask(array_id=array_id, index=index, state=state, job=None, detail=detail)

    # ------------------------------------------------------------------ cancel
    def _check_array_owner(self, record: ArrayRecord, user: str, admin: bool) -> None:
        if user != record.user and not admin and user not in self.admins:
            raise ForbiddenError(
                f"array {record.id} belongs to {record.user}; only its owner or an admin "
                "may cancel it"
            )

    async def cancel_array_task(
        self, array_id: int, index: int, *, user: str, admin: bool = False
    ) -> api.ArrayTask:
        """Cancel one task: a pending one in its array's row, a made one as its job."""
        record = self.array_record(array_id)
        self._check_array_owner(record, user, admin)
        if await off_the_loop(self.store.cancel_pending_task, array_id, index):
            self.wake()
        else:
            task = self.array_task(array_id, index)  # 404 for an index out of range
            if task.job is None:
                return task  # cancelled already
            await self.cancel(task.job.id, user=user, admin=admin)
        return self.array_task(array_id, index)

    async def cancel_array(
        self, array_id: int, *, user: str, admin: bool = False
    ) -> tuple[int, list[Job]]:
        """Cancel the whole array: its pending tasks in one statement, then its live jobs.

        Returns how many pending tasks were cancelled, and the jobs cancelled.
        """
        record = self.array_record(array_id)
        self._check_array_owner(record, user, admin)
        pending = await off_the_loop(self.store.cancel_pending_rest, array_id)
        live, _ = self.store.list_jobs(states=LIVE_STATES, array_id=array_id, limit=None)
        reason = f"cancelled by {user} with its array"
        jobs = [
            await self.cancel(job.id, user=user, admin=admin, reason=reason)
            for job in live
            if job.state not in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
        ]
        self.wake()
        return pending, jobs


def _cancelled_before_start(record: ArrayRecord) -> int:
    """Tasks of ``record`` cancelled before they were made jobs."""
    rest = record.size - record.next_index if record.cancelled_rest else 0
    below = sum(1 for i in record.cancelled if not record.cancelled_rest or i < record.next_index)
    return rest + below


def split_task_id(text: str) -> tuple[int, int] | None:
    """``"123_7"`` as (123, 7); None for anything else."""
    head, sep, tail = text.partition("_")
    if not sep or not head.isdigit() or not tail.isdigit():
        return None
    return int(head), int(tail)
