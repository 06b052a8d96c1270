"""An in-memory cluster backend: jobs are records, time is the injected clock.

The scheduler's decisions (queue order, admission, packing, backfill, preemption, moves, limits,
lost nodes) depend on what a backend reports, not on how the job runs. This backend answers the
:class:`~jupyter_gpusched.cluster.base.Backend` protocol from plain records, so a scheduler on a
:class:`~jupyter_gpusched.core.clock.ManualClock` can be driven through hours of policy in
milliseconds. It runs nothing: what real processes, SSH and the node agent do is proved on the
simulated cluster (:mod:`jupyter_gpusched.cluster.sim`) by the integration tests.

What a test controls, and what the backend reports:

- **Nodes** come from :class:`~jupyter_gpusched.cluster.sim.specs.SimNodeSpec` shapes (the same
  GPUs, UUIDs and NVLink pairs the simulated cluster reports). :meth:`MemoryBackend.take_down`
  drops a node off the network (its jobs go on running, as on a real node that only became
  unreachable) and :meth:`MemoryBackend.bring_up` brings it back.
- **A launched job** runs until the test ends it (:meth:`MemoryBackend.finish`), until the
  duration declared for it (:meth:`MemoryBackend.plan`) has passed on the clock, or until it
  is cancelled (exit code ``-15``, as a SIGTERM'd process reports it).
- **GPU processes**: each running job shows one process on each of its GPUs, tagged with its
  job id and using the ``GPUSCHED_GPU_MEM_MB`` it was given; foreign processes
  (:meth:`MemoryBackend.add_foreign_process`) stand for someone else's use.
- **Launch records** (:attr:`MemoryBackend.launches`) keep what each launch was asked to run,
  with which environment, on which GPUs, for tests to assert on.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import BackendError, InvalidSpecError, NodeRefusedError
from jupyter_gpusched.core.inventory import GpuInfo, GpuProcess, NodeInventory
from jupyter_gpusched.core.models import Job, Placement

from .base import JobStatus, LaunchResult
from .sim.specs import DEFAULT_SIM_NODES, SimNodeSpec, gpu_state

__all__ = ["Launch", "MemoryBackend", "Run"]


@dataclass(frozen=True)
class Run:
    """What a launched job does: how long it runs and how it ends."""

    duration_s: float | None = None  # on the backend's clock; None = until finished or cancelled
    exit_code: int = 0  # how it ends once ``duration_s`` has passed
    output: bytes = b""  # what it writes to its log when it starts


@dataclass
class Launch:
    """One launch of one job attempt: what was asked, and what became of it."""

    job_id: int
    attempt: int
    node: str
    gpu_indices: list[int]
    argv: list[str]
    env: dict[str, str]  # the job's environment, CUDA_VISIBLE_DEVICES and GPUSCHED_JOB_ID included
    pid: int  # a fake pid, unique per launch: the handle finds the launch by it
    started_at: datetime
    started_mono: float
    run: Run
    log: bytearray = field(default_factory=bytearray)
    exit_code: int | None = None  # set once it ended
    ended_at: datetime | None = None
    checkpoint_at: datetime | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # log written or job ended

    @property
    def running(self) -> bool:
        """Not ended yet (as of the last :meth:`MemoryBackend._settle`)."""
        return self.exit_code is None

    def write(self, data: bytes) -> None:
        """Append to the job's log and wake its followers."""
        self.log += data
        self._wake()

    def end(self, exit_code: int, at: datetime) -> None:
        """Record the job's end (once)."""
        if self.exit_code is None:
            self.exit_code, self.ended_at = exit_code, at
            self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class MemoryBackend:
    """A :class:`~jupyter_gpusched.cluster.base.Backend` whose jobs live in memory.

    Parameters
    ----------
    nodes
        Shapes of the nodes (default: the simulated cluster's lab, 2 x 8 A100, 4 V100, 2 T4).
    clock
        The scheduler's clock: durations run on it, and launch and end times come from it.
    default_run
        What a job without a :meth:`plan` does (default: run until finished or cancelled).
    """

    def __init__(
        self,
        nodes: Sequence[SimNodeSpec] = DEFAULT_SIM_NODES,
        *,
        clock: Clock,
        default_run: Run | None = None,
    ) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise InvalidSpecError("nodes", f"node names must be unique, got {names}")
        self.clock = clock
        self.default_run = default_run or Run()
        self.launches: list[Launch] = []
        # (job id, attempt, node) -> its launch, or None once claimed without one
        self._attempts: dict[tuple[int, int, str], Launch | None] = {}
        self._specs = {n.name: n for n in nodes}
        self._gpus = {n.name: _gpus(n) for n in nodes}
        self._down: dict[str, str] = {}  # node -> why it is unreachable
        self._foreign: dict[str, list[tuple[int, GpuProcess]]] = {n: [] for n in names}
        self._plans: dict[int, Run] = {}
        self._pids = itertools.count(100_000)

    # ------------------------------------------------------------------ what the test controls
    def plan(self, job_id: int, run: Run | None = None, **fields: Any) -> None:
        """Declare what job ``job_id`` does when launched (every attempt), e.g. its duration.

        ``plan(7, duration_s=600, exit_code=3)`` is ``plan(7, Run(600, 3))``.
        """
        self._plans[job_id] = run if run is not None else Run(**fields)

    def finish(self, job_id: int, exit_code: int = 0) -> Launch:
        """End job ``job_id``'s running launch now with ``exit_code``; that launch."""
        launch = self.running_launch(job_id)
        launch.end(exit_code, self.clock.now())
        return launch

    def write_log(self, job_id: int, data: bytes) -> None:
        """Append ``data`` to the log of job ``job_id``'s running launch."""
        self.running_launch(job_id).write(data)

    def checkpoint(self, job_id: int, at: datetime) -> None:
        """Job ``job_id`` reports a checkpoint saved at ``at`` (as ``checkpointed()`` does)."""
        self.running_launch(job_id).checkpoint_at = at

    def take_down(self, node: str, why: str = "unreachable") -> None:
        """Drop ``node`` off the network; its jobs keep running there."""
        self._spec(node)
        self._down[node] = why

    def bring_up(self, node: str) -> None:
        """Make ``node`` reachable again."""
        self._spec(node)
        self._down.pop(node, None)

    def add_foreign_process(self, node: str, gpu_index: int, mem_mb: float) -> int:
        """Show a process the scheduler did not start on one GPU; its (fake) pid."""
        spec = self._spec(node)
        if not 0 <= gpu_index < spec.gpus:
            raise InvalidSpecError(
                "gpu_index", f"node {node} has GPUs 0..{spec.gpus - 1}, got {gpu_index}"
            )
        pid = next(self._pids)
        self._foreign[node].append((gpu_index, GpuProcess(pid, float(mem_mb), "python")))
        return pid

    def clear_foreign(self, node: str) -> None:
        """Remove every foreign process from ``node``."""
        self._spec(node)
        self._foreign[node] = []

    def running_launch(self, job_id: int) -> Launch:
        """The launch of job ``job_id`` that is still running (LookupError if none)."""
        self._settle()
        for launch in reversed(self.launches):
            if launch.job_id == job_id and launch.running:
                return launch
        raise LookupError(f"job {job_id} has no running launch")

    def alive(self, pid: int) -> bool:
        """Whether the launch with this pid still runs (the stale-copy checks use it)."""
        self._settle()
        return any(launch.pid == pid and launch.running for launch in self.launches)

    # ------------------------------------------------------------------ the Backend protocol
    async def start(self) -> None:
        """Nothing to connect."""

    async def close(self) -> None:
        """Nothing to release; jobs keep running, as on real nodes."""

    def node_down(self, name: str) -> bool:
        """Whether ``name`` is unreachable (the scheduler asks before declaring jobs lost)."""
        return name in self._down

    async def inventory(self, *, refresh: bool = False) -> list[NodeInventory]:
        """Every node with its GPUs, processes on them, and whether it is reachable."""
        self._settle()
        now = self.clock.now()
        nodes = []
        for name, spec in self._specs.items():
            if name in self._down:
                # As the SSH backend does: the shape last seen, marked down, with the reason.
                why = f"node {name} is {self._down[name]}"
                gpus = self._gpus[name]
                nodes.append(NodeInventory(name, gpus, spec.cpus, spec.mem_gb, False, why, now))
                continue
            procs: dict[int, list[GpuProcess]] = {g.index: [] for g in self._gpus[name]}
            for launch in self.launches:
                if launch.node == name and launch.running:
                    mem_mb = float(launch.env.get("GPUSCHED_GPU_MEM_MB") or 0.0)
                    for i in launch.gpu_indices:
                        procs[i].append(GpuProcess(launch.pid, mem_mb, "python", launch.job_id))
            for i, proc in self._foreign[name]:
                procs[i].append(proc)
            gpus = tuple(
                _with_processes(g, procs[g.index]) if procs[g.index] else g
                for g in self._gpus[name]
            )
            nodes.append(NodeInventory(name, gpus, spec.cpus, spec.mem_gb, probed_at=now))
        return nodes

    async def launch(
        self, job: Job, placement: Placement, *, argv: Sequence[str] | None = None
    ) -> LaunchResult:
        """Record the launch; the job is running from now on the clock.

        Idempotent per job attempt and node, as the agent's launch record makes it: a repeated
        launch returns the first; one of a claimed attempt starts nothing.
        """
        self._reachable(placement.node)
        key = (job.id, job.attempt, placement.node)
        if key in self._attempts:
            first = self._attempts[key]
            if first is None:
                raise NodeRefusedError(
                    f"node {placement.node}: job {job.id}.{job.attempt} holds a launch that "
                    "never finished starting"
                )
            return self._result(first)
        command = list(argv or job.spec.command or [])
        if not command:
            raise BackendError(f"job {job.id} has no command to run on {placement.node}")
        uuids = {g.index: g.uuid for g in self._gpus[placement.node]}
        env = {
            **job.spec.env,
            "GPUSCHED_JOB_ID": str(job.id),
            "CUDA_VISIBLE_DEVICES": ",".join(uuids[i] for i in placement.gpu_indices),
        }
        run = self._plans.get(job.id, self.default_run)
        launch = Launch(
            job_id=job.id,
            attempt=job.attempt,
            node=placement.node,
            gpu_indices=list(placement.gpu_indices),
            argv=command,
            env=env,
            pid=next(self._pids),
            started_at=self.clock.now(),
            started_mono=self.clock.monotonic(),
            run=run,
        )
        launch.write(run.output)
        self.launches.append(launch)
        self._attempts[key] = launch
        return self._result(launch)

    async def claim_launch(self, job: Job, placement: Placement) -> LaunchResult | None:
        """The attempt's launch if it started; else claim it so that it never starts."""
        self._reachable(placement.node)
        first = self._attempts.setdefault((job.id, job.attempt, placement.node), None)
        return None if first is None else self._result(first)

    @staticmethod
    def _result(launch: Launch) -> LaunchResult:
        where = f"memory://{launch.node}/jobs/{launch.job_id}.{launch.attempt}"
        return LaunchResult(
            handle={
                "node": launch.node,
                "pid": launch.pid,
                "pgid": launch.pid,
                "job_dir": where,
                "log": f"{where}/output.log",
            }
        )

    async def poll(self, job: Job) -> JobStatus:
        """Running, or ended with its exit code; ``lost`` while its node is unreachable."""
        try:
            launch = self._launch_of(job)
            self._reachable(launch.node)
        except BackendError as exc:
            return JobStatus(running=False, lost=True, detail=exc.message)
        if launch.running:
            return JobStatus(running=True, checkpoint_at=launch.checkpoint_at)
        return JobStatus(running=False, exit_code=launch.exit_code, ended_at=launch.ended_at)

    async def cancel(self, job: Job, *, grace_s: float = 10.0) -> None:
        """End the job now as a SIGTERM'd process does (a record has no grace to use)."""
        launch = self._launch_of(job)
        self._reachable(launch.node)
        launch.end(-signal.SIGTERM, self.clock.now())

    async def read_log(self, job: Job, *, offset: int = 0, limit: int = 65536) -> bytes:
        """Up to ``limit`` bytes of the job's log from ``offset`` (< 0: from the end)."""
        launch = self._launch_of(job)
        self._reachable(launch.node)
        if offset < 0:
            offset = max(0, len(launch.log) + offset)
        return bytes(launch.log[offset : offset + limit])

    async def follow_log(self, job: Job, *, offset: int = 0) -> AsyncIterator[bytes]:
        """Log bytes as they are written, until the job ends."""
        launch = self._launch_of(job)
        while True:
            self._settle()
            changed = launch.changed
            if len(launch.log) > offset:
                chunk = bytes(launch.log[offset:])
                offset += len(chunk)
                yield chunk
                continue
            if not launch.running:
                return
            await changed.wait()

    # ------------------------------------------------------------------ internals
    def _spec(self, node: str) -> SimNodeSpec:
        try:
            return self._specs[node]
        except KeyError:
            raise InvalidSpecError(
                "node", f"no node {node!r}; nodes: {sorted(self._specs)}"
            ) from None

    def _reachable(self, node: str) -> None:
        self._spec(node)
        if node in self._down:
            raise BackendError(f"node {node} is {self._down[node]}")

    def _launch_of(self, job: Job) -> Launch:
        """The launch a job's handle names (earlier attempts' handles name earlier launches)."""
        self._settle()
        pid = (job.handle or {}).get("pid")
        for launch in self.launches:
            if launch.pid == pid:
                return launch
        raise BackendError(f"job {job.id} has no launch record (pid, node) to find it by")

    def _settle(self) -> None:
        """End the launches whose declared duration has passed on the clock."""
        mono = self.clock.monotonic()
        for launch in self.launches:
            duration = launch.run.duration_s
            if launch.running and duration is not None and mono - launch.started_mono >= duration:
                launch.end(launch.run.exit_code, launch.started_at + timedelta(seconds=duration))


def _gpus(spec: SimNodeSpec) -> tuple[GpuInfo, ...]:
    """The GPUs the simulated cluster's NVML would report for ``spec``, idle."""
    return tuple(
        GpuInfo(
            index=g["index"],
            uuid=g["uuid"],
            model=spec.gpu_model,
            mem_total_mb=g["mem_total_mb"],
            nvlink_peers=() if g["nvlink_peer"] is None else (g["nvlink_peer"],),
        )
        for g in gpu_state(spec)["gpus"]
    )


def _with_processes(gpu: GpuInfo, procs: Sequence[GpuProcess]) -> GpuInfo:
    used = sum(p.used_mem_mb for p in procs)
    return GpuInfo(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        mem_total_mb=gpu.mem_total_mb,
        mem_used_mb=min(used, gpu.mem_total_mb),
        util_pct=100.0 if any(not p.foreign for p in procs) else 0.0,
        power_w=gpu.power_w,
        nvlink_peers=gpu.nvlink_peers,
        processes=tuple(procs),
    )
