"""The embedded simulated cluster: real SSH servers on loopback running real local processes."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncssh
import pytest
import pytest_asyncio
from _fixtures_polling import wait_for_async

from jupyter_gpusched.cluster.sim.cluster import SimCluster
from jupyter_gpusched.cluster.sim.specs import DEFAULT_SIM_NODES, SimNodeSpec, gpu_state
from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.errors import InvalidSpecError, NotFoundError
from jupyter_gpusched.core.models import Job, JobKind, JobSpec, Placement

# A node that echoes one TCP connection / one unix-socket connection, printing where it listens.
TCP_ECHO = """
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.sendall(c.recv(100).upper()); c.close()
"""
UNIX_ECHO = """
import os, socket
path = os.path.join(os.environ["TMPDIR"], "echo.sock")
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(1)
print(path, flush=True)
c, _ = s.accept(); c.sendall(c.recv(100).upper()); c.close()
"""


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[SimCluster]:
    async with SimCluster() as cluster:
        yield cluster


def connect(sim: SimCluster, node: str, **options: object) -> asyncssh.SSHClientConnection:
    """A plain asyncssh client, host key checking on, as any SSH user would connect."""
    base: dict[str, object] = {
        "port": sim.port(node),
        "username": getpass.getuser(),
        "client_keys": [str(sim.client_key)],
        "known_hosts": str(sim.known_hosts),
        "config": [],
    }
    return asyncssh.connect("127.0.0.1", **{**base, **options})  # type: ignore[return-value]


def run_line(*argv: str) -> str:
    return shlex.join(argv)


def proc_state(pid: int) -> str | None:
    """'R', 'S', 'Z', ... or None when the pid is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except OSError:
        return None


def session_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[3])
    except OSError:
        return None


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


# ---- the cluster's shape --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_default_cluster_has_the_issue_nodes_with_their_own_known_hosts(
    sim: SimCluster,
) -> None:
    configs = sim.node_configs()
    lines = sim.known_hosts.read_text().splitlines()

    assert [(c.name, c.host) for c in configs] == [
        ("a100-0", "127.0.0.1"),
        ("a100-1", "127.0.0.1"),
        ("v100-0", "127.0.0.1"),
        ("t4-0", "127.0.0.1"),
    ]
    assert len({c.port for c in configs}) == 4
    assert [line.split()[0] for line in lines] == [f"[127.0.0.1]:{c.port}" for c in configs]
    assert all(c.known_hosts == str(sim.known_hosts) for c in configs)
    assert all(c.client_keys == (str(sim.client_key),) for c in configs)
    assert all(c.python == sys.executable and c.staging == "sftp" for c in configs)
    assert [c.workdir for c in configs] == [
        str(sim.base_dir / "nodes" / c.name / "work") for c in configs
    ]
    assert oct(sim.client_key.stat().st_mode & 0o777) == "0o600"


def test_gpu_state_of_an_a100_node_has_nvlink_pairs_and_stable_uuids() -> None:
    state = gpu_state(DEFAULT_SIM_NODES[0])
    again = gpu_state(DEFAULT_SIM_NODES[0])
    other = gpu_state(DEFAULT_SIM_NODES[1])

    assert [g["nvlink_peer"] for g in state["gpus"]] == [1, 0, 3, 2, 5, 4, 7, 6]
    assert {g["name"] for g in state["gpus"]} == {"NVIDIA A100-SXM4-80GB"}
    assert [g["uuid"] for g in state["gpus"]] == [g["uuid"] for g in again["gpus"]]
    assert not {g["uuid"] for g in state["gpus"]} & {g["uuid"] for g in other["gpus"]}
    assert (state["cpus"], state["mem_gb"]) == (64, 512)


@pytest.mark.parametrize(
    ("spec", "name", "mem_mb", "links"),
    [
        (DEFAULT_SIM_NODES[2], "Tesla V100-SXM2-32GB", 32768, 0),
        (DEFAULT_SIM_NODES[3], "Tesla T4", 16384, 0),
        (
            SimNodeSpec("x", "L40S", 48, 3, cpus=8, mem_gb=64, nvlink_pairs=True),
            "NVIDIA L40S",
            49152,
            12,
        ),
    ],
)
def test_gpu_state_of_other_models(spec: SimNodeSpec, name: str, mem_mb: int, links: int) -> None:
    gpus = gpu_state(spec)["gpus"]

    assert len(gpus) == spec.gpus
    assert {(g["name"], g["mem_total_mb"], g["nvlink_links"]) for g in gpus} == {
        (name, mem_mb, links)
    }


