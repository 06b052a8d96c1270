"""The ``queue`` table, written from the API's JSON as plain data (dicts, as the server sends it).

The one writer of the table: the full ``jupyter gpusched queue`` and the ``%gpu`` magic hand it
their models dumped to JSON data (:func:`jupyter_gpusched.cli.formats.format_queue`), the quick
``queue`` (:mod:`.quick`) the server's answer as it came, so both print the same text without
the quick one importing pydantic. Standard library and :mod:`jupyter_gpusched.core.figures`
only.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any

from jupyter_gpusched.core.figures import (
    gpus_label,
    position_label,
    runtime_label,
    start_label,
    start_nudge,
)

#: The labels an array's task carries (``core.models.ARRAY_ID_LABEL``/``ARRAY_INDEX_LABEL``:
#: that module is pydantic's; a test checks the two agree).
ARRAY_LABELS = ("array_id", "array_index")

Data = Mapping[str, Any]


def local_tz() -> tzinfo:
    """The terminal's timezone."""
    return datetime.now().astimezone().tzinfo or UTC


def queue_text(
    jobs: list[Data],
    *,
    total: int | None = None,
    now: datetime | None = None,
    tz: tzinfo | None = None,
    arrays: list[Data] | None = None,
) -> str:
    """The ``queue`` table, then why each waiting job waits and when it should start.

    ``jobs`` and ``arrays`` are JobView and ArrayView as JSON data; ``arrays``: arrays with
    pending tasks, one line each (``123_[8-99999]``, as squeue shows).
    """
    if not jobs and not arrays:
        return "no jobs"
    now, tz = now or datetime.now(UTC), tz or local_tz()
    header = ("ID", "USER", "KIND", "STATE", "GPUS", "NODE", "AGE", "WHAT", "WHY")
    rows = [header]
    waiting = []
    for job in jobs:
        spec, state = job["spec"], job["state"]
        why = "" if state == "queued" else job.get("reason") or ""
        exit_code = job.get("exit_code")
        if exit_code not in (None, 0):
            why = why or f"exit {exit_code}"
        if state == "queued":
            position = job.get("position")
            why = "held" if job.get("held") else position_label(position) if position else ""
            waiting.append(waiting_text(job, now, tz))
        task = _task(spec)
        rows.append(
            (
                str(job["id"]) if task is None else f"{job['id']} ({task[0]}_{task[1]})",
                job["user"],
                spec["kind"],
                state,
                _gpus(spec),
                _where(job.get("placement")),
                runtime_label(_age_s(job["submitted_at"], now)),
                _clip(_what(spec), 30),
                _clip(why, 60),
            )
        )
    for array in arrays or ():
        rows.append(_array_row(array, now))
        reason = (array.get("reason") or "no reason yet").removeprefix("waiting: ")
        waiting.append(
            f"array {_array_label(array)}: {array['pending']} tasks wait with task "
            f"{array['id']}'s reason: {reason}"
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if total is not None and total > len(jobs):
        lines.append(f"... {total - len(jobs)} more (use --limit)")
    if waiting:
        lines += ["", "waiting:", *(f"  {line}" for line in waiting)]
    return "\n".join(lines)


def waiting_text(job: Data, now: datetime, tz: tzinfo) -> str:
    """``job 12, 2nd in line, starts in 12m (14:05): needs 8 GPUs free on one node; ...``."""
    parts = [f"job {job['id']}"]
    if job.get("position"):
        parts.append(position_label(job["position"]))
    estimate = job.get("estimate")
    fallback = _when(job.get("estimated_start"))
    parts.append(f"starts {start_label(estimate, fallback, now, tz)}")
    reason = (job.get("reason") or "no reason yet").removeprefix("waiting: ")
    nudge = start_nudge(estimate)
    return f"{', '.join(parts)}: {reason}" + (f"\n    estimate: {nudge}" if nudge else "")


def _array_label(array: Data) -> str:
    """``123_[8-99999]``: the array's pending tasks, as squeue shows them."""
    return f"{array['id']}_[{array['pending_range']}]"


def _array_row(array: Data, now: datetime) -> tuple[str, ...]:
    """The one line of an array's pending tasks in the queue table."""
    spec = array["spec"]
    return (
        _array_label(array),
        array["user"],
        spec["kind"],
        "pending",
        _gpus(spec),
        "",
        runtime_label(_age_s(array["submitted_at"], now)),
        _clip(_what(spec), 30),
        f"{array['pending']} tasks",
    )


def _what(spec: Data) -> str:
    command = " ".join(spec.get("command") or [])
    return str(spec.get("name") or command or spec.get("notebook") or "")


def _gpus(spec: Data) -> str:
    return gpus_label(spec["gpus"], spec.get("gpu_share"), spec.get("gpu_mem_gb"))


def _task(spec: Data) -> tuple[int, int] | None:
    """``(array id, index)`` of an array task, None for a job submitted alone."""
    labels = spec.get("labels") or {}
    aid, index = (labels.get(label) for label in ARRAY_LABELS)
    if aid is None or index is None or not aid.isdigit() or not index.isdigit():
        return None
    return int(aid), int(index)


def _when(value: datetime | str | None) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def _age_s(submitted_at: datetime | str, now: datetime) -> float:
    return max(0.0, (now - datetime.fromisoformat(str(submitted_at))).total_seconds())


def _where(placement: Data | None) -> str:
    if placement is None:
        return ""
    idx = placement.get("gpu_indices")
    return str(placement["node"]) + (f":{','.join(map(str, idx))}" if idx else "")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
