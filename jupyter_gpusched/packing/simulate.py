"""Replay a GPU-cluster trace on the packer, the way the FGD paper (ATC'23) evaluates policies.

Protocol (``replay``): shuffle the tasks with a seed, append tasks sampled with replacement
until the requested GPUs would pass 1.3 x the cluster's GPUs, place each on arrival (online,
never moved; a task that fits nowhere fails and is not retried), and after every arrival
record arrived % (requested GPUs, failed included, over capacity) and allocated %.

The trace is Alibaba's ``cluster-trace-gpu-v2023`` ("openb"), read from
``../shared/data/openb`` relative to the current directory unless told otherwise.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .packer import (
    MILLI,
    POLICIES,
    ClusterState,
    NodeShape,
    PackRequest,
    ShapeMix,
    metrics,
    pack,
)

DEFAULT_DATA_DIR = Path("../shared/data/openb")
NODES_FILE = "openb_node_list_gpu_node.csv"
TASKS_FILE = "openb_pod_list_default.csv"
WHERE_TO_GET = (
    "download the openb CSVs from Alibaba's clusterdata repository "
    "(cluster-trace-gpu-v2023/csv/) into that folder, or pass --data-dir"
)
REPORT_AT_PCT = (50, 80, 90, 95, 100, 130)
INFLATE = 1.3
#: GPU memory of the trace's models (G1-G3 are undisclosed: 0 = unknown)
GPU_MEM_GB = {"T4": 16.0, "P100": 16.0, "V100M16": 16.0, "V100M32": 32.0, "A10": 24.0}


class TraceError(Exception):
    """A trace file is missing or unreadable; the message says where to get it."""


def load_nodes(path: str | Path) -> list[NodeShape]:
    """Nodes of an openb node list (``sn, cpu_milli, memory_mib, gpu, model``)."""
    rows = _read_csv(path)
    return [
        NodeShape(
            name=r["sn"],
            gpu_model=r["model"] or "none",
            gpu_mem_gb=GPU_MEM_GB.get(r["model"], 0.0),
            gpus=int(r["gpu"]),
            cpus=int(r["cpu_milli"]) / 1000,
            mem_gb=int(r["memory_mib"]) / 1024,
        )
        for r in rows
    ]


def load_tasks(path: str | Path) -> list[PackRequest]:
    """Tasks of an openb pod list as requests (``gpu_milli`` per GPU, ``gpu_spec`` models)."""
    out = []
    for r in _read_csv(path):
        gpus = int(r["num_gpu"])
        milli = int(r["gpu_milli"])
        spec = r.get("gpu_spec") or ""
        models = tuple(sorted(set(spec.split("|")))) if spec and gpus else ()
        out.append(
            PackRequest(
                gpus=gpus,
                gpu_share=(milli / MILLI if gpus and milli else 1.0),
                cpus=int(r["cpu_milli"]) / 1000,
                mem_gb=int(r["memory_mib"]) / 1024,
                models=models,
            )
        )
    return out


def scale_cpu_only(tasks: Sequence[PackRequest], factor: float) -> list[PackRequest]:
    """The tasks with the CPUs of every CPU-only task (``gpus == 0``) multiplied by ``factor``.

    Builds the CPU-heavy variants of a trace (``bench/cpu_heavy.py``): when CPU-only work asks
    for 2-2.5x its usual CPUs, CPU rather than GPU runs out first on many nodes.
    """
    return [replace(t, cpus=t.cpus * factor) if t.gpus == 0 else t for t in tasks]


def _read_csv(path: str | Path) -> list[dict[str, str]]:
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file not found: {p}; {WHERE_TO_GET}")
    with p.open(newline="") as fh:
        return list(csv.DictReader(fh))


def gpu_demand(r: PackRequest) -> float:
    """GPUs a task requests (shares count as fractions)."""
    return r.gpus * (r.gpu_share if r.gpu_mem_gb is None else 1.0)


def inflate(
    tasks: Sequence[PackRequest], capacity_gpus: float, seed: int, factor: float = INFLATE
) -> list[PackRequest]:
    """Shuffled tasks plus tasks drawn with replacement up to ``factor`` x capacity (FGD)."""
    rng = np.random.default_rng(seed)
    limit = factor * capacity_gpus
    order: list[PackRequest] = []
    total = 0.0
    for i in rng.permutation(len(tasks)):  # a trace larger than the cluster is cut at the limit
        if total + gpu_demand(tasks[i]) > limit:
            return order
        order.append(tasks[i])
        total += gpu_demand(tasks[i])
    while True:
        t = tasks[int(rng.integers(len(tasks)))]
        if total + gpu_demand(t) > limit:
            break
        order.append(t)
        total += gpu_demand(t)
    return order


def policy_mix(policy: str, tasks: Sequence[PackRequest]) -> ShapeMix | None:
    """The shape mix a policy is given from the workload, as FGD takes the trace's shapes.

    ``fgd`` gets FGD's own: shapes by (GPUs, share, CPUs, models) covering 95 % of tasks,
    weighted by count. ``fragmentation`` gets the same with host memory in the shape, since
    its copies-that-fit measure checks memory too.
    """
    if policy == "fgd":
        return ShapeMix.from_requests(tasks, coverage=0.95, weigh="count", ignore_mem=True)
    if policy == "fragmentation":
        return ShapeMix.from_requests(tasks, coverage=0.95, weigh="count")
    return None


@dataclass
class ReplayResult:
    """What one replay measured."""

    policy: str
    seed: int
    tie_break: str
    placements: int  # arrivals placed or failed
    failed: int
    arrived_pct: np.ndarray = field(repr=False)  # after each arrival
    alloc_pct: np.ndarray = field(repr=False)
    final: dict[str, Any] = field(default_factory=dict)  # metrics() at the end, FGD's mix

    def alloc_at(self, arrived_pct: float) -> float:
        """Allocated % at the last arrival whose arrived % is at most ``arrived_pct``."""
        i = int(np.searchsorted(self.arrived_pct, arrived_pct + 1e-9, side="right")) - 1
        return float(self.alloc_pct[i]) if i >= 0 else 0.0


def replay(
    nodes: Sequence[NodeShape],
    tasks: Sequence[PackRequest],
    policy: str = "fragmentation",
    seed: int = 0,
    tie_break: str = "order",
    mix: ShapeMix | None = None,
) -> ReplayResult:
    """Replay one seed of the FGD protocol with one policy (see the module docstring)."""
    state = ClusterState.from_nodes(nodes)
    capacity = float(state.gpu_count.sum())
    arrivals = inflate(tasks, capacity, seed)
    if mix is None:
        mix = policy_mix(policy, tasks)
    arrived = np.empty(len(arrivals))
    alloc = np.empty(len(arrivals))
    requested = allocated = 0.0
    failed = 0
    for n, r in enumerate(arrivals):
        reply = pack(state, r, policy=policy, tie_break=tie_break, seed=seed, shape_mix=mix)
        demand = gpu_demand(r)
        requested += demand
        if reply.node is None:
            failed += 1
        else:
            state.allocate(reply)
            allocated += reply.share_per_gpu * len(reply.gpu_indices)
        arrived[n] = 100.0 * requested / capacity
        alloc[n] = 100.0 * allocated / capacity
    return ReplayResult(
        policy,
        seed,
        tie_break,
        len(arrivals),
        failed,
        arrived,
        alloc,
        metrics(state, policy_mix("fgd", tasks)).to_dict(),
    )


def summarize(results: Sequence[ReplayResult]) -> dict[str, Any]:
    """Mean over seeds of allocated % at each reported arrived %, plus end-state metrics."""
    out: dict[str, Any] = {
        "alloc_pct": {
            str(p): float(np.mean([r.alloc_at(p) for r in results])) for p in REPORT_AT_PCT
        },
        "seeds": [r.seed for r in results],
        "failed": float(np.mean([r.failed for r in results])),
        "placements": int(np.mean([r.placements for r in results])),
    }
    out["unalloc_pct_at_100"] = 100.0 - out["alloc_pct"]["100"]
    finals = [r.final for r in results]
    out["free_nodes"] = float(np.mean([sum(f["free_nodes_by_size"].values()) for f in finals]))
    out["frag_ratio"] = float(np.mean([f["frag_ratio"] for f in finals]))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jupyter gpusched simulate", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--data-dir", default=None, help=f"folder of the openb CSVs (default {DEFAULT_DATA_DIR})"
    )
    p.add_argument("--nodes", default=None, help=f"node list CSV (default DATA_DIR/{NODES_FILE})")
    p.add_argument("--tasks", default=None, help=f"task list CSV (default DATA_DIR/{TASKS_FILE})")
    p.add_argument(
        "--policy",
        default="fragmentation",
        help=f"policy or comma-separated policies among {', '.join(POLICIES)}",
    )
    p.add_argument("--seeds", type=int, default=1, help="replay seeds 0..K-1 and average")
    p.add_argument("--tie-break", choices=("order", "random"), default="order")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    """``jupyter gpusched simulate``: replay a trace with one or more policies."""
    args = _parser().parse_args(argv)
    data = Path(args.data_dir) if args.data_dir else DEFAULT_DATA_DIR
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies or args.seeds < 1:
        print(
            f"simulate: unknown policy {', '.join(bad) or '(none)'}; choose from "
            f"{', '.join(POLICIES)}"
            if bad or not policies
            else "simulate: --seeds must be >= 1",
            file=sys.stderr,
        )
        return 2
    try:
        nodes = load_nodes(args.nodes or data / NODES_FILE)
        tasks = load_tasks(args.tasks or data / TASKS_FILE)
    except TraceError as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 2
    results = {
        p: summarize([replay(nodes, tasks, p, s, args.tie_break) for s in range(args.seeds)])
        for p in policies
    }
    if args.json:
        print(
            json.dumps(
                {
                    "nodes": len(nodes),
                    "tasks": len(tasks),
                    "tie_break": args.tie_break,
                    "seeds": args.seeds,
                    "results": results,
                }
            )
        )
        return 0
    print(
        f"{len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs, {len(tasks)} tasks; "
        f"tie-break {args.tie_break}; seeds 0..{args.seeds - 1}"
    )
    head = "".join(f"{'@' + str(p) + '%':>8}" for p in REPORT_AT_PCT)
    print(f"{'policy':<14}{head}{'unalloc@100':>13}{'free nodes':>12}{'frag':>7}")
    for p, r in results.items():
        cells = "".join(f"{r['alloc_pct'][str(a)]:>8.2f}" for a in REPORT_AT_PCT)
        print(
            f"{p:<14}{cells}{r['unalloc_pct_at_100']:>13.2f}{r['free_nodes']:>12.1f}"
            f"{r['frag_ratio']:>7.3f}"
        )
    print("allocated % of all GPUs at each arrived % (requested GPUs / capacity)")
    return 0
