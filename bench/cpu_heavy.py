"""Packer quality when CPUs run short: CPU-heavy variants of the openb traces.

The FGD authors publish openb task lists whose CPU-only tasks (``num_gpu = 0``) ask for more
CPU than in ``default``; this repository does not have them. This script builds its own
variants from the shared traces instead, and never writes them anywhere: every task with
``num_gpu = 0`` gets its ``cpu_milli`` multiplied by a factor (1.5x, 2x, 2.5x; memory, GPU
tasks and nodes unchanged; ``simulate.scale_cpu_only``). In ``default`` CPU-only tasks ask for
19.2K of the cluster's 107K CPUs; at 2.5x, with the GPU tasks' own CPUs, the CPUs requested at
arrived = 100 % pass the cluster's, so CPU is the scarce dimension on many nodes and a policy
that sees only GPUs strands them.

Figures: unallocated GPUs (% of 6,212) at arrived = 100 % (FGD's protocol, as bench/packer.py),
mean of the seeds, for fgd (ours), best_fit and the default policy, in both tie modes.

    python bench/cpu_heavy.py --data ../shared/data/openb                 # 3 seeds, 3 factors
    python bench/cpu_heavy.py --factors 2.5 --seeds 1 --traces default    # a quick look
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from jupyter_gpusched.packing.simulate import (
    NODES_FILE,
    WHERE_TO_GET,
    load_nodes,
    load_tasks,
    replay,
    scale_cpu_only,
)

POLICIES = ("fgd", "best_fit", "fragmentation")


def _unalloc(job: tuple[str, str, float, str, int, str]) -> float:
    """Unallocated % at arrived = 100 % of one replay (a process-pool job)."""
    data, trace, factor, policy, seed, tie = job
    nodes = load_nodes(Path(data) / NODES_FILE)
    tasks = scale_cpu_only(load_tasks(Path(data) / f"openb_pod_list_{trace}.csv"), factor)
    return 100 - replay(nodes, tasks, policy, seed, tie).alloc_at(100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="../shared/data/openb", help="folder of the openb CSVs")
    p.add_argument("--traces", default="default", help="comma-separated openb traces")
    p.add_argument("--factors", default="1.5,2,2.5", help="CPU factors of CPU-only tasks")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..K-1 per cell")
    p.add_argument("--ties", default="order,random", help="tie modes")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--jobs", type=int, default=1, help="replays run in parallel processes")
    args = p.parse_args(argv)
    data = Path(args.data)
    if not (data / NODES_FILE).is_file():
        print(f"bench: no {NODES_FILE} in {data}; {WHERE_TO_GET}", file=sys.stderr)
        return 2
    print("command: python " + " ".join(["bench/cpu_heavy.py", *(argv or sys.argv[1:])]))
    policies = args.policies.split(",")
    seeds = list(range(args.seeds))
    cells = [
        (trace, float(f), tie)
        for trace in args.traces.split(",")
        for f in args.factors.split(",")
        for tie in args.ties.split(",")
    ]
    where = str(data)
    jobs = [(where, t, f, pol, s, tie) for t, f, tie in cells for pol in policies for s in seeds]
    with ProcessPoolExecutor(max(args.jobs, 1)) as pool:
        values = dict(zip(jobs, pool.map(_unalloc, jobs), strict=True))
    print(
        f"\nunallocated GPUs (% of {sum(n.gpus for n in load_nodes(data / NODES_FILE))}) at "
        f"arrived = 100 %, mean of seeds {seeds}; CPU-only tasks' CPUs x factor"
    )
    print(f"{'trace':<12}{'cpu x':>6}  {'ties':<8}" + "".join(f"{q:>15}" for q in policies))
    for t, f, tie in cells:
        means = [np.mean([values[(where, t, f, pol, s, tie)] for s in seeds]) for pol in policies]
        print(f"{t:<12}{f:>6g}  {tie:<8}" + "".join(f"{m:>15.2f}" for m in means), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