def test_node_names_must_be_unique() -> None:
    with pytest.raises(InvalidSpecError):
        SimCluster([DEFAULT_SIM_NODES[3], DEFAULT_SIM_NODES[3]])


# ---- commands are real processes ------------------------------------------------------------


@pytest.mark.asyncio
async def test_command_really_runs_with_the_node_environment(sim: SimCluster) -> None:
    script = 'echo "$GPUSCHED_SIM_NODE $HOME $GPUSCHED_NVML_MODULE $FOO"; echo oops >&2; exit 3'
    async with connect(sim, "v100-0") as conn:
        done = await conn.run(
            run_line("sh", "-c", script), env={"FOO": "bar"}, stdin=asyncssh.DEVNULL
        )
        where = await conn.run("pwd; printenv GPUSCHED_SIM_STATE", stdin=asyncssh.DEVNULL)

    home = sim.node_dir("v100-0") / "home"
    assert done.exit_status == 3
    assert done.stdout == f"v100-0 {home} jupyter_gpusched.cluster.sim.nvml bar\n"
    assert done.stderr == "oops\n"
    assert where.stdout.split() == [str(home), str(sim.state_path("v100-0"))]


@pytest.mark.asyncio
async def test_nodes_do_not_share_home_directories(sim: SimCluster) -> None:
    async with connect(sim, "a100-0") as a, connect(sim, "t4-0") as t:
        await a.run("echo mine > note", check=True, stdin=asyncssh.DEVNULL)
        other = await t.run("cat note", stdin=asyncssh.DEVNULL)

    assert other.exit_status != 0
    assert (sim.node_dir("a100-0") / "home" / "note").read_text() == "mine\n"


@pytest.mark.asyncio
async def test_large_stdin_and_stdout_are_relayed_whole(sim: SimCluster) -> None:
    data = os.urandom(3 * 1024 * 1024)
    async with connect(sim, "t4-0") as conn:
        done = await conn.run("cat", input=data, encoding=None)

    assert done.exit_status == 0
    assert done.stdout == data


@pytest.mark.asyncio
async def test_death_by_signal_is_reported_as_exit_signal(sim: SimCluster) -> None:
    async with connect(sim, "t4-0") as conn:
        done = await conn.run("kill -s KILL $$", stdin=asyncssh.DEVNULL)

    assert done.exit_signal is not None and done.exit_signal[0] == "KILL"
    assert done.returncode == -signal.SIGKILL


@pytest.mark.asyncio
@pytest.mark.parametrize("stdin", [asyncssh.PIPE, asyncssh.DEVNULL], ids=["stdin-open", "eof"])
async def test_signal_request_reaches_the_command(sim: SimCluster, stdin: int) -> None:
    async with connect(sim, "t4-0") as conn:
        process = await conn.create_process("echo started; sleep 30", stdin=stdin)
        assert await process.stdout.readline() == "started\n"
        process.send_signal("TERM")
        done = await process.wait()

    assert done.returncode == -signal.SIGTERM


@pytest.mark.asyncio
async def test_hang_up_kills_the_command_but_not_a_detached_job(sim: SimCluster) -> None:
    script = (
        "sleep 60 >/dev/null 2>&1 & echo $!; "
        "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!; wait"
    )
    async with connect(sim, "a100-1") as conn:
        process = await conn.create_process(run_line("sh", "-c", script))
        attached = int(await process.stdout.readline())
        detached = int(await process.stdout.readline())
        # setsid runs in the background: hang up only once it has its own session
        await wait_for_async(lambda: session_of(detached) == detached, what="setsid to take effect")
        process.close()  # the client goes away without waiting for the command

    try:
        await wait_for_async(lambda: not alive(attached), what="the attached sleep to be killed")
        assert alive(detached)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(detached, signal.SIGKILL)


# ---- authentication and host keys -----------------------------------------------------------


@pytest.mark.asyncio
async def test_a_client_key_the_node_does_not_know_is_refused(sim: SimCluster) -> None:
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        async with connect(sim, "a100-0", client_keys=[stranger]):
            pass


