"""Runtime and idle limits: running jobs past their deadline, leases idle too long, stopped.

Each upkeep pass asks (:meth:`~.scheduler.Scheduler.tick`); the stops go through the tracker,
which records why, so the job's owner reads the limit it hit.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from jupyter_gpusched.core import policy, windows
from jupyter_gpusched.core.models import JobKind, JobState
from jupyter_gpusched.core.units import format_duration_s
from jupyter_gpusched.store.store import Store

from .tracking import JobTracker


async def enforce_limits(
    store: Store, tracker: JobTracker, now: datetime, window: windows.Window
) -> None:
    """Stop the running jobs past their deadline, and the leases idle past ``window``'s limit."""
    jobs, _ = store.list_jobs(states=[JobState.RUNNING], limit=1_000_000)
    stops = []
    for job in jobs:
        deadline = job.handle.get("deadline")
        if deadline and now >= datetime.fromisoformat(deadline):
            limit = job.handle.get("limit_s", 0)
            stops.append(
                tracker.stop(job, "timeout", f"max runtime {format_duration_s(limit)} reached")
            )
        elif job.spec.kind is JobKind.LEASE and policy.lease_idle_expired(job, window, now):
            idle = window.lease_idle_timeout_s or 0.0
            stops.append(
                tracker.stop(job, "idle", f"lease idle for {format_duration_s(idle)}: reclaimed")
            )
    await asyncio.gather(*stops)
