"""A Jupyter server whose queue hands its work to a real Slurm cluster (loopback, fake GPUs).

One server for the module (``backend_class = SlurmBackend``): a script, a notebook and a
``%%gpu`` cell run through Slurm on the GPUs Slurm gave them; the map shows the Slurm node
and others' Slurm jobs as foreign; cancel; a lease preempts a batch job, which is requeued;
a server restart mid-job finds the job again.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest
from _fixtures_live_server import execute, notebook, text
from _fixtures_polling import Deadline
from _fixtures_server import ServerProcess
from _fixtures_slurm import NODE, SlurmCluster

from jupyter_gpusched.client.api import GpuSchedClient
from jupyter_gpusched.core.api import JobView

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SHOW_GPUS = (
    "import os, time; time.sleep({delay}); print('gpus', os.environ['CUDA_VISIBLE_DEVICES'])"
)


class SlurmServer:
    """The server subprocess and how to (re)start it on the same store and state."""

    def __init__(self, root: Path, cluster: SlurmCluster) -> None:
        self.root = root
        self.cluster = cluster
        self.server: ServerProcess | None = None

    def start(self) -> ServerProcess:
        server = ServerProcess(
            self.root,
            backend_class="jupyter_gpusched.cluster.slurm.SlurmBackend",
            poll_interval_s=0.2,
            inventory_interval_s=1.0,
        )
        path = self.root / "config" / "jupyter_server_config.json"
        config = json.loads(path.read_text())
        config["SlurmBackend"] = {
            "slurm_conf": str(self.cluster.conf),
            "state_dir": str(self.cluster.base / "server-state"),
            "workdir": str(self.cluster.base / "work" / "server"),
            "python": sys.executable,
            "gpu_models": {"fake": "FAKE-16GB"},
        }
        # one window all day: leases may take every GPU and preempt batch jobs for it
        config["GpuSchedPolicy"] = {
            "windows": [
                {"name": "lab", "interactive_reserved_share": 0.0,
                 "interactive_max_share": 1.0, "preempt_batch": True}
            ]
        }  # fmt: skip
        path.write_text(json.dumps(config))
        self.server = server.start()
        return server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    @property
    def client(self) -> GpuSchedClient:
        assert self.server is not None
        return GpuSchedClient(self.server.url, self.server.token)


@pytest.fixture(scope="module")
def slurm_server(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SlurmServer]:
    server = SlurmServer(tmp_path_factory.mktemp("slurm-server"), slurm_cluster)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        slurm_cluster.cancel_all()


@pytest.fixture
def client(slurm_server: SlurmServer) -> Iterator[GpuSchedClient]:
    yield slurm_server.client
    client = slurm_server.client  # a restart gives the server a new port
    for job in client.list_jobs(limit=200).jobs:
        if job.state in ("queued", "starting", "running"):
            client.cancel(job.id)
    slurm_server.cluster.cancel_all()


def wait_for(
    client: GpuSchedClient, job_id: int, done: Callable[[JobView], bool], timeout_s: float = 60
) -> JobView:
    deadline = Deadline(timeout_s)
    while not done(job := client.get_job(job_id)):
        assert not deadline.expired(), f"job {job_id}: {job.state} ({job.reason})"
        time.sleep(0.1)
    return job


def in_state(*states: str) -> Callable[[JobView], bool]:
    return lambda job: job.state in states


def gpus_of(job: JobView) -> str:
    assert job.placement is not None
    return ",".join(map(str, job.placement.gpu_indices))


def test_a_script_runs_through_slurm_on_the_gpus_the_map_shows(
    client: GpuSchedClient, slurm_cluster: SlurmCluster
) -> None:
    job = client.submit(
        kind="script", gpus=2, command=[sys.executable, "-c", SHOW_GPUS.format(delay=2)]
    )
    running = wait_for(client, job.id, in_state("running"))
    slurm_id = running.handle["slurm_job_id"]
    assert slurm_cluster.job_state(slurm_id) in ("PENDING", "RUNNING")

    done = wait_for(client, job.id, in_state("succeeded", "failed"))
    assert done.state == "succeeded", done.reason
    assert client.read_log(job.id)[0].decode().split() == ["gpus", gpus_of(done)]
    assert len(done.placement.gpu_indices) == 2  # type: ignore[union-attr]


def test_the_map_shows_the_slurm_nodes_gpus_ours_and_others(
    client: GpuSchedClient, slurm_cluster: SlurmCluster, slurm_server: SlurmServer
) -> None:
    ours = client.submit(kind="script", gpus=1, command=["sleep", "30"])
    theirs = slurm_cluster.sbatch("--gres=gpu:fake:1", f"--output={slurm_server.root}/x.log",
                                  "--wrap", "sleep 30")  # fmt: skip
    slurm_cluster.wait_job(theirs, {"RUNNING"})
    running = wait_for(client, ours.id, in_state("running"))

    deadline = Deadline(30)
    while True:
        (node,) = client.cluster().nodes
        states = {g.index: g.state for g in node.gpus}
        if "foreign" in states.values() or deadline.expired():
            break
        time.sleep(0.2)
    assert (node.name, node.up, len(node.gpus)) == (NODE, True, 4)
    assert {g.model for g in node.gpus} == {"FAKE-16GB"}
    running = client.get_job(ours.id)
    (mine,) = running.placement.gpu_indices  # type: ignore[union-attr]
    assert states[mine] == "batch"
    assert [g.jobs[0].id for g in node.gpus if g.index == mine] == [ours.id]
    assert list(states.values()).count("foreign") == 1
    assert list(states.values()).count("free") == 2


def test_a_notebook_runs_through_slurm_and_comes_back_executed(
    client: GpuSchedClient, slurm_server: SlurmServer
) -> None:
    nb = notebook(
        "lr = 0.5", "import os\nprint('lr', lr, 'gpus', os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, slurm_server.root / "train.ipynb")

    submitted = client.submit_notebook("train.ipynb", parameters={"lr": 0.1}, gpus=1)
    assert submitted.job is not None
    done = wait_for(client, submitted.job.id, in_state("succeeded", "failed"), timeout_s=90)
    assert done.state == "succeeded", done.reason

    out = wait_for(client, done.id, lambda j: j.outputs is not None)
    assert out.outputs is not None and out.outputs.notebook is not None
    executed = nbformat.read(slurm_server.root / out.outputs.notebook, 4)
    printed = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert printed.split() == ["lr", "0.1", "gpus", gpus_of(done)]


def test_a_gpu_cell_runs_in_a_slurm_job_on_its_lease_gpus(
    client: GpuSchedClient, slurm_server: SlurmServer, tmp_path: Path
) -> None:
    assert slurm_server.server is not None
    nb = notebook(
        "%load_ext jupyter_gpusched",
        "%%gpu --gpus 1\nimport os\nprint('gpus', os.environ['CUDA_VISIBLE_DEVICES'])",
        "%%gpu\nprint('slurm job', os.environ['SLURM_JOB_ID'])",
    )
    execute(nb, slurm_server.server, tmp_path, allow_errors=False)

    (lease,) = client.list_jobs(kind="lease").jobs  # released when the kernel shut down
    assert text(nb.cells[1]).split() == ["gpus", gpus_of(lease)]
    assert text(nb.cells[2]).split() == ["slurm", "job", str(lease.handle["slurm_job_id"])]


def test_cancel_stops_the_slurm_job(client: GpuSchedClient, slurm_cluster: SlurmCluster) -> None:
    job = client.submit(kind="script", gpus=1, command=["sleep", "60"])
    running = wait_for(client, job.id, in_state("running"))
    slurm_id = running.handle["slurm_job_id"]
    slurm_cluster.wait_job(slurm_id, {"RUNNING"})

    cancelled = client.cancel(job.id)
    cancelled = wait_for(client, job.id, in_state("cancelled"))
    assert cancelled.reason and "cancelled by" in cancelled.reason
    slurm_cluster.wait_job(slurm_id, {"CANCELLED", "FAILED", "COMPLETED"}, timeout_s=15)


def test_a_lease_preempts_a_batch_job_which_is_checkpointed_and_requeued(
    client: GpuSchedClient, slurm_cluster: SlurmCluster
) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('checkpoint', flush=True), sys.exit(0)))\n"
        "print('working', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    batch = client.submit(kind="script", gpus=4, command=[sys.executable, "-c", code])
    first = wait_for(client, batch.id, in_state("running"))
    wait_for(client, batch.id, lambda j: b"working" in client.read_log(j.id)[0])

    lease = client.submit(kind="lease", gpus=1)
    granted = wait_for(client, lease.id, in_state("running"), timeout_s=60)
    again = wait_for(client, batch.id, lambda j: j.attempt == 1)

    assert again.state == "queued"
    (previous,) = again.handle["previous"]
    assert previous["slurm_job_id"] == first.handle["slurm_job_id"]
    assert "preempted for interactive work" in previous["stop_reason"]
    assert granted.placement is not None and granted.placement.node == NODE
    slurm_cluster.wait_job(first.handle["slurm_job_id"], {"COMPLETED", "CANCELLED", "FAILED"})
    log = Path(previous["log"]).read_text().splitlines()
    assert [x for x in log if not x.startswith("slurmstepd")] == ["working", "checkpoint"]


def test_a_server_restart_mid_job_finds_the_slurm_job_again(
    client: GpuSchedClient, slurm_server: SlurmServer, slurm_cluster: SlurmCluster
) -> None:
    go = slurm_server.root / "go"
    waiter = [
        sys.executable,
        "-c",
        f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "print('done', flush=True); sys.exit(7)",
    ]
    job = client.submit(kind="script", gpus=1, command=waiter)
    before = wait_for(client, job.id, in_state("running"))
    slurm_server.stop()
    slurm_id = before.handle["slurm_job_id"]
    assert slurm_cluster.job_state(slurm_id) in ("PENDING", "RUNNING")  # Slurm keeps it

    slurm_server.start()
    client = slurm_server.client
    again = client.get_job(job.id)
    assert (again.state, again.handle["slurm_job_id"]) == ("running", slurm_id)
    go.touch()
    done = wait_for(client, job.id, in_state("succeeded", "failed"))
    assert (done.state, done.exit_code) == ("failed", 7)
    assert client.read_log(job.id)[0] == b"done\n"
