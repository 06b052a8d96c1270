"""Wall time of ``jupyter gpusched queue`` against ``squeue``, in the same run.

Starts ``jupyter server`` (only jupyter-gpusched, the default simulated cluster) with
``--queued`` waiting jobs, then times ``jupyter-gpusched queue`` as a user runs it: a fresh
process that finds the server through the runtime dir's ``jpserver-*.json`` files (no URL
given) and prints the first 100 rows. When Slurm works on this machine, ``squeue`` on a
loopback cluster holding as many held jobs is timed the same way; otherwise a line says why it
was skipped. Medians of ``--n`` runs.

Run: ``.venv/bin/python bench/cli.py [--n 15] [--queued 200]``
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _server import FAR_FUTURE, TOKEN, start_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from jupyter_gpusched.client.api import GpuSchedClient  # noqa: E402

BIN = Path(sys.executable).parent


def timed(argv: list[str], env: dict[str, str], n: int) -> list[float]:
    """Wall seconds of ``n`` runs of ``argv`` (each must succeed)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


def squeue(n: int, queued: int) -> list[float] | None:
    """``squeue`` wall times on a loopback Slurm cluster with ``queued`` held jobs, or None."""
    from _fixtures_slurm import SlurmCluster, slurm_missing_reason

    if reason := slurm_missing_reason():
        print(f"squeue: skipped ({reason})")
        return None
    base = Path(tempfile.mkdtemp(prefix="gpusched-bench-squeue-"))
    base.chmod(0o755)
    cluster = SlurmCluster(base).start()
    try:
        subprocess.run(["sbatch", "--hold", f"--array=0-{queued - 1}", "--mem=10M",
                        f"--output={base}/%j.out", "--wrap", "true"],
                       env=cluster.env, check=True, capture_output=True)  # fmt: skip
        return timed(["squeue", "-r"], cluster.env, n)
    finally:
        cluster.cancel_all()
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15, help="runs of each (median)")
    parser.add_argument("--queued", type=int, default=200, help="waiting jobs")
    args = parser.parse_args(argv)
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs")  # fmt: skip
    peer = squeue(args.n, args.queued)

    root = Path(tempfile.mkdtemp(prefix="gpusched-bench-cli-"))
    proc, url, env = start_server(root)
    try:
        client = GpuSchedClient(url, TOKEN)
        spec = {"kind": "script", "command": ["true"], "not_before": FAR_FUTURE}
        client.submit_array(args.queued, spec)
        # Idle, as the figure says: let the passes that note why each new job waits finish.
        while True:
            t0 = time.perf_counter()
            client.list_jobs(limit=1)
            if time.perf_counter() - t0 < 0.05:
                break
            time.sleep(0.5)
        env = {k: v for k, v in env.items() if not k.startswith("GPUSCHED_")}
        ours = timed([str(BIN / "jupyter-gpusched"), "queue"], env, args.n)
        bare = timed([sys.executable, "-c", "pass"], env, args.n)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)

    med = statistics.median(ours)
    print(f"\nwall time, median of {args.n} ({args.queued} jobs queued):")
    print(f"  jupyter-gpusched queue (server found from jpserver-*.json): {med * 1000:7.1f} ms")
    print(f"  python -c pass (the interpreter's own start):              "
          f"{statistics.median(bare) * 1000:7.1f} ms")  # fmt: skip
    if peer:
        sq = statistics.median(peer)
        print(f"  squeue -r:                                                 {sq * 1000:7.1f} ms"
              f"   (ours / squeue = {med / sq:.1f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