@pytest.mark.asyncio
async def test_a_known_hosts_with_another_key_refuses_the_node(
    sim: SimCluster, tmp_path: Path
) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sim.port('a100-0')} {impostor}")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        async with connect(sim, "a100-0", known_hosts=str(wrong)):
            pass


@pytest.mark.asyncio
async def test_another_nodes_host_key_does_not_vouch_for_this_one(
    sim: SimCluster, tmp_path: Path
) -> None:
    t4_line = next(
        line
        for line in sim.known_hosts.read_text().splitlines()
        if line.startswith(f"[127.0.0.1]:{sim.port('t4-0')} ")
    )
    swapped = tmp_path / "known_hosts"
    swapped.write_text(t4_line.replace(str(sim.port("t4-0")), str(sim.port("a100-0")), 1))
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        async with connect(sim, "a100-0", known_hosts=str(swapped)):
            pass


# ---- nodes dropping out ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_stopped_node_drops_connections_and_comes_back_on_the_same_port(
    sim: SimCluster,
) -> None:
    port = sim.port("v100-0")
    conn = await connect(sim, "v100-0")
    await sim.stop_node("v100-0")

    await conn.wait_closed()
    with pytest.raises(OSError):
        await connect(sim, "v100-0")
    assert not sim.is_up("v100-0")

    await sim.start_node("v100-0")
    async with connect(sim, "v100-0") as again:
        done = await again.run("echo back", stdin=asyncssh.DEVNULL)
    assert (sim.port("v100-0"), done.stdout) == (port, "back\n")


@pytest.mark.asyncio
async def test_detached_jobs_survive_a_network_drop_but_not_a_crash(sim: SimCluster) -> None:
    line = "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!"
    async with connect(sim, "a100-0") as conn:
        job = int((await conn.run(line, stdin=asyncssh.DEVNULL)).stdout)

    await sim.stop_node("a100-0")
    assert alive(job)
    await sim.start_node("a100-0")
    await sim.stop_node("a100-0", kill_jobs=True)
    await wait_for_async(lambda: not alive(job), what="the crashed node's job to die")


@pytest.mark.asyncio
async def test_stop_of_a_temporary_cluster_kills_its_jobs_and_removes_its_dir() -> None:
    cluster = SimCluster([DEFAULT_SIM_NODES[3]])
    await cluster.start()
    base = cluster.base_dir
    async with connect(cluster, "t4-0") as conn:
        line = "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!"
        job = int((await conn.run(line, stdin=asyncssh.DEVNULL)).stdout)

    await cluster.stop()

    await wait_for_async(lambda: not alive(job), what="the job to be killed")
    assert not base.exists()


@pytest.mark.asyncio
async def test_given_base_dir_keeps_jobs_running_after_stop(tmp_path: Path) -> None:
    async with SimCluster([DEFAULT_SIM_NODES[3]], base_dir=tmp_path) as cluster:
        async with connect(cluster, "t4-0") as conn:
            line = "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!"
            job = int((await conn.run(line, stdin=asyncssh.DEVNULL)).stdout)
    try:
        assert alive(job)
        assert (tmp_path / "nodes" / "t4-0" / "gpus.json").exists()
    finally:
        os.kill(job, signal.SIGKILL)


# ---- forwarding and files -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_local_port_forwarding_reaches_a_service_on_the_node(sim: SimCluster) -> None:
    async with connect(sim, "a100-0") as conn:
        server = await conn.create_process(run_line(sys.executable, "-c", TCP_ECHO))
        remote_port = int(await server.stdout.readline())
        listener = await conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", remote_port)
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.get_port())
        writer.write(b"ping")
        answer = await reader.read(100)
        writer.close()
        listener.close()
        await server.wait()

    assert answer == b"PING"


@pytest.mark.asyncio
async def test_unix_socket_forwarding_reaches_a_service_on_the_node(
    sim: SimCluster, tmp_path: Path
) -> None:
    local = str(tmp_path / "fwd.sock")
    async with connect(sim, "a100-0") as conn:
        server = await conn.create_process(run_line(sys.executable, "-c", UNIX_ECHO))
        remote_path = (await server.stdout.readline()).strip()
        listener = await conn.forward_local_path(local, remote_path)
        reader, writer = await asyncio.open_unix_connection(local)
        writer.write(b"pong")
        answer = await reader.read(100)
        writer.close()
        listener.close()
        await server.wait()

    assert answer == b"PONG"


