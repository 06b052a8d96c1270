"""Text views of the API's answers: the queue table, the cluster map, definitions.

Shared by ``jupyter gpusched queue|nodes|definitions``, the ``%gpu`` magic and the demo. Every
figure is written by :mod:`jupyter_gpusched.core.figures` (the widget and the lab panel write
them the same way); times are local to the terminal unless a timezone is given.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jupyter_gpusched.core.api import ArrayView, Cluster, Definition, Gpu, JobView
from jupyter_gpusched.core.figures import (
    clock_label,
    fragmentation_text,
    schedule_line,
    window_line,
)

from .queue_text import local_tz, queue_text, waiting_text

__all__ = [
    "GLYPHS",
    "format_cluster",
    "format_definition",
    "format_notebook_job",
    "format_queue",
    "local_tz",
    "waiting_line",
]

#: GPU state -> glyph in the ``nodes`` map; lower case when the GPU is only partly taken.
GLYPHS = {"free": ".", "interactive": "I", "batch": "B", "foreign": "F", "down": "x"}


def format_queue(
    jobs: list[JobView],
    *,
    total: int | None = None,
    now: datetime | None = None,
    tz: tzinfo | None = None,
    arrays: list[ArrayView] | None = None,
) -> str:
    """The ``queue`` table of the API's models: :func:`~.queue_text.queue_text` of their JSON.

    ``arrays``: arrays with pending tasks, one line each (``123_[8-99999]``, as squeue shows).
    """
    return queue_text(
        [job.model_dump(mode="json") for job in jobs],
        total=total,
        now=now,
        tz=tz,
        arrays=[a.model_dump(mode="json") for a in arrays or ()],
    )


def waiting_line(job: JobView, now: datetime, tz: tzinfo) -> str:
    """``job 12, 2nd in line, starts in 12m (14:05): needs 8 GPUs free on one node; ...``."""
    return waiting_text(job.model_dump(mode="json"), now, tz)


def format_cluster(
    cluster: Cluster, *, now: datetime | None = None, tz: tzinfo | None = None
) -> str:
    """The ``nodes`` map: glyphs per GPU, free count, then figures and the window's rules."""
    now, tz = now or cluster.at, tz or local_tz()
    rows = []
    for node in cluster.nodes:
        glyphs = "".join(_glyph(g) for g in node.gpus)
        free = sum(1 for g in node.gpus if g.state == "free")
        model = node.gpus[0].model if node.gpus else "-"
        status = "up" if node.up else f"DOWN {node.error or ''}".strip()
        rows.append((node.name, model, f"[{glyphs}]", f"{free}/{len(node.gpus)} free", status))
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append(
        "legend: . free  I interactive  B batch  F foreign  x down (lower case: GPU partly shared)"
    )
    m, q, w = cluster.metrics, cluster.queue, cluster.window
    lines.append(
        f"gpus: {m.gpus_free}/{m.gpus_total} free; queue: {q.queued} waiting, {q.running} running"
    )
    lines.append(f"fragmentation: {fragmentation_text(m.model_dump())}")
    lines.append(f"window: {window_line(w.model_dump(), now, tz)} ({w.applies})")
    lines += [f"  - {rule}" for rule in w.rules]
    return "\n".join(lines)


def format_definition(
    d: Definition, *, now: datetime | None = None, tz: tzinfo | None = None
) -> str:
    """One line per recurring notebook job: its schedule in words and its next run.

    The next run reads in the definition's own timezone, the one its words ("weekdays at
    22:00") and the label after them mean; ``tz`` is ignored unless that zone is unknown here.
    """
    now = now or datetime.now(UTC)
    try:
        tz = ZoneInfo(d.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        tz = tz or local_tz()
    when = "paused" if d.paused else schedule_line(d.schedule_words, d.next_fire_at, now, tz)
    return (
        f"definition {d.id} [{d.user}] {d.spec.notebook}: {when} "
        f"({d.timezone}; cron '{d.schedule}', catch-up {d.catch_up}; {d.fire_count} runs)"
    )


def format_notebook_job(
    job: JobView, *, now: datetime | None = None, tz: tzinfo | None = None
) -> str:
    """A notebook job in one line, with where its executed copy went."""
    now, tz = now or datetime.now(UTC), tz or local_tz()
    spec = job.spec
    text = f"job {job.id} {job.state.value}: {spec.notebook}"
    if spec.not_before:
        text += f" (not before {clock_label(spec.not_before, now, tz)})"
    if job.outputs is not None and job.outputs.notebook:
        text += f" -> {job.outputs.notebook}"
    return text


def _glyph(gpu: Gpu) -> str:
    glyph = GLYPHS.get(gpu.state, "?")
    if gpu.state in ("interactive", "batch") and gpu.share_used < 1:
        glyph = glyph.lower()
    return glyph
