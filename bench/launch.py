"""Submit -> remote process start latency of SshBackend.launch on a warm connection.

Compares, on the same pooled SSH connection:

* ``asyncssh run('true')``  - the floor: one channel, one trivial remote process
* ``backend.run(['true'])`` - the same through SshBackend (channel bound, argv quoting)
* ``run([python, -c, pass])`` - what the node's interpreter start-up alone costs
* ``launch() returns``      - the agent started the detached wrapper and the job's process
* ``job exec'd``            - launch() called -> the job's first instruction (``date +%s.%N``)
* ``poll()``                - one status round trip

against the in-process asyncssh server the simulator uses and, when present, Debian's sshd.

Run: ``.venv/bin/python bench/launch.py [--n 50] [--no-sshd]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fixtures_ssh import (  # noqa: E402
    SSHD,
    InProcessSshServer,
    gpu_state,
    kill_marked,
    running_sshd,
)

from jupyter_gpusched.cluster.ssh import NodeConfig, SshBackend  # noqa: E402
from jupyter_gpusched.core.clock import SystemClock  # noqa: E402
from jupyter_gpusched.core.models import Job, JobSpec, Placement  # noqa: E402


def _row(name: str, samples_s: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples_s)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return f"  {name:<26} median {statistics.median(ms):7.2f} ms   p95 {p95:7.2f} ms   n={len(ms)}"


async def _timed(n: int, action: Callable[[int], Awaitable[object]]) -> list[float]:
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        await action(i)
        samples.append(time.perf_counter() - t0)
    return samples


async def bench_node(label: str, cfg: NodeConfig, n: int) -> None:
    backend = SshBackend([cfg], clock=SystemClock())
    node = cfg.name
    try:
        for _ in range(5):  # warm: connection, page cache, Python bytecode on the node
            await backend.run(node, ["true"], check=True)
        conn = backend._nodes[node].conn  # the pooled connection itself, for the floor
        bare: list[float] = []
        ours: list[float] = []
        for _ in range(n):  # interleaved, so load on a shared machine hits both alike
            # subprocess.DEVNULL is asyncssh.DEVNULL; the bench itself does not import asyncssh
            bare += await _timed(
                1, lambda i: conn.run("true", check=True, stdin=subprocess.DEVNULL)
            )
            ours += await _timed(1, lambda i: backend.run(node, ["true"], check=True))

        python = await _timed(
            n, lambda i: backend.run(node, [cfg.python, "-c", "pass"], check=True)
        )
        launched: list[float] = []
        execd: list[float] = []
        polls: list[float] = []
        submitted = datetime.now(UTC)
        for i in range(n + 3):
            job = Job(
                id=100_000 + i,
                spec=JobSpec(kind="script", command=["date", "+%s.%N"]),
                submitted_at=submitted,
            )
            t_wall = time.time()
            t0 = time.perf_counter()
            result = await backend.launch(job, Placement(node=node, gpu_indices=[0]))
            t_launch = time.perf_counter() - t0
            job = job.model_copy(update={"handle": result.handle})
            t1 = time.perf_counter()
            status = await backend.poll(job)
            t_poll = time.perf_counter() - t1
            while status.running:
                status = await backend.poll(job)
            started_wall = float((await backend.read_log(job)).split()[0])
            if i >= 3:  # the first launches warm the agent's imports
                launched.append(t_launch)
                execd.append(started_wall - t_wall)
                polls.append(t_poll)
        print(f"{label}")
        print(_row("asyncssh run('true')", bare))
        print(_row("backend.run(['true'])", ours))
        print(_row("run([python, -c, pass])", python))
        print(_row("launch() returns", launched))
        print(_row("job exec'd (from submit)", execd))
        print(_row("poll()", polls))
    finally:
        await backend.close()


def bench_rest(n: int) -> None:
    """REST submit -> the job's first instruction through a running server and its nodes.

    The server (``bench/_server.py``) runs the embedded simulated cluster: loopback SSH nodes.
    Each job is submitted when the one before has ended, so every submit finds the scheduler
    idle and its node's connection warm, as a lab's first job of the morning would.
    """
    from _server import TOKEN, start_server

    from jupyter_gpusched.client.api import GpuSchedClient

    root = Path(tempfile.mkdtemp(prefix="gpusched-bench-rest-"))
    proc, url, _ = start_server(root)
    client = GpuSchedClient(url, TOKEN)
    spec = {"kind": "script", "command": ["date", "+%s.%N"], "gpus": 1}
    samples: list[float] = []
    try:
        for i in range(n + 3):
            t_wall = time.time()
            job = client.submit(spec)
            done = client.wait(job.id, timeout_s=30, poll_s=0.05)
            if done.state != "succeeded":
                raise SystemExit(f"job {job.id} ended {done.state}: {done.reason}")
            log, _ = client.read_log(job.id)
            if i >= 3:  # the first ones warm the node's connection and agent
                samples.append(float(log.split()[0]) - t_wall)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    print("REST submit through a running server (embedded simulated cluster):")
    print(_row("submit -> first instruction", samples))


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="samples per figure")
    parser.add_argument("--no-sshd", action="store_true", help="skip Debian's sshd")
    parser.add_argument("--rest-only", action="store_true", help="only the REST figure")
    parser.add_argument("--no-rest", action="store_true", help="skip the REST figure")
    args = parser.parse_args(argv)
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
        f"on {os.cpu_count()} CPUs"
    )
    if not args.no_rest:
        await asyncio.to_thread(bench_rest, args.n)
    if args.rest_only:
        return 0
    directory = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    state = directory / "gpus.json"
    state.write_text(json.dumps(gpu_state(2)))
    server = InProcessSshServer(
        directory,
        env={
            "GPUSCHED_NVML_MODULE": "jupyter_gpusched.cluster.sim.nvml",
            "GPUSCHED_SIM_STATE": str(state),
        },
    )
    await server.start()
    try:
        await bench_node(
            "in-process asyncssh server (as the simulator):", server.node_config(), args.n
        )
    finally:
        kill_marked(server.token)
        await server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    if not args.no_sshd and Path(SSHD).exists():
        with running_sshd() as sshd:
            sshd.state_path.write_text(json.dumps(gpu_state(2)))
            sshd.state_path.chmod(0o644)
            await bench_node(
                f"Debian OpenSSH sshd (login {sshd.user}, {sshd.python}):",
                sshd.node_config(),
                args.n,
            )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
