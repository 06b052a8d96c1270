"""What one user may see of another's jobs: env values and notebook parameters stay private.

Views (:mod:`.api`), the events websocket and a job's timeline (``GET jobs/{id}/events``)
build what they send for a :class:`Viewer`; the owner and admins see everything, others see a
job's shape without its secrets. Events go through :func:`event_detail_for`, one rule for
every way they leave the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .models import JobSpec


@dataclass(frozen=True)
class Viewer:
    """Who a view is built for: what they may see of other people's jobs depends on it."""

    user: str
    admin: bool = False

    def sees_all_of(self, owner: str) -> bool:
        """Whether this viewer sees everything of ``owner``'s jobs (their own, or an admin)."""
        return self.admin or self.user == owner


#: What others see in place of a private value (an env variable's, a parameter's).
HIDDEN = "<hidden>"
#: Event detail keys anyone may see of another user's job (``fields`` is cut to its names).
_PUBLIC_DETAIL = frozenset(
    {"reason", "exit_code", "attempt", "node", "user", "definition_id", "action", "state"}
    | {"retry_job_id", "retry", "of", "not_before"}
)
#: Event kinds only the owner (and admins) receive: a notebook's cells as they run.
PRIVATE_EVENT_KINDS = frozenset({"progress"})


def public_spec(spec: JobSpec) -> JobSpec:
    """A job spec as other users see it: env names without values, no notebook parameters."""
    return spec.model_copy(update={"env": dict.fromkeys(spec.env, HIDDEN), "parameters": {}})


def public_detail(detail: dict[str, Any]) -> dict[str, Any]:
    """An event's detail as other users see it: public keys only, changed fields by name."""
    out = {k: v for k, v in detail.items() if k in _PUBLIC_DETAIL}
    if isinstance(detail.get("fields"), dict | list):
        out["fields"] = sorted(str(name) for name in detail["fields"])
    return out


def event_detail_for(
    viewer: Viewer | None, owner: str | None, kind: str, detail: dict[str, Any]
) -> dict[str, Any] | None:
    """An event's detail as ``viewer`` may see it; None when the event is not theirs to see.

    ``viewer`` None is the server itself, ``owner`` None an event of no job: both see it whole.
    Others get no :data:`PRIVATE_EVENT_KINDS` (a notebook's cell sources) and only the
    :func:`public_detail` of the rest (no output paths, handles or specs).
    """
    if viewer is None or owner is None or viewer.sees_all_of(owner):
        return detail
    if kind in PRIVATE_EVENT_KINDS:
        return None
    return public_detail(detail)
