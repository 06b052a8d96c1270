"""SshBackend against Debian's OpenSSH server: software we did not write.

sshd runs on a loopback port with its own config and keys; as root the tests log in as a
dedicated user (``gpusched-test``) running the system Python with the repo on PYTHONPATH, and a
fake ``nvidia-smi`` on PATH stands in for the GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncssh
import pytest
import pytest_asyncio
from _fixtures_polling import wait_for_async
from _fixtures_ssh import (
    SSHD,
    Sshd,
    check_a_fresh_backend_reattaches,
    ended,
    gpu_state,
    launched,
    running_sshd,
    script_job,
    world_readable_dir,
)

from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.errors import HostKeyError
from jupyter_gpusched.core.models import Job, Placement

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(
        not os.access(SSHD, os.X_OK),
        reason=f"{SSHD} missing: install openssh-server (scripts/system-deps.sh)",
    ),
]

UUIDS = [g["uuid"] for g in gpu_state(2)["gpus"]]


@pytest.fixture
def sshd() -> Iterator[Sshd]:
    with running_sshd() as server:
        server.state_path.write_text(json.dumps(gpu_state(2)))
        server.state_path.chmod(0o644)
        yield server


@pytest_asyncio.fixture
async def backend(sshd: Sshd, clock: ManualClock) -> AsyncIterator[SshBackend]:
    b = SshBackend([sshd.node_config()], clock=clock)
    yield b
    await b.close()


def on(gpus: list[int]) -> Placement:
    return Placement(node="sshd0", gpu_indices=gpus, gpu_uuids=[UUIDS[i] for i in gpus])


async def started(backend: SshBackend, job: Job, gpus: list[int]) -> Job:
    return await launched(backend, job, on(gpus))


@pytest.mark.asyncio
async def test_inventory_over_openssh_reports_our_jobs_and_foreign_gpu_use(
    backend: SshBackend, clock: ManualClock
) -> None:
    job = await started(backend, script_job(21, ["sleep", "60"], clock), [0])
    # someone ssh'ed in and started work on GPU 1 by hand, outside the scheduler
    await backend.run(
        "sshd0",
        [
            "env",
            f"CUDA_VISIBLE_DEVICES={UUIDS[1]}",
            "sh",
            "-c",
            "setsid -f sleep 60 </dev/null >/dev/null 2>&1",
        ],
        check=True,
    )
    [node] = await backend.inventory()
    await backend.cancel(job, grace_s=1)
    assert node.up and [g.model for g in node.gpus] == ["A100-80GB", "A100-80GB"]
    assert [g.nvlink_peers for g in node.gpus] == [(1,), (0,)]
    [ours] = node.gpus[0].processes
    [theirs] = node.gpus[1].processes
    assert (ours.pid, ours.job_id, ours.foreign) == (job.handle["pgid"], 21, False)
    assert (theirs.name, theirs.foreign) == ("sleep", True)
    assert node.gpus[1].mem_used_mb == 512


@pytest.mark.asyncio
async def test_launch_log_and_cancel_over_openssh(backend: SshBackend, clock: ManualClock) -> None:
    job = await started(
        backend,
        script_job(
            22,
            [
                "sh",
                "-c",
                'echo "gpus=$CUDA_VISIBLE_DEVICES"; trap "echo bye; exit 9" TERM; '
                "while :; do sleep 0.1; done",
            ],
            clock,
        ),
        [1],
    )
    assert (await backend.poll(job)).running
    await wait_for_async(lambda: backend.read_log(job), timeout_s=5, what="the job's first output")
    await backend.cancel(job, grace_s=5)
    status = await backend.poll(job)
    assert (status.running, status.exit_code) == (False, 9)
    log = await backend.read_log(job)  # sh may also report its killed sleep in between
    assert log.startswith(f"gpus={UUIDS[1]}\n".encode()) and log.endswith(b"bye\n")


@pytest.mark.asyncio
async def test_follow_log_over_openssh(backend: SshBackend, clock: ManualClock) -> None:
    job = await started(
        backend, script_job(23, ["sh", "-c", "echo a; sleep 0.3; echo b; exit 2"], clock), [0]
    )
    streamed = b"".join([chunk async for chunk in backend.follow_log(job)])
    assert streamed == b"a\nb\n"
    assert (await backend.poll(job)).exit_code == 2


def followers_of(job: Job) -> list[int]:
    """Pids of the node's ``agent log --follow`` processes for ``job`` (sshd's are local)."""
    mark = job.handle["job_dir"].encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--follow" in argv and mark in argv:
            found.append(int(pid))
    return found


@pytest.mark.asyncio
async def test_follows_cancelled_while_opening_leave_no_process_over_openssh(
    backend: SshBackend, clock: ManualClock
) -> None:
    job = await started(backend, script_job(27, ["sh", "-c", "echo a; sleep 600"], clock), [0])

    async def follow() -> None:
        async for _ in backend.follow_log(job):
            pass

    for i in range(40):  # cancelled at every step of opening a channel, and once it runs
        task = asyncio.ensure_future(follow())
        await asyncio.sleep(0.002 * (i % 20))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await wait_for_async(
        lambda: followers_of(job),
        lambda pids: not pids,
        timeout_s=60,
        what=lambda pids: f"the node's followers to end; {len(pids)} still run",
    )
    await backend.cancel(job, grace_s=1)


@pytest.mark.asyncio
async def test_staged_files_run_in_the_job_dir_over_openssh(
    sshd: Sshd, backend: SshBackend, clock: ManualClock
) -> None:
    local = world_readable_dir("gpusched-stage-")
    (local / "job.sh").write_text("echo staged $(basename $(pwd))\nexit 6\n")
    job = await started(
        backend, script_job(24, ["sh", "job.sh"], clock, files=[str(local / "job.sh")]), [0]
    )
    status = await ended(backend, job)
    assert status.exit_code == 6
    assert await backend.read_log(job) == f"staged {Path(job.handle['job_dir']).name}\n".encode()
    assert job.handle["job_dir"].startswith("/")  # ~ was expanded on the node side


@pytest.mark.asyncio
async def test_a_fresh_backend_reattaches_over_openssh(
    sshd: Sshd, backend: SshBackend, clock: ManualClock
) -> None:
    await check_a_fresh_backend_reattaches(
        backend, sshd.node_config(), clock, 25, (on([0]), on([1]))
    )


@pytest.mark.asyncio
async def test_openssh_with_an_unexpected_host_key_is_refused(
    sshd: Sshd, clock: ManualClock
) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode()
    known_hosts = sshd.private / "stale_known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {other}")
    backend = SshBackend([sshd.node_config(known_hosts=str(known_hosts))], clock=clock)
    with pytest.raises(HostKeyError) as info:
        await backend.run("sshd0", ["true"])
    assert f"127.0.0.1:{sshd.port}" in info.value.message
    assert str(known_hosts) in info.value.message


@pytest.mark.asyncio
async def test_openssh_forwards_a_port(backend: SshBackend) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"pong:" + await reader.readline())
        await writer.drain()
        writer.close()

    service = await asyncio.start_server(echo, "127.0.0.1", 0)
    (forward,) = await backend.forward_local_ports(
        "sshd0", [("127.0.0.1", service.sockets[0].getsockname()[1], 0)]
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", forward.local_port)
        writer.write(b"ping\n")
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
    finally:
        forward.close()
        await forward.wait_closed()
        service.close()
        await service.wait_closed()
    assert answer == b"pong:ping\n"


@pytest.mark.asyncio
async def test_input_to_a_command_that_exits_without_reading_it_is_its_exit_over_openssh(
    backend: SshBackend,
) -> None:
    """sudo refusing an owner exits before it reads the spec on stdin; that refusal must
    reach the caller as the command's exit, not as "Channel not open for sending"."""
    refusals = await asyncio.gather(
        *(
            backend.run("sshd0", ["sh", "-c", "echo no >&2; exit 1"], input="x" * (1 << 20))
            for _ in range(12)
        )
    )
    assert set(refusals) == {(1, "", "no\n")}
