"""Behaviour of the packer: each policy on small clusters, infeasible reasons, metrics."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_gpusched.core.errors import InvalidSpecError
from jupyter_gpusched.packing.packer import (
    POLICIES,
    ClusterState,
    NodeShape,
    PackReply,
    PackRequest,
    ShapeMix,
    metrics,
    pack,
    pack_many,
)
from jupyter_gpusched.packing.pricing import slot_value

A100 = NodeShape("a100-0", "A100-80GB", 80, 8, 64, 512, (0, 0, 0, 0, 1, 1, 1, 1))
T4 = NodeShape("t4-0", "T4", 16, 2, 16, 64)
V100 = NodeShape("v100-0", "V100-32GB", 32, 4, 32, 128)


def cluster(*nodes: NodeShape) -> ClusterState:
    return ClusterState.from_nodes(list(nodes or (A100, T4, V100)))


def test_whole_gpus_land_inside_one_nvlink_island() -> None:
    state = cluster(A100)
    reply = pack(state, PackRequest(4))
    assert reply.node_name == "a100-0"
    assert reply.gpu_indices in ((0, 1, 2, 3), (4, 5, 6, 7))
    state.allocate(reply)
    second = pack(state, PackRequest(4))
    assert set(second.gpu_indices).isdisjoint(reply.gpu_indices)


def test_best_fit_fills_the_tightest_node_first() -> None:
    state = cluster()
    reply = pack(state, PackRequest(2), policy="best_fit")
    assert reply.node_name == "t4-0"


def test_spread_takes_the_emptiest_node() -> None:
    state = cluster()
    reply = pack(state, PackRequest(1), policy="spread")
    assert reply.node_name == "a100-0"


def test_first_fit_follows_the_seeded_node_order() -> None:
    state = cluster()
    names = {pack(state, PackRequest(1), policy="first_fit", seed=s).node_name for s in range(8)}
    assert len(names) > 1  # different seeds, different fixed orders
    again = {pack(state, PackRequest(1), policy="first_fit", seed=3).node_name for _ in range(3)}
    assert len(again) == 1


def test_dot_product_prefers_the_node_with_most_of_what_the_request_needs_free() -> None:
    state = cluster(
        NodeShape("busy-cpu", "T4", 16, 2, 16, 64), NodeShape("idle-cpu", "T4", 16, 2, 16, 64)
    )
    state.allocate(PackReply(0, "busy-cpu", (), 0.0, None, True, cpus=8.0))
    assert pack(state, PackRequest(0, cpus=4), policy="dot_product").node_name == "idle-cpu"


@pytest.mark.parametrize("policy", ["fragmentation", "fgd"])
def test_fragmentation_policies_keep_the_big_node_whole_for_big_jobs(policy: str) -> None:
    state = cluster(A100, NodeShape("a100-1", "A100-80GB", 80, 8, 64, 512))
    mix = ShapeMix((PackRequest(8), PackRequest(1)), (1.0, 1.0))
    first = pack(state, PackRequest(1), policy=policy, shape_mix=mix)
    state.allocate(first)
    second = pack(state, PackRequest(1), policy=policy, shape_mix=mix)
    assert second.node == first.node  # the other node stays free for an 8-GPU job
    state.allocate(second)
    assert metrics(state).free_nodes_by_size == {8: 1}


def test_shared_gpus_are_packed_onto_one_gpu() -> None:
    state = cluster(T4)
    replies = pack_many(state, [PackRequest(1, 0.5), PackRequest(1, 0.5)], policy="best_fit")
    assert [r.gpu_indices for r in replies] == [(0,), (0,)]
    assert state.gpu_free[0].tolist() == [0.0, 1.0]


def test_fragmentation_opens_a_fresh_gpu_rather_than_strand_a_sliver() -> None:
    # 0.47 + 0.32 leaves 0.21 that none of the mix's shapes can use; a fresh GPU with 0.32
    # keeps room for a 0.65 (or two more 0.32s), and the 0.47 waits for another 0.47
    state = cluster(NodeShape("t4-0", "T4", 16, 2, 16, 64))
    shares = [PackRequest(1, x) for x in (0.47, 0.32, 0.65)]
    mix = ShapeMix((*shares, PackRequest(1)), (1.0, 1.0, 1.0, 1.0))
    state.allocate(pack(state, shares[0], shape_mix=mix))
    reply = pack(state, shares[1], shape_mix=mix)
    assert state.gpu_free[0, reply.gpu_indices[0]] == 1.0
    state.allocate(reply)
    assert pack(state, shares[2], shape_mix=mix).gpu_indices == reply.gpu_indices


@pytest.mark.parametrize("seed", range(6))
def test_cpu_only_work_goes_where_cpus_exceed_what_the_gpus_need(seed: int) -> None:
    # the mix's GPU work needs 8 CPUs per GPU on average: "lean" (4 GPUs, 32 CPUs) needs all
    # of its CPUs for its GPUs, "roomy" (4 GPUs, 60 CPUs) has 28 to spare. Per shape, both
    # lose one copy of the 14-CPU shape to an 8-CPU job, so only the mix's average tells them
    # apart; whatever the seeded node order, the CPU-only job must not strand a lean GPU.
    lean = NodeShape("lean", "T4", 16, 4, 32, 256)
    roomy = NodeShape("roomy", "T4", 16, 4, 60, 256)
    mix = ShapeMix((PackRequest(1, cpus=2), PackRequest(1, cpus=14)), (1.0, 1.0))
    state = cluster(lean, roomy)
    assert pack(state, PackRequest(0, cpus=8), shape_mix=mix, seed=seed).node_name == "roomy"


def test_gpu_work_that_brings_many_cpus_goes_where_cpus_abound() -> None:
    lean = NodeShape("lean", "T4", 16, 4, 32, 256)
    roomy = NodeShape("roomy", "T4", 16, 4, 96, 256)
    mix = ShapeMix((PackRequest(1, cpus=8), PackRequest(1, cpus=24)), (3.0, 1.0))
    names = {
        pack(cluster(lean, roomy), PackRequest(1, cpus=24), shape_mix=mix, seed=s).node_name
        for s in range(6)
    }
    assert names == {"roomy"}


def test_slot_value_prices_gpu_sizes_by_how_they_pack() -> None:
    halves = ShapeMix((PackRequest(1, 0.5), PackRequest(1)), (3.0, 1.0))
    value = slot_value(halves)
    assert value[[0, 499, 500, 999, 1000]].tolist() == pytest.approx([0, 0, 500, 500, 1000])
    # 0.81 shares fit with nothing else in the mix: each costs a whole GPU. A 0.32 and a 0.65
    # share one GPU, so together they cost one (how the LP splits it between them is its own).
    big = ShapeMix((PackRequest(1, 0.81), PackRequest(1, 0.32), PackRequest(1, 0.65)), (1, 1, 1))
    value = slot_value(big)
    assert value[810] == pytest.approx(1000)
    assert value[320] + value[650] == pytest.approx(1000)
    assert value[970] == pytest.approx(1000)
    assert (np.diff(value) >= -1e-9).all()  # more free share is never worth less


def test_gpu_memory_request_becomes_a_share_of_each_nodes_gpu() -> None:
    state = cluster(A100, T4)
    reply = pack(state, PackRequest(1, gpu_mem_gb=20), policy="best_fit")
    assert reply.node_name == "a100-0"  # 20 GB does not fit a 16 GB T4
    assert reply.share_per_gpu == pytest.approx(0.25)


def test_model_constraint_matches_case_insensitively_and_by_prefix() -> None:
    state = cluster()
    assert pack(state, PackRequest(1, models=("a100",))).node_name == "a100-0"
    assert pack(state, PackRequest(1, models=("t4", "v100"))).node_name in ("t4-0", "v100-0")


def test_only_and_exclude_narrow_the_choice_without_changing_the_state() -> None:
    state = cluster()
    free = state.gm.copy()
    assert pack(state, PackRequest(2), only="a100-0").node_name == "a100-0"
    assert pack(state, PackRequest(2), only="t4-0").node_name == "t4-0"
    assert pack(state, PackRequest(4), only="t4-0").node is None  # 2 GPUs there
    chosen = pack(state, PackRequest(2)).node_name
    other = pack(state, PackRequest(2), exclude={chosen})
    assert other.node_name not in (None, chosen)
    assert pack(state, PackRequest(2), exclude={"a100-0", "t4-0", "v100-0"}).node is None
    assert (state.gm == free).all()
    with pytest.raises(InvalidSpecError, match="no node named"):
        pack(state, PackRequest(1), only="nope")


def test_cpu_and_memory_limit_placement() -> None:
    state = cluster(T4, V100)
    assert pack(state, PackRequest(1, cpus=20)).node_name == "v100-0"
    assert pack(state, PackRequest(1, mem_gb=100)).node_name == "v100-0"


def test_node_down_and_foreign_processes_are_avoided() -> None:
    state = cluster(T4, V100)
    state.set_node_up("v100-0", False)
    assert pack(state, PackRequest(1)).node_name == "t4-0"
    state.occupy_foreign("t4-0", 0, 0.3)
    assert pack(state, PackRequest(1), policy="best_fit").gpu_indices == (1,)
    state.occupy_foreign("t4-0", 1, 1.0)
    reply = pack(state, PackRequest(1))
    assert reply.node is None and reply.feasible_ever
    state.set_node_up("v100-0", True)
    assert pack(state, PackRequest(1)).node_name == "v100-0"


def test_release_returns_capacity() -> None:
    state = cluster(T4)
    reply = pack(state, PackRequest(2, cpus=4, mem_gb=8))
    state.allocate(reply)
    assert pack(state, PackRequest(1)).node is None
    state.release(reply.node_name, reply.gpu_indices, 1.0, cpus=4, mem_gb=8)
    assert pack(state, PackRequest(2, cpus=16, mem_gb=64)).node_name == "t4-0"


def test_copy_is_independent() -> None:
    state = cluster(T4)
    clone = state.copy()
    clone.allocate(pack(clone, PackRequest(2)))
    assert pack(state, PackRequest(2)).node_name == "t4-0"
    assert pack(clone, PackRequest(1)).node is None


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (PackRequest(16), "no node has 16 GPUs; the largest has 8 (a100-0)"),
        (
            PackRequest(1, models=("H100",)),
            "no GPU of model H100; models here: A100-80GB, T4, V100-32GB",
        ),
        (
            PackRequest(1, gpu_mem_gb=100),
            "no GPU has 100 GB of memory; the largest has 80 GB (a100-0)",
        ),
        (
            PackRequest(2, models=("T4",), cpus=32),
            "no node with 2 GPUs of model T4 has 32 CPUs; the largest has 16 (t4-0)",
        ),
        (
            PackRequest(0, mem_gb=1024),
            "no node with 0 GPUs has 1024 GB memory; the largest has 512 GB (a100-0)",
        ),
    ],
)
def test_never_feasible_requests_say_what_would_fit(request_: PackRequest, reason: str) -> None:
    reply = pack(cluster(), request_)
    assert reply.node is None
    assert reply.feasible_ever is False
    assert reply.reason == reason


def test_full_cluster_says_where_the_most_room_is() -> None:
    state = cluster(T4)
    state.allocate(pack(state, PackRequest(1)))
    reply = pack(state, PackRequest(2))
    assert reply.node is None and reply.feasible_ever
    assert reply.reason is not None
    assert reply.reason == (
        "needs 2 GPUs free on one node; the most now is 1 on t4-0 (1 node could hold it once "
        "jobs end)"
    )


def test_no_room_names_cpus_when_the_gpus_are_there() -> None:
    state = cluster(T4)
    state.allocate(pack(state, PackRequest(0, cpus=state.cpus_total[0] - 1)))
    reply = pack(state, PackRequest(1, cpus=4))
    assert reply.reason is not None and reply.reason.startswith(
        "needs 4 CPUs beside its GPUs; t4-0, which has the GPUs, has 1 CPUs free"
    )


def test_no_room_for_a_memory_share_says_how_much_memory_per_gpu() -> None:
    state = cluster(T4)
    state.allocate(pack(state, PackRequest(2, gpu_share=0.75)))
    reply = pack(state, PackRequest(1, gpu_mem_gb=8))
    assert reply.reason is not None and reply.reason.startswith(
        "needs 1 GPU with 8G free each on one node; the most now is 0 on t4-0"
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_places_and_reports_infeasible(policy: str) -> None:
    state = cluster()
    replies = pack_many(
        state, [PackRequest(4), PackRequest(1, 0.5), PackRequest(16)], policy=policy
    )
    assert [r.node is not None for r in replies] == [True, True, False]
    m = metrics(state)
    assert m.allocated_share == pytest.approx(4.5 / 14)
    assert m.unallocated_share == pytest.approx(1 - 4.5 / 14)


def test_metrics_on_an_empty_cluster() -> None:
    m = metrics(cluster())
    assert m.allocated_share == 0.0
    assert m.free_nodes_by_size == {2: 1, 4: 1, 8: 1}
    assert m.largest_placeable_gpus == 8
    # the generic mix (half GPU, 1, 2, 4, 8 GPUs at equal GPU mass) finds 4 and 8 GPU jobs
    # cannot use the T4 node, and 8 GPU jobs cannot use the V100 node
    assert m.frag_ratio == pytest.approx((0.375 * 2 + 0.125 * 4) / 3.875 / 14)
    assert m.to_dict()["free_nodes_by_size"] == {"2": 1, "4": 1, "8": 1}


def test_bad_requests_raise_invalid_spec() -> None:
    with pytest.raises(InvalidSpecError):
        pack(cluster(), PackRequest(-1))
    with pytest.raises(InvalidSpecError):
        pack(cluster(), PackRequest(1, gpu_share=1.5))
    with pytest.raises(InvalidSpecError):
        pack(cluster(), PackRequest(1), policy="nope")
    with pytest.raises(InvalidSpecError):
        pack(cluster(), PackRequest(1), tie_break="coin")
