"""Queue policy: fair share, quotas, admission, order, backfill, preemption, CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _fixtures_policy import T0, make_job

from jupyter_gpusched.cli import policy as policy_cli
from jupyter_gpusched.core.backfill import (
    Release,
    Reservation,
    backfill_allowed,
    consume_spare,
    estimate_runtime_s,
    reserved_start,
)
from jupyter_gpusched.core.models import JobState
from jupyter_gpusched.core.policy import (
    AdmissionContext,
    UsageRecord,
    add_to_context,
    admit,
    batch_runtime_limit_s,
    fair_share_usage,
    gpu_hours_today,
    lease_idle_expired,
    order_queue,
)
from jupyter_gpusched.core.preemption import (
    Migration,
    PreemptCandidate,
    choose_migration,
    choose_preemptions,
)
from jupyter_gpusched.core.windows import DEFAULT_WINDOWS, PolicyConfig, Quota, Window

UTC = UTC
DAY, NIGHT = DEFAULT_WINDOWS


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# ------------------------------------------------------------------ fair share and quotas


def test_usage_of_a_finished_job_halves_after_one_half_life() -> None:
    record = UsageRecord("alice", 2.0, T0 - timedelta(hours=1), T0)
    fresh = fair_share_usage([record], 3600.0, T0)["alice"]
    later = fair_share_usage([record], 3600.0, T0 + timedelta(hours=1))["alice"]

    assert later == pytest.approx(fresh / 2)
    assert 1.0 < fresh < 2.0  # under 2 GPU-hours: the early part has decayed already


def test_running_jobs_count_up_to_now_and_plain_tuples_work() -> None:
    usage = fair_share_usage([("bob", 1.0, T0 - timedelta(hours=2), None)], 1e12, T0)
    assert usage == {"bob": pytest.approx(2.0)}


def test_gpu_hours_today_start_at_local_midnight() -> None:
    config = PolicyConfig(timezone="Europe/Berlin")
    # Local midnight in Berlin is 23:00 UTC the day before.
    records = [UsageRecord("alice", 4.0, utc(2026, 11, 22, 22), utc(2026, 11, 23, 1))]
    assert gpu_hours_today(records, config, T0) == {"alice": pytest.approx(8.0)}


def ctx_for(**kwargs: object) -> AdmissionContext:
    base: dict[str, object] = {"window": DAY, "now": T0, "total_gpus": 32}
    return AdmissionContext(**{**base, **kwargs})  # type: ignore[arg-type]


def test_quota_on_gpus_at_once_makes_the_job_wait_with_the_numbers() -> None:
    ctx = ctx_for(user_gpus={"alice": 4}, default_quota=Quota(gpus_at_once=4))
    admission = admit(make_job(1, gpus=1), ctx)
    assert not admission
    assert admission.reason == "waiting: quota (4 of 4 GPUs in use)"


def test_quota_per_user_overrides_the_default() -> None:
    ctx = ctx_for(
        user_gpus={"alice": 4},
        default_quota=Quota(gpus_at_once=4),
        quotas={"alice": Quota(gpus_at_once=8)},
    )
    assert admit(make_job(1, gpus=4), ctx).ok


def test_quota_on_gpu_hours_per_day() -> None:
    ctx = ctx_for(user_gpu_hours_today={"alice": 12.5}, default_quota=Quota(gpu_hours_per_day=12))
    assert admit(make_job(1), ctx).reason == ("waiting: quota (12.5 of 12 GPU-hours used today)")


def test_day_window_keeps_the_reserved_share_from_batch() -> None:
    ctx = ctx_for(batch_gpus=24)
    admission = admit(make_job(1), ctx)
    assert admission.reason == (
        "waiting: the day window reserves 25% of GPUs (8) for interactive work; batch jobs "
        "hold 24 of the other 24"
    )
    assert admit(make_job(2, kind="lease"), ctx).ok
    assert admit(make_job(3), ctx_for(window=NIGHT, batch_gpus=24)).ok


@pytest.mark.parametrize(
    ("window", "batch_gpus", "interactive_gpus"),
    [(NIGHT, 28, 0), (DAY, 20, 8), (DAY, 30, 0)],
)
def test_a_job_that_finds_too_few_gpus_free_is_not_blamed_on_the_window(
    window: object, batch_gpus: float, interactive_gpus: float
) -> None:
    # 8 GPUs wanted, fewer free: the packer says which GPUs are missing where, not the window
    ctx = ctx_for(window=window, batch_gpus=batch_gpus, interactive_gpus=interactive_gpus)
    assert admit(make_job(1, gpus=8), ctx).ok


def test_interactive_work_is_capped_at_the_window_max_share() -> None:
    ctx = ctx_for(window=NIGHT, interactive_gpus=16)
    assert admit(make_job(1, kind="lease"), ctx).reason == (
        "waiting: night window lets interactive work take at most 50% of GPUs (16 of 16 in use)"
    )


def test_not_before_is_shown_in_the_policy_timezone() -> None:
    job = make_job(1, not_before=utc(2026, 11, 23, 21))
    ctx = ctx_for(timezone="Europe/Berlin")
    assert admit(job, ctx).reason == "waiting: not before 22:00"
    assert admit(job, ctx_for(now=utc(2026, 11, 23, 21))).ok


def test_held_job_waits() -> None:
    assert admit(make_job(1, held=True), ctx_for()).reason == "waiting: held by its owner"


def test_batch_job_declaring_more_than_the_day_limit_waits_for_night() -> None:
    long = make_job(1, max_runtime_s=8 * 3600)
    assert admit(long, ctx_for()).reason == (
        "waiting: declares 8h runtime, day window starts batch jobs of at most 4h"
    )
    assert admit(long, ctx_for(window=NIGHT)).runtime_limit_s == 8 * 3600


def test_undeclared_batch_job_started_by_day_gets_the_day_limit() -> None:
    assert admit(make_job(1), ctx_for()).runtime_limit_s == 4 * 3600
    assert batch_runtime_limit_s(DAY) == 4 * 3600 and batch_runtime_limit_s(NIGHT) is None


def test_context_counts_running_jobs_by_class_and_user() -> None:
    running = [make_job(1, kind="lease", gpus=2), make_job(2, gpus=4, user="bob")]
    ctx = AdmissionContext.build(
        config=PolicyConfig(),
        window=DAY,
        now=T0,
        total_gpus=32,
        running=running,
        hours_today=gpu_hours_today(
            [("bob", 4.0, T0 - timedelta(hours=2), None)], PolicyConfig(), T0
        ),
    )
    ctx = add_to_context(ctx, make_job(3, gpus=1))
    assert (ctx.interactive_gpus, ctx.batch_gpus) == (2, 5)
    assert ctx.user_gpus == {"alice": 3, "bob": 4}
    assert ctx.user_gpu_hours_today == {"bob": pytest.approx(8.0)}


# ------------------------------------------------------------------ queue order


def test_by_day_interactive_goes_first_then_lower_usage_then_age() -> None:
    jobs = [
        make_job(1, user="heavy", submitted_at=T0 - timedelta(hours=3)),
        make_job(2, user="light", submitted_at=T0 - timedelta(hours=1)),
        make_job(3, kind="lease", user="heavy", submitted_at=T0),
        make_job(4, user="light", submitted_at=T0 - timedelta(hours=2)),
    ]
    order = order_queue(jobs, {"heavy": 100.0, "light": 1.0}, T0, DAY)
    assert [j.id for j in order.jobs] == [3, 4, 2, 1]


def test_without_interactive_first_fair_share_alone_decides() -> None:
    equal = Window("night", interactive_first=False)
    jobs = [make_job(1, user="light"), make_job(2, kind="lease", user="heavy")]
    order = order_queue(jobs, {"heavy": 100.0, "light": 1.0}, T0, equal)
    assert [j.id for j in order.jobs] == [1, 2]


def test_held_and_future_jobs_are_set_aside_with_reasons() -> None:
    jobs = [
        make_job(1, held=True),
        make_job(2, not_before=T0 + timedelta(hours=1)),
        make_job(3, state=JobState.RUNNING),
        make_job(4),
    ]
    order = order_queue(jobs, {}, T0, DAY, timezone_name="Europe/Berlin")
    assert [j.id for j in order.jobs] == [4]
    assert order.skipped == {
        1: "waiting: held by its owner",
        2: "waiting: not before 11:00",
        3: "not queued (running)",
    }


# ------------------------------------------------------------------ backfill


def test_runtime_estimate_prefers_declared_then_history_then_default() -> None:
    past = [
        make_job(
            i, started_at=T0, finished_at=T0 + timedelta(minutes=10 * i), state=JobState.SUCCEEDED
        )
        for i in range(1, 11)
    ]
    assert estimate_runtime_s(make_job(99, max_runtime_s=60), past) == 60
    assert estimate_runtime_s(make_job(99), past) == 90 * 60  # 90th percentile of 10..100 min
    assert estimate_runtime_s(make_job(99), [], default_s=123) == 123
    assert estimate_runtime_s(make_job(99), [600.0, 1200.0], percentile=50) == 600


def test_reserved_start_is_when_enough_gpus_free_up_on_one_node() -> None:
    running = [
        make_job(1, gpus=4, node="a", state=JobState.RUNNING, started_at=T0, max_runtime_s=3600),
        make_job(2, gpus=4, node="b", state=JobState.RUNNING, started_at=T0, max_runtime_s=1800),
        make_job(3, gpus=4, node="b", state=JobState.RUNNING, started_at=T0, max_runtime_s=7200),
    ]
    head = make_job(10, gpus=8)
    # Half an hour after b frees 4 GPUs nothing fits 8; at 1 h node a has 4 + 4 free.
    reservation = reserved_start(head, running, {"a": 4, "b": 0}, T0)
    assert reservation == Reservation(T0 + timedelta(hours=1), "a", 0.0)


def test_reserved_start_now_when_the_head_fits_and_never_when_it_cannot() -> None:
    assert reserved_start(2, [], {"a": 3}, T0) == Reservation(T0, "a", 1.0)
    assert reserved_start(16, [], {"a": 8, "b": 8}, T0).start is None


def test_count_based_reservation_uses_one_pseudo_node() -> None:
    releases = [Release("x", 3, T0 + timedelta(hours=2))]
    assert reserved_start(4, releases, 1.0, T0) == Reservation(T0 + timedelta(hours=2), "*", 0.0)


def test_backfill_only_when_it_cannot_delay_the_head() -> None:
    reservation = Reservation(T0 + timedelta(hours=2), "a", 1.0)
    two = make_job(1, gpus=2)
    assert backfill_allowed(two, reservation, T0, 3600).ok  # ends before the head starts
    assert backfill_allowed(two, reservation, T0, 3 * 3600, node="b").ok  # another node
    assert backfill_allowed(make_job(2), reservation, T0, 3 * 3600).ok  # fits the spare GPU
    late = backfill_allowed(two, reservation, T0, 3 * 3600)
    assert not late and late.reason == (
        "waiting: would delay the queue's head, due to start at 2026-11-23T11:00+00:00"
    )
    assert not backfill_allowed(two, T0 + timedelta(hours=2), T0, 3 * 3600)


def test_only_a_job_still_on_the_reserved_node_at_its_start_takes_the_spare() -> None:
    reservation = Reservation(T0 + timedelta(hours=2), "a", 2.0)
    taken = Reservation(T0 + timedelta(hours=2), "a", 1.0)
    assert consume_spare(reservation, 1, node="b", ends_at=T0 + timedelta(hours=5)) == reservation
    assert consume_spare(reservation, 1, node="a", ends_at=T0 + timedelta(hours=1)) == reservation
    assert consume_spare(reservation, 1, node="a", ends_at=T0 + timedelta(hours=3)) == taken
    assert consume_spare(reservation, 1) == taken  # unknown node and end: assume the worst
    assert consume_spare(reservation, 5, node="a").spare_gpus == 0.0


# ------------------------------------------------------------------ preemption and leases


def test_preemption_picks_the_least_work_lost_then_fewest_jobs() -> None:
    cands = [
        PreemptCandidate(1, 4, T0 - timedelta(hours=1)),  # 4 GPU-h lost
        PreemptCandidate(2, 2, T0 - timedelta(hours=1)),  # 2 GPU-h
        PreemptCandidate(3, 2, T0 - timedelta(hours=3), T0 - timedelta(minutes=30)),  # 1 GPU-h
        PreemptCandidate(4, 1, T0 - timedelta(hours=10)),  # 10 GPU-h
    ]
    assert choose_preemptions(4, cands, T0, window=DAY) == [2, 3]
    assert choose_preemptions(2, cands, T0, window=DAY) == [3]


def test_preemption_follows_the_placement_check() -> None:
    cands = [PreemptCandidate(1, 1, T0), PreemptCandidate(2, 4, T0 - timedelta(hours=1))]
    # Only job 2's node could host the lease once freed.
    assert choose_preemptions(1, cands, T0, lambda ids: 2 in ids, window=DAY) == [2]


def test_no_preemption_when_the_window_forbids_it_or_nothing_helps() -> None:
    cands = [PreemptCandidate(1, 2, T0)]
    assert choose_preemptions(1, cands, T0, window=NIGHT) is None
    assert choose_preemptions(4, cands, T0, window=DAY) is None


def test_preemption_reads_checkpoints_from_running_jobs() -> None:
    jobs = [
        make_job(1, gpus=2, state=JobState.RUNNING, started_at=T0 - timedelta(hours=5),
                 handle={"checkpoint_at": (T0 - timedelta(minutes=5)).isoformat()}),
        make_job(2, gpus=2, state=JobState.RUNNING, started_at=T0 - timedelta(hours=1)),
    ]  # fmt: skip
    assert choose_preemptions(2, jobs, T0) == [1]


def test_idle_lease_expires_after_the_window_timeout() -> None:
    lease = make_job(
        1, kind="lease", state=JobState.RUNNING, started_at=T0 - timedelta(hours=3),
        last_activity_at=T0 - timedelta(minutes=31),
    )  # fmt: skip
    assert lease_idle_expired(lease, DAY, T0)
    assert not lease_idle_expired(lease, NIGHT, T0)  # 2 h by night
    assert not lease_idle_expired(lease, Window("w"), T0)  # no timeout


# ------------------------------------------------------------------ CLI


@pytest.fixture
def no_user_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the machine's own Jupyter config files out of the CLI's view."""
    monkeypatch.setenv("JUPYTER_NO_CONFIG", "1")


