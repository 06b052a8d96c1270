"""Text views of the API's answers: the queue table and the cluster map.

Shared by ``jupyter gpusched queue|nodes``, the ``%gpu`` magic and the demo.
"""

from __future__ import annotations

from datetime import UTC, datetime

from jupyter_gpusched.core.api import Cluster, Definition, Gpu, JobView
from jupyter_gpusched.core.models import Placement
from jupyter_gpusched.core.units import format_duration_s

#: GPU state -> glyph in the ``nodes`` map; lower case when the GPU is only partly taken.
GLYPHS = {"free": ".", "interactive": "I", "batch": "B", "foreign": "F", "down": "x"}


def format_queue(jobs: list[JobView], *, total: int | None = None) -> str:
    """The ``queue`` table: one row per job, the reason it waits or failed at the end."""
    if not jobs:
        return "no jobs"
    header = ("ID", "USER", "KIND", "STATE", "GPUS", "NODE", "AGE", "WHAT", "WHY")
    rows = [header]
    now = datetime.now(UTC)
    for job in jobs:
        spec = job.spec
        gpus = str(spec.gpus)
        if spec.gpu_share and spec.gpu_share < 1:
            gpus = f"{spec.gpu_share:g}"
        what = spec.name or " ".join(spec.command or []) or spec.notebook or ""
        why = job.reason or ""
        if job.position:
            why = f"#{job.position} {why}".strip()
        if job.held:
            why = f"held {why}".strip()
        if job.exit_code not in (None, 0):
            why = why or f"exit {job.exit_code}"
        age_s = max(0, int((now - job.submitted_at).total_seconds()))
        rows.append(
            (
                str(job.id),
                job.user,
                spec.kind.value,
                job.state.value,
                gpus,
                _where(job.placement),
                format_duration_s(age_s, parts=1),
                _clip(what, 30),
                _clip(why, 60),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if total is not None and total > len(jobs):
        lines.append(f"... {total - len(jobs)} more (use --limit)")
    return "\n".join(lines)


def format_cluster(cluster: Cluster) -> str:
    """The ``nodes`` map: glyphs per GPU, free count, then figures and the window."""
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
        f"gpus: {m.gpus_free}/{m.gpus_total} free, largest placeable job "
        f"{m.largest_placeable_gpus} GPUs, fragmentation {m.frag_ratio:.2f}; "
        f"queue: {q.queued} queued, {q.running} running"
    )
    until = f" until {w.until:%a %H:%M %Z}" if w.until else ""
    nxt = f", then {w.next_window}" if w.next_window and w.until else ""
    lines.append(f"window: {w.name}{until}{nxt}")
    return "\n".join(lines)


def format_definition(d: Definition) -> str:
    """One line per recurring notebook job."""
    state = "paused" if d.paused else f"next {_iso(d.next_fire_at)}"
    return (
        f"definition {d.id} [{d.user}] {d.schedule!r} {d.timezone} "
        f"catch-up {d.catch_up}: {d.spec.notebook} ({state}, {d.fire_count} runs)"
    )


def format_notebook_job(job: JobView) -> str:
    """A notebook job in one line, with where its executed copy went."""
    spec = job.spec
    text = f"job {job.id} {job.state.value}: {spec.notebook}"
    if spec.not_before:
        text += f" (not before {_iso(spec.not_before)})"
    if "output_notebook" in spec.labels:
        text += f" -> {spec.labels['output_notebook']}"
    return text


def _iso(when: datetime | None) -> str:
    return when.isoformat() if when else "-"


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
