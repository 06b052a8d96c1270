"""Big inputs: bounded at the API, and never on the node's exec line.

Issue #15: one 300 KB argument broke the node's SSH connection for every user ("Max packet
size exceeded"), 200 KB gave "Argument list too long", a 10 MB label was accepted and made
every ``GET jobs`` 11 MB.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from _fixtures_polling import wait_for_async

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.sim.specs import SimNodeSpec
from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core.clock import SystemClock
from jupyter_gpusched.core.errors import InvalidSpecError
from jupyter_gpusched.core.models import Job, JobState, Placement, parse_spec

T4 = SimNodeSpec("t4-0", "T4", 16, 2, cpus=16, mem_gb=64)
#: The job's report: total bytes of its arguments and of $BIG.
REPORT = (
    "import os, sys; open(sys.argv[1], 'w').write("
    "f'{sum(len(a) for a in sys.argv[2:])} {len(os.environ[\"BIG\"])}')"
)


@pytest_asyncio.fixture
async def backend(tmp_path: Path) -> AsyncIterator[SshBackend]:
    sim = SimCluster((T4,), base_dir=tmp_path / "sim")
    await sim.start()
    pool = SshBackend(sim.node_configs(), clock=SystemClock())
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()
        await sim.stop(kill_jobs=True)


@pytest.mark.asyncio
async def test_big_arguments_and_environment_reach_the_job_and_the_connection_stays_up(
    backend: SshBackend, tmp_path: Path
) -> None:
    report = tmp_path / "report"
    args = ["a" * (120 * 1024)] * 4  # 480 KB: far past one SSH packet, within the limits
    spec = parse_spec(
        {"kind": "script", "command": [sys.executable, "-c", REPORT, str(report), *args],
         "env": {"BIG": "b" * 100_000}},
        user="ann",
    )  # fmt: skip
    job = Job(id=1, spec=spec, state=JobState.STARTING, submitted_at=datetime.now(UTC))
    neighbour = asyncio.ensure_future(backend.run("t4-0", ["sleep", "0.5"], check=True))
    launched = await backend.launch(job, Placement(node="t4-0", gpu_indices=[0]))
    await neighbour  # another user's command on the same connection went through
    ran = job.model_copy(update={"handle": launched.handle})
    await wait_for_async(
        lambda: backend.poll(ran), lambda status: not status.running, what="the job to end"
    )
    assert report.read_text() == f"{4 * 120 * 1024} 100000"
    assert backend.node_error("t4-0") is None and not backend.node_down("t4-0")


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"command": ["echo", "x" * 300_000]}, "command", "293K; at most 128K each"),
        ({"command": ["echo", *["x" * 100_000] * 11]}, "command", "at most 1M together"),
        ({"command": ["true"], "env": {"BIG": "x" * 300_000}}, "env", "at most 128K each"),
        ({"command": ["true"], "labels": {"note": "x" * 10_000_000}}, "labels.note", "1024"),
        ({"command": ["true"], "labels": {f"k{i}": "v" for i in range(100)}}, "labels", "64"),
        ({"command": ["true"], "workdir": "/" + "d" * 5000}, "workdir", "4096"),
    ],
    ids=["one-300KB-argument", "argv-past-1MB", "env-value", "10MB-label", "100-labels", "path"],
)
def test_oversized_fields_are_refused_with_the_limit(
    spec: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_spec({"kind": "script", **spec}, user="ann")
    assert err.value.field == field, err.value.message
    assert says in err.value.message, err.value.message
