"""One user's flood against another user's reads, submits and starts, on the lab-wide service.

Issue #30, point 3: while one user (``mallory``) queues ``--jobs`` far-future jobs as arrays of
``--array`` (the flood), another (``alice``) lists the queue (``GET jobs?limit=20`` every
``--read-every-s``) and submits now and then; once the flood is in, alice's 1-GPU job is timed
from submit to start (``--starts`` times). The same is measured without the flood: ``quiet``
rounds, where alice does the same for as long as the flood round before took. Each round
starts a fresh ``jupyter gpusched service`` (store tokens, the embedded simulated cluster, a
SQLite store, the scheduler's default intervals), and ``flood`` and ``quiet`` rounds alternate
(which goes first alternates too). Printed per round and as min / median / max over the rounds,
with the load average beside each: alice's read latency (p50, p95, max), her submit latency
(p95) and answers other than 201, her job's start latency (median), and flood / quiet ratios of
the medians.

Run: ``.venv/bin/python bench/flood.py [--rounds 5] [--jobs 30000] [--array 10000]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _server import FAR_FUTURE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _fixtures_service import ServiceProcess  # noqa: E402

#: The scheduler's own defaults (the test fixtures' fast ticks would flatter every figure).
DEFAULT_INTERVALS = {"tick_interval_s": 1.0, "poll_interval_s": 2.0, "inventory_interval_s": 30.0}


@dataclass
class Round:
    """What alice saw in one round."""

    kind: str
    reads_ms: list[float] = field(default_factory=list)
    submits_ms: list[float] = field(default_factory=list)
    refused: dict[int, int] = field(default_factory=dict)  # status -> count, other than 201
    starts_ms: list[float] = field(default_factory=list)
    flood_s: float = 0.0
    load: float = 0.0

    def p(self, values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def call(service: ServiceProcess, token: str, method: str, path: str, body: Any = None) -> Any:
    """One request; (status, JSON answer or None)."""
    status, answer, _ = service.call(method, path, body, token=token, timeout_s=120)
    return status, answer


def alice_meanwhile(
    service: ServiceProcess, token: str, stop: threading.Event, out: Round, read_every_s: float
) -> None:
    """Read the queue every ``read_every_s``, submit a far-future job every tenth time."""
    n = 0
    while not stop.is_set():
        began = time.perf_counter()
        status, _ = call(service, token, "GET", "jobs?limit=20")
        out.reads_ms.append((time.perf_counter() - began) * 1000)
        if status != 200:
            out.refused[status] = out.refused.get(status, 0) + 1
        n += 1
        if n % 10 == 0:
            began = time.perf_counter()
            body = {"kind": "script", "command": ["true"], "not_before": FAR_FUTURE}
            status, _ = call(service, token, "POST", "jobs", body)
            out.submits_ms.append((time.perf_counter() - began) * 1000)
            if status != 201:
                out.refused[status] = out.refused.get(status, 0) + 1
        stop.wait(read_every_s)


def start_latency_ms(service: ServiceProcess, token: str) -> float:
    """Submit a 1-GPU job; milliseconds until the service says it started; then cancel it."""
    began = time.perf_counter()
    status, job = call(
        service, token, "POST", "jobs", {"kind": "script", "command": ["sleep", "60"]}
    )
    assert status == 201, status
    while True:
        _, now = call(service, token, "GET", f"jobs/{job['id']}")
        if now["state"] != "queued":
            took = (time.perf_counter() - began) * 1000
            break
        time.sleep(0.01)
    call(service, token, "DELETE", f"jobs/{job['id']}")
    return took


def one_round(kind: str, args: argparse.Namespace, quiet_s: float) -> Round:
    out = Round(kind)
    with tempfile.TemporaryDirectory(prefix="gpusched-flood-") as tmp:
        root = Path(tmp)
        (root / "config").mkdir()
        service = ServiceProcess(
            root,
            admins=("carol",),
            # the flooder may queue all of it (the lab's limits would refuse most of it)
            policy={
                "windows": [{"name": "all"}],
                "user_limits": {
                    "mallory": {"queued_jobs": args.jobs + 1000, "submits_per_s": 1000}
                },
            },
            **DEFAULT_INTERVALS,
        )
        service.start(timeout_s=120)
        try:
            alice, mallory = service.mint("alice"), service.mint("mallory")
            stop = threading.Event()
            watcher = threading.Thread(
                target=alice_meanwhile, args=(service, alice, stop, out, args.read_every_s)
            )
            watcher.start()
            began = time.perf_counter()
            if kind == "flood":
                body = {"kind": "script", "command": ["true"], "not_before": FAR_FUTURE}
                for _ in range(args.jobs // args.array):
                    status, _ = call(
                        service, mallory, "POST", "jobs", {**body, "array": args.array}
                    )
                    assert status == 201, f"the flood was refused: {status}"
            else:
                time.sleep(quiet_s)
            out.flood_s = time.perf_counter() - began
            stop.set()
            watcher.join()
            out.starts_ms = [start_latency_ms(service, alice) for _ in range(args.starts)]
            out.load = os.getloadavg()[0]
        finally:
            service.stop()
    return out


def show(r: Round) -> str:
    other = ",".join(f"{k}x{v}" for k, v in sorted(r.refused.items())) or "none"
    return (
        f"{r.kind:5}  reads p50 {r.p(r.reads_ms, 0.5):6.1f} p95 {r.p(r.reads_ms, 0.95):6.1f} "
        f"max {max(r.reads_ms, default=float('nan')):7.1f} ms ({len(r.reads_ms)})  "
        f"submits p95 {r.p(r.submits_ms, 0.95):6.1f} ms  not 2xx: {other}  "
        f"start {statistics.median(r.starts_ms):6.0f} ms  [{r.flood_s:5.1f} s, load {r.load:.2f}]"
    )


def spread(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each kind")
    parser.add_argument("--jobs", type=int, default=30_000, help="far-future jobs of the flood")
    parser.add_argument("--array", type=int, default=10_000, help="jobs per POST of the flood")
    parser.add_argument("--read-every-s", type=float, default=0.05, help="alice's read pace")
    parser.add_argument("--starts", type=int, default=3, help="start latencies per round")
    args = parser.parse_args()

    rounds: dict[str, list[Round]] = {"flood": [], "quiet": []}
    quiet_s = 10.0
    for i in range(args.rounds):
        for kind in ("flood", "quiet") if i % 2 == 0 else ("quiet", "flood"):
            r = one_round(kind, args, quiet_s)
            if kind == "flood":
                quiet_s = r.flood_s  # the quiet rounds read for as long as a flood lasted
            rounds[kind].append(r)
            print(f"round {i + 1}  {show(r)}", flush=True)

    print(f"\n{args.rounds} rounds each, min / median / max:")
    for kind, rs in rounds.items():
        print(
            f"{kind:5}  reads p95 {spread([r.p(r.reads_ms, 0.95) for r in rs])} ms, "
            f"max {spread([max(r.reads_ms) for r in rs])} ms; "
            f"submits p95 {spread([r.p(r.submits_ms, 0.95) for r in rs])} ms; "
            f"start {spread([statistics.median(r.starts_ms) for r in rs])} ms; "
            f"load {spread([r.load for r in rs])}; "
            f"not 2xx {sum(sum(r.refused.values()) for r in rs)}"
        )
    flood, quiet = rounds["flood"], rounds["quiet"]
    ratio = [
        f.p(f.reads_ms, 0.95) / q.p(q.reads_ms, 0.95) for f, q in zip(flood, quiet, strict=True)
    ]
    starts = [
        statistics.median(f.starts_ms) / statistics.median(q.starts_ms)
        for f, q in zip(flood, quiet, strict=True)
    ]
    print(f"flood / quiet, paired by round: reads p95 {spread(ratio)}x, start {spread(starts)}x")


if __name__ == "__main__":
    main()
