"""Hypothesis properties of the policy: queue order, backfill, preemption, fair share."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from _fixtures_policy import T0, make_job
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jupyter_gpusched.core.backfill import Release, backfill_allowed, consume_spare, reserved_start
from jupyter_gpusched.core.policy import UsageRecord, fair_share_usage, order_queue
from jupyter_gpusched.core.preemption import (
    PreemptCandidate,
    choose_preemptions,
    preemption_cost_gpu_s,
)
from jupyter_gpusched.core.windows import Window

queued_jobs = st.lists(
    st.builds(
        dict,
        kind=st.sampled_from(["script", "lease"]),
        user=st.sampled_from(["ann", "bob", "cy"]),
        age_min=st.integers(0, 600),
        held=st.booleans(),
        later=st.booleans(),
    ),
    max_size=12,
)


@given(
    queued_jobs, st.booleans(), st.dictionaries(st.sampled_from(["ann", "bob"]), st.floats(0, 1e3))
)
def test_queue_order_is_a_permutation_sorted_by_class_usage_age(
    specs: list[dict[str, object]], interactive_first: bool, usage: dict[str, float]
) -> None:
    jobs = [
        make_job(
            i,
            kind=str(s["kind"]),
            user=str(s["user"]),
            submitted_at=T0 - timedelta(minutes=int(s["age_min"])),  # type: ignore[call-overload]
            held=bool(s["held"]),
            not_before=T0 + timedelta(hours=1) if s["later"] else None,
        )
        for i, s in enumerate(specs)
    ]
    window = Window("w", interactive_first=interactive_first)
    order = order_queue(jobs, usage, T0, window)

    assert sorted([j.id for j in order.jobs] + list(order.skipped)) == [j.id for j in jobs]
    assert all(not j.held and j.spec.not_before is None for j in order.jobs)
    keys = [
        (
            int(interactive_first and j.spec.kind.value != "lease"),
            usage.get(j.user, 0.0),
            j.submitted_at,
        )
        for j in order.jobs
    ]
    assert keys == sorted(keys)


candidates = st.lists(
    st.builds(
        lambda g, age, ck: PreemptCandidate(0, g, T0 - timedelta(minutes=age), ck),
        st.sampled_from([0.5, 1, 2, 4, 8]),
        st.integers(0, 600),
        st.one_of(st.none(), st.just(T0 - timedelta(minutes=7))),
    ),
    max_size=7,
).map(
    lambda cs: [
        PreemptCandidate(i, c.gpus, c.started_at, c.checkpoint_at) for i, c in enumerate(cs)
    ]
)


@settings(max_examples=200, deadline=None)
@given(candidates, st.sampled_from([0.5, 1, 2, 3, 4, 8, 12]))
def test_preemption_frees_enough_at_minimal_cost(
    cands: list[PreemptCandidate], need: float
) -> None:
    day = Window("day", preempt_batch=True)
    chosen = choose_preemptions(need, cands, T0, window=day)
    by_id = {c.job_id: c for c in cands}

    def cost(ids: tuple[int, ...]) -> tuple[float, int]:
        return (round(sum(preemption_cost_gpu_s(by_id[i], T0) for i in ids), 6), len(ids))

    feasible = [
        ids
        for n in range(1, len(cands) + 1)
        for ids in itertools.combinations(sorted(by_id), n)
        if sum(by_id[i].gpus for i in ids) >= need
    ]
    if not feasible:
        assert chosen is None
        return
    assert chosen is not None
    assert sum(by_id[i].gpus for i in chosen) >= need
    assert cost(tuple(chosen)) == min(cost(ids) for ids in feasible)


running_on_nodes = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 4), st.integers(1, 600)),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    running_on_nodes,
    st.integers(1, 8),
    st.integers(1, 4),
    st.integers(1, 900),
    st.sampled_from([None, "a", "b", "c"]),
)
def test_allowed_backfill_never_delays_the_head(
    running: list[tuple[str, int, int]], head_gpus: int, cand_gpus: int, cand_min: int,
    node: str | None,
) -> None:  # fmt: skip
    capacity = 8.0
    free = {n: capacity - sum(g for m, g, _ in running if m == n) for n in "abc"}
    if min(free.values()) < 0:
        return
    releases = [Release(n, g, T0 + timedelta(minutes=m)) for n, g, m in running]
    reservation = reserved_start(head_gpus, releases, free, T0)
    cand = make_job(99, gpus=cand_gpus)
    target = node or reservation.node or "a"
    if free[target] < cand_gpus:
        return  # the packer would not place it there
    if not backfill_allowed(cand, reservation, T0, cand_min * 60.0, node=node):
        return
    after_free = {**free, target: free[target] - cand_gpus}
    after = [*releases, Release(target, cand_gpus, T0 + timedelta(minutes=cand_min))]
    delayed = reserved_start(head_gpus, after, after_free, T0)
    assert reservation.start is None or (
        delayed.start is not None and delayed.start <= reservation.start
    )


@settings(max_examples=300, deadline=None)
@given(
    running_on_nodes,
    st.integers(1, 8),
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 900), st.sampled_from("abc")),
        min_size=1,
        max_size=4,
    ),
)
# Node a frees 4 of its 8 GPUs at 2 h for a 6-GPU head (2 spare): one long 2-GPU job may take
# the spare, a second may not.
@example(
    [("a", 4, 120), ("b", 4, 600), ("b", 4, 600), ("c", 4, 600), ("c", 4, 600)],
    6,
    [(2, 900, "a"), (2, 900, "a")],
)
def test_a_run_of_allowed_backfills_never_delays_the_head(
    running: list[tuple[str, int, int]], head_gpus: int, cands: list[tuple[int, int, str]]
) -> None:
    """What the scheduler does in one pass: backfill, then ``consume_spare``, repeatedly."""
    free = {n: 8.0 - sum(g for m, g, _ in running if m == n) for n in "abc"}
    if min(free.values()) < 0:
        return
    releases = [Release(n, g, T0 + timedelta(minutes=m)) for n, g, m in running]
    reservation = first = reserved_start(head_gpus, releases, free, T0)
    if first.start is None or first.start == T0:
        return
    for i, (gpus, minutes, node) in enumerate(cands):
        ends = T0 + timedelta(minutes=minutes)
        cand = make_job(100 + i, gpus=gpus)
        if free[node] < gpus or not backfill_allowed(cand, reservation, T0, minutes * 60.0, node):
            continue
        free[node] -= gpus
        releases.append(Release(node, gpus, ends))
        reservation = consume_spare(reservation, gpus, node=node, ends_at=ends)
    delayed = reserved_start(head_gpus, releases, free, T0)
    assert delayed.start is not None and delayed.start <= first.start


records = st.lists(
    st.builds(
        lambda g, a, d: UsageRecord("u", g, T0 - timedelta(hours=a + d), T0 - timedelta(hours=a)),
        st.floats(0.5, 8),
        st.floats(0, 100),
        st.floats(0, 50),
    ),
    max_size=6,
)


@given(records, st.floats(60, 1e7), st.floats(1, 1e6))
def test_fair_share_decays_by_half_per_half_life_and_splits_additively(
    recs: list[UsageRecord], half_life_s: float, later_s: float
) -> None:
    now = fair_share_usage(recs, half_life_s, T0).get("u", 0.0)
    later = fair_share_usage(recs, half_life_s, T0 + timedelta(seconds=later_s)).get("u", 0.0)
    assert later == pytest.approx(now * 0.5 ** (later_s / half_life_s), rel=1e-6, abs=1e-9)
    halves = [
        part
        for r in recs
        for mid in [r.start + (r.end - r.start) / 2]  # type: ignore[operator]
        for part in (r._replace(end=mid), r._replace(start=mid))
    ]
    split = fair_share_usage(halves, half_life_s, T0).get("u", 0.0)
    assert split == pytest.approx(now, rel=1e-6, abs=1e-9)
