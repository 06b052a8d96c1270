"""Waiting for something to become true: the one polling helper of the suite.

``wait_for(probe, until)`` calls ``probe()`` until ``until(value)`` holds and returns that
value; past ``timeout_s`` it fails the test with what it waited for and the last value seen.
``await wait_for_async(...)`` is the same on the running event loop (``probe`` may be a
coroutine function, and an optional ``step`` runs before each look, e.g. a scheduler tick).

Exceptions listed in ``ignoring`` read as "not yet" (a server that is still starting refuses
connections); any other exception ends the wait at once (a probe raises when waiting is
pointless, e.g. the process it waits on exited).

Every ``timeout_s`` here is what the work may take on a quiet machine: a :class:`Deadline`
stretches it by :func:`patience` while the machine is loaded (this box has 2 cores and is
shared; a second ``make test`` beside one triples its load). A wait that succeeds returns at
once, so stretching costs nothing; only a failure is reported later. Fixed limits elsewhere
(``subprocess.run(timeout=...)``, a kernel's ``wait_for_ready``) take :func:`scaled` seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_MISSING: Any = object()

#: ``GPUSCHED_TEST_PATIENCE=N`` fixes the stretch factor (e.g. 3 on a slow CI machine).
PATIENCE_ENV = "GPUSCHED_TEST_PATIENCE"
#: The most a deadline stretches with the load: a wait still fails within minutes.
MAX_PATIENCE = 8.0


def patience() -> float:
    """How many times longer than on a quiet machine work may take here now (1 to 8).

    The 1-minute load average per CPU, or ``$GPUSCHED_TEST_PATIENCE`` when set.
    """
    fixed = os.environ.get(PATIENCE_ENV)
    if fixed:
        return max(1.0, float(fixed))
    per_cpu = os.getloadavg()[0] / len(os.sched_getaffinity(0))
    return min(max(1.0, per_cpu), MAX_PATIENCE)


def scaled(seconds: float) -> float:
    """``seconds`` of a quiet machine, stretched by the present :func:`patience`."""
    return seconds * patience()


def scaled_ms(seconds: float) -> int:
    """:func:`scaled` in milliseconds, as playwright takes its timeouts."""
    return int(scaled(seconds) * 1000)


class Deadline:
    """A limit of ``seconds`` on a quiet machine, stretched by the load while it runs.

    The factor is the highest :func:`patience` seen since the start: load that rises during
    the wait (another test run starts beside this one) still extends it.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()
        self.factor = patience()

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def expired(self) -> bool:
        """Whether the limit has passed (the load is looked at again before saying so)."""
        if self.elapsed_s <= self.seconds * self.factor:
            return False
        self.factor = max(self.factor, patience())
        return self.elapsed_s > self.seconds * self.factor

    def remaining_s(self) -> float:
        """Seconds left at the present factor (0 when expired)."""
        return max(0.0, self.seconds * self.factor - self.elapsed_s)

    def __str__(self) -> str:
        return f"{self.elapsed_s:.1f}s ({self.seconds:g}s x patience {self.factor:.1f})"


def _describe(what: str | Callable[[Any], str], last: Any) -> str:
    if callable(what):
        return what(last) if last is not _MISSING else "the first answer"
    seen = "no answer" if last is _MISSING else repr(last)
    return f"{what} (last seen: {seen})"


def wait_for(
    probe: Callable[[], T],
    until: Callable[[T], object] = bool,
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
    what: str | Callable[[T], str] = "a condition",
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``probe`` every ``interval_s`` until ``until`` accepts its value; that value.

    ``timeout_s`` is a quiet machine's seconds (see :class:`Deadline`).
    """
    deadline = Deadline(timeout_s)
    last: Any = _MISSING
    while True:
        try:
            last = probe()
            if until(last):
                return last
        except ignoring:
            pass
        if deadline.expired():
            raise AssertionError(f"gave up after {deadline} waiting for {_describe(what, last)}")
        time.sleep(interval_s)


async def wait_for_async(
    probe: Callable[[], T | Awaitable[T]],
    until: Callable[[T], object] = bool,
    *,
    step: Callable[[], Awaitable[object]] | None = None,
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
    what: str | Callable[[T], str] = "a condition",
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`wait_for` on the running loop; ``step`` is awaited before each call of ``probe``."""
    deadline = Deadline(timeout_s)
    last: Any = _MISSING
    while True:
        try:
            if step is not None:
                await step()
            value = probe()
            last = await value if inspect.isawaitable(value) else value
            if until(last):
                return last  # type: ignore[no-any-return]
        except ignoring:
            pass
        if deadline.expired():
            raise AssertionError(f"gave up after {deadline} waiting for {_describe(what, last)}")
        await asyncio.sleep(interval_s)
