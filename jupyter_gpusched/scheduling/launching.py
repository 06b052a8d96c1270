"""Starting placed jobs on their nodes: exactly once per attempt, whatever happens meanwhile.

A job is written as ``starting`` (with its placement) before its node is asked to start it, and
as ``running`` (with its pid) once the node says it did. Anything can happen in between -- the
scheduler killed, its lease taken over, the connection dropped, the job cancelled -- so:

* a launch is idempotent per job attempt (the node keeps a launch record in the attempt's job
  directory): a ``starting`` job found without a pid is simply launched again, and gets the
  first launch back if there was one (:meth:`Launcher.resume`);
* a launch whose outcome is unknown (the connection went) leaves the job ``starting`` on its
  node, to be resumed, never requeued elsewhere while the node may be running it;
* a job cancelled while starting is stopped once its launch returns, or, when no launch is in
  flight, its attempt is claimed on the node so that no late launch can start it;
* a launch the node refuses (a working directory that does not exist...) is tried again after
  a growing pause, and after a few tries the job fails with the node's words as its reason;
  one its owner cannot run on the node (no account, no key, sudo says no) fails at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from jupyter_gpusched.cluster.base import Backend
from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import (
    AccountError,
    ConflictError,
    GpuSchedError,
    NodeRefusedError,
)
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.models import ACTIVE_STATES, Job, JobKind, JobState, Placement
from jupyter_gpusched.core.units import format_duration_s
from jupyter_gpusched.packing.packer import PackReply
from jupyter_gpusched.store.store import Store

from .tracking import JobTracker
from .waiting import placed

log = logging.getLogger(__name__)

#: Handle keys that outlive a failed launch (the rest describe the launch itself).
_KEEP_ON_REQUEUE = ("previous", "launch_failures")


class Launcher:
    """Launches ``starting`` jobs and settles what their launches did.

    Parameters
    ----------
    max_failures
        Launches the nodes refuse before the job fails.
    backoff_s
        Pause after the first refused launch; it doubles with each further one.
    """

    def __init__(
        self,
        store: Store,
        backend: Backend,
        tracker: JobTracker,
        clock: Clock,
        commands: dict[JobKind, Callable[[Job], Sequence[str]]],
        *,
        max_failures: int = 3,
        backoff_s: float = 5.0,
    ) -> None:
        self.store = store
        self.backend = backend
        self.tracker = tracker
        self.clock = clock
        self.commands = commands
        self.max_failures = max_failures
        self.backoff_s = backoff_s

    async def place(
        self, job: Job, reply: PackReply, node: NodeInventory, limit_s: float | None
    ) -> None:
        """Start queued ``job`` where the packer put it on ``node``: ``starting``, then launch.

        ``limit_s``: its runtime limit (its deadline is kept in its handle). A job cancelled or
        changed since the pass read it is left for the next pass.
        """
        assert reply.node_name is not None
        uuids = {g.index: g.uuid for g in node.gpus}
        mem_gb = None
        if node.gpus and reply.share_per_gpu < 1:
            mem_gb = round(reply.share_per_gpu * node.gpus[0].mem_total_mb / 1024, 3)
        placement = Placement(
            node=reply.node_name,
            gpu_indices=list(reply.gpu_indices),
            gpu_uuids=[uuids.get(i, "") for i in reply.gpu_indices],
            share_per_gpu=reply.share_per_gpu,
            gpu_mem_gb=mem_gb,
        )
        now = self.clock.now()
        others: list[Job] = []
        if placement.share_per_gpu < 1:  # whom it shares with goes into its reason
            others, _ = self.store.list_jobs(states=list(ACTIVE_STATES), limit=1_000_000)
        handle: dict[str, Any] = {k: v for k, v in job.handle.items() if k in _KEEP_ON_REQUEUE}
        # Where this attempt would run, so it can be found (or claimed) if its launch is cut.
        handle.update(node=placement.node, attempt=job.attempt)
        if node.gpus:
            handle["gpu_mem_mb"] = int(placement.share_per_gpu * node.gpus[0].mem_total_mb)
        if limit_s is not None:
            handle["deadline"] = (now + timedelta(seconds=limit_s)).isoformat()
            handle["limit_s"] = limit_s
        try:
            job = self.tracker.move(
                job.id,
                JobState.STARTING,
                expect=JobState.QUEUED,
                placement=placement,
                started_at=now,
                # a lease's idle time counts from its kernel's first answer (its first touch)
                last_activity_at=None if job.spec.kind is JobKind.LEASE else now,
                handle=handle,
                reason=placed(placement, others),
            )
        except ConflictError:
            return  # cancelled or changed since this pass read the queue: the next pass sees it
        await self.launch(job)

    async def launch(self, job: Job) -> None:
        """Start a job already written as ``starting``; record what came of it."""
        assert job.placement is not None
        try:
            argv = list(self.commands[job.spec.kind](job))
            # The job learns how much GPU memory it may use; the simulator also reads it.
            env = {**job.spec.env, "GPUSCHED_GPU_MEM_MB": str(job.handle.get("gpu_mem_mb", 0))}
            spec = job.spec.model_copy(update={"env": env})
            result = await self.backend.launch(
                job.model_copy(update={"spec": spec}), job.placement, argv=argv
            )
        except NodeRefusedError as exc:
            self._refused(job, exc.message, final=isinstance(exc, AccountError))
            return
        except GpuSchedError as exc:
            # Unknown whether it started: it stays starting on its node and is resumed.
            log.warning("gpusched: launch of job %s unsettled: %s", job.id, exc.message)
            with contextlib.suppress(ConflictError):
                self.store.update_job(
                    job.id, reason=f"starting on {job.placement.node}: {exc.message}"
                )
            return
        await self._started(job.id, result.handle)

    async def resume(self, job: Job) -> None:
        """Settle a ``starting`` job that has no pid in the store (its launch was cut short)."""
        if job.handle.get("stopping"):
            await self._abandon(job)
        else:
            await self.launch(job)

    async def _started(self, job_id: int, launched: dict[str, Any]) -> None:
        """The node started it: running -- unless it was cancelled meanwhile; then stop it."""
        job = self.store.get_job(job_id)
        if job.state is JobState.STARTING and not job.handle.get("stopping"):
            try:
                self.tracker.move(
                    job_id,
                    JobState.RUNNING,
                    expect=JobState.STARTING,
                    handle={**job.handle, **launched},
                    reason=None,
                )
                return
            except ConflictError:
                job = self.store.get_job(job_id)  # cancelled between our read and write
        # Stopped while it was starting: keep where it runs, and stop it.
        with contextlib.suppress(ConflictError):
            job = self.store.update_job(job_id, handle={**job.handle, **launched}, event=None)
        with contextlib.suppress(GpuSchedError):
            await self.tracker.kill(job, str(job.handle.get("stop_reason") or "stopped"))
        if job.state is JobState.STARTING:
            await self.tracker.settle_stopped(job_id)

    async def _abandon(self, job: Job) -> None:
        """A job stopped while starting, no launch in flight: make sure it never runs."""
        assert job.placement is not None
        try:
            launched = await self.backend.claim_launch(job, job.placement)
        except GpuSchedError:
            return  # the node cannot say now; try again next pass
        if launched is not None:
            await self._started(job.id, launched.handle)
            return
        with contextlib.suppress(ConflictError):
            self.tracker.move(
                job.id,
                JobState.CANCELLED,
                reason=job.handle.get("stop_reason") or "cancelled while starting",
                finished_at=self.clock.now(),
            )

    def _refused(self, job: Job, message: str, *, final: bool = False) -> None:
        """The node could not start it: try again after a pause, or fail after a few tries.

        ``final``: trying again cannot help (the owner has no account there); fail now.
        """
        node = job.placement.node if job.placement else "its node"
        failures = int(job.handle.get("launch_failures", 0)) + 1
        handle = {k: v for k, v in job.handle.items() if k in _KEEP_ON_REQUEUE}
        handle["launch_failures"] = failures
        with contextlib.suppress(ConflictError):
            if final or failures >= self.max_failures:
                tries = "" if final else f" ({failures} tries)"
                self.tracker.move(
                    job.id,
                    JobState.FAILED,
                    expect=JobState.STARTING,
                    handle=handle,
                    finished_at=self.clock.now(),
                    reason=f"could not start on {node}{tries}: {message}",
                )
                return
            pause_s = self.backoff_s * 2 ** (failures - 1)
            handle["retry_launch_at"] = (self.clock.now() + timedelta(seconds=pause_s)).isoformat()
            self.tracker.move(
                job.id,
                JobState.QUEUED,
                expect=JobState.STARTING,
                handle=handle,
                placement=None,
                started_at=None,
                reason=(
                    f"could not start on {node} (try {failures} of {self.max_failures}): "
                    f"{message}; trying again in {format_duration_s(pause_s)}"
                ),
            )
