"""What ``%%gpu`` and ``%gpu`` tell the user, one line each: waiting, running, refused.

Every figure is written by :mod:`jupyter_gpusched.core.figures`, as in the widget, the CLI and
the lab panel.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from typing import Any

from jupyter_gpusched.core.api import JobView, Window
from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.figures import (
    gpus_label,
    position_label,
    start_label,
    start_nudge,
    window_line,
)
from jupyter_gpusched.core.models import JobState

from .options import OPTION_OF


def plain(exc: GpuSchedError) -> str:
    """A refusal in one line, naming the option to fix (``--gpus: must be at most 64, ...``)."""
    field = getattr(exc, "field", None)
    option = OPTION_OF.get(field or "")
    if option and exc.message.startswith(f"{field}: "):
        return f"{option}{exc.message[len(field or '') :]}"
    return exc.message


def mismatch(job: JobView, asked: dict[str, Any], name: str) -> str | None:
    """What to tell a cell whose request differs from the lease it would run on, or None."""
    spec = job.spec
    held = {
        "gpus": spec.gpus,
        "gpu_mem_gb": spec.gpu_mem_gb,
        "gpu_share": spec.gpu_share,
        "gpu_models": spec.gpu_models,
    }
    if all(held.get(k) == v for k, v in asked.items()):
        return None
    has = gpus_label(spec.gpus, spec.gpu_share, spec.gpu_mem_gb)
    if spec.gpu_models:
        has += f" of model {'|'.join(spec.gpu_models)}"
    wants = gpus_label(
        asked.get("gpus", spec.gpus), asked.get("gpu_share"), asked.get("gpu_mem_gb")
    )
    if asked.get("gpu_models"):
        wants += f" of model {'|'.join(asked['gpu_models'])}"
    other = "" if name == "default" else f" --lease {name}"
    return (
        f"this notebook's lease {job.id}{other} holds {has}; this cell asks for {wants}. "
        f"Run %gpu release{other} first (the lease's variables are lost), then run this cell "
        "again; or give --lease NAME for a second lease"
    )


def standing(job: JobView) -> str:
    """Where a new job stands: ``queued, 2nd in line, starts in 12m (14:05)``."""
    parts = [job.state.value]
    if job.state is JobState.QUEUED and job.position:
        parts.append(position_label(job.position))
    estimate = job.estimate.model_dump() if job.estimate is not None else None
    if job.state is JobState.QUEUED and (job.estimated_start or estimate):
        now = datetime.now(UTC)
        parts.append(f"starts {start_label(estimate, job.estimated_start, now, _local_tz())}")
        if nudge := start_nudge(estimate):
            parts.append(nudge)
    return ", ".join(parts)


def waiting_line(
    job: JobView, window: Window | None, now: datetime | None = None, tz: tzinfo | None = None
) -> str:
    """The one line shown while a lease waits: position, start, reason, the window in force."""
    now, tz = now or datetime.now(UTC), tz or _local_tz()
    spec = job.spec
    parts = [
        f"%%gpu: waiting for lease {job.id} "
        f"({gpus_label(spec.gpus, spec.gpu_share, spec.gpu_mem_gb)})"
    ]
    if job.state is JobState.QUEUED:
        if job.position:
            parts.append(position_label(job.position))
        estimate = job.estimate.model_dump() if job.estimate is not None else None
        parts.append(f"starts {start_label(estimate, job.estimated_start, now, tz)}")
        if nudge := start_nudge(estimate):
            parts.append(nudge)
    else:
        parts.append(job.state.value)
    if job.reason:
        parts.append(job.reason.removeprefix("waiting: "))
    if window is not None:
        parts.append(window_line(window.model_dump(), now, tz))
    return " | ".join(parts)


def running_line(job: JobView) -> str:
    """The line that replaces the waiting one once the lease runs (and what it shares)."""
    placement = job.placement
    node = placement.node if placement else "?"
    gpus = ",".join(str(i) for i in placement.gpu_indices) if placement else ""
    line = f"%%gpu: lease {job.id} running on {node} GPU {gpus}"
    reason = job.reason or ""
    if placement is not None and placement.share_per_gpu < 1 and reason.startswith("placed on "):
        line += f" ({reason.split(', ', 1)[-1]})"  # "20G of each, sharing them with job 12"
    return line


def _local_tz() -> tzinfo:
    return datetime.now().astimezone().tzinfo or UTC
