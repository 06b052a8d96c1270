"""The Slurm backend against plain ``sbatch``, on one real Slurm cluster, in the same run.

Starts Debian's munged + slurmctld + slurmd on loopback (the test fixture's cluster: one node,
4 fake GPUs, 8 CPUs; ``SchedulerParameters=batch_sched_delay=0,sched_min_interval=100000``, so
Slurm's own scheduling pass runs about once a second) and measures, interleaved so machine
load hits both alike:

* submit -> start: from the call (``sbatch`` in a subprocess, or ``SlurmBackend.launch``) to
  the job's first instruction (``date +%s.%N``), one job at a time on an idle node;
* the call itself: until ``sbatch`` exits / ``launch()`` returns;
* submissions per second: ``--burst`` jobs submitted back to back (sequential calls, and the
  backend's launches also all at once with ``asyncio.gather``);
* one poll round for ``--burst`` queued jobs: the backend's batched ``squeue`` against one
  ``squeue -j ID`` per job.

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (``scripts/system-deps.sh``).

Run: ``.venv/bin/python bench/slurm.py [--n 15] [--burst 50]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _fixtures_slurm import NODE, SlurmCluster, slurm_missing_reason  # noqa: E402

from jupyter_gpusched.cluster.slurm import SlurmBackend  # noqa: E402
from jupyter_gpusched.core.clock import SystemClock  # noqa: E402
from jupyter_gpusched.core.models import Job, JobSpec, Placement  # noqa: E402

_ids = iter(range(1, 10**9))


def _row(name: str, samples_s: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples_s)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return f"  {name:<34} median {statistics.median(ms):8.1f} ms   p95 {p95:8.1f} ms   n={len(ms)}"


def _job(command: list[str], gpus: int) -> Job:
    return Job(
        id=next(_ids),
        spec=JobSpec(kind="script", command=command, gpus=gpus, cpus=1, mem_gb=0.1),
        submitted_at=datetime.now(UTC),
    )


def _plain_argv(out: Path, gpus: int, command: str) -> list[str]:
    """The plain sbatch a user would type for the same job (same node, GRES, CPUs, memory)."""
    argv = ["sbatch", "--parsable", f"--nodelist={NODE}", "--cpus-per-task=1", "--mem=103M"]
    if gpus:
        argv.append(f"--gres=gpu:fake:{gpus}")
    return [*argv, f"--output={out}", "--wrap", command]


async def _started_at(path: Path, timeout_s: float = 60.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return float(text.split()[0])
        await asyncio.sleep(0.005)
    raise TimeoutError(f"{path} stayed empty")


async def latency(cluster: SlurmCluster, backend: SlurmBackend, base: Path, n: int) -> None:
    plain_call, plain_start, ours_call, ours_start = [], [], [], []
    for i in range(n + 1):  # the first of each warms the controller and the page cache
        out = base / f"plain-{i}.log"
        t_wall, t0 = time.time(), time.perf_counter()
        subprocess.run(_plain_argv(out, 1, "date +%s.%N"), env=cluster.env, check=True,
                       capture_output=True)  # fmt: skip
        call = time.perf_counter() - t0
        started = await _started_at(out) - t_wall
        if i:
            plain_call.append(call)
            plain_start.append(started)
        cluster.cancel_all()

        job = _job(["date", "+%s.%N"], 1)
        t_wall, t0 = time.time(), time.perf_counter()
        result = await backend.launch(job, Placement(node=NODE, gpu_indices=[0]))
        call = time.perf_counter() - t0
        started = await _started_at(Path(result.handle["log"])) - t_wall
        if i:
            ours_call.append(call)
            ours_start.append(started)
        cluster.cancel_all()
    print("submit -> start, one job at a time on an idle node (1 GPU):")
    print(_row("plain sbatch: call returns", plain_call))
    print(_row("SlurmBackend.launch(): returns", ours_call))
    print(_row("plain sbatch: job exec'd", plain_start))
    print(_row("SlurmBackend.launch(): job exec'd", ours_start))


async def throughput(cluster: SlurmCluster, backend: SlurmBackend, base: Path, burst: int) -> None:
    # Held jobs (--hold / a partition with no room would also do): measure submission only.
    t0 = time.perf_counter()
    ids = []
    for i in range(burst):
        argv = _plain_argv(base / f"burst-{i}.log", 0, "true")
        done = subprocess.run([*argv[:2], "--hold", *argv[2:]], env=cluster.env, check=True,
                              capture_output=True, text=True)  # fmt: skip
        ids.append(int(done.stdout.strip()))
    plain_s = time.perf_counter() - t0
    cluster.cancel_all()

    backend.sbatch_args = ["--hold"]
    jobs = [_job(["true"], 0) for _ in range(burst)]
    t0 = time.perf_counter()
    for job in jobs:
        await backend.launch(job, Placement(node=NODE))
    ours_s = time.perf_counter() - t0
    cluster.cancel_all()

    jobs = [_job(["true"], 0) for _ in range(burst)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(backend.launch(j, Placement(node=NODE)) for j in jobs))
    gathered_s = time.perf_counter() - t0
    print(f"submissions per second, {burst} held jobs back to back:")
    print(f"  {'plain sbatch, sequential':<34} {burst / plain_s:8.1f} /s")
    print(f"  {'SlurmBackend.launch, sequential':<34} {burst / ours_s:8.1f} /s")
    print(f"  {'SlurmBackend.launch, gathered':<34} {burst / gathered_s:8.1f} /s")

    held = [j.model_copy(update={"handle": r.handle}) for j, r in zip(jobs, results, strict=True)]
    rounds, singles = [], []
    for _ in range(5):
        before = backend.states.calls.get("squeue", 0)
        t0 = time.perf_counter()
        statuses = await asyncio.gather(*(backend.poll(j) for j in held))
        rounds.append(time.perf_counter() - t0)
        assert all(s.running for s in statuses)
        assert backend.states.calls["squeue"] == before + 1
        t0 = time.perf_counter()
        for job in held:
            subprocess.run(["squeue", "-h", "-j", str(job.handle["slurm_job_id"])],
                           env=cluster.env, check=True, capture_output=True)  # fmt: skip
        singles.append(time.perf_counter() - t0)
    print(f"one poll of {burst} jobs:")
    print(_row("SlurmBackend.poll x N (gathered)", rounds))
    print(_row("squeue -j ID, once per job", singles))
    backend.sbatch_args = []
    cluster.cancel_all()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15, help="latency samples of each")
    parser.add_argument("--burst", type=int, default=50, help="jobs per throughput figure")
    args = parser.parse_args(argv)
    reason = slurm_missing_reason()
    if reason:
        print(f"skipped: {reason}")
        return 1
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs")  # fmt: skip
    base = Path(tempfile.mkdtemp(prefix="gpusched-bench-slurm-"))
    base.chmod(0o755)
    cluster = SlurmCluster(base).start()
    backend = SlurmBackend(
        clock=SystemClock(),
        state_dir=str(base / "gpusched"),
        slurm_conf=str(cluster.conf),
        workdir=str(base / "work" / "gpusched"),
    )
    try:
        await backend.start()
        await backend.inventory()
        await latency(cluster, backend, base, args.n)
        await throughput(cluster, backend, base, args.burst)
    finally:
        await backend.close()
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
