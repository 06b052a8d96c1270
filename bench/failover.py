"""Two services on one PostgreSQL store, the leader killed with kill -9 while 200 jobs run.

The full-size run of ``tests/test_failover.py``: a throw-away PostgreSQL, the simulated nodes in
a process of their own, two ``jupyter gpusched service`` processes (leader lease TTL 3 s), 200
batch jobs of 0.5-6 s on 1, 2 or 4 GPUs, an every-minute notebook definition, and the leader
killed with kill -9 at random moments (after each kill the victim comes back as a standby),
then hung with SIGSTOP until a standby takes over (its lease must expire: the TTL-bound case)
and woken up again (its late writes must be refused).
Prints jobs lost, jobs run twice, GPU overlaps, duplicate cron firings and each takeover time
(kill -> the standby says it leads).

Run: ``.venv/bin/python bench/failover.py [--jobs 200] [--kills 3] [--seed 1]``
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _fixtures_failover import SimNodes, audit, job_spec, kill_leftovers, start_pair  # noqa: E402
from _fixtures_postgres import _Cluster, _find_bindir  # noqa: E402

ENDED = ("succeeded", "failed", "cancelled", "lost")


def notebook() -> dict[str, object]:
    """A one-cell notebook, sent as content (the service reads no paths)."""
    cell = {"cell_type": "code", "metadata": {}, "source": "print('tick')", "outputs": [],
            "execution_count": None}  # fmt: skip
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return {"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4,
            "nbformat_minor": 5}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--freezes", type=int, default=1, help="leaders hung with SIGSTOP")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    bindir = _find_bindir()
    if bindir is None:
        print("needs Debian's postgresql (make system-deps)", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="gpusched-failover-"))
    cluster = _Cluster(bindir)
    cluster.start()
    runs = root / "runs"
    runs.mkdir()
    nodes = SimNodes(root / "nodes")
    rng = random.Random(args.seed)
    pair = None
    try:
        pair = start_pair(root, cluster.url, nodes.nodes)
        api, token = pair.services[0], pair.services[0].admin_token
        began = time.monotonic()
        ids = []
        for _ in range(args.jobs):
            spec = job_spec(runs, rng.uniform(0.5, 6.0), rng.choice((1, 1, 1, 2, 4)))
            ids.append(api.api("POST", "jobs", spec, token=token)["id"])
        cron = api.api("POST", "definitions", {"notebook": "cron.ipynb", "schedule": "* * * * *",
                                               "content": notebook()}, token=token)  # fmt: skip
        takeovers = []
        for _ in range(args.kills):
            time.sleep(rng.uniform(2.0, 8.0))
            _, took_s = pair.kill_leader()
            takeovers.append(took_s)
        frozen = []
        for _ in range(args.freezes):
            time.sleep(rng.uniform(2.0, 5.0))
            frozen.append(pair.freeze_leader())
        while True:
            live = pair.leader()
            jobs = {j["id"]: j for j in live.api("GET", "jobs?limit=1000", token=token)["jobs"]}
            if all(jobs[i]["state"] in ENDED for i in ids):
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - began
        seen = audit(runs)
        fired = live.api("GET", f"definitions/{cron['id']}", token=token)["runs"]
        times = [r["fire_at"] for r in fired]
        not_ok = {i: jobs[i]["state"] for i in ids if jobs[i]["state"] != "succeeded"}
        print(f"jobs {len(ids)}, kills {args.kills}, all ended after {elapsed:.0f} s")
        print(f"jobs not succeeded (lost or failed): {len(not_ok)} {not_ok or ''}")
        print(f"jobs run twice: {sum(1 for n in seen.starts.values() if n > 1)}")
        print(f"jobs never run: {len(set(ids) - set(seen.starts))}")
        print(f"GPU overlaps: {len(seen.overlaps)} {seen.overlaps or ''}")
        print(f"cron firings: {len(times)}, duplicates: {len(times) - len(set(times))}")
        print("takeover after kill -9: " + ", ".join(f"{t:.1f} s" for t in takeovers))
        print("takeover from a leader hung (SIGSTOP): " + ", ".join(f"{t:.1f} s" for t in frozen))
        return 0 if not (not_ok or seen.overlaps or len(times) != len(set(times))) else 1
    finally:
        if pair is not None:
            for service in pair.services:
                service.stop()
        nodes.stop()
        kill_leftovers(runs)
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
