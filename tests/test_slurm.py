"""SlurmBackend against a real slurmctld + slurmd (+ munged) on loopback with fake GPU GRES.

Backend level: what a launch asks of Slurm and what comes back (GPUs, exit codes, logs), one
squeue per poll round, cancel with a grace period, launches that are idempotent and claimable,
a fresh backend (a restarted server) finding its jobs, jobs run as their owner, the map of the
node with others' Slurm jobs as foreign, and a lease kernel reached over SSH.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _fixtures_polling import wait_for_async
from _fixtures_slurm import NODE, SlurmCluster

from jupyter_gpusched.cluster.base import JobStatus
from jupyter_gpusched.cluster.portforward import ProcessForward
from jupyter_gpusched.cluster.slurm import SlurmBackend, commands
from jupyter_gpusched.core.clock import SystemClock
from jupyter_gpusched.core.errors import NodeRefusedError
from jupyter_gpusched.core.models import Job, JobSpec, Placement

pytestmark = [pytest.mark.slurm, pytest.mark.asyncio]

_ids = iter(range(1000, 100000))


def make_job(
    command: list[str] | None, *, kind: str = "script", attempt: int = 0, **spec: Any
) -> Job:
    """A job as the scheduler hands it to the backend (a fresh id each time)."""
    return Job(
        id=next(_ids),
        attempt=attempt,
        spec=JobSpec(kind=kind, command=command, user=spec.pop("user", "root"), **spec),
        submitted_at=datetime.now(UTC),
    )


def at(*gpus: int) -> Placement:
    return Placement(node=NODE, gpu_indices=list(gpus))


async def launched(backend: SlurmBackend, job: Job, placement: Placement) -> Job:
    result = await backend.launch(job, placement)
    return job.model_copy(update={"handle": result.handle, "placement": placement})


async def until(backend: SlurmBackend, job: Job, done: Any, timeout_s: float = 30) -> JobStatus:
    """Poll until ``done(status)``; the status then."""
    for _ in range(int(timeout_s / 0.1)):
        status = await backend.poll(job)
        if done(status):
            return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"job {job.id}: {status}")


def started(status: JobStatus) -> bool:
    return status.running and status.gpu_indices is not None


def ended(status: JobStatus) -> bool:
    return not status.running


@pytest.fixture
def state_dir(slurm_cluster: SlurmCluster) -> Any:
    path = Path(tempfile.mkdtemp(prefix="state-", dir=slurm_cluster.base))
    path.chmod(0o755)
    return path


def backend_for(cluster: SlurmCluster, state_dir: Path, **traits: Any) -> SlurmBackend:
    traits.setdefault("workdir", str(state_dir / "work"))
    return SlurmBackend(
        clock=SystemClock(), state_dir=str(state_dir), slurm_conf=str(cluster.conf), **traits
    )


@pytest_asyncio.fixture
async def backend(slurm_cluster: SlurmCluster, state_dir: Path) -> AsyncIterator[SlurmBackend]:
    b = backend_for(slurm_cluster, state_dir)
    await b.start()
    await b.inventory()
    try:
        yield b
    finally:
        await b.close()
        slurm_cluster.cancel_all()


async def test_a_script_runs_on_the_gpus_slurm_gave_it_with_its_env_intact(
    backend: SlurmBackend, slurm_cluster: SlurmCluster
) -> None:
    show = "import json, os, time; time.sleep(1.5); print(json.dumps({k: os.environ.get(k) for k in ['CUDA_VISIBLE_DEVICES', 'ODD', 'GPUSCHED_JOB_ID']}), flush=True); raise SystemExit(3)"  # noqa: E501
    job = make_job([sys.executable, "-c", show, "a b; $(id)"], gpus=2, env={"ODD": "a,b c;'$x"})
    job = await launched(backend, job, at(2, 3))

    again = await backend.launch(job, at(2, 3))  # a launch repeated (cut short before) is the same
    assert again.handle == job.handle
    running = await until(backend, job, started)
    done = await until(backend, job, ended)

    assert done.exit_code == 3
    seen = json.loads((await backend.read_log(job)).decode().splitlines()[-1])
    assert seen == {
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, running.gpu_indices or ())),
        "ODD": "a,b c;'$x",
        "GPUSCHED_JOB_ID": str(job.id),
    }
    assert len(running.gpu_indices or ()) == 2
    assert slurm_cluster.job_state(job.handle["slurm_job_id"]) == "FAILED"


async def test_every_poll_of_a_round_shares_one_squeue(backend: SlurmBackend) -> None:
    jobs = [await launched(backend, make_job(["sleep", "30"], gpus=1), at(i)) for i in range(3)]
    before = dict(backend.states.calls)
    statuses = await asyncio.gather(*(backend.poll(j) for j in jobs))
    assert all(s.running for s in statuses)
    assert backend.states.calls["squeue"] == before.get("squeue", 0) + 1


async def test_cancel_signals_the_job_which_gets_its_grace_to_checkpoint(
    backend: SlurmBackend,
) -> None:
    code = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    print('checkpointing', flush=True); time.sleep(0.5); print('saved', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    job = await launched(backend, make_job([sys.executable, "-c", code], gpus=1), at(0))
    await until(backend, job, started)
    await wait_for_async(lambda: backend.read_log(job), lambda log: b"ready" in log)

    await backend.cancel(job, grace_s=10)
    done = await until(backend, job, ended)

    assert done.exit_code == 0
    lines = (await backend.read_log(job)).decode().splitlines()
    # slurmstepd notes the signal in the log too ("*** JOB 7 ON gpu1 CANCELLED AT ... ***")
    ours = [x for x in lines if not x.startswith("slurmstepd")]
    assert ours == ["ready", "checkpointing", "saved"]


@pytest.mark.slow
async def test_a_job_that_ignores_term_is_killed_after_the_grace(backend: SlurmBackend) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    job = await launched(backend, make_job([sys.executable, "-c", code], gpus=1), at(0))
    await until(backend, job, started)
    await asyncio.sleep(0.5)  # past python's start, so the signal is ignored
    await backend.cancel(job, grace_s=1)
    done = await until(backend, job, ended)
    assert done.exit_code == -9


async def test_a_claimed_attempt_never_runs_even_when_its_launch_comes_late(
    backend: SlurmBackend, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    marker = state_dir / "ran"
    job = make_job(["touch", str(marker)], gpus=1)
    assert await backend.claim_launch(job, at(0)) is None

    with pytest.raises(NodeRefusedError, match="stopped before it started"):
        await backend.launch(job, at(0))
    # A launch already past its record check when the claim came: its sbatch still goes out.
    name = commands.job_name(job)
    job_dir = state_dir / "work" / "jobs" / name
    job_dir.mkdir(parents=True)
    env = {"GPUSCHED_LAUNCH_RECORD": backend.records.path(name), "GPUSCHED_JOB_DIR": str(job_dir)}
    (job_dir / "launch.sh").write_text(commands.launch_file_text(["touch", str(marker)], env))
    late = slurm_cluster.sbatch(
        f"--job-name={name}", "--gres=gpu:1", f"--output={job_dir}/output.log",
        f"--chdir={job_dir}", str(state_dir / "gpusched-batch.sh"), str(job_dir / "launch.sh"),
    )  # fmt: skip
    slurm_cluster.wait_job(late, {"FAILED", "COMPLETED"})

    assert not marker.exists()
    assert "not run" in (job_dir / "output.log").read_text()


async def test_a_claim_after_the_launch_returns_the_running_job(backend: SlurmBackend) -> None:
    job = await launched(backend, make_job(["sleep", "30"], gpus=1), at(1))
    claimed = await backend.claim_launch(job, at(1))
    assert claimed is not None and claimed.handle == job.handle


async def test_a_fresh_backend_finds_running_and_finished_jobs_by_their_handles(
    backend: SlurmBackend, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    running = await launched(backend, make_job(["sleep", "30"], gpus=1), at(0))
    finished = await launched(backend, make_job(["sh", "-c", "exit 5"], gpus=1), at(1))
    await until(backend, finished, ended)
    await backend.close()

    fresh = backend_for(slurm_cluster, state_dir)
    await fresh.start()
    assert (await until(fresh, running, started)).running
    assert (await fresh.poll(finished)).exit_code == 5
    await fresh.cancel(running, grace_s=2)
    assert (await until(fresh, running, ended)).exit_code == 128 + 15  # as sh reports it


async def test_the_map_shows_the_nodes_gpus_with_others_slurm_jobs_as_foreign(
    backend: SlurmBackend, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    ours = await launched(backend, make_job(["sleep", "30"], gpus=1), at(0))
    theirs = slurm_cluster.sbatch("--gres=gpu:fake:2", f"--output={state_dir}/x.log",
                                  "--wrap", "sleep 30")  # fmt: skip
    slurm_cluster.wait_job(theirs, {"RUNNING"})
    status = await until(backend, ours, started)

    (node,) = await backend.inventory(refresh=True)
    assert (node.name, node.cpus, node.up, len(node.gpus)) == (NODE, 8.0, True, 4)
    assert {g.model for g in node.gpus} == {"fake"}
    mine = set(status.gpu_indices or ())
    owners = {g.index: [p.job_id for p in g.processes] for g in node.gpus}
    foreign = {i for i, procs in owners.items() if procs == [None]}
    assert {i for i, procs in owners.items() if procs == [ours.id]} == mine
    assert len(foreign) == 2 and not foreign & mine


async def test_owner_mode_runs_the_job_as_its_owner_and_reads_their_private_log(
    slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    from _fixtures_users import ensure_user, root_only_reason

    if root_only_reason():
        pytest.skip(root_only_reason())
    alice = ensure_user("alice")
    fresh = f".gpusched-slurm-test-{state_dir.name}"  # folders this test makes in her home
    workdir = f"~/{fresh}/slurm"
    backend = backend_for(slurm_cluster, state_dir, run_as="owner", workdir=workdir)
    await backend.start()
    await backend.inventory()
    try:
        command = ["sh", "-c", 'id -un; echo "$HOME"; echo "$SECRET"']
        job = make_job(command, gpus=1, user="alice", env={"SECRET": "it's $(id)"})
        job = await launched(backend, job, at(0))
        assert (await until(backend, job, ended)).exit_code == 0
        job_dir = Path(job.handle["job_dir"])
        assert job_dir.is_relative_to(alice.home)
        assert job_dir.stat().st_uid == alice.uid and job_dir.stat().st_mode & 0o777 == 0o700
        # every folder made for her is hers alone, not only the job dir
        top = alice.home / fresh
        made = [top / rel for rel in job_dir.relative_to(top).parents]  # top, slurm, jobs
        modes = {str(p): p.stat().st_mode & 0o777 for p in made}
        assert set(modes.values()) == {0o700}, modes
        said = ["alice", str(alice.home), "it's $(id)"]
        assert (await backend.read_log(job)).decode().splitlines() == said
        local = state_dir / "fetched.log"
        await backend.fetch_file(job, job.handle["log"], str(local))
        assert local.read_text().splitlines() == said
    finally:
        await backend.close()
        slurm_cluster.cancel_all()
        shutil.rmtree(alice.home / fresh, ignore_errors=True)


async def test_a_lease_kernel_is_reached_over_ssh_when_nodes_name_the_slurm_node(
    slurm_cluster: SlurmCluster, state_dir: Path, tmp_path: Path
) -> None:
    from _fixtures_ssh import InProcessSshServer
    from jupyter_client.asynchronous.client import AsyncKernelClient

    from jupyter_gpusched.leases.bridge import KernelBridge, lease_command

    server = InProcessSshServer(tmp_path)
    await server.start()
    backend = SlurmBackend(
        [server.node_config(NODE)],
        clock=SystemClock(),
        state_dir=str(state_dir),
        slurm_conf=str(slurm_cluster.conf),
        workdir=str(state_dir / "work"),
    )
    await backend.start()
    await backend.inventory()
    bridge = KernelBridge(None, backend, connect_timeout_s=60)
    client = None
    try:
        job = make_job(None, kind="lease", gpus=1)  # type: ignore[arg-type]
        argv = lease_command(job, backend.node_config(NODE).python)
        result = await backend.launch(job, at(0), argv=argv)
        job = job.model_copy(update={"placement": at(0), "handle": result.handle})
        status = await until(backend, job, started)

        info, _ = await bridge.connection(job)
        client = AsyncKernelClient()
        client.load_connection_info(info)
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        seen: list[dict[str, Any]] = []
        reply = await client.execute_interactive(
            "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])", timeout=30,
            output_hook=seen.append,
        )  # fmt: skip
        assert reply["content"]["status"] == "ok"
        printed = "".join(m["content"].get("text", "") for m in seen if m["msg_type"] == "stream")
        assert printed.strip() == ",".join(map(str, status.gpu_indices or ()))
        assert all(isinstance(f, ProcessForward) for f in bridge._kernels[job.id].forwards)
    finally:
        if client is not None:
            client.stop_channels()
        await bridge.close()
        await backend.close()
        await server.stop()
        slurm_cluster.cancel_all()