@pytest.mark.asyncio
async def test_sftp_puts_and_gets_files_inside_the_node_only(
    sim: SimCluster, tmp_path: Path
) -> None:
    local = tmp_path / "train.py"
    local.write_text("print('hi')\n")
    work = sim.node_configs()[0].workdir
    other_node = str(sim.node_dir("a100-1") / "home" / "x")
    async with connect(sim, "a100-0") as conn, conn.start_sftp_client() as sftp:
        await sftp.makedirs(f"{work}/jobs/1.0", exist_ok=True)
        await sftp.put(str(local), f"{work}/jobs/1.0/train.py")
        await sftp.get(f"{work}/jobs/1.0/train.py", str(tmp_path / "back.py"))
        await sftp.put(str(local), "relative.py")
        home = await sftp.realpath(".")
        with pytest.raises(asyncssh.SFTPPermissionDenied):
            await sftp.put(str(local), other_node)
        with pytest.raises(asyncssh.SFTPPermissionDenied):
            await sftp.get("/etc/hostname", str(tmp_path / "h"))

    assert (tmp_path / "back.py").read_text() == "print('hi')\n"
    assert (sim.node_dir("a100-0") / "home" / "relative.py").exists()
    assert home == str(sim.node_dir("a100-0") / "home")


# ---- simulated outsiders --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_foreign_process_lands_in_the_node_state(tmp_path: Path) -> None:
    cluster = SimCluster([DEFAULT_SIM_NODES[3]], base_dir=tmp_path)
    await cluster.start()
    try:
        pid = cluster.add_foreign_process("t4-0", 1, 3000)
        named = cluster.add_foreign_process("t4-0", 0, 500, pid=4242, name="jupyter")
        state = json.loads(cluster.state_path("t4-0").read_text())
        with pytest.raises(InvalidSpecError):
            cluster.add_foreign_process("t4-0", 2, 100)
        with pytest.raises(NotFoundError):
            cluster.add_foreign_process("a100-7", 0, 100)
        cluster.clear_foreign("t4-0")
        cleared = json.loads(cluster.state_path("t4-0").read_text())
    finally:
        await cluster.stop()

    assert named == 4242
    assert state["foreign"] == [
        {"gpu_index": 1, "pid": pid, "mem_mb": 3000.0, "name": "python"},
        {"gpu_index": 0, "pid": 4242, "mem_mb": 500.0, "name": "jupyter"},
    ]
    assert cleared["foreign"] == []


# ---- the agent and the SSH backend on the sim -----------------------------------------------


@pytest.mark.asyncio
async def test_agent_probe_over_ssh_reports_the_simulated_gpus(sim: SimCluster) -> None:
    foreign = sim.add_foreign_process("a100-0", 2, 4096)
    probes = {}
    for node in ("a100-0", "t4-0"):
        async with connect(sim, node) as conn:
            line = run_line(sys.executable, "-m", "jupyter_gpusched.node.agent", "probe")
            done = await conn.run(line, check=True, stdin=asyncssh.DEVNULL)
        probes[node] = json.loads(done.stdout)

    a100, t4 = probes["a100-0"], probes["t4-0"]
    assert a100["source"] == "nvml"
    assert [(g["model"], g["mem_total_mb"]) for g in a100["gpus"]] == [("A100-80GB", 81920)] * 8
    assert [g["nvlink_peers"] for g in a100["gpus"]] == [[1], [0], [3], [2], [5], [4], [7], [6]]
    assert [(p["pid"], p["used_mem_mb"], p["job_id"]) for p in a100["gpus"][2]["processes"]] == [
        (foreign, 4096.0, None)
    ]
    assert a100["gpus"][2]["mem_used_mb"] == 4096
    assert [(g["model"], g["mem_total_mb"], g["nvlink_peers"]) for g in t4["gpus"]] == [
        ("T4", 16384, [])
    ] * 2


def _job(job_id: int, command: list[str], **env: str) -> Job:
    spec = JobSpec(kind=JobKind.SCRIPT, command=command, gpus=2, env=env)
    return Job(id=job_id, spec=spec, submitted_at=datetime(2026, 11, 23, tzinfo=UTC))


