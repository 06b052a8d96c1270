"""The lab-wide service against one person's server: submissions per second, same run.

Starts a personal ``jupyter server`` (only jupyter-gpusched) and a ``jupyter gpusched
service`` (store tokens, no Hub), each with the embedded simulated cluster, its own SQLite
store and the scheduler's default intervals; the service's user gets limits high enough not
to throttle a bench (its defaults would: that is their job). Then, in ``--rounds`` rounds,
each submits ``--submits`` jobs that wait for a far ``not_before`` from one client and from
``--clients`` clients (threads); who goes first alternates. Printed per round with the load
average, then min / median / max of service / personal ratios.

Run: ``.venv/bin/python bench/service.py [--rounds 5] [--submits 200] [--clients 8]``
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

from _server import TOKEN, start_server
from api import submit_rate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _fixtures_service import ServiceProcess  # noqa: E402

from jupyter_gpusched.client.api import GpuSchedClient  # noqa: E402

#: The scheduler's own defaults (the test fixtures' fast ticks would flatter every figure).
DEFAULT_INTERVALS = {"tick_interval_s": 1.0, "poll_interval_s": 2.0, "inventory_interval_s": 30.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--submits", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args(argv)
    print("command: python " + " ".join(["bench/service.py", *(argv or sys.argv[1:])]))
    with tempfile.TemporaryDirectory(prefix="gpusched-service-bench-") as tmp:
        root = Path(tmp)
        personal, url, _ = start_server(root / "personal")
        (root / "service" / "config").mkdir(parents=True)
        service = ServiceProcess(
            root / "service",
            policy={
                "windows": [{"name": "all"}],
                "user_limits": {"alice": {"queued_jobs": 1_000_000, "submits_per_s": 100_000}},
            },
            **DEFAULT_INTERVALS,
        )
        service.start(timeout_s=120)
        try:
            clients = {
                "personal": GpuSchedClient(url, TOKEN),
                "service": GpuSchedClient(service.url, service.mint("alice")),
            }
            rows: dict[str, list[float]] = {"1": [], str(args.clients): []}
            for r in range(args.rounds):
                order = ["personal", "service"] if r % 2 == 0 else ["service", "personal"]
                for threads in (1, args.clients):
                    rate = {}
                    load = os.getloadavg()[0]
                    for name in order:
                        rate[name] = submit_rate(clients[name], args.submits, threads)
                    ratio = rate["service"] / rate["personal"]
                    rows[str(threads)].append(ratio)
                    print(
                        f"round {r} ({order[0]} first), {threads} client(s): service "
                        f"{rate['service']:.0f}/s, personal {rate['personal']:.0f}/s, ratio "
                        f"{ratio:.2f}, load {load:.1f}",
                        flush=True,
                    )
        finally:
            service.stop()
            personal.send_signal(signal.SIGTERM)
            personal.wait(30)
    print(f"\nservice / personal submits/s, min/median/max over {args.rounds} rounds:")
    for threads, ratios in rows.items():
        print(
            f"  {threads} client(s): {min(ratios):.2f} / {statistics.median(ratios):.2f} / "
            f"{max(ratios):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
