"""Expected starts of waiting jobs: the backfill's estimate, for the whole queue."""

from __future__ import annotations

from datetime import timedelta

from _fixtures_policy import T0, make_job

from jupyter_gpusched.core.backfill import (
    estimate_runtime_s,
    expected_starts,
    reserved_start,
)
from jupyter_gpusched.core.models import JobState


def hours(h: float) -> timedelta:
    return timedelta(hours=h)


def running(job_id: int, node: str, gpus: int, started_h_ago: float, runtime_h: float):  # noqa: ANN201
    return make_job(
        job_id,
        gpus=gpus,
        node=node,
        state=JobState.RUNNING,
        started_at=T0 - hours(started_h_ago),
        max_runtime_s=runtime_h * 3600,
    )


def estimate(job):  # noqa: ANN001, ANN201
    return estimate_runtime_s(job, ())


# a100-0: 6 of 8 GPUs busy until T0+1h (job 1) and T0+3h (job 2); a100-1: 5 busy until T0+2h
RUNNING = [
    running(1, "a100-0", 3, 1, 2),
    running(2, "a100-0", 3, 1, 4),
    running(3, "a100-1", 5, 1, 3),
]
FREE = {"a100-0": 2.0, "a100-1": 3.0}


def test_the_head_gets_the_backfill_reservation() -> None:
    head = make_job(10, gpus=8, max_runtime_s=3600)
    starts = expected_starts([head], RUNNING, FREE, T0, estimate=estimate)
    assert starts[10] == reserved_start(head, RUNNING, FREE, T0, estimate=estimate).start
    assert starts[10] == T0 + hours(2)  # a100-1 is whole at T0+2h


def test_jobs_behind_the_head_wait_for_what_it_takes() -> None:
    queue = [
        make_job(10, gpus=8, max_runtime_s=2 * 3600),  # a100-1 from T0+2h to T0+4h
        make_job(11, gpus=8, max_runtime_s=3600),  # a100-0 is whole from T0+3h
        make_job(12, gpus=2, max_runtime_s=3600),  # fits now on a100-0's 2 free GPUs
        make_job(13, gpus=4, max_runtime_s=3600),
    ]
    starts = expected_starts(queue, RUNNING, FREE, T0, estimate=estimate)
    assert starts[10] == T0 + hours(2)
    assert starts[11] == T0 + hours(3)
    assert starts[12] == T0
    # a100-1 is job 10's from +2h to +4h; on a100-0 job 12 holds the 2 free GPUs until +1h,
    # when job 1 frees 3 more: 5 free from +1h until job 11 takes the node at +3h
    assert starts[13] == T0 + hours(1)


def test_a_lower_bound_holds_a_job_back() -> None:
    queue = [make_job(10, gpus=1, max_runtime_s=600)]
    starts = expected_starts(
        queue, RUNNING, FREE, T0, estimate=estimate, not_before={10: T0 + hours(5)}
    )
    assert starts[10] == T0 + hours(5)


def test_a_job_that_never_fits_has_no_expected_start() -> None:
    queue = [make_job(10, gpus=8), make_job(11, gpus=16)]
    starts = expected_starts(queue, RUNNING, FREE, T0, estimate=estimate)
    assert starts[10] is not None
    assert starts[11] is None


def test_overrunning_jobs_are_expected_to_end_now() -> None:
    late = [running(1, "a100-0", 8, 5, 1)]  # declared 1 h, running for 5 h
    starts = expected_starts([make_job(10, gpus=8)], late, {"a100-0": 0.0}, T0, estimate=estimate)
    assert starts[10] == T0


def test_a_job_may_span_an_instant_where_one_job_ends_as_another_starts() -> None:
    # a100-0: 2 free; job 1 holds 6 until T0+1h, when job 10 (6 GPUs, not before +1h) takes
    # them over. Job 11 fits the 2 free for 3 h from now: the level never drops at +1h (it
    # was once read as a dip to -4 there, and job 11 expected an hour late).
    busy = [running(1, "a100-0", 6, 1, 2)]
    queue = [make_job(10, gpus=6, max_runtime_s=3600), make_job(11, gpus=2, max_runtime_s=3 * 3600)]
    starts = expected_starts(
        queue, busy, {"a100-0": 2.0}, T0, estimate=estimate, not_before={10: T0 + hours(1)}
    )
    assert starts[10] == T0 + hours(1)
    assert starts[11] == T0
