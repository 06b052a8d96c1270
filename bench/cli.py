"""Wall time of ``jupyter gpusched queue`` against ``squeue -r``, rounds alternating (issue 37).

Starts ``jupyter server`` (only jupyter-gpusched, the default simulated cluster) holding
``--queued`` single waiting jobs (submitted as lists of at most 1,000 in ``POST jobs`` bodies,
so each is a record of its own, not one array), and Debian's Slurm 22.05 on loopback holding as
many held jobs, each submitted alone (a record each, as ours are; ``squeue -r`` prints each).
Then ``--rounds`` rounds; each times ``jupyter-gpusched queue`` as a user runs it (a fresh
process that finds the server through the runtime dir's ``jpserver-*.json`` files and prints
the first 100 rows and the count of the rest) ``--n`` times and ``squeue -r`` ``--n`` times,
which goes first alternating, and prints the round's medians beside the load average. Then the
min/median/max of the rounds' medians. ``--full`` also times the full traitlets application
(``queue --QueueApp.limit=100`` takes it: the same page) in each round, the path every
``queue`` took before the quick one.

Run: ``.venv/bin/python bench/cli.py [--rounds 5] [--n 10] [--queued 3000] [--full]``
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
from collections.abc import Callable
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


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def fill(client: GpuSchedClient, queued: int) -> None:
    """``queued`` single far-future jobs, in lists of at most 1,000 a request."""
    spec = {"kind": "script", "command": ["true"], "not_before": FAR_FUTURE}
    left = queued
    while left:
        batch = min(left, 1000)
        client.submit_many([spec] * batch)
        left -= batch
    # Idle, as a user finds it: let the passes that note why each new job waits finish.
    while True:
        t0 = time.perf_counter()
        client.list_jobs(limit=1)
        if time.perf_counter() - t0 < 0.05:
            break
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (>= 5)")
    parser.add_argument("--n", type=int, default=10, help="runs of each command a round")
    parser.add_argument("--queued", type=int, default=3000, help="waiting jobs in each")
    parser.add_argument("--full", action="store_true", help="also time the full application")
    args = parser.parse_args(argv)
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"load average before: {load()} on {os.cpu_count()} CPUs")

    from _fixtures_slurm import SlurmCluster, slurm_missing_reason

    if reason := slurm_missing_reason():
        print(f"squeue: cannot run here ({reason}); the figure needs the peer in the same run")
        return 1
    base = Path(tempfile.mkdtemp(prefix="gpusched-bench-squeue-"))
    base.chmod(0o755)
    cluster = SlurmCluster(base).start()
    root = Path(tempfile.mkdtemp(prefix="gpusched-bench-cli-"))
    proc, url, env = start_server(root)
    try:
        # 3,000 held jobs, each a record of its own as ours are (not one array record).
        sbatch = (f"sbatch --hold --mem=10M --output={base}/%j.out --wrap true >/dev/null "
                  f"&& echo x")  # fmt: skip
        subprocess.run(["xargs", "-P", "4", "-I", "{}", "sh", "-c", sbatch],
                       input="\n".join(map(str, range(args.queued))), text=True,
                       env=cluster.env, check=True, capture_output=True)  # fmt: skip
        lines = subprocess.run(["squeue", "-r"], env=cluster.env, check=True,
                               capture_output=True, text=True).stdout.count("\n")  # fmt: skip
        client = GpuSchedClient(url, TOKEN)
        fill(client, args.queued)
        env = {k: v for k, v in env.items() if not k.startswith("GPUSCHED_")}
        ours_argv = [str(BIN / "jupyter-gpusched"), "queue"]
        shown = subprocess.run(ours_argv, env=env, check=True, capture_output=True, text=True)
        print(f"jobs queued: {client.list_jobs(limit=1).total} (gpusched), "
              f"{lines - 1} lines of squeue -r; ours prints {shown.stdout.count(chr(10))} "
              f"lines: {shown.stdout.splitlines()[-1]!r}")  # fmt: skip
        runs: dict[str, Callable[[], list[float]]] = {
            "ours": lambda: timed(ours_argv, env, args.n),
            "squeue": lambda: timed(["squeue", "-r"], cluster.env, args.n),
        }
        if args.full:
            full_argv = [*ours_argv, "--QueueApp.limit=100"]
            runs["full app"] = lambda: timed(full_argv, env, args.n)
        bare = statistics.median(timed([sys.executable, "-c", "pass"], env, args.n))
        print(f"python -c pass: {bare * 1000:.1f} ms (median of {args.n})\n")
        print(f"medians of {args.n} runs a round (ms):")
        rounds: list[dict[str, float]] = []
        for r in range(args.rounds):
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]
            before = load()
            med = {name: statistics.median(runs[name]()) * 1000 for name in order}
            rounds.append(med)
            said = "  ".join(f"{name} {med[name]:6.1f}" for name in runs)
            print(f"  round {r + 1} ({' then '.join(order)}): {said}  "
                  f"ours/squeue {med['ours'] / med['squeue']:.2f}  "
                  f"load {before} -> {load()}")  # fmt: skip
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        cluster.cancel_all()
        cluster.stop()

    print("\nover the rounds' medians: min / median / max (ms)")
    for name in runs:
        xs = [m[name] for m in rounds]
        print(f"  {name:9} {min(xs):7.1f} / {statistics.median(xs):7.1f} / {max(xs):7.1f}")
    ratio = [m["ours"] / m["squeue"] for m in rounds]
    print(f"  ours / squeue, per round: {min(ratio):.2f} / {statistics.median(ratio):.2f} / "
          f"{max(ratio):.2f} (goal <= 1.5)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
