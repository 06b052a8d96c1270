"""The one clock passed everywhere, so tests and trace replay can drive time."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """What the scheduler needs to know about time."""

    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for timeouts and rates."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:  # noqa: D102
        return datetime.now(UTC)

    def monotonic(self) -> float:  # noqa: D102
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:  # noqa: D102
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told; ``sleep`` returns once the clock passes its deadline.

    Tests advance it with :meth:`advance` or :meth:`set`.
    """

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start time")
        self._now = start.astimezone(UTC)
        self._mono = 0.0
        self._changed = asyncio.Event() if _has_loop() else None

    def now(self) -> datetime:  # noqa: D102
        return self._now

    def monotonic(self) -> float:  # noqa: D102
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self._now += timedelta(seconds=seconds)
        self._mono += seconds
        self._notify()

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (must not be earlier than now)."""
        delta = (when - self._now).total_seconds()
        if delta < 0:
            raise ValueError("ManualClock cannot go back in time")
        self.advance(delta)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def sleep(self, seconds: float) -> None:  # noqa: D102
        deadline = self._mono + seconds
        while self._mono < deadline:
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class OffsetClock(SystemClock):
    """Real-time clock that reads as if it had started at ``start``.

    The demo uses it to run in a fixed policy window (a weekday morning) whatever the hour.
    """

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("OffsetClock needs a timezone-aware start time")
        self._start = start.astimezone(UTC)
        self._mono0 = time.monotonic()

    def now(self) -> datetime:  # noqa: D102
        return self._start + timedelta(seconds=time.monotonic() - self._mono0)
