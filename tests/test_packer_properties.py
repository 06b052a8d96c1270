"""Hypothesis invariants: the packer never over-allocates, honours models, and is seeded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpusched.packing import fragmentation, pricing
from jupyter_gpusched.packing.packer import (
    POLICIES,
    ClusterState,
    NodeShape,
    PackReply,
    PackRequest,
    ShapeMix,
    pack,
    pack_many,
)

MODELS = ("A100-80GB", "T4", "V100-32GB")
GPU_MEM = {"A100-80GB": 80.0, "T4": 16.0, "V100-32GB": 32.0}

nodes_st = st.lists(
    st.builds(
        lambda i, model, gpus, cpus, mem: NodeShape(
            f"n{i}", model, GPU_MEM[model], gpus, cpus, mem
        ),
        st.integers(0, 10**6),
        st.sampled_from(MODELS),
        st.sampled_from([0, 1, 2, 4, 8]),
        st.sampled_from([4.0, 16.0, 64.0]),
        st.sampled_from([16.0, 128.0, 512.0]),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda n: n.name,
)
request_st = st.builds(
    PackRequest,
    gpus=st.integers(0, 5),
    gpu_share=st.sampled_from([1.0, 0.5, 0.25, 0.33, 0.8]),
    gpu_mem_gb=st.one_of(st.none(), st.sampled_from([8.0, 20.0, 40.0])),
    cpus=st.sampled_from([0.0, 1.0, 4.0, 12.0]),
    mem_gb=st.sampled_from([0.0, 8.0, 64.0]),
    models=st.sampled_from([(), ("T4",), ("a100",), ("V100", "T4")]),
)


def _placed_usage(state: ClusterState, replies: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    gpu = np.zeros(state.gm.shape)
    cpu = np.zeros(state.n_nodes)
    mem = np.zeros(state.n_nodes)
    for r in replies:
        if r.node is None:
            continue
        for j in r.gpu_indices:
            gpu[r.node, j] += r.share_per_gpu
        cpu[r.node] += r.cpus
        mem[r.node] += r.mem_gb
    return gpu, cpu, mem


@settings(max_examples=60, deadline=None)
@given(
    nodes=nodes_st,
    requests=st.lists(request_st, max_size=25),
    policy=st.sampled_from(POLICIES),
    tie_break=st.sampled_from(["order", "random"]),
    seed=st.integers(0, 5),
)
def test_never_over_allocates_and_honours_models(
    nodes: list[NodeShape], requests: list, policy: str, tie_break: str, seed: int
) -> None:
    state = ClusterState.from_nodes(nodes)
    mix = ShapeMix.from_requests(requests) if requests and policy in ("fgd",) else None
    replies = pack_many(
        state, requests, policy=policy, tie_break=tie_break, seed=seed, shape_mix=mix
    )
    gpu, cpu, mem = _placed_usage(state, replies)
    counts = np.array([n.gpus for n in nodes])
    valid = np.arange(state.gm.shape[1])[None, :] < counts[:, None]
    assert (gpu <= 1.0 + 1e-9).all()
    assert (gpu[~valid] == 0).all()
    assert (cpu <= np.array([n.cpus for n in nodes]) + 1e-9).all()
    assert (mem <= np.array([n.mem_gb for n in nodes]) + 1e-9).all()
    assert np.allclose(state.gpu_free, np.where(valid, 1.0, 0.0) - gpu, atol=1e-9)
    for req, reply in zip(requests, replies, strict=True):
        if reply.node is None:
            assert reply.reason
            continue
        assert len(reply.gpu_indices) == req.gpus == len(set(reply.gpu_indices))
        if req.gpus and req.models:
            model = nodes[reply.node].gpu_model.upper()
            assert any(model.startswith(m.upper()) for m in req.models)
        if req.gpus and req.gpu_mem_gb is not None:
            gpu_mem = GPU_MEM[nodes[reply.node].gpu_model]
            assert reply.share_per_gpu * gpu_mem >= req.gpu_mem_gb - 1e-6


@settings(max_examples=40, deadline=None)
@given(
    nodes=nodes_st,
    requests=st.lists(request_st, max_size=20),
    policy=st.sampled_from(POLICIES),
    tie_break=st.sampled_from(["order", "random"]),
    seed=st.integers(0, 5),
)
def test_same_seed_same_placements(
    nodes: list[NodeShape], requests: list, policy: str, tie_break: str, seed: int
) -> None:
    def run() -> list[tuple]:
        state = ClusterState.from_nodes(nodes)
        return [
            (r.node, r.gpu_indices, r.reason)
            for r in pack_many(state, requests, policy=policy, tie_break=tie_break, seed=seed)
        ]

    assert run() == run()


@settings(max_examples=40, deadline=None)
@given(nodes=nodes_st, requests=st.lists(request_st, min_size=1, max_size=20))
def test_infeasible_ever_means_an_empty_cluster_cannot_host_it(
    nodes: list[NodeShape], requests: list
) -> None:
    state = ClusterState.from_nodes(nodes)
    for reply, req in zip(pack_many(state, requests), requests, strict=True):
        if reply.node is None and not reply.feasible_ever:
            empty = ClusterState.from_nodes(nodes)
            assert pack_many(empty, [req])[0].node is None


@settings(max_examples=40, deadline=None)
@given(
    nodes=nodes_st,
    requests=st.lists(request_st, min_size=1, max_size=25),
    probe=request_st,
    policy=st.sampled_from(["fragmentation", "fgd"]),
)
def test_cached_scores_match_a_fresh_state(
    nodes: list[NodeShape], requests: list, probe: PackRequest, policy: str
) -> None:
    # the caches refresh only touched rows; a copy starts with none, so both must agree
    state = ClusterState.from_nodes(nodes)
    mix = ShapeMix.from_requests(requests)
    pack_many(state, requests, policy=policy, shape_mix=mix)
    cached = pack(state, probe, policy=policy, shape_mix=mix)
    fresh = pack(state.copy(), probe, policy=policy, shape_mix=mix)
    assert (cached.node, cached.gpu_indices) == (fresh.node, fresh.gpu_indices)
    if cached.score is not None:  # a batch of rows may round the last bits differently
        assert cached.score == pytest.approx(fresh.score, abs=1e-6)


@settings(max_examples=20, deadline=None)
@given(
    kinds=nodes_st,
    copies=st.integers(10, 40),
    requests=st.lists(request_st, min_size=1, max_size=40),
    probes=st.lists(request_st, min_size=1, max_size=5),
    tie_break=st.sampled_from(["order", "random"]),
)
def test_deduplicated_refresh_places_like_row_by_row(
    kinds: list[NodeShape], copies: int, requests: list, probes: list, tie_break: str
) -> None:
    # large refreshes score each distinct node state once; the replies must not change.
    # Probes come after the cluster filled up: their first look refreshes every row.
    nodes = [
        NodeShape(f"{k.name}-{i}", k.gpu_model, k.gpu_mem_gb, k.gpus, k.cpus, k.mem_gb)
        for k in kinds
        for i in range(copies)
    ]

    def run() -> list[tuple]:
        state = ClusterState.from_nodes(nodes)
        mix = ShapeMix.from_requests(requests + probes)
        replies = pack_many(state, requests, tie_break=tie_break, seed=1, shape_mix=mix)
        replies += [pack(state, p, tie_break=tie_break, seed=1, shape_mix=mix) for p in probes]
        return [(r.node, r.gpu_indices, r.score) for r in replies]

    deduplicated = run()
    saved = fragmentation.DEDUP_MIN_ROWS
    fragmentation.DEDUP_MIN_ROWS = 10**9
    try:
        row_by_row = run()
    finally:
        fragmentation.DEDUP_MIN_ROWS = saved
    assert [r[:2] for r in deduplicated] == [r[:2] for r in row_by_row]
    # a batch of rows may round the last bits of a score differently
    assert [r[2] for r in deduplicated] == pytest.approx([r[2] for r in row_by_row], abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.sampled_from([1, 2, 4]), st.integers(1, 1000), st.floats(0.01, 10)),
        min_size=1,
        max_size=40,
    )
)
def test_slot_loss_is_never_negative(shapes: list[tuple[int, int, float]]) -> None:
    mix = ShapeMix(
        tuple(PackRequest(k, milli / 1000) for k, milli, _ in shapes),
        tuple(w for _, _, w in shapes),
    )
    value = pricing.slot_value(mix)
    assert value[0] == 0 and value[-1] <= 1000 + 1e-6
    assert (np.diff(value) >= -1e-9).all()  # more room is never worth less
    free = np.arange(1001)[:, None]
    take = np.arange(1, 1001)[None, :]
    loss = value[free] - value[take] - value[np.maximum(free - take, 0)]
    assert (np.where(free >= take, loss, 0) >= -1e-6).all()


def _one_by_one(
    state: ClusterState,
    requests: list,
    policy: str,
    tie_break: str,
    seed: int,
    mix: ShapeMix | None,
) -> list:
    """What pack_many promises: pack each request, then allocate it, in turn."""
    replies = []
    for r in requests:
        if mix is None:
            state.record_arrival(r)
        reply = pack(state, r, policy=policy, tie_break=tie_break, seed=seed, shape_mix=mix)
        if reply.node is not None:
            state.allocate(reply)
        replies.append(reply)
    return replies


@settings(max_examples=60, deadline=None)
@given(
    kinds=nodes_st,
    copies=st.integers(1, 5),
    requests=st.lists(request_st, min_size=1, max_size=20),
    policy=st.sampled_from(POLICIES),
    tie_break=st.sampled_from(["order", "random"]),
    seed=st.integers(0, 3),
    given_mix=st.booleans(),
    down=st.integers(-1, 4),
)
def test_pack_many_places_like_pack_then_allocate_one_by_one(
    kinds: list[NodeShape],
    copies: int,
    requests: list,
    policy: str,
    tie_break: str,
    seed: int,
    given_mix: bool,
    down: int,
) -> None:
    # pack_many files nodes in equal states together and scores each class once; every
    # reply and the state after must be what pack + allocate give request by request.
    # Copies of each node kind and repeated requests make classes with many nodes.
    nodes = [
        NodeShape(f"{k.name}-{i}", k.gpu_model, k.gpu_mem_gb, k.gpus, k.cpus, k.mem_gb)
        for k in kinds
        for i in range(copies)
    ]
    queue = requests * 3
    mix = ShapeMix.from_requests(queue) if given_mix else None
    batch, single = ClusterState.from_nodes(nodes), ClusterState.from_nodes(nodes)
    if 0 <= down < len(nodes):
        batch.set_node_up(down, False)
        single.set_node_up(down, False)
    got = pack_many(batch, queue, policy=policy, tie_break=tie_break, seed=seed, shape_mix=mix)
    want = _one_by_one(single, queue, policy, tie_break, seed, mix)

    def fields(r: PackReply) -> tuple:
        return (r.node, r.gpu_indices, r.share_per_gpu, r.reason, r.feasible_ever, r.cpus)

    assert [fields(r) for r in got] == [fields(r) for r in want]
    assert [r.score for r in got] == pytest.approx([r.score for r in want], abs=1e-6)
    assert np.array_equal(batch.gm, single.gm)
    assert np.array_equal(batch.cpus_free, single.cpus_free)
    assert np.array_equal(batch.mem_free_gb, single.mem_free_gb)
    assert batch.step == single.step


@settings(max_examples=40, deadline=None)
@given(
    nodes=nodes_st,
    requests=st.lists(request_st, min_size=1, max_size=25),
    cpus_override=st.booleans(),
)
def test_allocating_a_reply_leaves_the_statistics_a_fresh_state_computes(
    nodes: list[NodeShape], requests: list, cpus_override: bool
) -> None:
    # allocate takes the placed row's statistics from the after-state pack scored (when the
    # reply is applied as given to the state it was scored on): they must be exactly what a
    # state computing them from scratch finds
    state = ClusterState.from_nodes(nodes)
    mix = ShapeMix.from_requests(requests)
    for r in requests:
        reply = pack(state, r, shape_mix=mix)
        if reply.node is not None:
            state.allocate(reply, cpus=reply.cpus + 1 if cpus_override else None)
    fresh = state.copy()
    ours, theirs = state.stats(mix, fill=True), fresh.stats(mix, fill=True)
    assert np.array_equal(ours.counts, theirs.counts)
    assert np.array_equal(ours.frag, theirs.frag)
    assert np.array_equal(ours.frag_fill, theirs.frag_fill)
