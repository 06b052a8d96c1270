"""Arrays as one record (issue #37): accepting ``array: 100000``, and placing its tasks.

Two measures, each in ``--rounds`` alternating rounds, min/median/max with the load average
beside each round:

* **accept**: ``POST gpusched/api/jobs`` with ``array: N`` (a far ``not_before``: nothing runs)
  to a live Jupyter server (the personal default: SQLite, per-user limits off), from the call to
  its answer; tasks/s = N / that time. Its peer is ``sbatch --array=0-(N-1)`` on a real Slurm
  (Debian's slurmctld on loopback, ``MaxArraySize`` raised to hold N; ``--begin`` far ahead),
  from the call to ``sbatch``'s exit (its arrays stay pending: one record each, as ours).
* **placing**: the scheduler on an in-memory cluster of ``--nodes`` x 8 GPUs, every GPU free:
  ``--tasks`` one-GPU jobs queued as one array, or as as many single jobs (submitted before
  the clock starts), then passes run back to back until every one has started; jobs/s = tasks
  / that time. The array's tasks are made jobs by the passes themselves, a few hundred a pass.

Run: ``.venv/bin/python bench/arrays.py [--size 100000] [--rounds 5] [--tasks 512]``
(``--no-slurm`` to leave the peer out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _server import FAR_FUTURE, TOKEN, start_server  # noqa: E402

from jupyter_gpusched.cluster.memory import MemoryBackend  # noqa: E402
from jupyter_gpusched.cluster.sim.specs import SimNodeSpec  # noqa: E402
from jupyter_gpusched.core import windows  # noqa: E402
from jupyter_gpusched.core.clock import ManualClock  # noqa: E402
from jupyter_gpusched.core.models import JobSpec, JobState  # noqa: E402
from jupyter_gpusched.scheduling.scheduler import Scheduler  # noqa: E402
from jupyter_gpusched.store.store import Store  # noqa: E402

#: Saturday night: no day-time share kept for interactive work.
NIGHT = "2026-11-28T23:00:00+00:00"


def load() -> str:
    """The 1-minute load average, as ``load 3.2``."""
    return f"load {os.getloadavg()[0]:.1f}"


def spread(values: list[float], unit: str) -> str:
    """``min / median / max unit``."""
    return f"{min(values):,.0f} / {statistics.median(values):,.0f} / {max(values):,.0f} {unit}"


# ---------------------------------------------------------------------------- accept


def _call(url: str, method: str, path: str, body: object = None) -> tuple[float, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{url}gpusched/api/{path}",
        data=data,
        method=method,
        headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
    )
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as resp:
        answer = json.loads(resp.read())
    return time.perf_counter() - began, answer


def accept_ours(url: str, size: int) -> float:
    """Seconds from the call to the answer of one ``array: size`` submit (then cancelled)."""
    body = {"kind": "script", "command": ["true"], "gpus": 1, "not_before": FAR_FUTURE}
    took_s, answer = _call(url, "POST", "jobs", {**body, "array": size})
    assert isinstance(answer, dict) and answer["size"] == size, answer
    _call(url, "DELETE", f"arrays/{answer['array_id']}")
    return took_s


def accept_slurm(cluster: object, size: int) -> float:
    """Seconds ``sbatch --array=0-(size-1)`` takes.

    Not cancelled after: a pending array is one record in Slurm too, while cancelling 100,000
    tasks kept slurmctld busy (purging their records) into the next round's ``sbatch``.
    """
    env = cluster.env  # type: ignore[attr-defined]
    argv = ["sbatch", "--parsable", f"--array=0-{size - 1}", "--begin=now+300days"]
    argv += ["--gres=gpu:1", "--output=/dev/null", "--wrap", "true"]
    began = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    took_s = time.perf_counter() - began
    return took_s


def start_slurm(base: Path, size: int, rounds: int) -> object | None:
    """A one-node Slurm that takes ``rounds`` arrays of ``size``; None without Slurm.

    A pending array is one record, but ``MaxJobCount`` counts each of its tasks.
    """
    from _fixtures_slurm import SlurmCluster, slurm_missing_reason

    if (why := slurm_missing_reason()) is not None:
        print(f"(no Slurm peer: {why})")
        return None

    class BigArrays(SlurmCluster):
        def _write_config(self, cpus: int, mem_mb: int) -> None:
            super()._write_config(cpus, mem_mb)
            with self.conf.open("a") as conf:
                conf.write(f"MaxArraySize={size + 1}\nMaxJobCount={(rounds + 2) * size}\n")

    return BigArrays(base).start()


def bench_accept(args: argparse.Namespace) -> None:
    print(f"## accept: array of {args.size:,} tasks, {args.rounds} alternating rounds")
    root = Path(tempfile.mkdtemp(prefix="gpusched-arrays-"))
    proc, url, _ = start_server(root / "server")
    cluster = None if args.no_slurm else start_slurm(root / "slurm", args.size, args.rounds)
    ours: list[float] = []
    theirs: list[float] = []
    try:
        accept_ours(url, 10)  # warm: the first request pays imports
        for i in range(args.rounds):
            took = accept_ours(url, args.size)
            ours.append(took)
            line = f"  round {i + 1}: ours {took * 1000:7.1f} ms ({args.size / took:,.0f} tasks/s)"
            if cluster is not None:
                peer = accept_slurm(cluster, args.size)
                theirs.append(peer)
                line += f"   sbatch {peer * 1000:7.1f} ms ({args.size / peer:,.0f} tasks/s)"
            print(f"{line}   {load()}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if cluster is not None:
            cluster.stop()  # type: ignore[attr-defined]
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"  ours   : {spread([t * 1000 for t in ours], 'ms')}"
        f"   = {spread([args.size / t for t in ours], 'tasks/s')}"
    )
    if theirs:
        print(
            f"  sbatch : {spread([t * 1000 for t in theirs], 'ms')}"
            f"   = {spread([args.size / t for t in theirs], 'tasks/s')}"
        )


# ---------------------------------------------------------------------------- placing


async def place_round(tasks: int, nodes: int, *, array: bool) -> float:
    """Jobs/s placing ``tasks`` one-GPU jobs queued as one array or as single jobs."""
    from datetime import datetime

    base = Path(tempfile.mkdtemp(prefix="gpusched-place-"))
    clock = ManualClock(datetime.fromisoformat(NIGHT))
    specs = [SimNodeSpec(f"n{i}", "A100-80GB", 80.0, 8, 64, 512.0) for i in range(nodes)]
    sched = Scheduler(
        store=Store(f"sqlite:///{base / 'gpusched.db'}", clock=clock),
        backend=MemoryBackend(specs, clock=clock),
        policy=windows.PolicyConfig(),
        clock=clock,
        poll_interval_s=0,
        inventory_interval_s=3600,
        store_writer_process=False,
    )
    await sched.start()
    task, sched._task = sched._task, None  # the bench runs every pass itself
    if task is not None:
        task.cancel()
    try:
        spec = JobSpec(kind="script", command=["train"], gpus=1, user="alice")
        if array:
            await sched.submit_array(spec, tasks)
        else:
            sched.submit_many([spec] * tasks, array=False)
        began = time.perf_counter()
        while True:
            await sched.tick(upkeep=False)
            _, queued = sched.list_jobs(states=[JobState.QUEUED], limit=0)
            record = sched.store.list_arrays()
            if queued == 0 and not record:
                break
        took = time.perf_counter() - began
        started, total = sched.list_jobs(states=[JobState.STARTING, JobState.RUNNING], limit=0)
        assert total == tasks, (total, tasks)
        return tasks / took
    finally:
        await sched.stop()
        sched.store.close()
        shutil.rmtree(base, ignore_errors=True)


def bench_placing(args: argparse.Namespace) -> None:
    gpus = args.nodes * 8
    print(
        f"## placing: {args.tasks} one-GPU jobs on {args.nodes} nodes x 8 GPUs ({gpus} free), "
        f"{args.rounds} alternating rounds"
    )
    arrays: list[float] = []
    singles: list[float] = []
    asyncio.run(place_round(16, 2, array=True))  # warm: imports, first statements
    for i in range(args.rounds):
        # which goes first alternates too: the second of a pair finds the machine warmer
        if i % 2 == 0:
            a = asyncio.run(place_round(args.tasks, args.nodes, array=True))
            s = asyncio.run(place_round(args.tasks, args.nodes, array=False))
        else:
            s = asyncio.run(place_round(args.tasks, args.nodes, array=False))
            a = asyncio.run(place_round(args.tasks, args.nodes, array=True))
        arrays.append(a)
        singles.append(s)
        print(f"  round {i + 1}: array {a:7.0f} jobs/s   single jobs {s:7.0f} jobs/s   {load()}")
    print(f"  array tasks : {spread(arrays, 'jobs/s')}")
    print(f"  single jobs : {spread(singles, 'jobs/s')}")
    ratio = statistics.median(arrays) / statistics.median(singles)
    print(f"  array / single (medians): {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000, help="tasks of the accepted array")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=512, help="jobs placed per round")
    parser.add_argument("--nodes", type=int, default=64, help="nodes of 8 GPUs for placing")
    parser.add_argument("--no-slurm", action="store_true", help="leave the sbatch peer out")
    parser.add_argument("--only", choices=["accept", "placing"], default=None)
    args = parser.parse_args()
    if args.only in (None, "accept"):
        bench_accept(args)
    if args.only in (None, "placing"):
        bench_placing(args)


if __name__ == "__main__":
    main()
