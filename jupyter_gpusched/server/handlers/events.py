"""The events websocket: stored events after an id, then live ones and cluster updates."""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from tornado import websocket

from jupyter_gpusched.core.api import MAX_ID

from .base import API, GpuSchedMixin


class EventsHandler(GpuSchedMixin, websocket.WebSocketHandler, JupyterHandler):
    """Websocket of scheduler events; ``?after=ID`` replays stored events newer than ID.

    The scheduler adds ``cluster`` messages (no id) after changes, at most one per second.
    """

    _pump: asyncio.Task[None] | None = None

    def set_default_headers(self) -> None:
        """JupyterHandler's page headers make no sense on a websocket."""

    async def prepare(self) -> None:  # type: ignore[override]
        """Refuse unauthenticated upgrades instead of redirecting them to the login page."""
        await JupyterHandler.prepare(self, _redirect_to_login=False)

    @ws_authenticated
    @authorized
    async def get(self, *args: Any, **kwargs: Any) -> None:
        """Check the query, then upgrade to a websocket."""
        self._sched = await self.scheduler()
        self._after = self.query_int("after", 0, -1, MAX_ID)  # -1: only new events
        await super().get(*args, **kwargs)

    def open(self, *args: Any, **kwargs: Any) -> None:
        """Start relaying events to this client."""
        self._pump = asyncio.ensure_future(self._relay())

    async def _relay(self) -> None:
        try:
            async for event in self._sched.subscribe(after_id=self._after):
                await self.write_message(event.model_dump_json())
        except websocket.WebSocketClosedError:
            pass

    def on_message(self, message: str | bytes) -> None:
        """Clients only listen; anything they send is ignored."""

    def on_close(self) -> None:
        """Stop relaying."""
        if self._pump is not None:
            self._pump.cancel()


handlers: list[tuple[str, type]] = [(f"{API}/events", EventsHandler)]
