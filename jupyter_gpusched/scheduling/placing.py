"""Placing queued jobs: the queue in policy order, admitted, packed, backfilled, launched.

A mixin of :class:`~jupyter_gpusched.scheduling.scheduler.Scheduler` (its one pass over the
queue, ``_schedule``), kept apart so the loop's lifecycle and API actions read on their own.
Besides placing, a pass may preempt batch jobs for interactive work by day and move batch
jobs to open a whole node for a big job by night.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from jupyter_gpusched.cluster.base import Backend
from jupyter_gpusched.core import backfill, estimates, policy, windows
from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.models import (
    ACTIVE_STATES,
    Job,
    JobKind,
    JobState,
    PriorityClass,
)
from jupyter_gpusched.core.usage import UsageTally
from jupyter_gpusched.packing import packer
from jupyter_gpusched.store.availability import off_the_loop
from jupyter_gpusched.store.store import Store
from jupyter_gpusched.store.writer import StoreWriter, set_reasons

from . import faults, health, moves, waiting
from .increments import PassMemo, QueuePositions, active_marks
from .launching import Launcher
from .shapes import Shapes
from .tracking import JobTracker

log = logging.getLogger(__name__)

#: Jobs held, or waiting for a not_before further ahead than this, are not weighed by full
#: passes once they have their reason (a day: the time in it is written with its date then).
SOON = timedelta(days=1)
#: A queue this long (at the last pass) is read in a worker thread.
_LONG_QUEUE = 500
#: Days of usage fair share weighs (older usage has decayed to little at the default half-life).
FAIR_SHARE_DAYS = 14
#: Full passes may hold the loop this share of the time, while submissions wake short ones.
_FULL_PASS_SHARE = 0.01
#: A full pass's answers are trusted at least this long (the interval's pass, by default).
_MIN_TRUST_S = 1.0
#: No node kept for another job (the usual case): one empty set, hashed once.
_NO_CLAIMS: frozenset[str] = frozenset()


class Placing:
    """The placing pass; mixed into the scheduler, whose state it reads and writes."""

    # Set by the scheduler.
    store: Store
    backend: Backend
    policy: windows.PolicyConfig
    clock: Clock
    tracker: JobTracker
    launcher: Launcher
    packer_policy: str
    commands: dict[JobKind, Callable[[Job], Sequence[str]]]
    claim_ttl_s: float
    _inventory: list[NodeInventory]
    _positions: QueuePositions
    _estimates: dict[int, estimates.StartEstimate | None]
    _history: dict[str, list[Job]]
    _no_move: tuple[Any, ...] | None
    _reasons: dict[int, str | None]  # waiting reasons found by the pass under way
    _usage_tally: UsageTally  # fair share and today's GPU-hours, finished stretches kept
    _queue_was: int  # how many the last pass found queued
    _shapes: Shapes  # what each queued job requests, derived once per spec object
    _writer: StoreWriter | None  # the store writer process, when the store allows one
    _memo: PassMemo | None  # what the last full pass found, while it still holds
    _need_full: bool  # something besides submissions changed since the last pass
    full_pass_every_s: float  # the longest a full pass's answers are trusted
    callers: dict[str, tuple[frozenset[str], bool]]  # who users are, for their limits

    def _cluster_state(
        self, active_jobs: Sequence[Job] | None = None
    ) -> tuple[packer.ClusterState, dict[str, int]]:
        raise NotImplementedError  # the scheduler's

    async def _expand_arrays(self, now: datetime) -> None:
        raise NotImplementedError  # :mod:`.arrays`

    async def _schedule(self, now: datetime, active: windows.ActiveWindow) -> None:
        """One placing pass; the waiting reasons it finds are written together at its end.

        When only submissions happened since the last full pass, and no waiting job's time
        came, it weighs just the new jobs (:mod:`.increments`); otherwise the whole queue.
        """
        await self._expand_arrays(now)  # the array tasks that could start become jobs
        full, self._need_full = self._need_full, False
        self._reasons = {}
        try:
            if full or not self._short_pass(now, active):
                self._reasons = {}
                await self._place_queue(now, active)
        finally:
            reasons, self._reasons = self._reasons, {}
            if reasons:
                # one transaction for the pass, not one per waiting job: a bulk submit of
                # thousands would otherwise cost thousands of fsyncs
                await set_reasons(self.store, self._writer, reasons)

    def _short_pass(self, now: datetime, active: windows.ActiveWindow) -> bool:
        """:meth:`_place_new`, or False (a full pass) when it fails: the full one isolates jobs."""
        try:
            return self._place_new(now, active)
        except faults.NOT_THE_JOBS:
            raise
        except Exception:
            log.exception("gpusched: the short pass failed; weighing the whole queue")
            return False

    def _place_new(self, now: datetime, active: windows.ActiveWindow) -> bool:
        """Weigh only the jobs queued since the last full pass; False: a full pass must.

        Each new job gets its waiting reason and its place in line, or, when it could start,
        go ahead of the job the queue keeps room for, or preempt, this gives way (see
        :mod:`.increments`). Expected starts wait for the next full pass.
        """
        memo = self._memo
        if memo is None or (memo.due is not None and now >= memo.due):
            return False
        if self.clock.monotonic() >= memo.trusted_until:
            return False
        running, new = self.store.active_and_queued_since(memo.seen_id)
        if not memo.holds(self._inventory, self.policy, self.packer_policy, active, running):
            return False
        if not new:
            return True
        order = policy.order_queue(new, memo.usage, now, active.window)
        for key, job in zip(order.keys, order.jobs, strict=True):
            shape = self._shapes.of(job)
            admit_key = (job.user, job.held, shape.admit_key)
            admission = memo.admitted.get(admit_key)
            if admission is None:
                admission = memo.admitted[admit_key] = policy.admit(job, memo.ctx)
            if not admission.ok:
                self._set_reason(job, admission.reason)
                continue
            if memo.head_key is None or key < memo.head_key:
                return False  # it would be the job the queue keeps room for
            fit_key = (shape.key, _NO_CLAIMS)
            reply = memo.no_fit.get(fit_key) or packer.pack(
                memo.state, shape.request, policy=self.packer_policy
            )
            if reply.node is not None:
                return False
            if job.spec.priority_class is PriorityClass.INTERACTIVE and (
                active.window.preempt_batch
            ):
                return False
            memo.no_fit[fit_key] = reply
            if fit_key not in memo.no_room_why:
                why = waiting.no_room(reply.reason, job.spec, memo.state, self._inventory)
                memo.no_room_why[fit_key] = why
            self._set_reason(job, memo.no_room_why[fit_key])
        if order.skipped:
            by_id = {job.id: job for job in new}
            for job_id, reason in order.skipped.items():
                job = by_id[job_id]
                self._set_reason(job, reason)
                if job.spec.not_before is not None and not job.held:
                    memo.wake_by(job.spec.not_before)
        for key in order.keys:
            self._positions.add(key)
        memo.seen_id = max(job.id for job in new)
        self._queue_was += len(new)
        return True

    async def _place_queue(self, now: datetime, active: windows.ActiveWindow) -> None:
        # In a worker thread when the queue was long: with thousands queued this read is the
        # pass's longest stretch, and requests answered meanwhile would otherwise wait for all
        # of it; a short one costs less than the hop (submit -> start pays it). Shared: the
        # pass only reads the jobs (every change goes through the store), so nothing is copied.
        self._memo = None
        began = self.clock.monotonic()
        read = partial(self.store.queued_for_pass, now + SOON, shared=True)
        queued = await off_the_loop(read) if self._queue_was >= _LONG_QUEUE else read()
        self._queue_was = len(queued)
        if not queued:
            self._positions, self._estimates = QueuePositions(), {}
            return
        running, _ = self.store.list_jobs(states=list(ACTIVE_STATES), limit=None)
        state, _ = self._cluster_state(running)
        stretches = self.store.usage_stretches(since=now - timedelta(days=FAIR_SHARE_DAYS))
        usage, hours_today = self._usage_tally.totals(stretches, self.policy, now)
        order = faults.sift(
            queued, lambda jobs: policy.order_queue(jobs, usage, now, active.window), self._fault
        )
        by_id = {job.id: job for job in queued}
        claims = _kept_nodes(queued, now)
        self._shapes.begin_pass()
        self._positions = QueuePositions(order.keys)
        for job_id, reason in order.skipped.items():
            self._set_reason(by_id[job_id], reason)
        if (nothing_up := health.no_node_up(self._inventory)) is not None:
            for job in order.jobs:
                self._set_reason(job, nothing_up)
            self._estimates = {}
            return
        ctx = self._admission_context(now, active, state, hours_today, running)
        head: backfill.Reservation | None = None
        head_key: policy.OrderKey | None = None  # the place in line of the job it is for
        # Jobs left waiting, in queue order, and the earliest each may start: for estimates.
        waits: list[Job] = []
        floors: dict[int, datetime] = {}
        # Admissions, requests that fit nowhere and their reasons, until the next placement
        # changes the state: a long queue of look-alike jobs (an array, a busy cluster) asks
        # the rules and the packer once per owner and request shape rather than once per job,
        # and gets the same answers.
        admitted: dict[tuple[Any, ...], policy.Admission] = {}
        no_fit: dict[tuple[int, frozenset[str]], packer.PackReply] = {}
        no_room_why: dict[tuple[int, frozenset[str]], str] = {}
        # The active jobs as read above, until this pass changes one (a launch, a preemption,
        # a move): then read again. A pass that placed nothing reads them once.
        current: Sequence[Job] | None = running
        for key, job in zip(order.keys, order.jobs, strict=True):
            try:
                waits.append(job)
                retry_at = job.handle.get("retry_launch_at")
                if retry_at and now < datetime.fromisoformat(retry_at):
                    floors[job.id] = datetime.fromisoformat(retry_at)
                    continue  # its node refused it a moment ago; its reason says when it retries
                shape = self._shapes.of(job)
                admit_key = (job.user, job.held, shape.admit_key)
                admission = admitted.get(admit_key)
                if admission is None:
                    admission = admitted[admit_key] = policy.admit(job, ctx)
                if not admission.ok:
                    self._set_reason(job, admission.reason)
                    if admission.blocked_by == "window" and active.until is not None:
                        floors[job.id] = active.until
                    elif admission.blocked_by is not None:
                        waits.pop()  # held or over quota: no start to expect
                    continue
                request = shape.request
                claimed = (
                    frozenset(n for n, owner in claims.items() if owner != job.id)
                    if claims
                    else _NO_CLAIMS
                )
                fit_key = (shape.key, claimed)
                reply = no_fit.get(fit_key) or packer.pack(
                    state, request, policy=self.packer_policy, exclude=claimed
                )
                if reply.node is None:
                    no_fit[fit_key] = reply
                # only a job that fits somewhere needs it (the backfill's check, the head's spare)
                estimate = (
                    self._estimate(job) if head is not None and reply.node is not None else 0.0
                )
                if head is not None and reply.node is not None:
                    fits = backfill.backfill_allowed(job, head, now, estimate, node=reply.node_name)
                    if not fits.ok:
                        # Where the packer wanted it the job would delay the head: another node
                        # never does, so try those before leaving it waiting.
                        reply = packer.pack(
                            state,
                            request,
                            policy=self.packer_policy,
                            exclude={*claimed, *([head.node] if head.node else [])},
                        )
                        if reply.node is None:
                            self._set_reason(job, fits.reason)
                            continue
                if reply.node is None and job.spec.priority_class is PriorityClass.INTERACTIVE:
                    if active.window.preempt_batch and await self._preempt_for(job, state, current):
                        current = None
                        self._set_reason(job, "waiting: batch jobs are being preempted for it")
                        continue
                if reply.node is None:
                    mine = [n for n, owner in claims.items() if owner == job.id]
                    if mine:  # batch jobs are moving off its node: keep it for this job
                        self._set_reason(
                            job, f"waiting: batch jobs are moving off {mine[0]} for it"
                        )
                        head = head or backfill.Reservation(now, mine[0], 0.0)
                        continue
                    if fit_key not in no_room_why:
                        why = waiting.no_room(reply.reason, job.spec, state, self._inventory)
                        no_room_why[fit_key] = why
                    self._set_reason(job, no_room_why[fit_key])
                    if head is None:
                        head, head_key = self._reserved_start(job, now, state, current), key
                        batch = job.spec.priority_class is PriorityClass.BATCH
                        if batch and active.window.migrate_batch:
                            node = await self._migrate_for(job, state, head, active.window, current)
                            if node is not None:
                                current = None
                                claims[node] = job.id
                                head = backfill.Reservation(now, node, 0.0)
                    continue
                if head is not None:
                    ends = now + timedelta(seconds=estimate)
                    head = backfill.consume_spare(
                        head, policy.job_gpus(job), node=reply.node_name, ends_at=ends
                    )
                waits.pop()
                state.allocate(reply, cpus=job.spec.cpus, mem_gb=job.spec.mem_gb)
                admitted.clear()
                no_fit.clear()
                no_room_why.clear()
                ctx = policy.add_to_context(ctx, job)
                current = None
                self._positions.remove(key)  # out of the queue: those behind it move up
                await self._launch(job, reply, active)
            except faults.NOT_THE_JOBS:
                raise
            except Exception as exc:  # one job must not stop everyone's: hold it, go on
                if waits and waits[-1] is job:
                    waits.pop()
                self._fault(job, exc, key)
        for job_id in order.skipped:
            job = by_id[job_id]
            if job.spec.not_before is not None and not job.held:
                waits.append(job)
                floors[job_id] = job.spec.not_before
        if current is running and not claims:  # it changed nothing: short passes may follow
            self._memo = PassMemo(
                trusted_until=began + self.full_pass_every_s,
                due=min(floors.values(), default=None),
                inventory=self._inventory,
                config=self.policy,
                packer_policy=self.packer_policy,
                window=active.window,
                until=active.until,
                marks=active_marks(running),
                state=state,
                ctx=ctx,
                usage=usage,
                head_key=head_key,
                seen_id=max(job.id for job in queued),
                admitted=admitted,
                no_fit=no_fit,
                no_room_why=no_room_why,
            )
        if current is None:
            current, _ = self.store.list_jobs(states=list(ACTIVE_STATES), limit=None)
        # In a worker thread: a backfill profile for hundreds of waiting jobs is the pass's
        # longest stretch of pure computation, and requests meanwhile would wait for all of it.
        # Jobs it fails on are held back here, on the loop.
        culprits: list[tuple[Job, Exception]] = []
        ran = current

        def starts(jobs: Sequence[Job]) -> dict[int, estimates.StartEstimate | None]:
            return waiting.expected_starts(jobs, floors, ran, state, now, self._runtime)

        self._estimates = await off_the_loop(
            faults.sift, waits, starts, lambda job, exc: culprits.append((job, exc))
        )
        for job, exc in culprits:
            self._fault(job, exc)
        if self._memo is not None:
            # Trusted for a hundred times as long as the pass took: full passes then hold the
            # loop ~1 % of the time. A cheap one runs again each second, as every pass did.
            took = self.clock.monotonic() - began
            trust = min(self.full_pass_every_s, max(_MIN_TRUST_S, took / _FULL_PASS_SHARE))
            self._memo.trusted_until = began + trust

    def _fault(self, job: Job, exc: Exception, key: policy.OrderKey | None = None) -> None:
        """Hold a queued job the pass failed on (:mod:`.faults`): it leaves the line."""
        self._reasons.pop(job.id, None)
        if key is not None and self._positions.get(job.id) is not None:
            self._positions.remove(key)
        faults.hold(self.store, job, exc)

    def _admission_context(
        self,
        now: datetime,
        active: windows.ActiveWindow,
        state: packer.ClusterState,
        hours_today: Mapping[str, float],
        running: Sequence[Job],
    ) -> policy.AdmissionContext:
        """What admission weighs; ``hours_today``: GPU-hours per user since local midnight."""
        return policy.AdmissionContext.build(
            config=self.policy,
            window=active.window,
            now=now,
            total_gpus=float(state.gpu_count[state.node_up].sum()),
            running=running,
            hours_today=hours_today,
            callers=self.callers,
        )

    def _estimate(self, job: Job) -> float:
        return self._runtime(job).s

    def _runtime(self, job: Job) -> estimates.Runtime:
        history = self._history.get(job.user)
        if history is None:
            history, _ = self.store.list_jobs(
                states=[JobState.SUCCEEDED, JobState.FAILED], user=job.user, limit=50, order="-id"
            )
            self._history[job.user] = history
        return estimates.runtime(job, history)

    def _reserved_start(
        self, head: Job, now: datetime, state: packer.ClusterState, running: Sequence[Job] | None
    ) -> backfill.Reservation:
        """When and where ``head`` could start; ``running``: the active jobs (None: read them)."""
        if running is None:
            running, _ = self.store.list_jobs(states=list(ACTIVE_STATES), limit=1_000_000)
        whole_free = (state.gm == packer.MILLI) & state.valid & state.node_up[:, None]
        counts = whole_free.sum(axis=1)
        free = {name: float(n) for name, n in zip(state.node_names, counts, strict=True)}
        return backfill.reserved_start(head, running, free, now, estimate=self._estimate)

    def _running(self, active_jobs: Sequence[Job] | None) -> list[Job]:
        """The running jobs among ``active_jobs`` (None: read them)."""
        if active_jobs is None:
            return self.store.list_jobs(states=[JobState.RUNNING], limit=1_000_000)[0]
        return [j for j in active_jobs if j.state is JobState.RUNNING]

    async def _preempt_for(
        self, lease: Job, state: packer.ClusterState, active_jobs: Sequence[Job] | None
    ) -> bool:
        running = self._running(active_jobs)
        victims = moves.plan_preemption(
            state, lease, running, self.clock.now(), packer_policy=self.packer_policy
        )
        if not victims:
            return False
        by_id = {j.id: j for j in running}
        why = "preempted for interactive work"
        await asyncio.gather(*(self.tracker.stop(by_id[v], "preempt", why) for v in victims))
        return True

    async def _migrate_for(
        self,
        job: Job,
        state: packer.ClusterState,
        head: backfill.Reservation,
        window: windows.Window,
        active_jobs: Sequence[Job] | None,
    ) -> str | None:
        """Move batch jobs off one node so ``job`` starts there; the node kept for it, or None."""
        now = self.clock.now()
        running = self._running(active_jobs)
        # A move that did not pay only gets dearer with time (less idle time left to save,
        # more work since the checkpoints): search again only once something changed.
        marks = frozenset((j.id, j.handle.get("checkpoint_at")) for j in running)
        key = (job.id, marks, hash((state.gm.tobytes(), state.node_up.tobytes())))
        if key == self._no_move:
            return None
        plan = moves.plan_migration(
            state, job, running, now, head.start, window=window, packer_policy=self.packer_policy
        )
        if plan is None:
            self._no_move = key
            return None
        # Kept in the store, so a restart in the middle of the move still keeps the node.
        until = now + timedelta(seconds=self.claim_ttl_s)
        kept = {"node": plan.node, "until": until.isoformat()}
        self.store.update_job(job.id, handle={**job.handle, "kept_node": kept})
        self._set_reason(job, f"waiting: batch jobs are moving off {plan.node} for it")
        by_id = {j.id: j for j in running}
        await asyncio.gather(*(
            self.tracker.stop(by_id[v], "migrate", f"moved to make room for job {job.id}")
            for v in plan.job_ids
        ))  # fmt: skip
        return plan.node

    async def _launch(
        self, job: Job, reply: packer.PackReply, active: windows.ActiveWindow
    ) -> None:
        assert reply.node_name is not None
        node = next(n for n in self._inventory if n.name == reply.node_name)
        await self.launcher.place(job, reply, node, _runtime_limit(job, active))

    def _set_reason(self, job: Job, reason: str | None) -> None:
        """Record why a queued job waits (and why it was requeued); only when that changes.

        A held job keeps the reason whoever held it gave (:func:`~.policy.held_reason`).
        """
        if job.held and job.reason:
            return
        if reason and (why := job.handle.get("requeued")):
            reason = f"{reason}; requeued: {why}"
        if job.reason != reason:
            self._reasons[job.id] = reason


def _kept_nodes(queued: Sequence[Job], now: datetime) -> dict[str, int]:
    """Nodes kept for queued jobs that batch jobs were moved for (until the claims expire)."""
    kept: dict[str, int] = {}
    for job in queued:
        claim = job.handle.get("kept_node")
        if isinstance(claim, dict) and datetime.fromisoformat(claim["until"]) > now:
            kept[claim["node"]] = job.id
    return kept


def _runtime_limit(job: Job, active: windows.ActiveWindow) -> float | None:
    limits = [job.spec.max_runtime_s]
    if job.spec.priority_class is PriorityClass.BATCH:
        limits.append(policy.batch_runtime_limit_s(active.window))
    given = [x for x in limits if x]
    return min(given) if given else None
