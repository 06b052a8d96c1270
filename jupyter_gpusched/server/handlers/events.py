"""The events websocket: stored events after an id, then live ones and cluster updates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from tornado import websocket

from jupyter_gpusched.core.api import MAX_ID
from jupyter_gpusched.core.errors import UnavailableError

from ..streams import StreamGuard
from .base import API, GpuSchedMixin


class ListenOnlyWebSocket(GpuSchedMixin, websocket.WebSocketHandler, JupyterHandler):
    """A websocket that sends what ``relay()`` yields and ignores what its client sends.

    It closes with 1008 (policy violation) and the reason once its caller's token, or the
    admin right it was opened with, is revoked (:mod:`..streams`).
    """

    _pump: asyncio.Task[None] | None = None
    _guard: StreamGuard | None = None

    def set_default_headers(self) -> None:
        """JupyterHandler's page headers make no sense on a websocket."""

    async def prepare(self) -> None:  # type: ignore[override]
        """Refuse unauthenticated upgrades instead of redirecting them to the login page."""
        await JupyterHandler.prepare(self, _redirect_to_login=False)

    def open(self, *args: Any, **kwargs: Any) -> None:
        """Start relaying to this client, and re-checking who it is."""
        self._guard = StreamGuard(self, self._revoked)
        self._guard.start()
        self._pump = asyncio.ensure_future(self._send_all())

    def _revoked(self, why: str) -> None:
        """The caller's token no longer holds: close with 1008 and why."""
        self.close(1008, why.encode()[:120].decode(errors="ignore"))

    async def _send_all(self) -> None:
        try:
            async for message in self.relay():
                await self.write_message(message)
        except websocket.WebSocketClosedError:
            pass
        except UnavailableError as exc:  # the store went away: reconnect later with after=
            self.close(1013, exc.message.encode()[:120].decode(errors="ignore"))
        finally:
            if self._guard is not None:
                self._guard.stop()
            self.stopped()

    def relay(self) -> AsyncIterator[str | bytes]:
        """The messages to send, until the client or the source goes."""
        raise NotImplementedError

    def stopped(self) -> None:
        """The relay ended (either side went): release what it held."""

    def on_message(self, message: str | bytes) -> None:
        """Clients only listen; anything they send is ignored."""

    def on_close(self) -> None:
        """Stop relaying."""
        if self._pump is not None:
            self._pump.cancel()


class EventsHandler(ListenOnlyWebSocket):
    """Websocket of scheduler events; ``?after=ID`` replays stored events newer than ID.

    The scheduler adds ``cluster`` messages (no id) after changes, at most one per second.
    Each connection gets what its user may see (see :mod:`jupyter_gpusched.scheduling.events`).
    """

    _close_stream: Callable[[], None] | None = None  # counted against the caller's streams

    @ws_authenticated
    @authorized
    async def get(self, *args: Any, **kwargs: Any) -> None:
        """Check the query and the caller's streams (429 past them), then upgrade."""
        self._sched = await self.scheduler()
        self._after = self.query_int("after", 0, -1, MAX_ID)  # -1: only new events
        self._viewer = self.viewer
        self._close_stream = self.gate.open_stream(self.caller_limits(self._sched))
        await super().get(*args, **kwargs)
        if self.ws_connection is None:  # not upgraded (a bad handshake): nothing held
            self.stopped()

    def stopped(self) -> None:
        """The stream no longer counts against the caller's."""
        if self._close_stream is not None:
            self._close_stream()

    def on_close(self) -> None:
        """Stop relaying; the stream no longer counts."""
        super().on_close()
        self.stopped()

    async def relay(self) -> AsyncIterator[str | bytes]:  # type: ignore[override]
        """Stored events after ``after``, then live ones."""
        async for event in self._sched.subscribe(viewer=self._viewer, after_id=self._after):
            yield event.model_dump_json()


handlers: list[tuple[str, type]] = [(f"{API}/events", EventsHandler)]
