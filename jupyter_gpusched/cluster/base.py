"""The interface every cluster backend (local, ssh, sim) offers the scheduler.

Plain dataclasses in, plain dataclasses out: the scheduler never sees asyncssh or pynvml.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from jupyter_gpusched.core.models import Job, Placement


@dataclass(frozen=True)
class GpuProcess:
    """A compute process seen on a GPU by NVML / nvidia-smi."""

    pid: int
    used_mem_mb: float
    name: str = ""
    job_id: int | None = None  # the gpusched job it belongs to; None = someone else's
    user: str | None = None  # the account it runs as, when its job could not be read

    @property
    def foreign(self) -> bool:
        """True when the scheduler did not start this process: its GPU counts as occupied."""
        return self.job_id is None


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the node's agent reports it."""

    index: int
    uuid: str
    model: str  # short model name, e.g. "A100-80GB", "V100-32GB", "T4"
    mem_total_mb: float
    mem_used_mb: float = 0.0
    util_pct: float = 0.0
    power_w: float | None = None
    nvlink_peers: tuple[int, ...] = ()  # indices of GPUs reachable over NVLink
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class NodeInventory:
    """What one node has, as of ``probed_at``."""

    name: str
    gpus: tuple[GpuInfo, ...]
    cpus: float
    mem_gb: float
    up: bool = True
    error: str | None = None  # why the node is down / the probe failed
    probed_at: datetime | None = None


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
