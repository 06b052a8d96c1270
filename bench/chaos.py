"""The service killed with kill -9 at random moments while 200 jobs run: both stores, both windows.

The full-size run of ``tests/test_chaos.py``: the simulated nodes in a process of their own, one
``jupyter gpusched service`` on a SQLite file or a throw-away PostgreSQL, the lab's day or
night rules in force, 200 batch jobs of 0.2-4 s on 1, 2 or 4 GPUs with ``retries=2``, and the
service killed with kill -9 (half of the kills the moment a job is being launched) and started
again at once. Prints one table row per store and window: jobs lost, run twice, wrong final
states, GPUs held at the end with nothing running, GPU overlaps, and the time from restart to
the API answering (median / max). Meanwhile a retrying client (the project's API client, which
retries a create with its ``Idempotency-Key`` when no answer comes) makes ``--retrying``
more creates one after another; its column says how many were answered and how many jobs the
store holds beyond one per create (duplicates).

``--blips N`` runs the network side instead: each node reached through a loopback forwarder
whose line is cut N times for 4-12 s, a node with running jobs each time (less than the
service's 20 s ``node_down_after_s``, more than the few seconds it takes to count a node
unreachable), while 150 jobs of 10-30 s run with ``retries=1``, on both stores; then one
busy node cut past the grace. Prints jobs lost, run twice (work redone), killed, wrong final
states, GPU overlaps, and what became of the long cut's jobs (re-adopted, or stopped because
their retry ran).

Run: ``.venv/bin/python bench/chaos.py [--jobs 200] [--kills 8] [--seed 1] [--only sqlite-day]``
or ``.venv/bin/python bench/chaos.py --blips 15 [--jobs 150]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _fixtures_blip import run_blips  # noqa: E402
from _fixtures_chaos import run_chaos  # noqa: E402
from _fixtures_failover import SimNodes, kill_leftovers  # noqa: E402
from _fixtures_postgres import _Cluster, _find_bindir, create_database  # noqa: E402

HEADER = (
    "| store | window | jobs | kill -9 | lost | run twice | wrong final state | GPUs held "
    "| GPU overlaps | restart → answering (median / max) | of which scheduler start "
    "| retrying client | run |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--kills", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", help="one of sqlite-day, sqlite-night, postgres-day, postgres-night")
    p.add_argument(
        "--retrying", type=int, default=100, help="creates a retrying client makes meanwhile"
    )
    p.add_argument("--blips", type=int, default=0, help="cut the nodes' lines N times instead")
    args = p.parse_args(argv)
    if args.blips:
        return blips(args.blips, args.jobs if args.jobs != 200 else 150, args.seed)
    combos = [(s, w) for s in ("sqlite", "postgres") for w in ("day", "night")]
    if args.only:
        combos = [c for c in combos if "-".join(c) == args.only]
    root = Path(tempfile.mkdtemp(prefix="gpusched-chaos-"))
    pg = None
    if any(s == "postgres" for s, _ in combos):
        bindir = _find_bindir()
        if bindir is None:
            print("needs Debian's postgresql (make system-deps)", file=sys.stderr)
            return 2
        pg = _Cluster(bindir)
        pg.start()
    print(HEADER, flush=True)
    clean = True
    try:
        for n, (store, window) in enumerate(combos):
            run = root / f"{store}-{window}"
            run.mkdir()
            nodes = SimNodes(run / "nodes")
            try:
                if store == "sqlite":
                    url = f"sqlite:///{run / 'chaos.db'}"
                else:
                    assert pg is not None
                    url = create_database(pg.url, f"chaos_{window}")
                report = run_chaos(
                    run / "chaos",
                    store_url=url,
                    store=store,
                    window=window,
                    nodes=nodes.nodes,
                    jobs=args.jobs,
                    kills=args.kills,
                    seed=args.seed + n,
                    runtime_s=(0.2, 4.0),
                    timeout_s=1200.0,
                    retrying=args.retrying,
                )
            finally:
                nodes.stop()
                kill_leftovers(run / "chaos" / "runs")
            print(report.line(), flush=True)
            if not report.clean:
                clean = False
                for job_id, story in report.details.items():
                    print(f"  job {job_id}:", *story, sep="\n    ", flush=True)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0 if clean else 1


BLIP_HEADER = (
    "| store | jobs | line cuts (length) | lost | run twice | killed | wrong final state "
    "| GPU overlaps | long cut past the grace: its jobs | run |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def blips(cuts: int, jobs: int, seed: int) -> int:
    """Cut the nodes' lines ``cuts`` times on each store; one table row per store."""
    root = Path(tempfile.mkdtemp(prefix="gpusched-blips-"))
    bindir = _find_bindir()
    pg = _Cluster(bindir) if bindir is not None else None
    if pg is not None:
        pg.start()
    print(BLIP_HEADER, flush=True)
    clean = True
    try:
        for store in ("sqlite", "postgres") if pg is not None else ("sqlite",):
            run = root / store
            run.mkdir()
            nodes = SimNodes(run / "nodes")
            try:
                url = (
                    f"sqlite:///{run / 'blips.db'}"
                    if pg is None or store == "sqlite"
                    else create_database(pg.url, "blips")
                )
                report = run_blips(
                    run / "chaos", store_url=url, store=store, nodes=nodes.nodes,
                    jobs=jobs, blips=cuts, seed=seed,
                )  # fmt: skip
            finally:
                nodes.stop()
                kill_leftovers(run / "chaos" / "runs")
            print(report.line(), flush=True)
            clean = clean and report.clean
            for job_id, story in report.details.items():
                print(f"  job {job_id}:", *story, sep="\n    ", flush=True)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
