"""Submissions per second through ``POST jobs``, with an empty queue and a long one, and bulk.

Starts ``jupyter server`` (only jupyter-gpusched, the default simulated cluster, a SQLite store)
and measures, in one run:

- REST submissions per second, one client and ``--clients`` clients (threads, one job per
  request), with an empty queue (it holds the jobs of the figures before: at most
  2 x rounds x submits), again with ``--queued`` jobs waiting (queued jobs wait
  for a far ``not_before``, so nothing runs and the queue stays as long as it is), and again
  with every GPU taken by a long job and ``--queued`` more jobs that could start now but fit
  nowhere (a busy lab: each pass weighs them);
- a bulk submit: ``array: N`` in one request, jobs per second (median of ``--rounds``);
- the busy lab again, paired: a second server with the busy lab's queue and a fresh one side
  by side, ``--pairs`` rounds of ``--clients`` clients alternating between them (which goes
  first alternates too), each busy round divided by the empty round next to it; a figure
  above is three rounds of a second or less, in which one full pass (every 1-10 s) or one
  inventory probe weighs a lot, so the paired ratios say more about "flat";
- about the ceiling of any request through Jupyter on this machine: Jupyter's own
  ``GET api/status`` (auth and a small JSON answer) per second, one client and ``--clients``
  clients, on the same connections;
- when Slurm works on this machine (``tests/_fixtures_slurm``: Debian's slurmctld + slurmd on
  loopback), plain ``sbatch --hold`` side by side: one and ``--clients`` at once, and
  ``sbatch --array``; otherwise a line says why it was skipped.

Ratios are of figures from this same run. Run:
``.venv/bin/python bench/submit.py [--submits 300] [--clients 8] [--queued 3000]``
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _server import FAR_FUTURE, TOKEN, start_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from jupyter_gpusched.client import transport  # noqa: E402
from jupyter_gpusched.client.api import GpuSchedClient  # noqa: E402

SPEC = {"kind": "script", "command": ["true"], "gpus": 1, "not_before": FAR_FUTURE}
#: A job that could start now: queued while every GPU is taken, it fits nowhere.
BUSY = {"kind": "script", "command": ["true"], "gpus": 1}


def fill_cluster(client: GpuSchedClient) -> list[int]:
    """Take every GPU with one long job per node; their ids, once all run."""
    ids = [
        client.submit(kind="script", command=["sleep", "3600"], gpus=len(node.gpus)).id
        for node in client.cluster().nodes
    ]
    deadline = time.monotonic() + 60
    while any(client.get_job(i).state != "running" for i in ids):
        if time.monotonic() > deadline:
            raise SystemExit("the cluster-filling jobs did not all start within 60 s")
        time.sleep(0.2)
    return ids


def rate(n: int, clients: int, submit_one: Callable[[], object]) -> float:
    """Jobs per second for ``n`` submissions made by ``clients`` threads."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda _: submit_one(), range(n)))
    return n / (time.perf_counter() - t0)


def rest(client: GpuSchedClient, n: int, clients: int, rounds: int) -> float:
    """Median over ``rounds`` of REST submissions per second."""
    return statistics.median(rate(n, clients, lambda: client.submit(SPEC)) for _ in range(rounds))


def status_floor(url: str, n: int, clients: int, rounds: int) -> float:
    """Median over ``rounds`` of Jupyter's ``GET api/status`` per second, our transport."""
    headers = {"Authorization": f"token {TOKEN}"}
    status = url.rstrip("/") + "/api/status"

    def one() -> None:
        answer = transport.request("GET", status, body=None, headers=headers, timeout=30)
        assert answer.status == 200, answer.status

    return statistics.median(rate(n, clients, one) for _ in range(rounds))


def bulk(client: GpuSchedClient, n: int, rounds: int) -> float:
    """Median over ``rounds`` of jobs per second queued by one ``array: n`` request."""
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        answer = client.submit_array(n, SPEC)
        rates.append(len(answer.jobs) / (time.perf_counter() - t0))
    return statistics.median(rates)


def slurm(n: int, clients: int, array: int, rounds: int) -> dict[str, float] | None:
    """Plain sbatch figures on a loopback Slurm cluster, or None (a line says why)."""
    from _fixtures_slurm import SlurmCluster, slurm_missing_reason

    reason = slurm_missing_reason()
    if reason:
        print(f"sbatch: skipped ({reason})")
        return None
    base = Path(tempfile.mkdtemp(prefix="gpusched-bench-sbatch-"))
    base.chmod(0o755)
    cluster = SlurmCluster(base).start()
    argv = ["sbatch", "--parsable", "--hold", "--mem=10M", f"--output={base}/%j.out"]
    argv += ["--wrap", "true"]

    def one() -> None:
        subprocess.run(argv, env=cluster.env, check=True, capture_output=True)

    array = min(array, 1000)  # Slurm's default MaxArraySize is 1001

    def arr() -> float:
        t0 = time.perf_counter()
        subprocess.run([*argv[:2], f"--array=0-{array - 1}", *argv[2:]], env=cluster.env,
                       check=True, capture_output=True)  # fmt: skip
        return array / (time.perf_counter() - t0)

    try:
        out = {
            "1": statistics.median(rate(n, 1, one) for _ in range(rounds)),
            str(clients): statistics.median(rate(n, clients, one) for _ in range(rounds)),
        }
        cluster.cancel_all()
        out["array"] = statistics.median(arr() for _ in range(rounds))
        out["array_size"] = array
        cluster.cancel_all()
        return out
    finally:
        cluster.stop()


