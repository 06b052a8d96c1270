"""A job's timeline: its stored events as a job page shows them, oldest first.

Every state change with its reason, each new waiting reason, stops asked for, retries and the
executed notebook coming home. Details are cut down to what the page says (a reason, a node, a
file): handles, environments and specs in ``updated`` events never leave the store this way.
Progress lines of notebook jobs are many; only the last one stays. Built for a viewer, it
follows the events websocket's rule (:func:`~jupyter_gpusched.core.privacy.event_detail_for`):
of another user's job, no progress (cell sources) and only public details (no output paths).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jupyter_gpusched.core import api
from jupyter_gpusched.core.models import Event
from jupyter_gpusched.core.privacy import Viewer, event_detail_for

#: detail keys kept per event kind
_KEEP: dict[str, tuple[str, ...]] = {
    "submitted": ("definition_id",),
    "state": ("reason", "exit_code", "attempt", "node"),
    "notebook_output": ("notebook", "log"),
    "retry": ("retry_job_id", "retry", "of", "not_before"),
    "progress": ("cell", "of", "source"),
    "node": ("node", "up", "error"),
}


def timeline(
    events: Sequence[Event], *, viewer: Viewer | None = None, owner: str | None = None
) -> api.JobEvents:
    """The page's events: ``waiting`` and ``stopping`` carry their reason; others their facts.

    ``viewer``: whom the page is for, of a job of ``owner`` (None: everything, for the server).
    """
    out: list[api.EventMessage] = []
    last_progress: api.EventMessage | None = None
    for event in events:
        detail = _detail(event.kind, event.detail or {})
        if detail is not None:
            detail = event_detail_for(viewer, owner, event.kind, detail)
        if detail is None:
            continue
        message = api.EventMessage(
            id=event.id,
            at=event.at,
            kind=event.kind,
            job_id=event.job_id,
            from_state=event.from_state,
            to_state=event.to_state,
            detail=detail,
        )
        if event.kind == "progress":
            last_progress = message
            continue
        out.append(message)
    if last_progress is not None:
        out.append(last_progress)
        out.sort(key=lambda e: e.id or 0)
    return api.JobEvents(events=out)


def _detail(kind: str, detail: dict[str, Any]) -> dict[str, Any] | None:
    fields = detail.get("fields") if isinstance(detail.get("fields"), dict) else {}
    if kind == "waiting":
        return {"reason": fields.get("reason")}
    if kind == "stopping":
        handle = fields.get("handle") if isinstance(fields.get("handle"), dict) else {}
        return {"reason": handle.get("stop_reason"), "how": handle.get("stopping")}
    if kind in _KEEP:
        return {k: detail[k] for k in _KEEP[kind] if k in detail}
    if kind == "updated":
        names = sorted(k for k in fields if k in ("held", "spec"))
        return {"fields": names} if names else None
    return None
