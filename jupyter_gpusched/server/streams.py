"""Open streams re-check their caller: revoking a token or an admin right ends them in seconds.

A log follow and the events websocket are authorized when they open and may then last for
hours. Under the lab-wide service's identities (:mod:`.auth`: the Hub's tokens, or the
service's own), a :class:`StreamGuard` asks every ``stream_recheck_s`` whether the caller's
token still names them -- and, when they opened the stream as an admin (an admin's websocket
carries everyone's env values and parameters, an admin may follow anyone's log), whether they
still are one -- and ends the stream when not: the websocket closes with 1008 (policy
violation) and the reason, the follow ends its body.

While the Hub or the store cannot answer, streams stay open and the next period asks again. A
single-user Jupyter server's own identity (its one user's token) is checked when a stream
opens, as Jupyter checks its kernels' websockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class StreamGuard:
    """Ends one handler's stream (``end(reason)``) once its caller's token no longer holds."""

    def __init__(self, handler: Any, end: Callable[[str], None]) -> None:
        self._handler = handler
        self._end = end
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start checking, if the server's identities can be checked again (else nothing)."""
        provider = self._handler.identity_provider
        every_s = getattr(provider, "stream_recheck_s", None)
        if every_s is None or not hasattr(provider, "recheck"):
            return
        user = self._handler.current_user
        admin = bool(self._handler.is_admin())
        self._task = asyncio.ensure_future(self._watch(provider, user.username, admin, every_s))

    def stop(self) -> None:
        """Stop checking (the stream ended). Idempotent."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self, provider: Any, name: str, admin: bool, every_s: float) -> None:
        failing = False
        while True:
            await asyncio.sleep(every_s)
            try:
                now = await provider.recheck(self._handler)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the Hub or the store away: ask again later
                if not failing:
                    log.warning("gpusched: cannot re-check %s's open stream: %s", name, exc)
                failing = True
                continue
            failing = False
            why = _why_not(name, admin, now, now is not None and self._admin(now))
            if why is not None:
                log.info("gpusched: ending %s's open stream: %s", name, why)
                self._task = None
                with contextlib.suppress(Exception):
                    self._end(why)
                return

    def _admin(self, user: Any) -> bool:
        """Whether ``user`` (as identified now) is an admin: the handler's ``is_admin`` rule."""
        said = getattr(user, "gpusched_admin", None)
        if said is not None:
            return bool(said)
        return user.username in self._handler.settings.get("gpusched_admins", ())


def _why_not(name: str, admin: bool, now: Any, admin_now: bool) -> str | None:
    """Why a stream opened by ``name`` (an admin or not) may go on no longer; None: it may."""
    if now is None:
        return f"the token of {name} was revoked"
    if now.username != name:
        return f"the token no longer names {name}"
    if admin and not admin_now:
        return f"{name} is no longer an admin of the queue"
    return None
