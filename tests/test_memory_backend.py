"""The in-memory backend keeps the Backend protocol's promises, and shows the sim's cluster."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from jupyter_gpusched.cluster.memory import MemoryBackend, Run
from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.sim.specs import DEFAULT_SIM_NODES
from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.errors import BackendError, InvalidSpecError, NodeRefusedError
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.models import Job, JobSpec, Placement

pytestmark = pytest.mark.asyncio


def job(job_id: int, clock: ManualClock, attempt: int = 0, **handle: object) -> Job:
    spec = JobSpec(kind="script", user="alice", command=["train"], gpus=2)
    return Job(id=job_id, spec=spec, submitted_at=clock.now(), attempt=attempt, handle=dict(handle))


T4 = Placement(node="t4-0", gpu_indices=[0, 1])


def shape(nodes: list[NodeInventory]) -> list[tuple[object, ...]]:
    """What the scheduler packs on: names, host resources, GPUs and their links."""
    return [
        (
            n.name,
            n.up,
            n.cpus,
            n.mem_gb,
            [(g.index, g.uuid, g.model, g.mem_total_mb, g.nvlink_peers) for g in n.gpus],
        )
        for n in nodes
    ]


async def test_inventory_is_what_the_simulated_cluster_reports_over_ssh(tmp_path: Path) -> None:
    async with SimCluster(DEFAULT_SIM_NODES, base_dir=tmp_path / "sim") as sim:
        ssh = SshBackend(sim.node_configs(), clock=SystemClock())
        try:
            over_ssh = await ssh.inventory(refresh=True)
        finally:
            await ssh.close()
    in_memory = await MemoryBackend(clock=ManualClock()).inventory()
    assert shape(in_memory) == shape(over_ssh)


async def test_a_job_runs_for_its_declared_duration_on_the_clock() -> None:
    clock = ManualClock()
    backend = MemoryBackend(clock=clock)
    backend.plan(1, duration_s=600, exit_code=3, output=b"epoch 1\n")
    launched = job(1, clock, **(await backend.launch(job(1, clock), T4)).handle)
    clock.advance(599)
    assert (await backend.poll(launched)).running
    clock.advance(1)
    ended = await backend.poll(launched)
    assert (ended.running, ended.exit_code) == (False, 3)
    assert ended.ended_at == launched.submitted_at + timedelta(seconds=600)
    assert await backend.read_log(launched, offset=6) == b"1\n"


async def test_running_jobs_show_as_their_own_processes_on_their_gpus() -> None:
    clock = ManualClock()
    backend = MemoryBackend(clock=clock)
    spec_env = job(4, clock).spec.model_copy(update={"env": {"GPUSCHED_GPU_MEM_MB": "2048"}})
    await backend.launch(job(4, clock).model_copy(update={"spec": spec_env}), T4)
    foreign_pid = backend.add_foreign_process("t4-0", 1, mem_mb=1000)
    t4 = next(n for n in await backend.inventory() if n.name == "t4-0")
    procs = {g.index: [(p.job_id, p.used_mem_mb) for p in g.processes] for g in t4.gpus}
    assert procs == {0: [(4, 2048.0)], 1: [(4, 2048.0), (None, 1000.0)]}
    assert [p.pid for p in t4.gpus[1].processes if p.foreign] == [foreign_pid]
    launch = backend.running_launch(4)
    assert launch.env["CUDA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in t4.gpus)


async def test_finish_and_cancel_end_a_job_as_a_process_would() -> None:
    clock = ManualClock()
    backend = MemoryBackend(clock=clock)
    first = job(1, clock, **(await backend.launch(job(1, clock), T4)).handle)
    second = job(2, clock, **(await backend.launch(job(2, clock), T4)).handle)
    backend.finish(1, exit_code=0)
    await backend.cancel(second, grace_s=5)
    assert (await backend.poll(first)).exit_code == 0
    assert (await backend.poll(second)).exit_code == -15  # SIGTERM
    assert not backend.alive(second.handle["pid"])


async def test_an_unreachable_node_loses_its_jobs_until_it_is_back() -> None:
    clock = ManualClock()
    backend = MemoryBackend(clock=clock)
    running = job(1, clock, **(await backend.launch(job(1, clock), T4)).handle)
    backend.take_down("t4-0")
    assert backend.node_down("t4-0")
    status = await backend.poll(running)
    assert status.lost and "t4-0" in (status.detail or "")
    with pytest.raises(BackendError, match="t4-0"):
        await backend.cancel(running)
    with pytest.raises(BackendError, match="t4-0"):
        await backend.launch(job(2, clock), T4)
    t4 = next(n for n in await backend.inventory() if n.name == "t4-0")
    assert (t4.up, t4.error, len(t4.gpus)) == (False, "node t4-0 is unreachable", 2)
    backend.bring_up("t4-0")
    assert (await backend.poll(running)).running  # it went on running there


async def test_each_attempt_is_found_by_its_own_handle() -> None:
    clock = ManualClock()
    backend = MemoryBackend(clock=clock)
    old = job(1, clock, **(await backend.launch(job(1, clock), T4)).handle)
    new = job(1, clock, 1, **(await backend.launch(job(1, clock, attempt=1), T4)).handle)
    await backend.cancel(old)
    assert not (await backend.poll(old)).running
    assert (await backend.poll(new)).running
    assert [launch.attempt for launch in backend.launches] == [0, 1]


async def test_following_a_log_streams_until_the_job_ends() -> None:
    clock = ManualClock()
    backend = MemoryBackend(clock=clock, default_run=Run(output=b"start\n"))
    running = job(1, clock, **(await backend.launch(job(1, clock), T4)).handle)
    chunks: list[bytes] = []

    async def follow() -> None:
        async for chunk in backend.follow_log(running):
            chunks.append(chunk)

    following = asyncio.ensure_future(follow())
    await asyncio.sleep(0)
    backend.write_log(1, b"step 1\n")
    await asyncio.sleep(0)
    backend.finish(1)
    await asyncio.wait_for(following, timeout=5)
    assert b"".join(chunks) == b"start\nstep 1\n"


async def test_unknown_nodes_and_gpus_are_refused_with_the_known_ones() -> None:
    backend = MemoryBackend(clock=ManualClock())
    with pytest.raises(InvalidSpecError, match="a100-0"):
        backend.take_down("a200-0")
    with pytest.raises(InvalidSpecError, match="0..1"):
        backend.add_foreign_process("t4-0", 2, mem_mb=1)
    with pytest.raises(InvalidSpecError, match="unique"):
        MemoryBackend([DEFAULT_SIM_NODES[3]] * 2, clock=ManualClock())


async def test_a_repeated_launch_returns_the_first_and_a_claimed_attempt_never_starts() -> None:
    clock = ManualClock()
    backend = MemoryBackend(clock=clock)
    first = await backend.launch(job(1, clock), T4)
    assert (await backend.launch(job(1, clock), T4)).handle == first.handle
    found = await backend.claim_launch(job(1, clock), T4)
    assert found is not None and found.handle == first.handle
    assert await backend.claim_launch(job(2, clock), T4) is None
    with pytest.raises(NodeRefusedError, match="never finished starting"):
        await backend.launch(job(2, clock), T4)
    assert [launch.job_id for launch in backend.launches] == [1]
