"""What a full pass found, so the passes submissions wake can weigh only the new jobs.

While submissions pour in, every group commit wakes a pass, and a full pass weighs the whole
queue: with 3,000 jobs that fit nowhere that was 28-35 ms, so a busy lab's submit rate fell
with the length of its queue. Between two full passes the answers for the jobs already weighed
stay the same unless something besides a submission happened: a job started, ended or moved,
a node changed, a queued job was cancelled, held or edited, the window turned. The scheduler
asks for a full pass whenever one of those happens, when a waiting job's time comes (a
not-before time, a launch retry), and as time moves on (fair-share usage, quotas and expected
starts drift): every second while a full pass is cheap, as seldom as every
``full_pass_every_s`` (10 s) when it is long, so that full passes hold the loop about 1 % of the
time (Slurm's full pass runs every 60 s).
Otherwise a pass, the interval's included, weighs only the jobs submitted since, against what
the last full pass kept here.

Such a short pass only ever leaves jobs waiting, with their reasons: a new job that could
start, that would go ahead of the job the queue keeps room for, or that could preempt, makes
it give way to a full pass. So it cannot place a job where a full pass would not.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jupyter_gpusched.core import policy, windows
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.models import Job
from jupyter_gpusched.packing import packer


class QueuePositions:
    """Each eligible queued job's place in line (1 first), as of the last pass."""

    def __init__(self, keys: list[policy.OrderKey] | None = None) -> None:
        self._keys = list(keys or ())  # sorted: the queue's order (a copy: it changes)
        self._key_of = {key[3]: key for key in self._keys}  # the key's last item is the id

    def get(self, job_id: int) -> int | None:
        """``job_id``'s place, or None when the last pass did not line it up."""
        key = self._key_of.get(job_id)
        return None if key is None else bisect_left(self._keys, key) + 1

    def add(self, key: policy.OrderKey) -> None:
        """Line up a job a short pass weighed (those behind it move back one)."""
        insort(self._keys, key)
        self._key_of[key[3]] = key

    def remove(self, key: policy.OrderKey) -> None:
        """Take a job out of line (placed: those behind it move up one)."""
        del self._keys[bisect_left(self._keys, key)]
        del self._key_of[key[3]]


def active_marks(active: Sequence[Job]) -> list[tuple[Any, ...]]:
    """What placing reads of the active jobs: a change to any asks for a full pass."""
    return [(job.id, job.state, job.placement, job.attempt) for job in active]


@dataclass
class PassMemo:
    """The answers of the last full pass that changed nothing (placed, stopped, moved)."""

    # Until when (the clock's monotonic time) its answers are trusted: see Placing._place_queue.
    trusted_until: float
    # The first time a waiting job's lot changes by time alone (a not-before time, a launch
    # retry, the window's turn), when a full pass must run; None: no such time.
    due: datetime | None
    # What those answers rest on besides the queue; compared before each short pass.
    inventory: list[NodeInventory]  # by identity: each probe gives a new list
    config: windows.PolicyConfig  # by identity: a changed policy is a new object
    packer_policy: str
    window: windows.Window
    until: Any  # when the window turns
    marks: list[tuple[Any, ...]]  # the active jobs (:func:`active_marks`)
    # What the pass weighed with.
    state: packer.ClusterState
    ctx: policy.AdmissionContext
    usage: Mapping[str, float]
    # The place in line of the job the queue keeps room for (None: no job waits for room).
    head_key: policy.OrderKey | None
    # The highest job id it saw queued: a short pass reads only jobs above it.
    seen_id: int
    # Its answers by owner and request shape, which a short pass adds to.
    admitted: dict[tuple[Any, ...], policy.Admission] = field(default_factory=dict)
    no_fit: dict[Any, packer.PackReply] = field(default_factory=dict)
    no_room_why: dict[Any, str] = field(default_factory=dict)

    def wake_by(self, at: datetime) -> None:
        """A job waiting for ``at`` was queued since: a full pass must run then."""
        self.due = at if self.due is None else min(self.due, at)

    def holds(
        self,
        inventory: list[NodeInventory],
        config: windows.PolicyConfig,
        packer_policy: str,
        active: windows.ActiveWindow,
        running: Sequence[Job],
    ) -> bool:
        """Whether the answers still hold for jobs already weighed."""
        return (
            inventory is self.inventory
            and config is self.config
            and packer_policy == self.packer_policy
            and active.window == self.window
            and active.until == self.until
            and active_marks(running) == self.marks
        )
