"""REST API throughput and latency against a live server with 10,000 jobs stored.

Starts ``jupyter server`` (only jupyter-gpusched enabled, the default 4-node simulated
cluster) on a store pre-filled with ``--history`` finished jobs, then measures

- submissions per second through ``POST jobs`` (queued jobs that wait for a far ``not_before``,
  so nothing runs), one client and ``--threads`` clients;
- ``GET jobs`` latency (p50/p95/p99) for the default page, a state filter, a user filter
  and a deep offset, with the server otherwise idle;
- the same ``GET jobs`` page again while a second process keeps ``--threads`` clients
  submitting (the load), with the submissions per second that load got meanwhile.

Run: ``.venv/bin/python bench/api.py [--history 10000] [--submits 200] [--threads 8]``
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _server import FAR_FUTURE, TOKEN, start_server

from jupyter_gpusched.client.api import GpuSchedClient
from jupyter_gpusched.core.clock import SystemClock
from jupyter_gpusched.core.models import JobState, parse_spec
from jupyter_gpusched.store.store import Store


def prefill(url: str, n: int) -> float:
    """``n`` finished jobs of 10 users, through the store's own API; seconds taken."""
    store = Store(url, clock=SystemClock())
    store.migrate()
    t0 = time.perf_counter()
    for i in range(n):
        spec = parse_spec(
            {"kind": "script", "command": ["python", f"run{i}.py"], "gpus": 1 + i % 4},
            user=f"user{i % 10}",
        )
        job = store.add_job(spec)
        store.transition(job.id, JobState.CANCELLED, reason="bench history")
    store.close()
    return time.perf_counter() - t0


def submit_rate(client: GpuSchedClient, n: int, threads: int) -> float:
    def one(i: int) -> None:
        client.submit(kind="script", command=["true"], not_before=FAR_FUTURE, name=f"b{i}")

    t0 = time.perf_counter()
    if threads == 1:
        for i in range(n):
            one(i)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(n)))
    return n / (time.perf_counter() - t0)


def latency_ms(call: object, n: int) -> tuple[float, float, float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()  # type: ignore[operator]
        samples.append((time.perf_counter() - t0) * 1000)
    q = statistics.quantiles(samples, n=100)
    return statistics.median(samples), q[94], q[98]


#: The submission load: its own process (its client threads would share this one's GIL and
#: slow the measured requests on the client side), submitting until stdin closes.
LOAD = """
import sys, threading
from concurrent.futures import ThreadPoolExecutor
from jupyter_gpusched.client.api import GpuSchedClient
client, done, count = GpuSchedClient(sys.argv[1], sys.argv[2]), threading.Event(), [0]
def submit_until_done(_):
    while not done.is_set():
        client.submit(kind="script", command=["true"], not_before=sys.argv[3])
        count[0] += 1
with ThreadPoolExecutor(int(sys.argv[4])) as pool:
    futures = [pool.submit(submit_until_done, i) for i in range(int(sys.argv[4]))]
    sys.stdin.read()
    done.set()
print(count[0])
"""


def under_load(url: str, threads: int, call: object, n: int) -> tuple[float, float, float, float]:
    """p50/p95/p99 of ``call`` while ``threads`` clients submit; the load's submits/s."""
    load = subprocess.Popen(
        [sys.executable, "-c", LOAD, url, TOKEN, FAR_FUTURE, str(threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # let the load reach its pace
    t0 = time.perf_counter()
    figures = latency_ms(call, n)
    elapsed = time.perf_counter() - t0
    submitted, _ = load.communicate("", timeout=60)
    return (*figures, int(submitted) / (elapsed + 1.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=10_000, help="finished jobs stored first")
    ap.add_argument("--submits", type=int, default=200, help="jobs submitted per measurement")
    ap.add_argument("--threads", type=int, default=8, help="concurrent clients")
    ap.add_argument("--gets", type=int, default=200, help="GET requests per query")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        store_url = f"sqlite:///{root / 'gpusched.db'}"
        fill_s = prefill(store_url, args.history)
        print(
            f"stored {args.history} finished jobs in {fill_s:.1f}s "
            f"({args.history / fill_s:.0f} jobs/s via Store.add_job + transition)"
        )
        proc, url, _ = start_server(root, store_url)
        try:
            client = GpuSchedClient(url, TOKEN)
            seq = submit_rate(client, args.submits, 1)
            par = submit_rate(client, args.submits, args.threads)
            total = client.list_jobs(limit=0).total
            print(
                f"POST jobs: {seq:.0f} submissions/s (1 client), {par:.0f}/s "
                f"({args.threads} clients); {total} jobs stored, "
                f"{2 * args.submits} of them queued"
            )
            queries = {
                "GET jobs (first 100)": {},
                "GET jobs?state=queued&limit=50": {"state": "queued", "limit": 50},
                "GET jobs?user=user3&limit=50": {"user": "user3", "limit": 50},
                "GET jobs?limit=50&offset=9000": {"limit": 50, "offset": 9000},
            }
            for label, query in queries.items():
                p50, p95, p99 = latency_ms(lambda q=query: client.list_jobs(**q), args.gets)
                print(f"{label:34s} p50 {p50:6.1f} ms  p95 {p95:6.1f} ms  p99 {p99:6.1f} ms")
            p50, p95, p99, rate = under_load(url, args.threads, client.list_jobs, args.gets * 2)
            print(
                f"GET jobs (first 100), {args.threads} clients submitting meanwhile "
                f"({rate:.0f} submits/s): p50 {p50:6.1f} ms  p95 {p95:6.1f} ms  p99 {p99:6.1f} ms"
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    print(
        f"machine: {os.cpu_count()} CPUs; command: {sys.executable} bench/api.py "
        + " ".join(sys.argv[1:])
    )


if __name__ == "__main__":
    main()