@pytest.mark.usefixtures("no_user_config")
def test_policy_cli_explains_a_known_instant(capsys: pytest.CaptureFixture[str]) -> None:
    assert policy_cli.main(["--at", "2026-11-23 09:00"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("At Mon 2026-11-23 09:00 UTC (UTC) the 'day' window is in force.\n")
    assert "next change: 'night' from Mon 2026-11-23 20:00 UTC (in 11h)" in out


def test_policy_cli_reads_a_config_file_and_local_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "jupyter_server_config.json"
    path.write_text(json.dumps({"GpuSchedPolicy": {"timezone": "Europe/Berlin"}}))
    argv = ["--at", "2026-11-23 08:30", "--config", str(path), "--json"]
    assert policy_cli.main(argv) == 0
    view = json.loads(capsys.readouterr().out)
    assert datetime.fromisoformat(view["at"]) == utc(2026, 11, 23, 7, 30)
    assert view["window"]["name"] == "day"
    assert datetime.fromisoformat(view["window"]["since"]) == utc(2026, 11, 23, 7)


@pytest.mark.usefixtures("no_user_config")
def test_policy_cli_accepts_offsets_and_now(capsys: pytest.CaptureFixture[str]) -> None:
    assert policy_cli.main(["--at", "2026-11-21T10:00+01:00"]) == 0
    assert "the 'night' window" in capsys.readouterr().out
    assert policy_cli.main(["--at", "now"], now=utc(2026, 11, 24, 12)) == 0
    assert "At Tue 2026-11-24 12:00 UTC" in capsys.readouterr().out


@pytest.mark.usefixtures("no_user_config")
def test_policy_cli_bad_time_prints_one_line_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert policy_cli.main(["--at", "next tuesday"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "'next tuesday' is not a time" in captured.err


# ------------------------------------------------------------------ moving batch jobs


def _on(
    job_id: int, node: str, gpus: float, ran_h: float, checkpoint_h: float | None = None
) -> PreemptCandidate:
    """A candidate on ``node`` that started ``ran_h`` ago and checkpointed ``checkpoint_h`` ago."""
    mark = None if checkpoint_h is None else T0 - timedelta(hours=checkpoint_h)
    return PreemptCandidate(job_id, gpus, T0 - timedelta(hours=ran_h), mark, node)


def test_migration_moves_the_cheapest_jobs_off_the_best_node() -> None:
    running = [_on(1, "a", 2, 3, 0.5), _on(2, "a", 2, 3, 0.1), _on(3, "b", 6, 1)]
    plan_calls: list[tuple[str, frozenset[int]]] = []

    def plan(node: str, ids: frozenset[int]) -> bool:
        plan_calls.append((node, ids))
        return True

    move = choose_migration(
        8,
        {"a": 4, "b": 2},
        running,
        T0,
        T0 + timedelta(hours=2),
        plan,
        window=Window("night", migrate_batch=True),
    )
    # a needs 4 more GPUs: both of its jobs (0.6 h of 2 GPUs lost, and 5 min on 4 GPUs to
    # restart); b would lose 6 GPU-h
    assert move == Migration("a", (1, 2), pytest.approx(2 * 0.6 * 3600 + 4 * 300))
    assert plan_calls == [("a", frozenset({1, 2}))]


def test_migration_only_when_the_work_lost_is_less_than_the_idle_time_saved() -> None:
    running = [_on(1, "a", 4, 3)]  # no checkpoint: 12 GPU-h lost, and a restart

    def plan(node: str, ids: frozenset[int]) -> bool:
        return True

    night = Window("night", migrate_batch=True)
    soon, late = T0 + timedelta(hours=1), T0 + timedelta(hours=2)  # 8 or 16 GPU-h idle saved
    assert choose_migration(8, {"a": 4}, running, T0, soon, plan, window=night) is None
    assert choose_migration(8, {"a": 4}, running, T0, late, plan, window=night) is not None
    assert choose_migration(8, {"a": 4}, running, T0, late, plan, window=Window("day")) is None
    assert choose_migration(8, {"a": 4}, running, T0, None, plan, window=night) is None
    assert choose_migration(8, {"a": 4}, running, T0, late, lambda n, i: False) is None
