"""Short pauses of Python's cyclic garbage collector on a server that holds thousands of jobs.

A full (generation 2) collection scans every container object in the process: a running
server holds ~250,000 of them from start-up alone (the modules of Jupyter, numpy, SQLAlchemy,
pydantic, asyncssh, ...) and its job cache adds ~16 per job kept (up to 20,000 jobs). Each full
collection stopped the event loop for 150-190 ms, the tail of ``GET jobs`` under load
(``bench/api.py``). What survived a full collection is long-lived, so after start-up and
after each full collection it is frozen (:func:`gc.freeze`: never scanned again, still freed
by reference counting as usual) and the next full collection scans only what came since
(~20 ms with the same bench). A reference cycle among frozen objects would never be
collected, so every ``sweep_every_s`` everything is unfrozen and the next full collection
sweeps it all: one long pause an hour instead of one every few seconds.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any


class GcFreezer:
    """Freezes what survived each full collection; unfreezes all every ``sweep_every_s``."""

    def __init__(
        self,
        *,
        sweep_every_s: float = 3600.0,
        check_every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sweep_every_s = sweep_every_s
        self.check_every_s = check_every_s
        self._clock = clock
        self._swept_at = clock()
        self._full_done = False
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Freeze what start-up made, and watch full collections (on the running loop)."""
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_gc)
        self._timer = asyncio.get_running_loop().call_later(self.check_every_s, self._check)

    def stop(self) -> None:
        """Stop watching and unfreeze everything (the next full collection sees all)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.unfreeze()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Inside a collection nothing may be frozen; note it, and freeze from the loop.
        if phase == "stop" and info.get("generation") == 2:
            self._full_done = True

    def _check(self) -> None:
        self.check()
        self._timer = asyncio.get_running_loop().call_later(self.check_every_s, self._check)

    def check(self) -> None:
        """Freeze after a full collection; unfreeze everything when a sweep is due."""
        now = self._clock()
        if now - self._swept_at >= self.sweep_every_s:
            self._swept_at = now
            self._full_done = False
            gc.unfreeze()
        elif self._full_done:
            self._full_done = False
            gc.collect(1)  # the young generations' garbage goes first, not into the freezer
            gc.freeze()
