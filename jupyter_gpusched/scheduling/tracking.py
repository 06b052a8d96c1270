"""Following launched jobs: what their nodes report becomes state changes in the store.

The scheduler decides; the tracker records. A poll's answer (running, ended, lost) moves a
job through the state machine; stops (cancel, preemption, moves, limits) settle here with
the reason they were given, and every signal sent to a job is an event on it (``kill``); a
node that comes back is reconciled: lost jobs found again, an earlier attempt of a requeued
job still running there re-adopted while its retry has not started, else stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from jupyter_gpusched.cluster.base import Backend, JobStatus
from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import BackendError, ConflictError, GpuSchedError
from jupyter_gpusched.core.models import ACTIVE_STATES, TERMINAL_STATES, Job, JobState, Placement
from jupyter_gpusched.store.store import Store

#: Bytes of a failed job's log read for its last error line: more than Python's stdout buffer
#: (8 KiB), which is flushed at exit after the traceback went to the unbuffered stderr.
_TAIL_BYTES = 32768
#: Longest reason taken from a log line.
_REASON_CHARS = 200
#: ``FileNotFoundError: ...``, ``torch.cuda.OutOfMemoryError: ...``, ``KeyboardInterrupt``.
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class JobTracker:
    """Polls active jobs and writes what happened; every state change of a job passes here."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        clock: Clock,
        *,
        node_down: Callable[[str], bool],
        settled: Callable[[str], bool],
        on_ended: Callable[[int], None],
        poll_interval_s: float,
        cancel_grace_s: float,
    ) -> None:
        self.store = store
        self.backend = backend
        self.clock = clock
        self.node_down = node_down  # past the grace: its jobs are lost
        self.settled = settled  # answering, and reconciled if it was down
        self.on_ended = on_ended  # told of every job that reached a terminal state
        self.poll_interval_s = poll_interval_s
        self.cancel_grace_s = cancel_grace_s
        self._polled_at: float | None = None

    async def poll_active(self, *, force: bool = False) -> None:
        """Poll every active job (at most every ``poll_interval_s`` unless forced)."""
        mono = self.clock.monotonic()
        if not force and self._polled_at is not None:
            if mono - self._polled_at < self.poll_interval_s:
                return
        self._polled_at = mono
        jobs, _ = self.store.list_jobs(states=list(ACTIVE_STATES), limit=1_000_000)
        jobs = [j for j in jobs if launched(j)]  # the rest are the launcher's to settle
        statuses = await asyncio.gather(*(self.safe_poll(j) for j in jobs))
        for job, status in zip(jobs, statuses, strict=True):
            # An API call (cancel) may have settled the job while we polled: theirs stands.
            with contextlib.suppress(ConflictError):
                self.apply_status(job, status)

    async def safe_poll(self, job: Job) -> JobStatus:
        """The backend's answer for one job; an error reads as lost, never raises."""
        if not launched(job):
            return JobStatus(running=False, lost=True, detail="its launch has not returned")
        try:
            status = await self.backend.poll(job)
        except GpuSchedError as exc:
            return JobStatus(running=False, lost=True, detail=exc.message)
        if status.running or status.lost or not status.exit_code or job.handle.get("stopping"):
            return status
        return replace(status, detail=await self._last_error(job) or status.detail)

    async def _last_error(self, job: Job) -> str | None:
        """The last error line of a failed job's log: its reason, not a bare "exit code 1"."""
        try:
            tail = await self.backend.read_log(job, offset=-_TAIL_BYTES, limit=_TAIL_BYTES)
        except Exception:  # an older node agent, a log gone: the exit code says enough
            return None
        return last_error_line(tail.decode("utf-8", "replace"))

    def apply_status(self, job: Job, status: JobStatus) -> None:
        """Record one poll: started, ended, or lost (when its node is down, or says it is gone)."""
        node = job.placement.node if job.placement else None
        if status.lost:
            if node and (status.gone or self.node_down(node)):
                self.lose(job, status.detail or f"node {node} is unreachable")
            return
        if status.running:
            if job.state is JobState.STARTING:
                job = self.move(job.id, JobState.RUNNING, expect=JobState.STARTING)
            p = job.placement
            if p is not None and status.gpu_indices is not None:
                if list(status.gpu_indices) != p.gpu_indices:  # the engine picked other GPUs
                    moved = p.model_copy(
                        update={"gpu_indices": list(status.gpu_indices), "gpu_uuids": []}
                    )
                    job = self.store.update_job(job.id, placement=moved, event=None)
            mark = status.checkpoint_at.isoformat() if status.checkpoint_at else None
            if mark and job.handle.get("checkpoint_at") != mark:  # what a stop would lose
                # Re-read: a stop may have marked the handle while this poll was out.
                handle = self.store.get_job(job.id).handle
                self.store.update_job(job.id, handle={**handle, "checkpoint_at": mark}, event=None)
            return
        self.finish(self.store.get_job(job.id), status)  # with a stop's marks, if one came

    def move(self, job_id: int, to_state: JobState, **fields: Any) -> Job:
        """Change a job's state in the store, noting ended jobs for the end hooks."""
        job = self.store.transition(job_id, to_state, **fields)
        if job.state in TERMINAL_STATES:
            self.on_ended(job.id)
        return job

    def finish(self, job: Job, status: JobStatus) -> None:
        """Record a job's end, by why it was stopped if it was (requeue after a move)."""
        code = status.exit_code
        ended = status.ended_at or self.clock.now()
        stopping = job.handle.get("stopping")
        if stopping in ("preempt", "migrate"):
            self.move(
                job.id,
                JobState.PREEMPTED,
                reason=job.handle.get("stop_reason"),
                finished_at=ended,
                exit_code=code,
            )
            self.requeue(job, f"{job.handle.get('stop_reason')}: requeued")
            return
        if stopping in ("cancel", "idle"):
            self.move(
                job.id,
                JobState.CANCELLED,
                finished_at=ended,
                exit_code=code,
                reason=job.handle.get("stop_reason") or "cancelled",
            )
        elif code == 0:  # its own reason: not a stale one such as "node is back"
            self.move(
                job.id, JobState.SUCCEEDED, finished_at=ended, exit_code=0, reason="exit code 0"
            )
        else:
            reason = job.handle.get("stop_reason") or _exit_reason(code)
            if status.detail and not job.handle.get("stop_reason"):
                reason = f"{status.detail} ({reason})"
            self.move(job.id, JobState.FAILED, finished_at=ended, exit_code=code, reason=reason)

    def lose(self, job: Job, detail: str) -> None:
        """Mark a job lost; requeue it while it has retries left (and no one stopped it)."""
        ending = job.handle.get("stopping") in ("cancel", "idle")
        if ending:  # its stop could not reach the node: stopped when it is back, never rerun
            detail = f"{job.handle.get('stop_reason')}; {detail}: stopped if the node comes back"
        job = self.move(job.id, JobState.LOST, reason=detail)
        if job.attempt < job.spec.retries and not ending:
            retry = f"lost ({detail}); retry {job.attempt + 1} of {job.spec.retries}"
            self.requeue(job, retry, lost=True)

    def requeue(self, job: Job, reason: str, *, lost: bool = False) -> None:
        """Queue a job again, keeping its earlier attempts' handles to reap stale copies.

        With each handle go the attempt's number, placement and start, and whether it was
        lost with its node (not stopped by us), so an attempt found still running when its
        node is back can be re-adopted where it runs.
        """
        attempt = {k: v for k, v in job.handle.items() if k != "previous"}
        attempt.setdefault("attempt", job.attempt)
        if lost:
            attempt["lost"] = True
        if job.placement is not None:
            attempt["placement"] = job.placement.model_dump(mode="json")
        if job.started_at is not None:
            attempt["started_at"] = job.started_at.isoformat()
        previous = [*job.handle.get("previous", []), attempt]
        self.move(
            job.id,
            JobState.QUEUED,
            reason=reason,
            attempt=job.attempt + 1,
            placement=None,
            handle={"previous": previous, "requeued": reason},  # the wait's reason says it
            started_at=None,
            exit_code=None,
        )

    async def mark_reachability(
        self, node: str, since: datetime | None, down_at: datetime | None
    ) -> None:
        """Tell the node's jobs it stopped answering (and when they are requeued), or is back."""
        jobs, _ = self.store.list_jobs(states=list(ACTIVE_STATES), node=node, limit=None)
        for job in jobs:
            if since is not None and down_at is not None:
                reason = (
                    f"node {node} unreachable since {since:%Y-%m-%d %H:%M:%S} UTC; the job keeps "
                    f"its GPUs and is requeued if the node is not back by {down_at:%H:%M:%S} UTC"
                )
                event = "unreachable"
            elif job.handle.get("stopping"):  # a stop it missed while the node was away
                with contextlib.suppress(GpuSchedError):
                    await self.kill(job, str(job.handle.get("stop_reason")))
                continue
            elif job.reason and job.reason.startswith(f"node {node} unreachable"):
                reason, event = None, "reachable"
            else:
                continue
            with contextlib.suppress(ConflictError):
                self.store.update_job(job.id, reason=reason, event=event)

    async def reconcile_node(self, name: str) -> None:
        """A node was down and is back: settle its lost jobs, re-adopt what still runs there."""
        lost, _ = self.store.list_jobs(states=[JobState.LOST], node=name, limit=100_000)
        for job in lost:
            status = await self.safe_poll(job)
            if status.lost:
                continue
            if status.running:
                job = self.move(job.id, JobState.RUNNING, reason="node is back")
                if job.handle.get("stopping"):
                    with contextlib.suppress(GpuSchedError):
                        await self.kill(job, str(job.handle.get("stop_reason")))
            else:
                self.finish(job, status)
        for job in self.store.jobs_with_earlier_attempts([JobState.QUEUED]):
            with contextlib.suppress(ConflictError):
                await self._readopt(job, name)

    async def _readopt(self, job: Job, node: str) -> None:
        """Take back a requeued job's last attempt if it still runs (or ended) on ``node``.

        Its retry has not started (the job is queued), so the attempt that kept running
        through the node's absence is the job again: nothing is killed, no work redone. An
        attempt that ended meanwhile gives the job its end.
        """
        *earlier, last = job.handle.get("previous", [])
        placement = last.get("placement")
        if last.get("node") != node or last.get("reaped") or not last.get("lost"):
            return  # not lost with this node (a preemption stopped it): nothing to take back
        if placement is None:
            return
        if last.get("pid") is None:
            return  # its launch never returned; reap_stale claims it so it never starts
        attempt = job.model_copy(
            update={
                "handle": last,
                "placement": Placement.model_validate(placement),
                "attempt": int(last.get("attempt", job.attempt - 1)),
            }
        )
        status = await self.safe_poll(attempt)
        if status.lost:
            return  # gone without a trace: the retry stands, and reap_stale has nothing to do
        handle = {k: v for k, v in last.items() if k not in ("placement", "started_at", "lost")}
        if earlier:
            handle["previous"] = earlier
        started = last.get("started_at")
        self.move(
            job.id,
            JobState.STARTING,
            expect=JobState.QUEUED,
            reason=f"re-adopted: node {node} is back and attempt {attempt.attempt} still ran there",
            placement=attempt.placement,
            handle=handle,
            attempt=attempt.attempt,
        )
        job = self.move(
            job.id,
            JobState.RUNNING,
            expect=JobState.STARTING,
            started_at=datetime.fromisoformat(started) if started else None,
        )
        if not status.running:
            self.finish(job, status)

    async def reap_stale(self) -> None:
        """Stop earlier attempts of requeued jobs still running on nodes that came back.

        A lost job may have kept running on a node that only dropped off the network; once
        the job runs again elsewhere (or waits), the old copy must not go on using GPUs.
        Retried every tick until the node answers.
        """
        for job in self.store.jobs_with_earlier_attempts([JobState.QUEUED, *ACTIVE_STATES]):
            stale = [
                old
                for old in job.handle.get("previous", [])
                if not old.get("reaped") and old.get("node")
            ]
            changed = False
            for old in stale:
                if not self.settled(old["node"]):
                    continue  # away, or back and not reconciled yet (it may be re-adopted)
                try:
                    await self._reap(job, old)
                except GpuSchedError:
                    continue
                old["reaped"] = True
                changed = True
            if changed:
                with contextlib.suppress(ConflictError):
                    self.store.update_job(job.id, handle=job.handle, event="reconciled")

    async def _reap(self, job: Job, old: dict[str, Any]) -> None:
        """Stop one earlier attempt; one whose launch never returned is claimed first."""
        if old.get("pgid") is None:
            if old.get("attempt") is None:
                return  # nothing says where it would be
            attempt = job.model_copy(update={"attempt": int(old["attempt"])})
            found = await self.backend.claim_launch(attempt, Placement(node=old["node"]))
            if found is None:
                return  # never started, and now never will
            old.update(found.handle)
        earlier = job.model_copy(
            update={"handle": old, "attempt": int(old.get("attempt", job.attempt))}
        )
        status = await self.safe_poll(earlier)
        if status.lost and not status.gone:
            raise BackendError(status.detail or f"node {old['node']} cannot tell")  # next tick
        if not status.running:
            return  # ended by itself while its node was away: nothing to stop
        await self.kill(
            earlier,
            f"an earlier attempt ({old.get('attempt', '?')}) still ran on node {old['node']} "
            f"when it came back, and the job runs again as attempt {job.attempt}",
        )

    async def kill(self, job: Job, why: str) -> None:
        """Signal a job's processes (TERM, then KILL after the grace), writing a ``kill`` event.

        Every stop the scheduler makes passes here, so a job's events say what was killed,
        where and why, whether the job then ends, requeues or was an earlier attempt's copy.
        """
        node = str(job.handle.get("node") or (job.placement.node if job.placement else ""))
        detail = {"node": node, "attempt": job.attempt, "why": why}
        with contextlib.suppress(GpuSchedError):
            self.store.add_event("kill", job_id=job.id, detail=detail)
        await self.backend.cancel(job, grace_s=self.cancel_grace_s)

    async def stop(self, job: Job, why: str, reason: str) -> None:
        """Stop a running job (TERM, then KILL after the grace), recording why first."""
        handle = {**job.handle, "stopping": why, "stop_reason": reason}
        try:
            job = self.store.update_job(job.id, handle=handle, event="stopping")
        except ConflictError:
            return  # it changed meanwhile (ended, cancelled): the next pass looks again
        with contextlib.suppress(GpuSchedError):
            await self.kill(job, reason)
        await self.settle_stopped(job.id)

    async def settle_stopped(self, job_id: int) -> Job:
        """After a stop signal: record the end now if the job is gone (the loop may race us)."""
        job = self.store.get_job(job_id)
        if job.state not in ACTIVE_STATES:
            return job
        status = await self.safe_poll(job)
        if status.running or status.lost:
            return job  # still dying; the next poll records it
        with contextlib.suppress(ConflictError):
            self.finish(self.store.get_job(job_id), status)
        return self.store.get_job(job_id)


def launched(job: Job) -> bool:
    """Whether the job's launch returned (its pid is in the store)."""
    return job.handle.get("pid") is not None


def last_error_line(log: str) -> str | None:
    """The line of a log tail that says why it failed, cut to ``_REASON_CHARS``.

    The last ``SomeError: ...`` line, else the last line that mentions an error, else None.
    """
    lines = [_ANSI.sub("", line).strip() for line in log.splitlines()]
    lines = [line for line in lines if line]
    for pick in (_ERROR_LINE.match, lambda line: "error" in line.lower()):
        for line in reversed(lines):
            if pick(line):
                return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 1] + "…"
    return None


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "ended without an exit code"
    if code < 0 or code > 128:
        sig = -code if code < 0 else code - 128
        return f"killed by signal {sig}"
    return f"exit code {code}"
