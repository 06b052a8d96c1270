"""What Slurm says of our jobs, asked once per poll for all of them.

The scheduler polls every running job at once (``asyncio.gather`` of ``backend.poll``); the
polls that arrive together join one *round*: one ``squeue -j <ids>`` for all of them, one
``squeue --json`` when a job of ours started and the GPUs Slurm gave it are not known yet,
and one ``sacct`` for jobs the controller has already forgotten (when accounting is on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from jupyter_gpusched.core.errors import BackendError

from ..ssh.config import RemoteResult
from .parse import JobRow, job_ids_arg, parse_sacct, parse_squeue, parse_squeue_json, squeue_format

log = logging.getLogger(__name__)

#: Runs a Slurm command (argv) as the service and returns its result.
SlurmRunner = Callable[[Sequence[str]], Awaitable[RemoteResult]]
#: Our job id of a Slurm job (id, name) when it is one of ours (its launch record names it).
OursTest = Callable[[int, str], int | None]


class JobStates:
    """Batched state rounds, and the GPU indices of our running jobs.

    Parameters
    ----------
    slurm
        Runs ``squeue`` / ``sacct`` argv.
    ours
        Tells our Slurm jobs from others' in ``squeue --json`` output.
    """

    def __init__(self, slurm: SlurmRunner, ours: OursTest) -> None:
        self._slurm = slurm
        self._ours = ours
        self._want: set[int] = set()
        self._round: asyncio.Future[dict[int, JobRow]] | None = None
        self.last: dict[int, JobRow | None] = {}  # latest row of each job asked about (None: gone)
        # our running jobs: Slurm job id -> (node, GPU indices, our job id)
        self.gpus: dict[int, tuple[str, tuple[int, ...], int]] = {}
        self.sacct_works: bool | None = None  # None until tried
        self.calls: dict[str, int] = {}  # commands run, by name (the benchmarks read it)

    async def row(self, slurm_id: int) -> JobRow | None:
        """The job's row, None when Slurm no longer knows it.

        One round (one ``squeue``) answers every poll that asks at the same time.
        """
        self._want.add(slurm_id)
        if self._round is None:
            self._round = asyncio.ensure_future(self._run_round())
        rows = await asyncio.shield(self._round)
        return rows.get(slurm_id)

    async def _run_round(self) -> dict[int, JobRow]:
        await asyncio.sleep(0)  # let the polls started together add their ids
        ids, self._want = self._want, set()
        self._round = None  # later polls start the next round
        rows = await self.squeue(ids)
        missing = ids - set(rows)
        if missing:
            rows.update(await self.sacct(missing))
        started = [r for r in rows.values() if r.active and r.started and r.gpus is None]
        if any(r.job_id not in self.gpus for r in started):
            await self.learn_gpus()
        for r in rows.values():
            if not r.active:
                self.gpus.pop(r.job_id, None)
        for job_id in ids - set(rows):
            self.gpus.pop(job_id, None)
            self.last[job_id] = None
        self.last.update(rows)
        return rows

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    async def squeue(self, ids: Iterable[int]) -> dict[int, JobRow]:
        """One ``squeue`` for ``ids`` (states of the jobs the controller still holds)."""
        ids = set(ids)
        if not ids:
            return {}
        self._count("squeue")
        argv = ["squeue", "-h", "-t", "all", "-j", job_ids_arg(ids), "-O", squeue_format()]
        result = await self._slurm(argv)
        if result.exit_status != 0:
            if "Invalid job id" in str(result.stderr):
                return {}  # none of them is known any more
            raise BackendError(f"squeue failed: {str(result.stderr).strip()[-500:]}")
        return parse_squeue(result.stdout)

    async def sacct(self, ids: Iterable[int]) -> dict[int, JobRow]:
        """How jobs the controller forgot ended, from accounting (empty when it is off)."""
        if self.sacct_works is False:
            return {}
        self._count("sacct")
        fields = "JobIDRaw,JobName,State,ExitCode,End"
        argv = ["sacct", "-n", "-P", "-X", "-j", job_ids_arg(ids), "-o", fields]
        try:
            result = await self._slurm(argv)
        except BackendError:
            return {}
        if result.exit_status != 0:
            self.sacct_works = False
            log.info("gpusched: sacct unavailable (%s)", str(result.stderr).strip()[-200:])
            return {}
        self.sacct_works = True
        return parse_sacct(result.stdout)

    async def learn_gpus(self) -> None:
        """Record which GPU indices every running job of ours holds (one ``squeue --json``)."""
        self._count("squeue --json")
        result = await self._slurm(["squeue", "--json"])
        if result.exit_status != 0:
            raise BackendError(f"squeue --json failed: {str(result.stderr).strip()[-500:]}")
        gpus = {}
        for row in parse_squeue_json(result.stdout).values():
            job_id = self._ours(row.job_id, row.name) if row.active and row.started else None
            if job_id is not None:
                gpus[row.job_id] = (row.node, row.gpus or (), job_id)
        self.gpus = gpus  # every job Slurm runs is listed: ours that ended drop out

    def ours_on(self, node: str) -> dict[int, int]:
        """GPU index -> our job id, for our jobs known to run on ``node``."""
        return {i: job for n, idx, job in self.gpus.values() if n == node for i in idx}
