"""SshBackend against an in-process asyncssh server running real local processes."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest
import pytest_asyncio
from _fixtures_polling import wait_for_async
from _fixtures_ssh import (
    InProcessSshServer,
    check_a_fresh_backend_reattaches,
    ended,
    fake_gpu_bin,
    gpu_state,
    kill_marked,
    launched,
    script_job,
)

from jupyter_gpusched.cluster.ssh import NodeConfig, SshBackend
from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.errors import BackendError, HostKeyError
from jupyter_gpusched.core.inventory import GpuProcess
from jupyter_gpusched.core.models import Placement

UUIDS = [g["uuid"] for g in gpu_state(4)["gpus"]]


@pytest_asyncio.fixture
async def server(tmp_path: Path) -> AsyncIterator[InProcessSshServer]:
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps(gpu_state(4)))
    srv = InProcessSshServer(
        tmp_path,
        env={
            "GPUSCHED_NVML_MODULE": "jupyter_gpusched.cluster.sim.nvml",
            "GPUSCHED_SIM_STATE": str(state),
        },
    )
    await srv.start()
    yield srv
    kill_marked(srv.token)
    await srv.stop()


@pytest_asyncio.fixture
async def backend(server: InProcessSshServer, clock: ManualClock) -> AsyncIterator[SshBackend]:
    b = SshBackend([server.node_config()], clock=clock)
    yield b
    await b.close()


def on(gpus: list[int], uuids: list[str] | None = None, node: str = "n0") -> Placement:
    return Placement(
        node=node, gpu_indices=gpus, gpu_uuids=[UUIDS[i] for i in gpus] if uuids is None else uuids
    )


@pytest.mark.asyncio
async def test_inventory_comes_from_nvml_on_the_node(
    server: InProcessSshServer, backend: SshBackend, clock: ManualClock, tmp_path: Path
) -> None:
    foreign = [{"gpu_index": 3, "pid": 4_100_003, "mem_mb": 4096, "name": "python"}]
    (tmp_path / "gpus.json").write_text(json.dumps(gpu_state(4, foreign)))
    [node] = await backend.inventory()
    assert node.up and node.error is None and node.probed_at == clock.now()
    assert (node.name, node.cpus, node.mem_gb) == ("n0", 32, 256)
    assert [g.uuid for g in node.gpus] == UUIDS
    assert {g.model for g in node.gpus} == {"A100-80GB"}
    assert [g.nvlink_peers for g in node.gpus] == [(1,), (0,), (3,), (2,)]
    assert node.gpus[3].processes == (GpuProcess(4_100_003, 4096.0, "", job_id=None),)
    assert node.gpus[3].processes[0].foreign
    assert node.gpus[3].mem_used_mb == 4096


@pytest.mark.asyncio
async def test_inventory_falls_back_to_nvidia_smi(tmp_path: Path, clock: ManualClock) -> None:
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps(gpu_state(2)))
    bindir = fake_gpu_bin(tmp_path)
    srv = InProcessSshServer(
        tmp_path, env={"FAKE_NVIDIA_SMI_STATE": str(state), "PATH": f"{bindir}:/usr/bin:/bin"}
    )
    await srv.start()
    backend = SshBackend([srv.node_config()], clock=clock)
    try:
        [node] = await backend.inventory()
    finally:
        await backend.close()
        await srv.stop()
    assert [(g.index, g.uuid, g.model, g.mem_total_mb) for g in node.gpus] == [
        (0, UUIDS[0], "A100-80GB", 81920),
        (1, UUIDS[1], "A100-80GB", 81920),
    ]
    assert [g.nvlink_peers for g in node.gpus] == [(1,), (0,)]


@pytest.mark.asyncio
async def test_inventory_is_reprobed_after_the_interval_or_on_demand(
    backend: SshBackend, clock: ManualClock, tmp_path: Path
) -> None:
    first = await backend.inventory()
    someone = [{"gpu_index": 0, "pid": 4_100_004, "mem_mb": 100, "name": "x"}]
    (tmp_path / "gpus.json").write_text(json.dumps(gpu_state(4, someone)))
    cached = await backend.inventory()
    clock.advance(backend.inventory_interval_s)
    later = await backend.inventory()
    (tmp_path / "gpus.json").write_text(json.dumps(gpu_state(4)))
    forced = await backend.inventory(refresh=True)
    assert cached == first and first[0].gpus[0].processes == ()
    assert [p.pid for p in later[0].gpus[0].processes] == [4_100_004]
    assert forced[0].gpus[0].processes == ()


@pytest.mark.asyncio
async def test_launch_stages_files_sets_gpus_and_env_and_keeps_argv_literal(
    backend: SshBackend, clock: ManualClock, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUSCHED_JOB_ID'],"
        " os.environ['LR'])\n"
        "print(sys.argv[1:])\n"
        "print(os.path.basename(os.getcwd()))\n"
        "sys.exit(4)\n"
    )
    job = script_job(
        12,
        [sys.executable, "train.py", "a b", "$(id); rm -rf x"],
        clock,
        files=[str(script)],
        env={"LR": "0.1"},
    )
    job = await launched(backend, job, on([1, 2]))
    status = await ended(backend, job)
    log = (await backend.read_log(job)).decode().splitlines()
    assert status.exit_code == 4 and not status.lost and status.ended_at is not None
    assert log == [
        f"{UUIDS[1]},{UUIDS[2]} 12 0.1",
        "['a b', '$(id); rm -rf x']",
        Path(job.handle["job_dir"]).name,
    ]
    assert set(job.handle) == {"node", "pid", "pgid", "start_time", "job_dir", "log"}
    assert (
        await backend.read_log(job, offset=len(UUIDS[1]) + 1, limit=len(UUIDS[2]))
        == UUIDS[2].encode()
    )


@pytest.mark.asyncio
async def test_gpus_are_named_by_index_when_no_uuid_is_known(
    backend: SshBackend, clock: ManualClock
) -> None:
    cmd = ["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"']
    bare = await launched(backend, script_job(1, cmd, clock), on([0, 3], uuids=[]))
    await ended(backend, bare)
    await backend.inventory()  # now the backend knows the UUIDs itself
    known = await launched(backend, script_job(2, cmd, clock), on([0, 3], uuids=[]))
    await ended(backend, known)
    assert await backend.read_log(bare) == b"0,3\n"
    assert await backend.read_log(known) == f"{UUIDS[0]},{UUIDS[3]}\n".encode()


@pytest.mark.asyncio
async def test_follow_log_streams_until_the_job_ends(
    backend: SshBackend, clock: ManualClock, tmp_path: Path
) -> None:
    # The job writes its later lines only once the follower has its first one: a slow machine
    # cannot let the job end before the follow starts and so hand over all of it at once.
    go = tmp_path / "go"
    script = (
        f"echo line 1; while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.02; done; "
        "echo line 2; sleep 0.2; echo line 3"
    )
    job = await launched(backend, script_job(3, ["sh", "-c", script], clock), on([0]))
    chunks = []
    async for chunk in backend.follow_log(job):
        chunks.append(chunk)
        go.touch()
    assert b"".join(chunks) == b"line 1\nline 2\nline 3\n"
    assert len(chunks) >= 2  # it streamed, not one read at the end
    assert (await backend.poll(job)).exit_code == 0


@pytest.mark.asyncio
async def test_cancel_terminates_the_whole_process_group(
    backend: SshBackend, clock: ManualClock
) -> None:
    job = await launched(
        backend, script_job(4, ["sh", "-c", "sleep 60 & sleep 60 & wait"], clock), on([0])
    )
    assert (await backend.poll(job)).running
    await backend.cancel(job, grace_s=5)
    status = await backend.poll(job)
    assert (status.running, status.exit_code) == (False, -15)


@pytest.mark.asyncio
async def test_launching_the_same_attempt_twice_starts_it_once(
    backend: SshBackend, clock: ManualClock
) -> None:
    job = script_job(5, ["sleep", "60"], clock)
    first = await backend.launch(job, on([0]))
    second = await backend.launch(job, on([0]))
    retry = await backend.launch(job.model_copy(update={"attempt": 1}), on([0]))
    for handle in (first.handle, retry.handle):
        await backend.cancel(job.model_copy(update={"handle": handle}), grace_s=1)
    assert second.handle == first.handle
    assert retry.handle["pid"] != first.handle["pid"]


@pytest.mark.asyncio
async def test_an_unknown_host_key_is_refused_naming_host_and_file(
    server: InProcessSshServer, clock: ManualClock, tmp_path: Path
) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh")
    known_hosts = tmp_path / "other_known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{server.port} {impostor.decode()}")
    backend = SshBackend([server.node_config(known_hosts=str(known_hosts))], clock=clock)
    with pytest.raises(HostKeyError) as info:
        await backend.run("n0", ["true"])
    [node] = await backend.inventory()
    assert f"127.0.0.1:{server.port}" in info.value.message
    assert str(known_hosts) in info.value.message
    assert not node.up or node.error is not None
    assert "host key" in (node.error or "")


@pytest.mark.asyncio
async def test_a_missing_known_hosts_file_is_an_error_not_a_free_pass(
    server: InProcessSshServer, clock: ManualClock, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere" / "known_hosts"
    backend = SshBackend([server.node_config(known_hosts=str(missing))], clock=clock)
    with pytest.raises(HostKeyError, match="does not exist"):
        await backend.run("n0", ["true"])


@pytest.mark.asyncio
async def test_a_fresh_backend_finds_running_and_finished_jobs(
    server: InProcessSshServer, backend: SshBackend, clock: ManualClock
) -> None:
    await check_a_fresh_backend_reattaches(
        backend, server.node_config(), clock, 6, (on([0]), on([1]))
    )


@pytest.mark.asyncio
async def test_a_dropped_node_is_lost_then_down_then_reconciled(
    server: InProcessSshServer, backend: SshBackend, clock: ManualClock
) -> None:
    job = await launched(backend, script_job(8, ["sleep", "60"], clock), on([0]))
    await backend.inventory()
    await server.stop()

    first = await backend.poll(job)  # the connection is gone; reconnecting is refused
    during_backoff = await backend.poll(job)  # no new attempt until the backoff passes
    assert (
        first.lost
        and during_backoff.lost
        and "next connection attempt" in str(during_backoff.detail)
    )
    assert not backend.node_down("n0")
    clock.advance(1)
    assert (await backend.poll(job)).lost
    clock.advance(2)
    assert (await backend.poll(job)).lost
    assert backend.node_down("n0")
    [down] = await backend.inventory(refresh=True)
    assert not down.up and down.error and len(down.gpus) == 4

    await server.start()  # back on the same port
    assert (await backend.poll(job)).lost  # still waiting out the backoff (4 s)
    clock.advance(4)
    assert (await backend.poll(job)).running
    assert not backend.node_down("n0")
    [back] = await backend.inventory(refresh=True)
    assert back.up and back.error is None
    await backend.cancel(job, grace_s=1)


@pytest.mark.asyncio
async def test_poll_without_a_launch_record_is_lost(
    backend: SshBackend, clock: ManualClock
) -> None:
    status = await backend.poll(script_job(9, ["true"], clock))
    assert status.lost and "no launch record" in str(status.detail)


@pytest.mark.asyncio
async def test_run_quotes_every_argument(backend: SshBackend) -> None:
    result = await backend.run("n0", ["printf", "%s\\n", "a b", "$(id)", "x;y", "'q'"])
    assert result == (0, "a b\n$(id)\nx;y\n'q'\n", "")


@pytest.mark.asyncio
async def test_run_with_check_raises_with_the_end_of_stderr(backend: SshBackend) -> None:
    with pytest.raises(BackendError, match="exited with 3: boom"):
        await backend.run("n0", ["sh", "-c", "echo boom >&2; exit 3"], check=True)


@pytest.mark.asyncio
async def test_concurrent_channels_per_node_are_bounded(
    server: InProcessSshServer, clock: ManualClock
) -> None:
    backend = SshBackend([server.node_config(max_channels=2)], clock=clock)
    try:
        results = await asyncio.gather(*(backend.run("n0", ["sleep", "0.1"]) for _ in range(8)))
    finally:
        await backend.close()
    assert [r.exit_status for r in results] == [0] * 8
    assert server.max_sessions_seen == 2


async def pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A kernel port stand-in: answers one line with ``pong:`` and that line."""
    writer.write(b"pong:" + await reader.readline())
    await writer.drain()
    writer.close()


