"""Packer benchmark on the Alibaba openb trace: placements per second and placement quality.

Speed: one FGD-protocol replay of openb default (seed 0, order ties, ~10.8K placements on
1,213 nodes) per policy, against a naive pure-Python first-fit over the same arrivals.
Quality: unallocated GPUs at arrived = 100 % per trace x tie-break mode for fgd, best_fit and
our default policy (fragmentation), next to the FGD paper's published figures.

    python bench/packer.py --data ../shared/data/openb          # short: 1 seed
    python bench/packer.py --data ../shared/data/openb --full   # 3 seeds
    python bench/packer.py --skip-quality --repeat 3             # speed only, least of 3
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jupyter_gpusched.packing.packer import MILLI, POLICIES, NodeShape, PackRequest
from jupyter_gpusched.packing.simulate import (
    NODES_FILE,
    WHERE_TO_GET,
    inflate,
    load_nodes,
    load_tasks,
    replay,
)

TRACES = ("default", "multigpu50", "gpushare80", "gpuspec20")
#: unallocated % at arrived = 100 % (mean of 10 seeds), from the FGD authors' result files
PUBLISHED = {
    "default": {"best_fit": 7.14, "fgd": 4.77},
    "multigpu50": {"best_fit": 4.38, "fgd": 2.91},
    "gpushare80": {"best_fit": 13.34, "fgd": 10.92},
    "gpuspec20": {"best_fit": 11.54, "fgd": 5.34},
}


def naive_first_fit(nodes: list[NodeShape], arrivals: list[PackRequest]) -> int:
    """Pure-Python first fit over the node list (lists of ints, no numpy): the baseline."""
    free = [[MILLI] * n.gpus for n in nodes]
    cpu = [n.cpus for n in nodes]
    mem = [n.mem_gb for n in nodes]
    models = [n.gpu_model for n in nodes]
    placed = 0
    for r in arrivals:
        need = round(r.gpu_share * MILLI) if r.gpus else 0
        for i in range(len(nodes)):
            if cpu[i] < r.cpus - 1e-9 or mem[i] < r.mem_gb - 1e-9:
                continue
            if r.models and models[i] not in r.models:
                continue
            gpus = [j for j, f in enumerate(free[i]) if f >= need][: r.gpus]
            if len(gpus) < r.gpus:
                continue
            for j in gpus:
                free[i][j] -= need
            cpu[i] -= r.cpus
            mem[i] -= r.mem_gb
            placed += 1
            break
    return placed


def _timed(run: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(CPU s, wall s) of the run with the least CPU time: others' load only ever adds."""
    best = (math.inf, math.inf)
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        run()
        best = min(best, (time.process_time() - c0, time.perf_counter() - t0))
    return best


def speed(nodes: list[NodeShape], tasks: list[PackRequest], repeat: int = 1) -> None:
    """Placements per CPU second of each policy (CPU time: fair on a shared machine)."""
    arrivals = inflate(tasks, sum(n.gpus for n in nodes), seed=0)
    naive_cpu, naive_wall = _timed(lambda: naive_first_fit(nodes, arrivals), repeat)
    naive_rate = len(arrivals) / naive_cpu
    print(
        f"\n## Speed: one replay of openb default, {len(arrivals)} placements on {len(nodes)} "
        f"nodes (seed 0, order ties, one core; least CPU time of {repeat} run(s))"
    )
    print(
        f"{'policy':<15}{'CPU s':>8}{'wall s':>8}{'placements/CPU s':>18}{'vs naive first-fit':>20}"
    )
    print(
        f"{'naive (python)':<15}{naive_cpu:>8.2f}{naive_wall:>8.2f}{naive_rate:>18,.0f}"
        f"{1.0:>19.1f}x"
    )
    for policy in POLICIES:
        cpu, wall = _timed(lambda p=policy: replay(nodes, tasks, p, seed=0), repeat)
        rate = len(arrivals) / cpu
        print(
            f"{policy:<15}{cpu:>8.2f}{wall:>8.2f}{rate:>18,.0f}{rate / naive_rate:>19.1f}x",
            flush=True,
        )


def quality(
    data: Path, nodes: list[NodeShape], seeds: list[int], traces: tuple[str, ...] = TRACES
) -> None:
    print(
        f"\n## Quality: unallocated GPUs (% of {sum(n.gpus for n in nodes)}) at arrived = 100 %,"
        f" mean of seeds {seeds}"
    )
    print(
        f"{'trace':<12}{'ties':<8}{'fgd':>8}{'best_fit':>10}{'ours':>8}   "
        f"{'published fgd':>14}{'published best_fit':>20}"
    )
    for trace in traces:
        tasks = load_tasks(data / f"openb_pod_list_{trace}.csv")
        for tie in ("order", "random"):
            cells = []
            for policy in ("fgd", "best_fit", "fragmentation"):
                vals = [100 - replay(nodes, tasks, policy, s, tie).alloc_at(100) for s in seeds]
                cells.append(float(np.mean(vals)))
            pub = PUBLISHED[trace]
            print(
                f"{trace:<12}{tie:<8}{cells[0]:>8.2f}{cells[1]:>10.2f}{cells[2]:>8.2f}   "
                f"{pub['fgd']:>14.2f}{pub['best_fit']:>20.2f}",
                flush=True,
            )
    print("(published: reference simulator, fixed seeded node order, 10 seeds)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="../shared/data/openb", help="folder of the openb CSVs")
    p.add_argument("--full", action="store_true", help="3 seeds per cell instead of 1")
    p.add_argument("--seeds", type=int, default=None, help="seeds per quality cell")
    p.add_argument("--traces", default=",".join(TRACES), help="comma-separated openb traces")
    p.add_argument("--repeat", type=int, default=1, help="time each replay N times, keep the least")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--skip-speed", action="store_true")
    args = p.parse_args(argv)
    data = Path(args.data)
    if not (data / NODES_FILE).is_file():
        print(f"bench: no {NODES_FILE} in {data}; {WHERE_TO_GET}", file=sys.stderr)
        return 2
    print("command: python " + " ".join(["bench/packer.py", *(argv or sys.argv[1:])]))
    nodes = load_nodes(data / NODES_FILE)
    if not args.skip_speed:
        speed(nodes, load_tasks(data / "openb_pod_list_default.csv"), max(args.repeat, 1))
    if not args.skip_quality:
        n = args.seeds or (3 if args.full else 1)
        quality(data, nodes, list(range(n)), tuple(args.traces.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
