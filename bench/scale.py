"""One scheduling pass of 100,000 queued requests over a synthetic 10,000-node x 8-GPU cluster.

Measures wall and CPU time (CPU time is what to compare on a shared machine), requests per
second and peak memory (tracemalloc peak of Python/numpy
allocations, and the process's max RSS) of ``pack_many`` with a given policy.
``--baseline`` also places the queue request by request (``pack`` then ``allocate``, what
``pack_many`` did before it filed nodes by state) on a fresh cluster in the same process,
checks that every reply is the same, and prints the ratio.

    python bench/scale.py                   # default: 10,000 nodes, 100,000 requests
    python bench/scale.py --nodes 1000 --requests 10000   # a quick look
    python bench/scale.py --no-tracemalloc --baseline    # against one by one (~15 s more)
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc

import numpy as np

from jupyter_gpusched.packing.packer import (
    ClusterState,
    NodeShape,
    PackRequest,
    ShapeMix,
    pack,
    pack_many,
)

#: request shapes and their frequencies: mostly one GPU or a share, some multi-GPU and CPU jobs
SHAPES = [
    (PackRequest(1, 1.0, cpus=8, mem_gb=64), 0.40),
    (PackRequest(1, 0.5, cpus=4, mem_gb=32), 0.20),
    (PackRequest(1, 0.25, cpus=2, mem_gb=16), 0.10),
    (PackRequest(2, 1.0, cpus=16, mem_gb=128), 0.10),
    (PackRequest(4, 1.0, cpus=32, mem_gb=256), 0.07),
    (PackRequest(8, 1.0, cpus=64, mem_gb=512), 0.03),
    (PackRequest(0, cpus=8, mem_gb=32), 0.10),
]


def synthetic(
    n_nodes: int, n_requests: int, seed: int
) -> tuple[list[NodeShape], list[PackRequest]]:
    """A uniform 8-GPU cluster (two NVLink islands per node) and a seeded request queue."""
    nodes = [
        NodeShape(f"node-{i:05d}", "A100-80GB", 80, 8, 128, 1024, (0, 0, 0, 0, 1, 1, 1, 1))
        for i in range(n_nodes)
    ]
    rng = np.random.default_rng(seed)
    probs = np.array([p for _, p in SHAPES])
    picks = rng.choice(len(SHAPES), size=n_requests, p=probs / probs.sum())
    return nodes, [SHAPES[i][0] for i in picks]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--policy", default="fragmentation")
    p.add_argument("--tie-break", default="order", choices=("order", "random"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="unused: the cluster and queue are synthetic")
    p.add_argument(
        "--no-tracemalloc",
        action="store_true",
        help="time without tracemalloc (it slows allocation-heavy code); RSS still reported",
    )
    p.add_argument("--baseline", action="store_true", help="also place one by one, compare")
    args = p.parse_args(argv)
    print("command: python " + " ".join(["bench/scale.py", *(argv or sys.argv[1:])]))
    nodes, requests = synthetic(args.nodes, args.requests, args.seed)
    mix = ShapeMix.from_requests(requests)  # the queue's own shape mix
    if not args.no_tracemalloc:
        tracemalloc.start()
    c0 = time.process_time()
    t0 = time.perf_counter()
    state = ClusterState.from_nodes(nodes)
    build_s = time.perf_counter() - t0
    replies = pack_many(
        state, requests, policy=args.policy, tie_break=args.tie_break, seed=args.seed, shape_mix=mix
    )
    total_s = time.perf_counter() - t0
    cpu_s = time.process_time() - c0
    _, peak = tracemalloc.get_traced_memory()
    if tracemalloc.is_tracing():
        tracemalloc.stop()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    placed = sum(r.node is not None for r in replies)
    gpus = 8 * args.nodes
    used = gpus - float(state.gpu_free.sum())
    print(
        f"cluster: {args.nodes:,} nodes x 8 GPUs = {gpus:,} GPUs; queue: {args.requests:,} "
        f"requests; policy {args.policy}, ties {args.tie_break}"
    )
    print(
        f"build state: {build_s:.2f} s; pass: {total_s:.2f} s wall, {cpu_s:.2f} s CPU "
        f"({args.requests / cpu_s:,.0f} requests per CPU second)"
    )
    print(
        f"placed {placed:,}, not placed {args.requests - placed:,}; "
        f"GPUs allocated {100 * used / gpus:.1f} %"
    )
    traced = f"tracemalloc {peak / 2**20:.1f} MiB, " if not args.no_tracemalloc else ""
    print(f"peak memory: {traced}max RSS {rss_mb:.0f} MiB")
    if args.baseline:
        c0 = time.process_time()
        alone = ClusterState.from_nodes(nodes)
        one_by_one = []
        for r in requests:
            reply = pack(
                alone,
                r,
                policy=args.policy,
                tie_break=args.tie_break,
                seed=args.seed,
                shape_mix=mix,
            )
            if reply.node is not None:
                alone.allocate(reply)
            one_by_one.append(reply)
        base_s = time.process_time() - c0
        same = [(r.node, r.gpu_indices, r.reason) for r in replies] == [
            (r.node, r.gpu_indices, r.reason) for r in one_by_one
        ]
        print(
            f"one by one (pack + allocate): {base_s:.2f} s CPU; pack_many {base_s / cpu_s:.1f}x "
            f"faster; same replies: {same}"
        )
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
