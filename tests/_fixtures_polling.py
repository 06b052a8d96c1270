"""Waiting for something to become true: the one polling helper of the suite.

``wait_for(probe, until)`` calls ``probe()`` until ``until(value)`` holds and returns that
value; past ``timeout_s`` it fails the test with what it waited for and the last value seen.
``await wait_for_async(...)`` is the same on the running event loop (``probe`` may be a
coroutine function, and an optional ``step`` runs before each look, e.g. a scheduler tick).

Exceptions listed in ``ignoring`` read as "not yet" (a server that is still starting refuses
connections); any other exception ends the wait at once (a probe raises when waiting is
pointless, e.g. the process it waits on exited).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_MISSING: Any = object()


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
    """Call ``probe`` every ``interval_s`` until ``until`` accepts its value; that value."""
    deadline = time.monotonic() + timeout_s
    last: Any = _MISSING
    while True:
        try:
            last = probe()
            if until(last):
                return last
        except ignoring:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(
                f"gave up after {timeout_s:g}s waiting for {_describe(what, last)}"
            )
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
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
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
        if loop.time() > deadline:
            raise AssertionError(
                f"gave up after {timeout_s:g}s waiting for {_describe(what, last)}"
            )
        await asyncio.sleep(interval_s)
