"""A job's reason says what became of it (issue #32).

A failed job's reason was "exit code 1" while the ``FileNotFoundError`` was only in its log;
a job re-adopted when its node came back kept the reason "node is back" after it finished; a
0-GPU job read "placed on gpu1 GPU , 0 GPU of each".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _fixtures_scheduler import Harness, memory_scheduler, py, sim, sim_harness

from jupyter_gpusched.cluster.memory import Run
from jupyter_gpusched.cluster.slurm.access import SharedFiles
from jupyter_gpusched.core.models import JobState, Placement
from jupyter_gpusched.scheduling.tracking import last_error_line
from jupyter_gpusched.scheduling.waiting import placed

__all__ = ["sim", "sim_harness"]  # the fixtures, imported for their tests

TRACEBACK = """\
epoch 1
Traceback (most recent call last):
  File "/home/alice/train.py", line 3, in <module>
    open("data/train.csv")
FileNotFoundError: [Errno 2] No such file or directory: 'data/train.csv'
\x1b[31mcleanup done\x1b[0m
"""


def test_the_last_error_line_is_the_exception_even_with_lines_after_it() -> None:
    assert last_error_line(TRACEBACK) == (
        "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.csv'"
    )


def test_without_an_exception_line_a_line_that_mentions_an_error_is_taken() -> None:
    assert last_error_line("step 9\nCUDA error: out of memory\nbye\n") == (
        "CUDA error: out of memory"
    )
    assert last_error_line("all good\n\n") is None
    assert last_error_line("ValueError: " + "x" * 500) == "ValueError: " + "x" * 187 + "…"


@pytest.mark.asyncio
async def test_a_failed_scripts_reason_is_its_last_error_line_read_from_its_node(
    sim_harness: Harness,
) -> None:
    # a real script over SSH on the sim cluster: the node agent reads the log's last bytes
    # more log than the tail read comes first; what stdout still buffers is flushed after the
    # traceback, as Python does at exit
    code = "print('x' * 40000, flush=True); print('epoch 1'); open('train.py')"
    bad = sim_harness.submit(command=py(code), gpus=1)
    await sim_harness.settle(bad.id)
    job = sim_harness.job(bad.id)
    assert job.state is JobState.FAILED and job.exit_code == 1
    assert job.reason == (
        "FileNotFoundError: [Errno 2] No such file or directory: 'train.py' (exit code 1)"
    )


@pytest.mark.asyncio
async def test_a_job_that_finishes_after_its_node_came_back_drops_the_reason_node_is_back(
    tmp_path: Path,
) -> None:
    async with memory_scheduler(tmp_path) as h:
        job = h.submit(gpus=1, run=Run(duration_s=600))
        await h.settle(job.id, state=JobState.RUNNING)
        node = h.job(job.id).placement.node  # type: ignore[union-attr]
        h.memory.take_down(node)
        await h.until(lambda: "unreachable" in (h.job(job.id).reason or ""))
        h.clock.advance(301)  # past the grace: declared down, its job lost
        await h.settle(job.id, state=JobState.LOST)
        h.memory.bring_up(node)
        await h.until(lambda: h.job(job.id).reason == "node is back")
        h.clock.advance(600)
        await h.settle(job.id)
        assert h.job(job.id).state is JobState.SUCCEEDED
        assert h.job(job.id).reason == "exit code 0"


def test_a_job_with_no_gpu_is_placed_on_its_node_without_a_gpu_list() -> None:
    assert placed(Placement(node="gpu1", gpu_indices=[], share_per_gpu=0.0), []) == (
        "placed on gpu1, no GPU"
    )


@pytest.mark.asyncio
async def test_a_log_on_the_shared_filesystem_is_read_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"x" * 50_000 + b"\nValueError: bad lr\n")
    files = SharedFiles(dict(os.environ))
    assert await files.read(None, str(log), -20) == b"r\nValueError: bad lr\n"[-20:]
    assert await files.read(None, str(log), -(10**9)) == log.read_bytes()  # more than it holds


@pytest.mark.asyncio
async def test_a_failed_job_on_the_in_memory_backend_gets_its_last_error_line(
    tmp_path: Path,
) -> None:
    async with memory_scheduler(tmp_path) as h:
        output = TRACEBACK.encode() * 400  # ~100 KB: only the end is read
        job = h.submit(gpus=1, run=Run(duration_s=60, exit_code=1, output=output))
        await h.settle(job.id, state=JobState.RUNNING)
        h.clock.advance(60)
        await h.settle(job.id)
        assert h.job(job.id).reason == (
            "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.csv' (exit code 1)"
        )
