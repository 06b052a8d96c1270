"""What users ask of the queue: submit, read, cancel, change, logs.

A mixin of :class:`~jupyter_gpusched.scheduling.scheduler.Scheduler`, as
:mod:`.placing` is: request handlers call these; the loop and the pass live apart.
Admission here is judged against the empty cluster's shapes (never the queue), so a submit
costs a dictionary lookup and one commit, whatever the queue holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from jupyter_gpusched.cluster.base import Backend
from jupyter_gpusched.core import api, policy, windows
from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import (
    ConflictError,
    ForbiddenError,
    GpuSchedError,
    InfeasibleError,
    InvalidSpecError,
    TooManyError,
)
from jupyter_gpusched.core.estimates import StartEstimate
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.limits import RETRY_AFTER_S, UserLimits, refusal
from jupyter_gpusched.core.models import (
    ACTIVE_STATES,
    ARRAY_BEING_QUEUED,
    TERMINAL_STATES,
    Job,
    JobKind,
    JobSpec,
    JobState,
    PriorityClass,
    array_task,
)
from jupyter_gpusched.core.privacy import Viewer
from jupyter_gpusched.packing import packer
from jupyter_gpusched.packing.inventory import pack_request
from jupyter_gpusched.store.availability import off_the_loop
from jupyter_gpusched.store.idempotency import KeyClaim
from jupyter_gpusched.store.store import Store

from .health import NodeHealth
from .increments import QueuePositions
from .placing import SOON
from .submits import GroupCommit
from .tracking import JobTracker, launched
from .waiting import largest

#: Tasks of an array written in one transaction; a bigger array takes several.
BULK_CHUNK = 500
#: A big array none of whose tasks was written for this long was cut off (a killed server).
CUT_ARRAY_AFTER_S = 600.0


class JobActions:
    """The API's actions on jobs; mixed into the scheduler, whose state they read."""

    # Set by the scheduler.
    store: Store
    backend: Backend
    clock: Clock
    policy: windows.PolicyConfig
    tracker: JobTracker
    health: NodeHealth
    admins: frozenset[str]
    cancel_grace_s: float
    commands: dict[JobKind, Callable[[Job], Sequence[str]]]
    _inventory: list[NodeInventory]
    _base_key: tuple[Any, ...]
    _positions: QueuePositions
    _estimates: dict[int, StartEstimate | None]
    _feasible: dict[tuple[Any, ...], str | None]
    _group: GroupCommit
    # Who the callers are, as their last request said: user -> (groups, admin). The running
    # jobs' limit is weighed by passes, which have no request to ask.
    callers: dict[str, tuple[frozenset[str], bool]]
    # Jobs accepted and not yet committed, by (user, whether a lease).
    _submitting: dict[tuple[str, bool], int]

    def wake(self) -> None:
        """Ask for a pass soon (the scheduler's)."""
        raise NotImplementedError

    def wake_for_new(self) -> None:
        """Ask for a pass soon after only queueing jobs (the scheduler's)."""
        raise NotImplementedError

    async def notify(self) -> None:
        """Tell event subscribers now (the scheduler's)."""
        raise NotImplementedError

    def _empty_state(self) -> packer.ClusterState:
        raise NotImplementedError  # the scheduler's

    def submit(self, spec: JobSpec, claim: KeyClaim | None = None) -> Job:
        """Queue a job; refuse at once a request no node could ever hold.

        ``claim``: the request's idempotency key, committed with the job.
        """
        self._admit(spec)
        job = self.store.add_job(spec, claim)
        self.wake_for_new()
        return job

    async def submit_grouped(self, spec: JobSpec, claim: KeyClaim | None = None) -> Job:
        """:meth:`submit` for concurrent callers: committed off the loop, with the others'."""
        self._admit(spec)
        with self._incoming([spec]):
            return await self._group.submit(spec, claim)

    @contextlib.contextmanager
    def _incoming(self, specs: Sequence[JobSpec], copies: int = 1) -> Iterator[None]:
        """Count ``specs`` (each ``copies`` times: an array) as on their way into the queue.

        :meth:`check_room` adds them to what the store counts: entered before the first await
        (the check just before saw nothing of them), so two submits at once cannot both pass.
        """
        counts = Counter((spec.user, spec.kind is JobKind.LEASE) for spec in specs)
        counts = Counter({key: n * copies for key, n in counts.items()})
        for key, n in counts.items():
            self._submitting[key] = self._submitting.get(key, 0) + n
        try:
            yield
        finally:
            for key, n in counts.items():
                if (left := self._submitting[key] - n) > 0:
                    self._submitting[key] = left
                else:
                    del self._submitting[key]

    def note_caller(self, user: str, groups: frozenset[str], admin: bool) -> None:
        """Remember who ``user`` is (their groups, whether an admin) for the passes' limits."""
        if self.callers.get(user) != (groups, admin):
            self.callers[user] = (groups, admin)
            self.wake()  # their running jobs' limit may have changed: weigh the whole queue

    def limits_of(self, user: str) -> UserLimits:
        """The limits that hold for ``user``, as far as this scheduler knows who they are."""
        groups, admin = self.callers.get(user, (frozenset(), False))
        return self.policy.limits.for_user(user, groups, admin)

    def check_room(self, mine: UserLimits, *, jobs: int, leases: int = 0) -> None:
        """Refuse (429) ``jobs`` more jobs, ``leases`` of them leases, past ``mine``'s limits.

        Counted in the store (the truth, which another service sharing it writes too), plus
        this server's submits not yet committed.
        """
        limits = mine.limits
        if limits.queued_jobs is None and (limits.leases is None or not leases):
            return
        queued, live_leases, tasks = self.store.live_counts(mine.user)
        queued += tasks  # an array's pending tasks count as queued jobs
        pending_leases = self._submitting.get((mine.user, True), 0)
        queued += self._submitting.get((mine.user, False), 0) + pending_leases
        live_leases += pending_leases
        if limits.queued_jobs is not None and queued + jobs > limits.queued_jobs:
            raise TooManyError(
                refusal(mine, "queued_jobs", queued, jobs),
                retry_after_s=RETRY_AFTER_S["queued_jobs"],
            )
        if limits.leases is not None and leases and live_leases + leases > limits.leases:
            raise TooManyError(
                refusal(mine, "leases", live_leases, leases),
                retry_after_s=RETRY_AFTER_S["leases"],
            )

    def submit_many(self, specs: Sequence[JobSpec], *, array: bool = True) -> list[Job]:
        """Queue several jobs in one transaction, all or none (a bulk submit, or an array).

        Each is admitted as :meth:`submit` admits one; the first refusal refuses them all,
        naming the job by its 0-based index. The copies of an array's spec are judged once.
        """
        self._admit_all(specs)
        jobs = self.store.add_jobs(specs, array=array)
        self.wake_for_new()
        return jobs

    async def submit_bulk(
        self, specs: Sequence[JobSpec], claim: KeyClaim | None = None
    ) -> list[Job]:
        """Queue several jobs as one array, all or none, without holding up anyone else.

        Admitted as :meth:`submit_many` admits them. Up to :data:`BULK_CHUNK` are one
        transaction; a bigger array is written :data:`BULK_CHUNK` tasks a transaction, off the
        event loop, so others' requests and commits go between its chunks. Its tasks are held
        while it is written and released in one statement at the end: none starts unless all
        were queued. If the submit fails, the tasks written so far are cancelled (a server
        killed meanwhile leaves them held; :meth:`cancel_cut_arrays` cancels them later).
        ``claim``: the request's idempotency key, committed with the array's first task.
        """
        self._admit_all(specs)
        with self._incoming(specs):
            return await self._write_bulk(specs, claim)

    async def _write_bulk(self, specs: Sequence[JobSpec], claim: KeyClaim | None) -> list[Job]:
        if len(specs) <= BULK_CHUNK:
            jobs = await off_the_loop(self.store.add_jobs, specs, array=True, claim=claim)
            self.wake_for_new()
            return jobs
        head = await off_the_loop(self.store.add_array_head, specs[0], claim)
        jobs = [head]
        copies = all(spec is specs[0] for spec in specs)  # array: N, the usual flood
        try:
            for start in range(1, len(specs), BULK_CHUNK):
                indices = range(start, min(start + BULK_CHUNK, len(specs)))
                if copies:  # made in a thread too: 500 tasks are ~15 ms of the GIL
                    chunk, values = await off_the_loop(
                        self.store.task_values, specs[0], head.id, indices, ARRAY_BEING_QUEUED
                    )
                    jobs += await self._group.write_held(chunk, ARRAY_BEING_QUEUED, values)
                else:
                    chunk = [array_task(specs[i], head.id, i) for i in indices]
                    jobs += await self._group.write_held(chunk, ARRAY_BEING_QUEUED)
            reason = self._far_reason(specs)
            await off_the_loop(self.store.release_array, head.id, jobs, reason)
        except BaseException as exc:
            why = f"its bulk submit failed ({type(exc).__name__}); none of it ran: submit it again"
            with contextlib.suppress(Exception):  # the store is away: a later pass does it
                await off_the_loop(self.store.cancel_unfinished_arrays, why, array_id=head.id)
            raise
        self.wake()  # a full pass weighs them all
        for job in jobs:  # our own objects (the cache keeps its own)
            job.held, job.reason = False, reason
        return jobs

    def _far_reason(self, specs: Sequence[JobSpec]) -> str | None:
        """The waiting reason of an array's tasks all waiting for one far ``not_before``.

        Released with it, they are never weighed by a pass until their time comes near
        (:meth:`~jupyter_gpusched.store.store.Store.queued_for_pass`); else None.
        """
        at = specs[0].not_before
        now = self.clock.now()
        if at is None or at <= now + SOON or any(s.not_before != at for s in specs):
            return None
        return policy.not_before_reason(at, now, self.policy.timezone)

    def cancel_cut_arrays(self) -> int:
        """Cancel the tasks of big arrays whose submit was cut off (a killed server); how many.

        Only arrays nobody has written to for :data:`CUT_ARRAY_AFTER_S`: another server may be
        writing one right now.
        """
        before = self.clock.now() - timedelta(seconds=CUT_ARRAY_AFTER_S)
        why = "its bulk submit was cut off before all of it was queued; none of it ran"
        return self.store.cancel_unfinished_arrays(why, before=before)

    def _admit_all(self, specs: Sequence[JobSpec]) -> None:
        """:meth:`_admit` each job; the first refusal names the job by its 0-based index."""
        for i, spec in enumerate(specs):
            if i and spec is specs[i - 1]:
                continue
            try:
                self._admit(spec)
            except InfeasibleError as exc:
                raise InfeasibleError(f"job {i} of {len(specs)}: {exc.message}") from None

    def _admit(self, spec: JobSpec) -> None:
        self.check_feasible(spec)
        if spec.kind not in self.commands:
            raise InfeasibleError(f"{spec.kind.value} jobs are not enabled on this server")

    def check_feasible(self, spec: JobSpec) -> None:
        """Raise InfeasibleError, saying what would fit, if no node could ever hold ``spec``.

        Judged against the empty cluster's shapes (kept until the nodes change), never the
        queue or the store; the answer is kept per request shape, so a submit like an earlier
        one costs a dictionary lookup.
        """
        if not any(n.gpus or n.cpus for n in self._inventory):
            return  # no node ever answered: nothing to judge against
        empty = self._empty_state()
        request = pack_request(spec)
        key = (self._base_key, request)
        if key not in self._feasible:
            if len(self._feasible) >= 4096:
                self._feasible.clear()
            reply = packer.pack(empty, request, policy="first_fit")
            never = reply.node is None and not reply.feasible_ever
            self._feasible[key] = reply.reason if never else None
        if (reason := self._feasible[key]) is not None:
            raise InfeasibleError(f"this job can never fit: {reason}")

    @contextlib.contextmanager
    def cap_in_context(self) -> Iterator[None]:
        """A per-job cap refused while this runs says what the largest node offers instead."""
        try:
            yield
        except InvalidSpecError as exc:
            field = exc.field.rpartition(".")[2]
            more = (
                largest(self._inventory, field) if "(the per-job cap on " in exc.message else None
            )
            if more is None:
                raise
            raise InvalidSpecError(exc.field, f"{exc.message.partition(': ')[2]}; {more}") from None

    def get_job(self, job_id: int) -> Job:
        """One job (NotFoundError if absent)."""
        return self.store.get_job(job_id)

    def list_jobs(self, **filters: Any) -> tuple[list[Job], int]:
        """A page of jobs and the total matching the filters."""
        return self.store.list_jobs(**filters)

    def job_view(self, job: Job, viewer: Viewer | None = None) -> api.JobView:
        """The API's JSON for a job as ``viewer`` may see it, position and expected start.

        ``viewer`` None: everything (the server's own use, never an answer to a request).
        """
        if job.state is not JobState.QUEUED:
            return api.JobView.of(job, viewer=viewer)
        if job.id in self._estimates:
            estimate = self._estimates[job.id]
            expected = estimate.at if estimate is not None else None
            view = api.StartEstimateView.of(estimate)
        else:  # a job waiting for a far not_before, which passes do not weigh: then at best
            expected = None if job.held else job.spec.not_before
            view = api.StartEstimateView.at_not_before(expected)
        return api.JobView.of(job, self._positions.get(job.id), viewer, expected, view)

    def _check_owner(self, job: Job, user: str, admin: bool) -> None:
        if user != job.user and not admin and user not in self.admins:
            raise ForbiddenError(
                f"job {job.id} belongs to {job.user}; only its owner or an admin may change it"
            )

    async def cancel(
        self, job_id: int, *, user: str, admin: bool = False, reason: str | None = None
    ) -> Job:
        """Cancel a queued job, or stop a running one (TERM, then KILL after the grace).

        ``admin``: the caller administers the queue (the server's authentication says so).
        """
        job = self.store.get_job(job_id)
        self._check_owner(job, user, admin)
        if job.state in TERMINAL_STATES:
            raise ConflictError(f"job {job_id} already {job.state.value}; nothing to cancel")
        reason = reason or f"cancelled by {user}"
        if job.state in (JobState.QUEUED, JobState.PREEMPTED, JobState.LOST):
            job = self.tracker.move(
                job_id, JobState.CANCELLED, reason=reason, finished_at=self.clock.now()
            )
        else:
            handle = {**job.handle, "stopping": "cancel", "stop_reason": reason}
            job = self.store.update_job(job_id, handle=handle, event="stopping")
            if launched(job):
                try:
                    await self.tracker.kill(job, reason)
                except GpuSchedError as exc:
                    node = job.placement.node if job.placement else ""
                    if not self.health.unreachable(node):
                        raise
                    # Recorded: the stop is sent again when the node answers (or the job is
                    # dropped with the node once it is declared down).
                    why = f"cancelling: {exc.message}; the job is stopped when its node answers"
                    return self.store.update_job(job_id, reason=why, event=None)
                job = await self.tracker.settle_stopped(job_id)
            else:
                # Its launch has not returned: the launcher stops it once it does, or claims
                # its attempt so that it never starts (a pass away).
                self.wake()
                job = await self._settled(job_id, self.cancel_grace_s + 5.0)
        self.wake()
        await self.notify()
        return job

    async def _settled(self, job_id: int, timeout_s: float) -> Job:
        """The job once it left the active states, or as it is after ``timeout_s``."""
        deadline = self.clock.monotonic() + timeout_s
        job = self.store.get_job(job_id)
        while job.state in ACTIVE_STATES and self.clock.monotonic() < deadline:
            await asyncio.sleep(0.05)
            job = self.store.get_job(job_id)
        return job

    def update(
        self,
        job_id: int,
        *,
        user: str,
        admin: bool = False,
        priority: PriorityClass | None = None,
        held: bool | None = None,
    ) -> Job:
        """Change a job's priority class or hold it in the queue."""
        job = self.store.get_job(job_id)
        self._check_owner(job, user, admin)
        if job.state in TERMINAL_STATES:
            raise ConflictError(f"job {job_id} already {job.state.value}; it cannot change")
        fields: dict[str, Any] = {}
        if priority is not None:
            fields["spec"] = job.spec.model_copy(update={"priority": priority})
        if held is not None:
            fields["held"] = held
            if held and job.state is JobState.QUEUED:
                # said now: passes do not weigh held jobs (released ones they weigh again)
                fields["reason"] = "waiting: held by its owner"
        if not fields:
            return job
        job = self.store.update_job(job_id, **fields)
        self.wake()
        return job

    def touch(self, job_id: int) -> Job:
        """Record activity on a lease (a cell ran), postponing idle reclaim."""
        return self.store.update_job(job_id, last_activity_at=self.clock.now(), event=None)

    async def read_log(self, job_id: int, *, offset: int = 0, limit: int = 65536) -> bytes:
        """A slice of the job's log ('' before it started)."""
        job = self.store.get_job(job_id)
        if not job.handle.get("log"):
            return b""
        return await self.backend.read_log(job, offset=offset, limit=limit)

    async def follow_log(self, job_id: int, *, offset: int = 0) -> AsyncIterator[bytes]:
        """Log bytes as they are written, until the job ends."""
        while True:
            job = self.store.get_job(job_id)
            if job.handle.get("log"):
                break
            if job.state in TERMINAL_STATES:
                return
            await asyncio.sleep(0.2)
        async for chunk in self.backend.follow_log(job, offset=offset):
            yield chunk