@pytest.mark.asyncio
async def test_ssh_backend_inventories_the_whole_default_cluster(
    sim: SimCluster, clock: ManualClock
) -> None:
    backend = SshBackend(await sim.start(), clock=clock)
    try:
        nodes = await backend.inventory()
    finally:
        await backend.close()

    assert [(n.name, n.up, n.error) for n in nodes] == [
        ("a100-0", True, None),
        ("a100-1", True, None),
        ("v100-0", True, None),
        ("t4-0", True, None),
    ]
    assert [(len(n.gpus), n.gpus[0].model, n.gpus[0].mem_total_mb) for n in nodes] == [
        (8, "A100-80GB", 81920),
        (8, "A100-80GB", 81920),
        (4, "V100-32GB", 32768),
        (2, "T4", 16384),
    ]
    assert [g.nvlink_peers for g in nodes[1].gpus[:4]] == [(1,), (0,), (3,), (2,)]
    assert all(g.mem_used_mb == 0 for n in nodes for g in n.gpus)


@pytest.mark.asyncio
async def test_launched_job_uses_its_declared_memory_until_cancelled(
    sim: SimCluster, clock: ManualClock
) -> None:
    backend = SshBackend(await sim.start(), clock=clock)
    job = _job(7, ["sh", "-c", "echo running; exec sleep 60"], GPUSCHED_GPU_MEM_MB="12000")
    try:
        await backend.inventory()
        launched = await backend.launch(job, Placement(node="a100-1", gpu_indices=[2, 3]))
        job = job.model_copy(update={"handle": launched.handle})
        busy = {n.name: n for n in await backend.inventory(refresh=True)}["a100-1"]
        await backend.cancel(job, grace_s=2)
        status = await backend.poll(job)
        idle = {n.name: n for n in await backend.inventory(refresh=True)}["a100-1"]
        log = await backend.read_log(job)
    finally:
        await backend.close()

    assert [(g.index, g.mem_used_mb) for g in busy.gpus if g.mem_used_mb] == [
        (2, 12000),
        (3, 12000),
    ]
    assert [(p.used_mem_mb, p.job_id) for p in busy.gpus[2].processes] == [(12000, 7)]
    assert busy.gpus[2].util_pct > 0
    assert not alive(launched.handle["pgid"])
    assert (status.running, status.exit_code) == (False, -signal.SIGTERM)
    assert all(g.mem_used_mb == 0 and not g.processes for g in idle.gpus)
    assert log == b"running\n"


@pytest.mark.asyncio
async def test_job_log_streams_through_the_backend_until_the_job_ends(
    sim: SimCluster, clock: ManualClock
) -> None:
    backend = SshBackend(await sim.start(), clock=clock)
    job = _job(8, ["sh", "-c", "echo one; sleep 0.3; echo two"])
    try:
        await backend.inventory()
        launched = await backend.launch(job, Placement(node="t4-0", gpu_indices=[0, 1]))
        job = job.model_copy(update={"handle": launched.handle})
        chunks = [chunk async for chunk in backend.follow_log(job)]
        status = await backend.poll(job)
    finally:
        await backend.close()

    assert b"".join(chunks) == b"one\ntwo\n"
    assert (status.running, status.exit_code) == (False, 0)


@pytest.mark.asyncio
async def test_job_outlives_a_dropped_node_and_is_found_again(
    sim: SimCluster, clock: ManualClock
) -> None:
    backend = SshBackend(await sim.start(), clock=clock)
    job = _job(9, ["sleep", "60"], GPUSCHED_GPU_MEM_MB="1000")
    try:
        await backend.inventory()
        launched = await backend.launch(job, Placement(node="v100-0", gpu_indices=[0, 1]))
        job = job.model_copy(update={"handle": launched.handle})
        await sim.stop_node("v100-0")
        during = await backend.poll(job)
        await sim.start_node("v100-0")
        clock.advance(3600)  # past the backend's reconnect backoff
        after = await backend.poll(job)
        await backend.cancel(job, grace_s=2)
    finally:
        await backend.close()

    assert (during.running, during.lost) == (False, True)
    assert (after.running, after.lost) == (True, False)
