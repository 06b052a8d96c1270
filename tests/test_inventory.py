"""From what nodes report to what the packer sees: whose GPU processes are whose."""

from __future__ import annotations

from datetime import UTC, datetime

from jupyter_gpusched.core.inventory import GpuInfo, GpuProcess, NodeInventory
from jupyter_gpusched.core.models import Job, JobSpec, JobState, Placement
from jupyter_gpusched.packing.inventory import attribute_processes


def _job(job_id: int, user: str, node: str, gpus: list[int]) -> Job:
    return Job(
        id=job_id,
        spec=JobSpec(kind="script", command=["train"], user=user, gpus=len(gpus)),
        state=JobState.RUNNING,
        submitted_at=datetime(2026, 11, 23, 9, tzinfo=UTC),
        placement=Placement(node=node, gpu_indices=gpus),
    )


def _node(name: str, *procs: list[GpuProcess]) -> NodeInventory:
    gpus = tuple(
        GpuInfo(index=i, uuid=f"GPU-{i}", model="A100-80GB", mem_total_mb=81920, processes=tuple(p))
        for i, p in enumerate(procs)
    )
    return NodeInventory(name=name, gpus=gpus, cpus=32, mem_gb=256)


def test_an_owners_process_on_the_gpu_their_job_holds_is_that_jobs() -> None:
    # the probe ran as the scheduler's account: it saw owners, not the jobs' environment
    alices = GpuProcess(pid=10, used_mem_mb=4000, user="alice")
    bobs = GpuProcess(pid=11, used_mem_mb=2000, user="bob")
    marked = GpuProcess(pid=12, used_mem_mb=1000, job_id=9)
    unknown = GpuProcess(pid=13, used_mem_mb=500)
    inventory = [_node("n0", [alices, bobs], [alices, marked], [unknown]), _node("n1", [alices])]
    jobs = [_job(1, "alice", "n0", [0]), _job(2, "carol", "n0", [1])]

    [n0, n1] = attribute_processes(inventory, jobs)

    assert [p.job_id for p in n0.gpus[0].processes] == [1, None]  # bob's is foreign there
    assert [p.job_id for p in n0.gpus[1].processes] == [None, 9]  # carol's GPU, not alice's
    assert [p.job_id for p in n0.gpus[2].processes] == [None]
    assert [p.job_id for p in n1.gpus[0].processes] == [None]  # another node
    assert attribute_processes(inventory, []) == inventory