@pytest.mark.asyncio
async def test_a_local_port_is_forwarded_to_the_node(backend: SshBackend) -> None:
    kernel_port = await asyncio.start_server(pong, "127.0.0.1", 0)
    remote_port = kernel_port.sockets[0].getsockname()[1]
    (forward,) = await backend.forward_local_ports("n0", [("127.0.0.1", remote_port, 0)])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", forward.local_port)
        writer.write(b"ping\n")
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
    finally:
        forward.close()
        await forward.wait_closed()
        kernel_port.close()
        await kernel_port.wait_closed()
    assert forward.local_port != remote_port
    assert answer == b"pong:ping\n"


@pytest.mark.asyncio
async def test_forwards_run_in_their_own_process_end_with_a_dropped_node_and_come_back(
    server: InProcessSshServer, backend: SshBackend
) -> None:
    async def ping(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping\n")
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
        return answer

    service = await asyncio.start_server(pong, "127.0.0.1", 0)
    port = service.sockets[0].getsockname()[1]
    first = await backend.forward_local_ports(
        "n0", [("127.0.0.1", port, 0), ("127.0.0.1", port, 0)]
    )
    try:
        # The bytes are relayed by a child process: nothing of the forward is on this loop.
        assert len(server.conns) == 2  # the pool's connection and the forwarder's own
        assert [await ping(f.local_port) for f in first] == [b"pong:ping\n"] * 2
        await server.stop()
        async with asyncio.timeout(30):
            await first[0].wait_closed()
        await server.start()
        again = await backend.forward_local_ports(
            "n0", [("127.0.0.1", port, f.local_port) for f in first]
        )
        assert [f.local_port for f in again] == [f.local_port for f in first]
        assert await ping(again[1].local_port) == b"pong:ping\n"
        again[0].close()
        async with asyncio.timeout(10):
            await again[1].wait_closed()  # they live and end together
    finally:
        for f in first:
            f.close()
        service.close()
        await service.wait_closed()


@pytest.mark.asyncio
async def test_files_go_up_and_come_back_by_sftp(
    server: InProcessSshServer, backend: SshBackend, tmp_path: Path
) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"payload\n")
    await backend.put_file("n0", str(source), "~/staged/deeper/in.txt")
    await backend.get_file("n0", "~/staged/deeper/in.txt", str(tmp_path / "out.txt"))
    assert (server.home / "staged" / "deeper" / "in.txt").read_bytes() == b"payload\n"
    assert (tmp_path / "out.txt").read_bytes() == b"payload\n"