def paired_busy(n: int, clients: int, queued: int, pairs: int) -> None:
    """Busy lab against an empty queue on two servers at once, rounds alternating; prints."""
    servers: list[subprocess.Popen[bytes]] = []
    servers_clients: list[tuple[GpuSchedClient, dict[str, object]]] = []
    try:
        for busy in (False, True):
            proc, url, _ = start_server(Path(tempfile.mkdtemp(prefix="gpusched-bench-pair-")))
            servers.append(proc)
            client = GpuSchedClient(url, TOKEN)
            if busy:
                fill_cluster(client)
                client.submit_array(queued, BUSY)
            rate(n, clients, lambda c=client, s=BUSY if busy else SPEC: c.submit(s))  # warm
            servers_clients.append((client, BUSY if busy else SPEC))
        rates: dict[bool, list[float]] = {False: [], True: []}
        for i in range(pairs):
            for busy in (i % 2 == 1, i % 2 == 0):
                client, spec = servers_clients[busy]
                rates[busy].append(rate(n, clients, lambda c=client, s=spec: c.submit(s)))
    finally:
        for proc in servers:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    ratios = [b / e for b, e in zip(rates[True], rates[False], strict=True)]
    print(
        f"  busy lab, paired ({pairs} rounds of {n} from {clients} clients on each of two "
        f"servers): busy / empty {', '.join(f'{r:.2f}' for r in ratios)}; median "
        f"{statistics.median(ratios):.2f}; empty {statistics.median(rates[False]):.1f}/s, "
        f"busy {statistics.median(rates[True]):.1f}/s (medians)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=300, help="REST submits per figure")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--queued", type=int, default=3000, help="queue length of the 2nd run")
    parser.add_argument("--array", type=int, default=5000, help="jobs per bulk submit")
    parser.add_argument("--rounds", type=int, default=3, help="medians of this many")
    parser.add_argument("--pairs", type=int, default=8, help="busy/empty pairs; 0: skip")
    args = parser.parse_args(argv)
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs")  # fmt: skip
    peer = slurm(args.submits, args.clients, args.array, args.rounds)

    root = Path(tempfile.mkdtemp(prefix="gpusched-bench-submit-"))
    proc, url, _ = start_server(root)
    try:
        client = GpuSchedClient(url, TOKEN)
        client.submit(SPEC)  # warm the server's first-request paths
        figures = {}
        for clients in (1, args.clients):
            figures[("empty", clients)] = rest(client, args.submits, clients, args.rounds)
        # Fill the queue to --queued waiting jobs (bulk: it is quick), then measure again.
        waiting = client.list_jobs(state="queued", limit=0).total
        while waiting < args.queued:
            waiting += len(client.submit_array(min(5000, args.queued - waiting), SPEC).jobs)
        before = {"empty": 0, "queued": waiting}
        for clients in (1, args.clients):
            figures[("queued", clients)] = rest(client, args.submits, clients, args.rounds)
        # A busy lab: every GPU taken by a long job, and --queued more jobs that could start
        # now but fit nowhere (the queue waiting for a far not_before stays too).
        fillers = fill_cluster(client)
        client.submit_array(args.queued, BUSY)
        before["busy"] = args.queued
        for clients in (1, args.clients):
            figures[("busy", clients)] = rest(client, args.submits, clients, args.rounds)
        for job_id in fillers:
            client.cancel(job_id)
        bulk_rate = bulk(client, args.array, args.rounds)  # last: it lengthens the queue
        floor = {k: status_floor(url, args.submits, k, args.rounds) for k in (1, args.clients)}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)

    print(f"\nREST submissions per second ({args.submits} per figure, median of {args.rounds}):")
    for clients in (1, args.clients):
        empty, full = figures[("empty", clients)], figures[("queued", clients)]
        line = f"  {clients} client(s): empty queue {empty:7.1f}/s"
        line += f"   with {before['queued']}+ queued {full:7.1f}/s"
        line += f"   (long / empty = {full / empty:.2f})"
        busy = figures[("busy", clients)]
        line += f"   with {before['busy']} more fitting nowhere {busy:7.1f}/s"
        line += f"   (busy / empty = {busy / empty:.2f})"
        if peer:
            line += f"   sbatch {peer[str(clients)]:7.1f}/s (ours / sbatch = "
            line += f"{empty / peer[str(clients)]:.2f})"
        print(line)
    for clients in (1, args.clients):
        print(
            f"  {clients} client(s): Jupyter's own GET api/status {floor[clients]:7.1f}/s "
            f"(about the ceiling of a Jupyter request; submits / that = "
            f"{figures[('empty', clients)] / floor[clients]:.2f})"
        )
    if args.pairs:
        paired_busy(args.submits, args.clients, args.queued, args.pairs)
    line = f"bulk submit, array of {args.array} in one request: {bulk_rate:9.0f} jobs/s"
    if peer:
        line += f"   sbatch --array of {peer['array_size']:.0f}: {peer['array']:9.0f} tasks/s"
        line += f" (ours / sbatch = {bulk_rate / peer['array']:.2f})"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
