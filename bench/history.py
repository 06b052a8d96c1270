"""A year of a lab's jobs in the store: the server's memory, idle CPU, restart and reads.

Fills a store with ``--ended`` finished jobs (each with its submit, start and end events and a
usage stretch, as a real run leaves them) of ``--users`` users and ``--queued`` jobs waiting
for a far ``not_before``, then starts ``jupyter server`` (only jupyter-gpusched, the embedded
simulated cluster) on it and measures, against the same server on an empty store (the peer:
what the figures would be if history cost nothing), in alternating rounds:

- seconds from the process's start to the first answered ``GET jobs``;
- the server's RSS once it settled, and its CPU while nothing happens (``--idle`` seconds);
- ``GET jobs`` latency (the default page of 100), idle and while 8 clients submit jobs that
  wait for a far ``not_before`` (with the submits/s they got; they stay in the store).

Run: ``.venv/bin/python bench/history.py [--ended 1000000] [--queued 10000] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _server import FAR_FUTURE, TOKEN, start_server
from api import under_load
from sqlalchemy import insert

from jupyter_gpusched.core.clock import SystemClock
from jupyter_gpusched.core.models import parse_spec, stored_spec
from jupyter_gpusched.store.orm import EventRow, JobRow, UsageRow
from jupyter_gpusched.store.store import Store

CHUNK = 5_000


def fill(url: str, ended: int, queued: int, users: int) -> float:
    """Store the history and the queue through SQL inserts (the store's own API takes hours
    for a million jobs); seconds taken."""
    store = Store(url, clock=SystemClock())
    store.migrate()
    t0 = time.perf_counter()
    start = datetime.now(UTC) - timedelta(days=365)
    step = timedelta(days=365) / max(ended, 1)
    specs = [
        stored_spec(
            parse_spec(
                {"kind": "script", "command": ["python", "train.py"], "gpus": 1 + u % 4},
                user=f"user{u:03d}",
            )
        ).model_dump(mode="json")
        for u in range(users)
    ]
    with store.engine.begin() as conn:
        for lo in range(0, ended, CHUNK):
            jobs, events, usage = [], [], []
            ids = range(lo + 1, min(lo + CHUNK, ended) + 1)
            for i in ids:
                u = i % users
                at = start + step * i
                began, done = at + timedelta(seconds=30), at + timedelta(seconds=30 + i % 7200)
                state = "succeeded" if i % 10 else "failed"
                jobs.append(
                    {
                        "id": i,
                        "version": 3,
                        "state": state,
                        "username": f"user{u:03d}",
                        "kind": "script",
                        "priority_class": "normal",
                        "submitted_at": at,
                        "node": f"a100-{i % 2}",
                        "held": False,
                        "started_at": began,
                        "finished_at": done,
                        "last_activity_at": None,
                        "exit_code": 0 if i % 10 else 1,
                        "reason": None,
                        "attempt": 0,
                        "spec": specs[u],
                        "handle": {"pid": 1000 + i % 30000, "ended_hooks_done": True},
                        "placement": {"node": f"a100-{i % 2}", "gpu_indices": [i % 8]},
                        "not_before": None,
                        "array_id": None,
                    }
                )
                events += [
                    {
                        "at": at,
                        "job_id": i,
                        "kind": "submitted",
                        "from_state": None,
                        "to_state": "queued",
                        "detail": {"user": f"user{u:03d}"},
                    },
                    {
                        "at": began,
                        "job_id": i,
                        "kind": "state",
                        "from_state": "starting",
                        "to_state": "running",
                        "detail": {},
                    },
                    {
                        "at": done,
                        "job_id": i,
                        "kind": "state",
                        "from_state": "running",
                        "to_state": state,
                        "detail": {},
                    },
                ]
                usage.append(
                    {
                        "job_id": i,
                        "username": f"user{u:03d}",
                        "gpus": 1.0,
                        "started_at": began,
                        "finished_at": done,
                    }
                )
            conn.execute(insert(JobRow.__table__), jobs)
            conn.execute(insert(EventRow.__table__), events)
            conn.execute(insert(UsageRow.__table__), usage)
    for lo in range(0, queued, CHUNK):
        spec = parse_spec(
            {"kind": "script", "command": ["true"], "not_before": FAR_FUTURE}, user="waiting"
        )
        store.add_jobs([spec] * min(CHUNK, queued - lo))
    store.close()
    return time.perf_counter() - t0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(url: str, path: str) -> bytes:
    req = urllib.request.Request(url + path, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def measure(
    root: Path, store_url: str, idle_s: float, reads: int, clients: int = 8
) -> dict[str, float]:
    """One server start on ``store_url``: start-up, settled RSS, idle CPU, GET jobs times
    (idle, and while ``clients`` submit far-future jobs: their submits/s too)."""
    t0 = time.perf_counter()
    proc, url, _ = start_server(root, store_url)
    try:
        get(url, "gpusched/api/jobs")
        started = time.perf_counter() - t0
        time.sleep(5)  # let the first passes run
        c0, w0 = cpu_s(proc.pid), time.perf_counter()
        time.sleep(idle_s)
        idle = (cpu_s(proc.pid) - c0) / (time.perf_counter() - w0)
        times = []
        for _ in range(reads):
            r0 = time.perf_counter()
            json.loads(get(url, "gpusched/api/jobs"))
            times.append(time.perf_counter() - r0)
        times.sort()
        page = lambda: get(url, "gpusched/api/jobs")  # noqa: E731
        _, _, load_p99, rate = under_load(url, clients, page, reads)
        return {
            "start_s": started,
            "rss_mib": rss_mib(proc.pid),
            "idle_cpu": idle,
            "get_p50_ms": 1000 * times[len(times) // 2],
            "get_p99_ms": 1000 * times[min(len(times) - 1, int(len(times) * 0.99))],
            "loaded_p99_ms": load_p99,
            "submits_s": rate,
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def summary(values: list[float], fmt: str) -> str:
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ended", type=int, default=1_000_000)
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measured")
    ap.add_argument("--reads", type=int, default=200, help="GET jobs per round")
    ap.add_argument("--store", default=None, help="a filled store's URL to reuse (SQLite file)")
    args = ap.parse_args(argv)
    print("command: python " + " ".join(["bench/history.py", *(argv or sys.argv[1:])]))
    with tempfile.TemporaryDirectory(prefix="gpusched-history-") as tmp:
        tmp_path = Path(tmp)
        full = args.store or f"sqlite:///{tmp_path / 'full.db'}"
        if args.store is None:
            took = fill(full, args.ended, args.queued, args.users)
            print(f"filled {args.ended} ended + {args.queued} queued jobs in {took:.0f} s")
        # a first start weighs the new queue once (as submits would have), not measured
        warm = measure(tmp_path / "warm-up", full, 1.0, 10)
        print(f"warm-up start: {warm['start_s']:.1f} s, RSS {warm['rss_mib']:.0f} MiB")
        results: dict[str, list[dict[str, float]]] = {"empty": [], "full": []}
        for r in range(args.rounds):
            for name in ("empty", "full") if r % 2 == 0 else ("full", "empty"):
                root = tmp_path / f"{name}-{r}"
                url = f"sqlite:///{tmp_path / 'empty.db'}" if name == "empty" else full
                load = os.getloadavg()[0]
                m = measure(root, url, args.idle, args.reads)
                m["load"] = load
                results[name].append(m)
                print(
                    f"round {r} {name:5}: " + ", ".join(f"{k} {v:.3g}" for k, v in m.items()),
                    flush=True,
                )
        print(
            f"\nmin/median/max over {args.rounds} rounds, alternating "
            f"({args.ended} ended + {args.queued} queued against an empty store)"
        )
        for key, fmt in (
            ("start_s", "{:.2f}"),
            ("rss_mib", "{:.0f}"),
            ("idle_cpu", "{:.3f}"),
            ("get_p50_ms", "{:.1f}"),
            ("get_p99_ms", "{:.1f}"),
            ("loaded_p99_ms", "{:.1f}"),
            ("submits_s", "{:.0f}"),
            ("load", "{:.1f}"),
        ):
            full_v = [m[key] for m in results["full"]]
            empty_v = [m[key] for m in results["empty"]]
            print(f"{key:11} full {summary(full_v, fmt):>22}   empty {summary(empty_v, fmt):>22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
