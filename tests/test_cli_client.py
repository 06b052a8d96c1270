"""``jupyter gpusched submit|queue|cancel|logs|nodes`` and the client against a live server."""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _fixtures_polling import wait_for
from _fixtures_server import FAR_FUTURE

from jupyter_gpusched.cli import app as cli
from jupyter_gpusched.cli.formats import format_cluster, format_queue
from jupyter_gpusched.client.api import ApiError, GpuSchedClient, find_server
from jupyter_gpusched.core.api import Cluster, EventMessage, JobView


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One server for the module (each test cleans up the jobs it leaves running)."""
    from _fixtures_server import ServerProcess

    server = ServerProcess(tmp_path_factory.mktemp("cli")).start()
    yield server
    server.stop()


@pytest.fixture
def discovered(module_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CLI sees the server only through the running-server files, as `jupyter server list`."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", module_server.env["JUPYTER_RUNTIME_DIR"])
    monkeypatch.delenv("GPUSCHED_URL", raising=False)
    monkeypatch.delenv("GPUSCHED_TOKEN", raising=False)
    return module_server


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def wait_state(client: GpuSchedClient, job_id: int, *states: str) -> JobView:
    return wait_for(
        lambda: client.get_job(job_id),
        lambda job: job.state in states,
        what=f"job {job_id} to be {states}",
    )


def sockets_to(port: int) -> list[socket.socket]:
    """Open client sockets of this process to ``port`` on the loopback."""

    def peer_port(sock: socket.socket) -> int | None:
        try:
            return int(sock.getpeername()[1])
        except OSError:
            return None

    return [
        o
        for o in gc.get_objects()
        if isinstance(o, socket.socket)
        and o.fileno() != -1
        and o.family == socket.AF_INET
        and peer_port(o) == port
    ]


def test_submit_queue_logs_and_cancel_through_the_discovered_server(
    discovered: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys,
        "submit",
        "--gpus",
        "2",
        "--gpu-mem",
        "16G",
        "--name",
        "hello",
        "--",
        sys.executable,
        "-c",
        "print('hi from job')",
    )
    assert (code, err) == (0, "")
    assert out.startswith("submitted job ") and "(queued" in out
    ran = out.split()[2]
    client = GpuSchedClient(discovered.url, discovered.token)
    job = wait_state(client, int(ran), "succeeded")
    assert job.spec.gpus == 2 and job.spec.gpu_mem_gb == 16
    assert job.spec.command is not None
    assert job.spec.command[1:] == ["-c", "print('hi from job')"]

    assert run(capsys, "logs", ran) == (0, "hi from job\n", "")
    assert run(capsys, "logs", ran, "-f") == (0, "hi from job\n", "")

    code, out, _ = run(capsys, "submit", "--at", FAR_FUTURE, "--", "true")
    waits = out.split()[2]
    # the scheduling pass that says why it waits runs just after the submit answers
    wait_for(lambda: client.get_job(int(waits)).reason, what="a reason for the waiting job")
    code, out, _ = run(capsys, "queue")
    table, _, below = out.partition("\n\nwaiting:\n")
    header, *rows = table.splitlines()
    assert header.split()[:4] == ["ID", "USER", "KIND", "STATE"]
    assert [r.split()[:4][::3] for r in rows] == [[waits, "queued"]]
    assert below.startswith(f"  job {waits}, starts in ") and ": not before " in below
    code, out, _ = run(capsys, "queue", "--all")
    table = out.partition("\n\n")[0]
    assert {ran, waits} <= {r.split()[0] for r in table.splitlines()[1:]}

    assert run(capsys, "cancel", waits) == (0, f"job {waits} cancelled\n", "")
    code, out, err = run(capsys, "cancel", waits)
    assert code == 1 and out == ""
    assert err.startswith(f"jupyter gpusched cancel: job {waits} already cancelled")
    assert err.count("\n") == 1


def test_submit_array_runs_each_task_with_its_index_then_queue_and_cancel_by_array(
    discovered: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys,
        "submit",
        "--array",
        "3",
        "--gpus",
        "0",
        "--",
        sys.executable,
        "-c",
        "import os; print('task', os.environ['GPUSCHED_ARRAY_INDEX'])",
    )
    assert (code, err) == (0, "")
    array_id = int(out.split()[2].rstrip(":"))
    assert out.startswith(f"submitted array {array_id}: 3 tasks {array_id}_[0-2] (queued;")
    client = GpuSchedClient(discovered.url, discovered.token)
    tasks = wait_for(
        lambda: client.list_jobs(array=array_id).jobs,
        lambda jobs: len(jobs) == 3,
        what="the array's tasks to be made jobs",
    )
    for job in tasks:
        assert wait_state(client, job.id, "succeeded", "failed").state == "succeeded"
    for i in range(3):
        code, out, err = run(capsys, "logs", f"{array_id}_{i}")
        assert (code, out, err) == (0, f"task {i}\n", "")

    code, out, _ = run(capsys, "submit", "--array", "5", "--at", FAR_FUTURE, "--", "true")
    waits = int(out.split()[2].rstrip(":"))
    code, out, _ = run(capsys, "queue", "--array", str(waits))
    table = out.partition("\n\nwaiting:")[0]  # the rows; why each waits comes below
    first, pending = (r.split() for r in table.splitlines()[1:])
    assert first[:2] == [str(waits), f"({waits}_0)"]
    assert pending[0] == f"{waits}_[1-4]" and "pending" in pending  # one line for the rest
    code, out, err = run(capsys, "logs", f"{waits}_3")
    assert (code, out) == (1, "")
    assert err == (
        f"jupyter gpusched logs: task {waits}_3 has not started: it waits with its array's "
        "pending tasks (2 of them before it); it becomes a job when the scheduler can place it\n"
    )
    code, out, _ = run(capsys, "cancel", f"{waits}_2")
    assert (code, out) == (0, f"task {waits}_2 was cancelled before it started\n")
    code, out, _ = run(capsys, "queue", "--array", str(waits))
    assert f"{waits}_[1,3-4]" in out
    assert run(capsys, "cancel", "--array", str(waits)) == (
        0,
        f"array {waits}: 3 pending tasks cancelled, 1 jobs cancelled\n",
        "",
    )
    assert client.get_job(waits).state == "cancelled"
    assert run(capsys, "cancel", "--array", str(waits)) == (
        0,
        f"array {waits}: 0 pending tasks cancelled, 0 jobs cancelled\n",
        "",
    )


def test_nodes_prints_a_line_per_node_and_a_glyph_per_gpu(
    discovered: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client = GpuSchedClient(discovered.url, discovered.token)
    job = client.submit(kind="script", command=["sleep", "30"], gpus=2, gpu_models=["T4"])
    wait_state(client, job.id, "running")
    code, out, _ = run(capsys, "nodes")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["g0", "A100-80GB", "[....]", "4/4", "free", "up"]
    assert lines[1].split() == ["g1", "T4", "[BB]", "0/2", "free", "up"]
    assert "legend" in lines[2] and "1 running" in lines[3]
    client.cancel(job.id)


def test_the_queue_says_where_each_waiting_job_stands_when_it_starts_and_why() -> None:
    now = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)

    def job(job_id: int, **over: Any) -> JobView:
        base = {
            "id": job_id,
            "state": "queued",
            "user": "alice",
            "priority_class": "batch",
            "submitted_at": now - timedelta(minutes=3),
            "spec": {"kind": "script", "command": ["python", "train.py"], "gpus": 8, "user": "a"},
        }
        return JobView.model_validate({**base, **over})

    jobs = [
        job(
            10,
            position=1,
            estimated_start=now + timedelta(minutes=12, seconds=5),
            reason="waiting: needs 8 GPUs free on one node; the most now is 5 on a100-1",
        ),
        job(11, held=True, reason="waiting: held by its owner"),
        job(
            12,
            state="failed",
            exit_code=2,
            spec={"kind": "script", "command": ["x"], "gpus": 1, "gpu_share": 0.5, "user": "a"},
        ),
    ]
    table, _, below = format_queue(jobs, now=now, tz=UTC).partition("\n\nwaiting:\n")
    rows = [r.split() for r in table.splitlines()[1:]]
    assert rows[0] == ["10", "alice", "script", "queued", "8", "GPUs", "3m", "python", "train.py",
                       "1st", "in", "line"]  # fmt: skip
    assert (
        rows[1][-1] == "held" and rows[2][4:6] == ["0.5", "GPU"] and rows[2][-2:] == ["exit", "2"]
    )
    assert below.splitlines() == [
        "  job 10, 1st in line, starts in 12m (09:12): needs 8 GPUs free on one node; the most "
        "now is 5 on a100-1",
        "  job 11, starts unknown: held by its owner",
    ]


def test_format_cluster_marks_shared_down_and_foreign_gpus() -> None:
    def gpu(state: str, share: float = 0.0) -> dict:
        return {
            "index": 0,
            "uuid": "u",
            "model": "T4",
            "mem_total_gb": 16.0,
            "mem_used_gb": 0.0,
            "util_pct": 0.0,
            "state": state,
            "share_used": share,
            "nvlink_peers": [],
            "jobs": [],
        }

    def node(name: str, up: bool, gpus: list[dict], error: str | None = None) -> dict:
        return {"name": name, "up": up, "error": error, "cpus": 8, "mem_gb": 64, "gpus": gpus}

    cluster = Cluster.model_validate(
        {
            "nodes": [
                node(
                    "n0",
                    True,
                    [gpu("interactive", 0.5), gpu("batch", 1.0), gpu("foreign"), gpu("free")],
                ),
                node("n1", False, [gpu("down")], "unreachable"),
            ],
            "metrics": {
                "allocated_share": 0.5,
                "unallocated_share": 0.5,
                "free_nodes_by_size": {},
                "gpus_free": 1,
                "gpus_total": 5,
                "largest_placeable_gpus": 1,
                "frag_ratio": 0.25,
            },
            "queue": {"queued": 3, "running": 2},
            "window": {
                "name": "day",
                "applies": "Mon-Fri 08:00-20:00",
                "since": "2026-11-23T08:00:00+00:00",
                "until": "2026-11-23T20:00:00+00:00",
                "next_window": "night",
                "interactive_reserved_share": 0.25,
                "interactive_max_share": 0.75,
                "batch_max_runtime_s": 14400,
                "lease_idle_timeout_s": 1800,
                "preempt_batch": True,
                "migrate_batch": False,
                "interactive_first": True,
                "rules": ["interactive at most 75%", "batch stopped after 4h"],
            },
            "at": "2026-11-23T10:00:00+00:00",
        }
    )
    lines = format_cluster(cluster, tz=UTC).splitlines()
    assert lines[0].split() == ["n0", "T4", "[iBF.]", "1/4", "free", "up"]
    assert lines[1].split() == ["n1", "T4", "[x]", "0/1", "free", "DOWN", "unreachable"]
    assert lines[3] == "gpus: 1/5 free; queue: 3 waiting, 2 running"
    assert lines[4] == (
        "fragmentation: largest job that fits now: 1 GPU; 0 GPUs stranded in partly used GPUs; "
        "25% of the free capacity fits no usual job size (lower is better)"
    )
    assert lines[5] == "window: day window until 20:00, then night (Mon-Fri 08:00-20:00)"
    assert lines[6:] == ["  - interactive at most 75%", "  - batch stopped after 4h"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "--gpus", "2"], "give the command to run after --"),
        (["submit", "--gpus", "two", "--", "x"], "argument --gpus: 'two' is not a whole number"),
        (["submit", "--mem", "lots", "--", "x"], "write it like 16G"),
        (["submit", "--env", "NOVALUE", "--", "x"], "NAME=VALUE"),
        (["logs"], "required"),
        (["cancel", "x"], "'x' is neither a job id nor an array task like 123_7"),
        (["queue", "extra"], "unrecognized arguments: extra"),
        (["submit", "--array", "0", "--", "x"], "--array: from 1 to 10000000 tasks, got 0"),
        (["submit", "--array", "-2", "--", "x"], "argument --array: must be 0 or more"),
        (["cancel"], "the following arguments are required: ID"),
        (["frobnicate"], "unknown command 'frobnicate'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_before_any_server_is_asked(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert message in err and err.count("\n") == 1


def test_api_and_connection_errors_exit_1_with_one_line(
    discovered: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "submit", "--gpus", "64", "--", "x")
    assert code == 1 and "never fit" in err and err.count("\n") == 1
    code, _, err = run(capsys, "logs", "999")
    assert code == 1 and "job 999" in err
    code, _, err = run(capsys, "queue", "--url", discovered.url, "--token", "wrong")
    assert code == 1 and "token" in err
    code, _, err = run(capsys, "nodes", "--url", "http://127.0.0.1:9/")
    assert code == 1 and "cannot reach http://127.0.0.1:9/" in err
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(discovered.root / "empty"))
    code, _, err = run(capsys, "queue")
    assert code == 1 and "no running Jupyter server with jupyter-gpusched found" in err


def test_environment_names_the_server_before_discovery(
    discovered: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSCHED_URL", "http://127.0.0.1:9/base")
    monkeypatch.setenv("GPUSCHED_TOKEN", "from-env")
    info = find_server()
    assert (info.url, info.token) == ("http://127.0.0.1:9/base/", "from-env")
    assert find_server("http://h:1", "t").url == "http://h:1/"
    monkeypatch.delenv("GPUSCHED_URL")
    assert find_server() == find_server(discovered.url, discovered.token)


def test_client_covers_every_route(discovered: Any) -> None:
    client = GpuSchedClient.discover()
    job = client.submit({"kind": "script", "command": ["true"]}, not_before=FAR_FUTURE)
    mine = client.list_jobs(state=["queued"], user="me").jobs
    assert [j.id for j in mine] == [job.id]
    changed = client.update(job.id, held=True, priority="interactive")
    assert changed.held is True and changed.priority_class == "interactive"
    assert client.leases() == [] and client.leases(user="me") == []
    assert client.cluster().metrics.gpus_total == 6
    assert client.policy(at="2026-11-24T03:00:00+00:00").window.name == "night"
    assert client.cancel(job.id).state == "cancelled"
    with pytest.raises(ApiError) as err:
        client.release(job.id)
    assert (err.value.status, err.value.error) == (404, "NotFoundError")

    done = client.submit(kind="script", command=[sys.executable, "-c", "print('x' * 3)"])
    assert client.wait(done.id, timeout_s=30).state == "succeeded"
    assert client.read_log(done.id, offset=1) == (b"xx\n", 4)
    assert b"".join(client.follow_log(done.id)) == b"xxx\n"

    async def events_of_job() -> list[EventMessage]:
        seen = []
        async for event in client.events(after=0):
            if event.job_id == job.id:
                seen.append(event)
            if event.to_state == "cancelled" and event.job_id == job.id:
                return seen
        raise AssertionError("the events websocket closed")

    kept = sockets_to(discovered.port)  # the calls above share one kept-alive connection
    assert len(kept) == 1
    events = asyncio.run(asyncio.wait_for(events_of_job(), 30))
    assert events[0].kind == "submitted" and events[0].job and events[0].job.id == job.id
    assert sockets_to(discovered.port) == kept, "the events websocket outlived its loop"
    assert [e.id for e in events] == sorted(e.id or 0 for e in events)


def test_the_command_imports_no_server_side_package_and_takes_trait_options(
    discovered: Any,
) -> None:
    import json
    import subprocess

    code = (
        "import sys\n"
        "from jupyter_gpusched.cli.app import main\n"
        "code = main(['queue', '--QueueApp.limit=1', '--json'])\n"
        "heavy = {'jupyter_server', 'tornado', 'sqlalchemy', 'IPython', 'asyncssh', 'numpy'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}), code, file=sys.stderr)\n"
    )
    env = {**discovered.env, "GPUSCHED_URL": discovered.url, "GPUSCHED_TOKEN": discovered.token}
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert ran.stderr.strip() == "[] 0"
    assert json.loads(ran.stdout)["limit"] == 1


def test_queue_finds_the_server_from_the_runtime_dir_without_importing_jupyter_server(
    discovered: Any,
) -> None:
    import subprocess

    code = (
        "import sys\n"
        "from jupyter_gpusched.cli.app import main\n"
        "code = main(['queue'])\n"
        "server_side = {'jupyter_server', 'tornado', 'sqlalchemy', 'jupyter_client', 'zmq'}\n"
        "print(sorted(server_side & {m.split('.')[0] for m in sys.modules}), code, "
        "file=sys.stderr)\n"
    )
    env = {k: v for k, v in discovered.env.items() if not k.startswith("GPUSCHED_")}
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert ran.stderr.strip() == "[] 0"
    assert ran.stdout.startswith(("ID ", "no jobs"))


def test_a_config_file_sets_a_commands_options(
    discovered: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "jupyter_gpusched_config.py").write_text(
        "c.QueueApp.limit = 1\nc.QueueApp.all = True\n"
    )
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    client = GpuSchedClient(discovered.url, discovered.token)
    for _ in range(2):
        client.cancel(client.submit(kind="script", command=["true"], not_before=FAR_FUTURE).id)
    code, out, _ = run(capsys, "queue")
    assert code == 0 and out.splitlines()[-1].startswith("... ") and len(out.splitlines()) == 3
