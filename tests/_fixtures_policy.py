"""Builders of plain policy inputs (jobs, configs) for the policy tests and the day/night bench."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from jupyter_gpusched.core.models import Job, JobKind, JobSpec, JobState, Placement, PriorityClass

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)  # Monday 09:00 UTC, like the clock


def make_job(
    job_id: int,
    *,
    kind: str = "script",
    gpus: int = 1,
    user: str = "alice",
    submitted_at: datetime = T0 - timedelta(hours=1),
    state: JobState = JobState.QUEUED,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
    node: str | None = None,
    held: bool = False,
    last_activity_at: datetime | None = None,
    handle: dict[str, Any] | None = None,
    **spec: Any,
) -> Job:
    """A job with sensible defaults; ``spec`` goes to :class:`JobSpec`."""
    if kind == "script":
        spec.setdefault("command", ["python", "train.py"])
    if "priority" in spec and isinstance(spec["priority"], str):
        spec["priority"] = PriorityClass(spec["priority"])
    job_spec = JobSpec(kind=JobKind(kind), gpus=gpus, user=user, **spec)
    placement = None
    if node is not None:
        placement = Placement(node=node, gpu_indices=list(range(gpus)))
    return Job(
        id=job_id,
        spec=job_spec,
        state=state,
        held=held,
        submitted_at=submitted_at,
        started_at=started_at,
        finished_at=finished_at,
        placement=placement,
        last_activity_at=last_activity_at,
        handle=handle or {},
    )
