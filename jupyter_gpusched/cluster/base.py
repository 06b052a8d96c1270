"""The interface every cluster backend (local, ssh, sim) offers the scheduler.

Plain dataclasses in, plain dataclasses out: the scheduler never sees asyncssh or pynvml.
What a node has (``NodeInventory``, ``GpuInfo``, ``GpuProcess``) is plain data the pure packer
reads too, so it lives in :mod:`jupyter_gpusched.core.inventory`; a backend imports it there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.models import Job, Placement


@dataclass(frozen=True)
class JobStatus:
    """Answer of :meth:`Backend.poll`."""

    running: bool
    exit_code: int | None = None  # set once the job ended
    ended_at: datetime | None = None
    lost: bool = False  # the node cannot tell (unreachable) — the scheduler counts these
    # lost, and the node answered: the process is gone without an exit record (SIGKILL of its
    # wrapper, a reboot), so waiting for the node to come back would hold its GPUs for ever
    gone: bool = False
    detail: str | None = None
    checkpoint_at: datetime | None = None  # last checkpoint the job reported (running only)
    # GPUs the job holds when the cluster engine chose them (Slurm), for the placement
    gpu_indices: tuple[int, ...] | None = None


@dataclass
class LaunchResult:
    """Facts the backend needs later to poll, cancel and reattach; stored as ``job.handle``."""

    handle: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """A cluster the scheduler can act on."""

    async def start(self) -> None:
        """Connect / start what is needed. Idempotent."""
        ...

    async def close(self) -> None:
        """Release connections; running jobs keep running on their nodes."""
        ...

    async def inventory(self, *, refresh: bool = False) -> list[NodeInventory]:
        """Every configured node with its GPUs (down nodes too, with ``up=False``)."""
        ...

    async def launch(
        self, job: Job, placement: Placement, *, argv: Sequence[str] | None = None
    ) -> LaunchResult:
        """Start ``job`` detached on ``placement``; return facts to find it again.

        ``argv`` is what to run (a notebook runner, a kernel); default: the spec's command.
        Idempotent per job attempt: launching it again returns the first launch. Raises
        :class:`~jupyter_gpusched.core.errors.NodeRefusedError` when the node answered that
        it could not start it, another ``BackendError`` when the outcome is unknown.
        """
        ...

    async def claim_launch(self, job: Job, placement: Placement) -> LaunchResult | None:
        """The launch of this job attempt if it started; else make sure it never will.

        For a job whose launch may have been cut short (a crash, a cancel while starting):
        after this, a late ``launch`` of the same attempt starts nothing.
        """
        ...

    async def poll(self, job: Job) -> JobStatus:
        """Is the job still running; if not, its exit code."""
        ...

    async def cancel(self, job: Job, *, grace_s: float = 10.0) -> None:
        """SIGTERM the job's process group, SIGKILL after ``grace_s``."""
        ...

    async def read_log(self, job: Job, *, offset: int = 0, limit: int = 65536) -> bytes:
        """Bytes of the job's combined stdout+stderr log from ``offset`` (< 0: from the end)."""
        ...

    def follow_log(self, job: Job, *, offset: int = 0) -> AsyncIterator[bytes]:
        """Yield new log bytes as they are written, until the job ends."""
        ...
