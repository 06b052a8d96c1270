"""Notebook jobs on the embedded cluster: a scheduler with the notebook plugin, and notebooks.

Import the fixtures into a test module: ``from _fixtures_notebooks import nb_harness, ...``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nbformat
import pytest_asyncio
from _fixtures_polling import wait_for_async

from jupyter_gpusched.batch.notebooks import NotebookPlugin
from jupyter_gpusched.batch.requests import build_submission, parse_request
from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.sim.specs import SimNodeSpec
from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core import windows
from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.models import Job, JobState
from jupyter_gpusched.scheduling.scheduler import Scheduler
from jupyter_gpusched.store.store import Store

MONDAY_9AM = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
NODES = (
    SimNodeSpec("a100-0", "A100-80GB", 80, 4, cpus=32, mem_gb=256),
    SimNodeSpec("t4-0", "T4", 16, 2, cpus=8, mem_gb=64),
)
DONE = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def write_notebook(path: Path, cells: Sequence[str], *, parameters: str | None = None) -> Path:
    """A python3 notebook of code cells; ``parameters`` becomes the cell tagged parameters."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "language": "python",
        "display_name": "Python 3",
    }
    body = []
    if parameters is not None:
        cell = nbformat.v4.new_code_cell(parameters)
        cell.metadata["tags"] = ["parameters"]
        body.append(cell)
    body += [nbformat.v4.new_code_cell(src) for src in cells]
    nb.cells = [nbformat.v4.new_markdown_cell("# a test notebook"), *body]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def read_notebook(path: Path | str) -> Any:
    return nbformat.read(str(path), as_version=4)


def outputs_text(cell: Any) -> str:
    """Everything a cell printed (streams, results, error names and tracebacks)."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}\n" + "\n".join(out["traceback"]))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


class NbHarness:
    """Scheduler + SSH backend + notebook plugin on a sim cluster, driven tick by tick."""

    def __init__(
        self,
        sim: SimCluster,
        root: Path,
        clock: ManualClock,
        config: windows.PolicyConfig | None = None,
    ) -> None:
        self.sim = sim
        self.root = root
        self.clock = clock
        self.config = config or windows.PolicyConfig()
        self.store = Store(f"sqlite:///{root / 'gpusched.db'}", clock=clock)
        backend = SshBackend(
            sim.node_configs(),
            clock=SystemClock(),
            down_after_failures=2,
            backoff_base_s=0.05,
            backoff_max_s=0.2,
        )
        self.sched = Scheduler(
            store=self.store,
            backend=backend,
            policy=self.config,
            clock=clock,
            poll_interval_s=0,
            inventory_interval_s=0,
            cancel_grace_s=5,
        )
        self.plugin = NotebookPlugin(self.sched, backend)
        self.plugin.install()

    def submit(self, user: str = "alice", **body: Any) -> Job:
        request = parse_request(body)
        sub = build_submission(
            request,
            user=user,
            root_dir=str(self.root),
            config=self.config,
            now=self.clock.now(),
            recurring=False,
        )
        job, _ = self.plugin.submit(sub)
        assert job is not None
        return job

    def job(self, job_id: int) -> Job:
        return self.sched.get_job(job_id)

    async def until(self, pred: Callable[[], bool], timeout_s: float = 60.0) -> None:
        """Tick until ``pred()`` holds."""

        def states(_: object) -> str:
            jobs, _ = self.sched.list_jobs(limit=100)
            return f"jobs: {[(j.id, j.state, j.reason) for j in jobs]}"

        await wait_for_async(pred, step=self.sched.tick, timeout_s=timeout_s, what=states)

    async def settle(self, *ids: int) -> list[Job]:
        """Tick until the jobs ended and their end hooks ran; the jobs."""
        await self.until(
            lambda: all(
                self.job(i).state in DONE and self.job(i).handle.get("ended_hooks_done")
                for i in ids
            )
        )
        return [self.job(i) for i in ids]

    def events(self, job_id: int, kind: str) -> list[dict[str, Any]]:
        return [e.detail for e in self.store.list_events(job_id=job_id) if e.kind == kind]


@pytest_asyncio.fixture
async def nb_sim(tmp_path: Path) -> AsyncIterator[SimCluster]:
    cluster = SimCluster(NODES, base_dir=tmp_path / "sim")
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop(kill_jobs=True)


@pytest_asyncio.fixture
async def nb_harness(nb_sim: SimCluster, tmp_path: Path) -> AsyncIterator[NbHarness]:
    root = tmp_path / "root"
    root.mkdir()
    h = NbHarness(nb_sim, root, ManualClock(MONDAY_9AM))
    await h.sched.start()
    try:
        yield h
    finally:
        await h.plugin.close()
        await h.sched.stop()
        h.store.close()


def progress_cells(details: list[dict[str, Any]]) -> list[int]:
    return [int(d["cell"]) for d in details]


__all__ = [
    "NbHarness",
    "json",
    "nb_harness",
    "nb_sim",
    "outputs_text",
    "progress_cells",
    "read_notebook",
    "write_notebook",
]
