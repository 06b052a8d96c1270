"""The server's garbage-collector freezer: what survives a full collection is frozen, and a
sweep unfreezes everything now and then so cycles among frozen objects are still collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from jupyter_gpusched.server.gc_pauses import GcFreezer


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.asyncio
async def test_survivors_of_a_full_collection_are_frozen_until_the_sweep() -> None:
    clock = _Clock()
    freezer = GcFreezer(sweep_every_s=3600, check_every_s=60, clock=clock)
    freezer.start()
    try:
        assert gc.get_freeze_count() > 0  # what start-up made
        after_start = gc.get_freeze_count()
        kept = [[i] for i in range(10_000)]  # long-lived containers, as cached jobs are
        freezer.check()
        assert gc.get_freeze_count() == after_start  # no full collection yet: nothing new
        gc.collect(2)
        freezer.check()
        assert gc.get_freeze_count() >= after_start + len(kept)
        clock.now = 3600
        freezer.check()
        assert gc.get_freeze_count() == 0  # the sweep: the next full collection sees all
    finally:
        freezer.stop()
    assert gc.get_freeze_count() == 0 and freezer._on_gc not in gc.callbacks


@pytest.mark.asyncio
async def test_a_cycle_frozen_with_the_survivors_is_collected_after_the_sweep() -> None:
    clock = _Clock()
    freezer = GcFreezer(sweep_every_s=3600, check_every_s=60, clock=clock)

    class Node:
        other: object = None

    freezer.start()
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        gc.collect(2)
        freezer.check()  # frozen with the survivors of that collection
        del a, b
        gc.collect()
        assert gone() is not None  # frozen garbage: not collected yet
        clock.now = 3600
        freezer.check()
        gc.collect()
        assert gone() is None  # the sweep let the collector see it
    finally:
        freezer.stop()
