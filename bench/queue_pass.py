"""The placing passes against the length of the queue: the one a submit wakes, and a full one.

The scheduler on the in-memory cluster (the tests' default lab, 2 x 8 A100, 4 V100, 2 T4;
night, so no GPUs are kept for interactive work) with a SQLite file store, every GPU taken by a
long job, and ``N`` jobs waiting: ``busy`` jobs could start now but fit nowhere (a busy lab),
``later`` jobs wait for a far ``not_before``. Each figure is the median wall time of
``--passes`` place-only passes, each after one more submit (what ``POST jobs`` wakes): that
pass weighs only the new job (:mod:`jupyter_gpusched.scheduling.increments`). The full pass,
which weighs the whole queue (after any change but a submission, and as time moves on: each
second while it is cheap, as seldom as every 10 s when it is long), is timed the same way with
a full pass asked for. Baselines: the same passes with an empty queue, in this process. Last,
the full pass with 100 waiting after ``--history`` jobs ran and ended within the fortnight
whose usage fair share weighs, against it without them.

    .venv/bin/python bench/queue_pass.py [--sizes 0 1000 3000] [--passes 20] [--history 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _fixtures_scheduler import SATURDAY_NIGHT, memory_scheduler  # noqa: E402

from jupyter_gpusched.cluster.memory import Run  # noqa: E402
from jupyter_gpusched.core.models import JobState, Placement, parse_spec  # noqa: E402
from jupyter_gpusched.store.store import Store  # noqa: E402

FAR_FUTURE = "2099-01-01T00:00:00+00:00"
#: every GPU of the default lab, taken for as long as the bench runs
FILL = [(8, "A100"), (8, "A100"), (4, "V100"), (2, "T4")]


async def pass_ms(n: int, waiting: str, passes: int, *, full: bool, history: int = 0) -> float:
    """Median wall time of a place-only pass with ``n`` jobs of kind ``waiting`` queued.

    ``full``: a full pass, else the one a submit wakes. ``history``: that many jobs ran and
    ended before (within the fortnight fair share reads).
    """
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-pass-") as tmp:
        async with memory_scheduler(Path(tmp), start=SATURDAY_NIGHT) as h:
            if history:
                ran(h.sched.store, history)
            busy = [h.submit(gpus=g, gpu_models=[m], run=Run(duration_s=1e9)) for g, m in FILL]
            await h.settle(*(j.id for j in busy), state=JobState.RUNNING)
            # As in a server: the inventory probe runs beside the passes every 30 s (the
            # harness probes at every pass, and a new inventory asks for a full pass).
            h.sched.inventory_interval_s = 3600.0
            extra = {"not_before": FAR_FUTURE} if waiting == "later" else {}
            spec = parse_spec(
                {"kind": "script", "command": ["train"], "gpus": 1, **extra}, user="ann"
            )
            if n:
                h.sched.submit_many([spec] * n, array=False)
            for _ in range(3):  # the first passes write every new job's reason
                await h.sched.tick()
            times = []
            for _ in range(passes):
                h.sched.submit(spec)
                if full:
                    h.sched.wake()
                t0 = time.perf_counter()
                await h.sched.tick(upkeep=False)
                times.append((time.perf_counter() - t0) * 1000)
            return statistics.median(times)


def ran(store: Store, n: int) -> None:
    """``n`` jobs that held a GPU and ended, through the store as the tracker records them."""
    spec = parse_spec({"kind": "script", "command": ["train"], "gpus": 1}, user="carol")
    where = Placement(node="a100-0", gpu_indices=[0])
    for job in store.add_jobs([spec] * n):
        store.transition(job.id, JobState.STARTING, placement=where)
        store.transition(job.id, JobState.RUNNING)
        store.transition(job.id, JobState.SUCCEEDED)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 1000, 3000])
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--history", type=int, default=10_000, help="jobs that ran before")
    args = parser.parse_args()
    for full in (False, True):
        what = "full pass" if full else "pass a submit wakes"
        base = await pass_ms(0, "busy", args.passes, full=full)
        print(f"{what}, empty queue (baseline): {base:7.1f} ms")
        for waiting in ("busy", "later"):
            for n in (s for s in args.sizes if s):
                ms = await pass_ms(n, waiting, args.passes, full=full)
                per_job = (ms - base) / n * 1000
                print(
                    f"{what}, {n:5d} {waiting:5s} jobs waiting: {ms:7.1f} ms  "
                    f"({ms / base:5.1f} x baseline, {per_job:5.1f} us per waiting job)"
                )
    if args.history:
        ms = await pass_ms(100, "busy", args.passes, full=True, history=args.history)
        few = await pass_ms(100, "busy", args.passes, full=True)
        print(
            f"full pass, 100 busy jobs waiting, {args.history} ended in the fortnight: "
            f"{ms:7.1f} ms  ({ms / few:5.1f} x the same without them, {few:.1f} ms)"
        )


if __name__ == "__main__":
    asyncio.run(main())
