"""Node health as the scheduler last saw it, and its ups and downs in the audit log.

:class:`~.store.Store` is a :class:`NodeLedger`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jupyter_gpusched.core.clock import Clock

from .orm import EventRow, NodeRow
from .rows import add_event_row


@dataclass(frozen=True)
class NodeStatus:
    """Health of one node: reachable or not, and consecutive failed probes."""

    name: str
    up: bool
    failures: int
    detail: str | None
    updated_at: datetime


class NodeLedger:
    """The nodes table; the store's sessions underneath."""

    _clock: Clock
    read_session: Callable[[], AbstractContextManager[Session]]  # the store's
    write_session: Callable[..., AbstractContextManager[Session]]  # the store's
    _for_update: bool  # the store's: lock rows read for a write (not on SQLite)

    def set_node_status(
        self, name: str, *, up: bool, failures: int, detail: str | None = None
    ) -> None:
        """Record a node's health; a node going up or down is also logged as a ``node`` event."""
        now = self._clock.now()
        for attempt in range(2):
            try:
                with self.write_session() as s:
                    row = s.get(NodeRow, name, with_for_update=self._for_update)
                    was_up: bool | None = None
                    if row is None:
                        s.add(
                            NodeRow(
                                name=name, up=up, failures=failures, detail=detail, updated_at=now
                            )
                        )
                    else:
                        was_up = row.up
                        row.up, row.failures, row.detail, row.updated_at = up, failures, detail, now
                    if was_up is not up:
                        add_event_row(
                            s,
                            EventRow(
                                at=now,
                                job_id=None,
                                kind="node",
                                from_state=None,
                                to_state=None,
                                detail={"node": name, "up": up, "detail": detail},
                            ),
                        )
                return
            except IntegrityError:
                # Another server added this node first (PostgreSQL); now it can be locked.
                if attempt:
                    raise

    def node_status(self) -> dict[str, NodeStatus]:
        """Every node's last recorded health, by name."""
        with self.read_session() as s:
            return {
                r.name: NodeStatus(r.name, r.up, r.failures, r.detail, r.updated_at)
                for r in s.scalars(select(NodeRow).order_by(NodeRow.name))
            }
