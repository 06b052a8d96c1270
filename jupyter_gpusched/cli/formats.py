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
    gpus_label,
    position_label,
    runtime_label,
    schedule_line,
    start_label,
    start_nudge,
    window_line,
)
from jupyter_gpusched.core.models import JobState, Placement, array_of

#: GPU state -> glyph in the ``nodes`` map; lower case when the GPU is only partly taken.
GLYPHS = {"free": ".", "interactive": "I", "batch": "B", "foreign": "F", "down": "x"}


def local_tz() -> tzinfo:
    """The terminal's timezone."""
    return datetime.now().astimezone().tzinfo or UTC


def format_queue(
    jobs: list[JobView],
    *,
    total: int | None = None,
    now: datetime | None = None,
    tz: tzinfo | None = None,
    arrays: list[ArrayView] | None = None,
) -> str:
    """The ``queue`` table, then why each waiting job waits and when it should start.

    ``arrays``: arrays with pending tasks, one line each (``123_[8-99999]``, as squeue shows).
    """
    if not jobs and not arrays:
        return "no jobs"
    now, tz = now or datetime.now(UTC), tz or local_tz()
    header = ("ID", "USER", "KIND", "STATE", "GPUS", "NODE", "AGE", "WHAT", "WHY")
    rows = [header]
    waiting = []
    for job in jobs:
        spec = job.spec
        what = spec.name or " ".join(spec.command or []) or spec.notebook or ""
        why = "" if job.state is JobState.QUEUED else job.reason or ""
        if job.exit_code not in (None, 0):
            why = why or f"exit {job.exit_code}"
        if job.state is JobState.QUEUED:
            why = "held" if job.held else position_label(job.position) if job.position else ""
            waiting.append(waiting_line(job, now, tz))
        age_s = max(0.0, (now - job.submitted_at).total_seconds())
        task = array_of(spec)
        rows.append(
            (
                str(job.id) if task is None else f"{job.id} ({task[0]}_{task[1]})",
                job.user,
                spec.kind.value,
                job.state.value,
                gpus_label(spec.gpus, spec.gpu_share, spec.gpu_mem_gb),
                _where(job.placement),
                runtime_label(age_s),
                _clip(what, 30),
                _clip(why, 60),
            )
        )
    for array in arrays or ():
        rows.append(_array_row(array, now))
        waiting.append(
            f"array {_array_label(array)}: {array.pending} tasks wait with task "
            f"{array.id}'s reason: "
            f"{(array.reason or 'no reason yet').removeprefix('waiting: ')}"
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if total is not None and total > len(jobs):
        lines.append(f"... {total - len(jobs)} more (use --limit)")
    if waiting:
        lines += ["", "waiting:", *(f"  {line}" for line in waiting)]
    return "\n".join(lines)


def _array_label(array: ArrayView) -> str:
    """``123_[8-99999]``: the array's pending tasks, as squeue shows them."""
    return f"{array.id}_[{array.pending_range}]"


def _array_row(array: ArrayView, now: datetime) -> tuple[str, ...]:
    """The one line of an array's pending tasks in the queue table."""
    spec = array.spec
    what = spec.name or " ".join(spec.command or []) or spec.notebook or ""
    return (
        _array_label(array),
        array.user,
        spec.kind.value,
        "pending",
        gpus_label(spec.gpus, spec.gpu_share, spec.gpu_mem_gb),
        "",
        runtime_label(max(0.0, (now - array.submitted_at).total_seconds())),
        _clip(what, 30),
        f"{array.pending} tasks",
    )


def waiting_line(job: JobView, now: datetime, tz: tzinfo) -> str:
    """``job 12, 2nd in line, starts in 12m (14:05): needs 8 GPUs free on one node; ...``."""
    parts = [f"job {job.id}"]
    if job.position:
        parts.append(position_label(job.position))
    estimate = job.estimate.model_dump() if job.estimate is not None else None
    parts.append(f"starts {start_label(estimate, job.estimated_start, now, tz)}")
    reason = (job.reason or "no reason yet").removeprefix("waiting: ")
    nudge = start_nudge(estimate)
    return f"{', '.join(parts)}: {reason}" + (f"\n    estimate: {nudge}" if nudge else "")


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


def _where(placement: Placement | None) -> str:
    if placement is None:
        return ""
    idx = placement.gpu_indices
    return placement.node + (f":{','.join(map(str, idx))}" if idx else "")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