@pytest.mark.asyncio
async def test_an_unknown_node_is_a_clear_error(backend: SshBackend) -> None:
    with pytest.raises(BackendError, match="unknown node 'nope'"):
        await backend.run("nope", ["true"])


def followers_of(log_path: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if b"--follow" in cmdline and log_path.encode() in cmdline and state != "Z":
                pids.append(int(entry))
    return pids


@pytest.mark.asyncio
async def test_a_follower_that_stops_reading_ends_on_the_node(
    backend: SshBackend, clock: ManualClock
) -> None:
    job = await launched(
        backend,
        script_job(10, ["sh", "-c", "while :; do echo tick; sleep 0.1; done"], clock),
        on([0]),
    )
    stream = backend.follow_log(job)
    first = await stream.__anext__()
    assert followers_of(job.handle["log"])
    await stream.aclose()
    remaining = await wait_for_async(
        lambda: followers_of(job.handle["log"]), lambda followers: not followers, timeout_s=5
    )
    await backend.cancel(job, grace_s=1)
    assert first.startswith(b"tick\n") and remaining == []


def test_node_config_rejects_an_unknown_staging_mode() -> None:
    with pytest.raises(ValueError, match="staging must be 'sftp' or 'shared'"):
        NodeConfig(name="x", host="h", staging="nfs")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_follow_cut_by_a_dropped_connection_raises_instead_of_ending_quietly(
    server: InProcessSshServer, backend: SshBackend, clock: ManualClock
) -> None:
    job = await launched(
        backend,
        script_job(11, ["sh", "-c", "while :; do echo tick; sleep 0.1; done"], clock),
        on([0]),
    )
    stream = backend.follow_log(job)
    await stream.__anext__()
    await server.stop()
    with pytest.raises(BackendError, match="connection lost"):
        async for _ in stream:
            pass
    await server.start()
    clock.advance(60)
    await backend.cancel(job, grace_s=1)


@pytest.mark.asyncio
async def test_a_recycled_pid_is_not_mistaken_for_the_job(
    backend: SshBackend, clock: ManualClock
) -> None:
    job = await launched(backend, script_job(13, ["sleep", "60"], clock), on([0]))
    recycled = job.model_copy(
        update={"handle": {**job.handle, "start_time": job.handle["start_time"] - 1}}
    )
    mistaken = await backend.poll(recycled)
    genuine = await backend.poll(job)
    await backend.cancel(job, grace_s=1)
    assert genuine.running
    assert mistaken.lost and mistaken.gone and "without an exit record" in str(mistaken.detail)


@pytest.mark.asyncio
async def test_one_drop_counts_once_however_many_polls_saw_it(
    server: InProcessSshServer, backend: SshBackend, clock: ManualClock
) -> None:
    jobs = [
        await launched(backend, script_job(30 + i, ["sleep", "60"], clock), on([i]))
        for i in range(4)
    ]
    await server.stop()
    statuses = await asyncio.gather(*(backend.poll(j) for j in jobs))
    await server.start()
    clock.advance(60)
    for job in jobs:
        await backend.cancel(job, grace_s=1)
    assert all(s.lost for s in statuses)
    assert not backend.node_down("n0")


@pytest.mark.asyncio
async def test_a_local_port_is_forwarded_to_a_unix_socket_on_the_node(
    backend: SshBackend, tmp_path: Path
) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ipc:" + await reader.readline())
        await writer.drain()
        writer.close()

    path = str(tmp_path / "kernel.sock")
    service = await asyncio.start_unix_server(echo, path)
    forward = await backend.forward_local_port_to_path("n0", path)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", forward.local_port)
        writer.write(b"hello\n")
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
    finally:
        forward.close()
        await forward.wait_closed()
        service.close()
        await service.wait_closed()
    assert answer == b"ipc:hello\n"


@pytest.mark.asyncio
async def test_shared_staging_uploads_nothing_and_runs_in_the_given_workdir(
    server: InProcessSshServer, clock: ManualClock, tmp_path: Path
) -> None:
    shared = tmp_path / "project"
    shared.mkdir()
    (shared / "data.txt").write_text("on the shared filesystem\n")
    backend = SshBackend([server.node_config(staging="shared")], clock=clock)
    try:
        job = await launched(
            backend,
            script_job(
                14,
                ["cat", "data.txt"],
                clock,
                files=[str(shared / "data.txt")],
                workdir=str(shared),
            ),
            on([0]),
        )
        status = await ended(backend, job)
        log = await backend.read_log(job)
    finally:
        await backend.close()
    assert status.exit_code == 0 and log == b"on the shared filesystem\n"
    assert not (Path(job.handle["job_dir"]) / "data.txt").exists()


def serving_agents(token: str) -> list[int]:
    """Pids of the serving agents this test's server started (marked with its token).

    Job wrappers are forks of the agent that launched them, with its command line; they read
    /dev/null, a serving agent reads its channel.
    """
    pids = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            stdin = os.readlink(f"/proc/{entry}/fd/0")
        except (OSError, ValueError):
            continue
        if (
            b"jupyter_gpusched.node.agent" in cmdline
            and b"serve" in cmdline
            and (stdin != os.devnull)
        ):
            if f"GPUSCHED_TEST_RUN={token}".encode() in environ:
                pids.append(int(entry))
    return pids


def agent_starts(server: InProcessSshServer, subcommand: str) -> int:
    return sum(f"node.agent {subcommand}" in line for line in server.commands)


@pytest.mark.asyncio
async def test_launches_go_through_one_serving_agent_which_is_replaced_when_killed(
    server: InProcessSshServer, backend: SshBackend, clock: ManualClock
) -> None:
    jobs = [await launched(backend, script_job(i, ["sleep", "60"], clock), on([i])) for i in (1, 2)]
    assert agent_starts(server, "serve") == 1 and agent_starts(server, "launch") == 0
    [pid] = serving_agents(server.token)

    os.kill(pid, 9)  # the agent dies between two launches: the next launch starts another
    await wait_for_async(lambda: asyncio.sleep(0.05), lambda _: pid not in serving_agents(
        server.token), what="the serving agent to die")  # fmt: skip
    third = await launched(backend, script_job(3, ["sleep", "60"], clock), on([3]))
    assert agent_starts(server, "serve") == 2 and len(serving_agents(server.token)) == 1
    for job in (*jobs, third):
        assert (await backend.poll(job)).running
        await backend.cancel(job, grace_s=1)


@pytest.mark.asyncio
async def test_a_node_whose_agent_does_not_serve_gets_a_fresh_agent_per_launch(
    server: InProcessSshServer, clock: ManualClock, tmp_path: Path
) -> None:
    older = tmp_path / "older-agent"  # an install from before ``serve``: argparse refuses it
    older.write_text(
        '#!/bin/sh\nif [ "$1" = serve ]; then echo "invalid choice: serve" >&2; exit 2; fi\n'
        f'exec {sys.executable} -m jupyter_gpusched.node.agent "$@"\n'
    )
    older.chmod(0o755)
    backend = SshBackend([server.node_config(agent_cmd=(str(older),))], clock=clock)
    try:
        for i in (1, 2):
            job = await launched(backend, script_job(i, ["true"], clock), on([i]))
            assert (await ended(backend, job)).exit_code == 0
    finally:
        await backend.close()
    assert sum(" serve" in line for line in server.commands) == 1
    assert sum(" launch " in line for line in server.commands) == 2
