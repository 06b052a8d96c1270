"""Whether the store answers, and what callers get while it does not: 503 at once, not a stall.

The store's calls are synchronous and mostly made on the Jupyter server's event loop, where a
call that waits (a SQLite file another process holds locked, a PostgreSQL that is down) stalls
every request of the server, kernels included. So:

* a failure that means the store is away (locked, unreachable, read-only, not a database)
  becomes :class:`~jupyter_gpusched.core.errors.UnavailableError` -- a 503 with
  ``Retry-After`` saying what is wrong and what to do -- never a 500;
* after one, calls made on the event loop fail at once for a while (growing from 1 s to
  10 s) instead of waiting again; calls from worker threads (the leader lease's renewal) still
  go through and wait, and the first that succeeds ends the wait for everyone;
* a SQLite lock is waited on for at most ``LOOP_BUSY_TIMEOUT_MS`` on the loop (see
  :mod:`.engine`); PostgreSQL connects time out after a few seconds.

Reads still work while SQLite is only locked for writing (WAL readers never wait), read-only,
or on a full disk, so then only writes are cut off: the 503 says what to do (free space, make
the file writable), and the first write that succeeds again -- the leader lease's renewal
tries every few seconds -- ends it for everyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DatabaseError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from jupyter_gpusched.core.errors import UnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Pause after a first failure before calls on the loop try the store again; doubles up to max.
FIRST_PAUSE_S, MAX_PAUSE_S = 1.0, 10.0


#: Set (see :func:`for_the_loop`) in worker threads doing the event loop's store calls.
_FOR_THE_LOOP: ContextVar[bool] = ContextVar("gpusched_for_the_loop", default=False)


@contextlib.contextmanager
def for_the_loop() -> Iterator[None]:
    """Store calls a worker thread makes for the loop fail as fast as the loop's own.

    Someone waits for them (a request, a pass): a locked store should say so, not hold them.
    """
    token = _FOR_THE_LOOP.set(True)
    try:
        yield
    finally:
        _FOR_THE_LOOP.reset(token)


async def off_the_loop(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call`` in a worker thread, for the loop (:func:`for_the_loop`).

    A long read, or a write waiting for the lock, then holds no other request of the server.
    """

    def run() -> T:
        with for_the_loop():
            return call(*args, **kwargs)

    return await asyncio.to_thread(run)


def on_event_loop() -> bool:
    """True in a thread running an asyncio loop (a blocking call stalls everything there).

    Also in a worker thread working for one (:func:`for_the_loop`).
    """
    if _FOR_THE_LOOP.get():
        return True
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def is_store_away(exc: BaseException) -> bool:
    """Whether a database error means the store is away (not a bug or a conflict)."""
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeoutError)):
        return True
    # a corrupt SQLite file: DatabaseError itself (IntegrityError and the like are subclasses)
    return type(exc) is DatabaseError


class Availability:
    """The store's health as its callers see it; one per :class:`~.store.Store`."""

    def __init__(self, url: str) -> None:
        parsed = make_url(url)
        self._sqlite = parsed.get_backend_name() == "sqlite"
        self._where = parsed.database if self._sqlite else parsed.host or "localhost"
        self._lock = threading.Lock()
        self._error: UnavailableError | None = None
        self._writes_only = False  # a locked SQLite file still serves reads
        self._pause_s = FIRST_PAUSE_S
        self._until = 0.0  # time.monotonic() before which calls on the loop fail at once

    @property
    def error(self) -> UnavailableError | None:
        """Why the store is away, None while it answers."""
        return self._error

    @contextlib.contextmanager
    def guard(self, *, write: bool) -> Iterator[None]:
        """Around one transaction: fail fast while away, translate what says it is away."""
        error = self._error
        if (
            error is not None
            and (write or not self._writes_only)
            and on_event_loop()
            and time.monotonic() < self._until
        ):
            raise UnavailableError(error.message, retry_after_s=self._until - time.monotonic())
        try:
            yield
        except Exception as exc:
            if not is_store_away(exc):
                raise
            raise self._failed(exc) from None
        if self._error is not None and (write or not self._writes_only):
            self._back()

    def _failed(self, exc: Exception) -> UnavailableError:
        message, writes_only = self._explain(exc)
        with self._lock:
            first = self._error is None or self._error.message != message
            if self._error is not None:
                self._pause_s = min(MAX_PAUSE_S, self._pause_s * 2)
            self._until = time.monotonic() + self._pause_s
            self._writes_only = writes_only
            self._error = UnavailableError(message, retry_after_s=self._pause_s)
        if first:
            log.error("gpusched: %s", message)
        return self._error

    def _back(self) -> None:
        with self._lock:
            if self._error is None:
                return
            self._error = None
            self._pause_s = FIRST_PAUSE_S
            self._until = 0.0
        log.warning("gpusched: the store answers again")

    def _explain(self, exc: Exception) -> tuple[str, bool]:
        """What is wrong, in words that say what to do; and whether only writes are cut."""
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]
        if not self._sqlite:
            return f"the store (PostgreSQL at {self._where}) cannot be reached: {detail}", False
        code = getattr(getattr(exc, "orig", None), "sqlite_errorcode", 0) & 0xFF
        lowered = detail.lower()
        if code == sqlite3.SQLITE_FULL or (not code and "disk is full" in lowered):
            folder = os.path.dirname(os.path.abspath(self._where))
            return (
                f"the disk holding the store file {self._where} is full: free space in "
                f"{folder} (or move the store elsewhere, GpuSchedApp.store_url); reads go on, "
                "and writes resume by themselves once there is room",
                True,
            )
        if code == sqlite3.SQLITE_READONLY or "readonly" in lowered or "read-only" in lowered:
            return (
                f"the store file {self._where} is read-only for this user ({detail}): make the "
                "file and its directory writable, or set GpuSchedApp.store_url elsewhere; reads "
                "go on, and writes resume by themselves once it is writable",
                True,
            )
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in lowered:
            return (
                f"the store file {self._where} is locked by another process (a tool holding a "
                "transaction open?); writes wait until it is released",
                True,
            )
        if "not a database" in lowered or "malformed" in lowered:
            return (
                f"the store file {self._where} is not a usable SQLite database ({detail}): move "
                "it away (a fresh store is made) or restore a backup",
                False,
            )
        if "unable to open" in lowered:
            return (
                f"cannot open the store file {self._where} ({detail}): check that its "
                "directory exists and is writable",
                False,
            )
        return f"the store {self._where} failed: {detail}", False
