"""Expected starts say what they rest on, give a range, and say "unknown" rather than guess.

Issue #32: "starts in 3h59m" rested on a 4 h default for jobs with no runtime limit but read
as certain; later the same queue said "starts any moment" while every GPU had 40+ min left
(a running job that outlived its estimate was expected to end "now").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from _fixtures_policy import T0, make_job
from _fixtures_scheduler import SATURDAY_NIGHT, memory_scheduler

from jupyter_gpusched.cli.formats import format_queue, waiting_line
from jupyter_gpusched.client.lines import waiting_line as magic_waiting_line
from jupyter_gpusched.client.widgets import _why
from jupyter_gpusched.cluster.memory import Run
from jupyter_gpusched.core.api import JobView
from jupyter_gpusched.core.estimates import Runtime, StartEstimate, runtime, start_estimates
from jupyter_gpusched.core.models import Job, JobState

#: Runtimes (s) of each user's finished jobs.
HISTORY: dict[str, Sequence[float]] = {"carol": [600.0, 900.0, 1200.0]}


def minutes(m: float) -> timedelta:
    return timedelta(minutes=m)


def runtime_of(job: Job) -> Runtime:
    return runtime(job, HISTORY.get(job.user, ()))


def busy(job_id: int, user: str, started_min_ago: float, **spec: Any) -> Job:
    """A running job holding all 8 GPUs of a100-0."""
    return make_job(
        job_id,
        gpus=8,
        user=user,
        node="a100-0",
        state=JobState.RUNNING,
        started_at=T0 - minutes(started_min_ago),
        **spec,
    )


def estimate_for(running: Job, waiting: Job | None = None) -> StartEstimate:
    waiting = waiting or make_job(10, gpus=8, max_runtime_s=3600)
    out = start_estimates([waiting], [running], {"a100-0": 0.0}, T0, runtime_of=runtime_of)
    found = out[waiting.id]
    assert found is not None
    return found


def test_a_start_behind_a_job_with_no_limit_and_no_history_is_a_guess_with_a_nudge() -> None:
    est = estimate_for(busy(1, "alice", started_min_ago=1))
    assert est.basis == "guess"
    assert est.at == T0 + minutes(239)  # the 4 h default, as before, but no longer certain
    assert est.latest is None  # nothing bounds a job that set no limit
    assert est.earliest == T0
    assert "job 1 set no --max-runtime" in est.note and "4h is assumed" in est.note


def test_a_job_that_outlived_its_owners_runtimes_makes_the_start_unknown_not_any_moment() -> None:
    # carol's jobs ran 10-20 min; this one has run 45 min and declared no limit
    est = estimate_for(busy(1, "carol", started_min_ago=45))
    assert est.basis == "unknown" and est.at is None and est.latest is None
    assert "job 1 ran longer than any estimate" in est.note and "--max-runtime" in est.note


def test_a_start_behind_declared_limits_has_a_firm_latest() -> None:
    est = estimate_for(busy(1, "alice", started_min_ago=20, max_runtime_s=3600))
    assert est.basis == "limits"
    assert est.at == est.latest == T0 + minutes(40)
    assert est.earliest == T0  # a job may end before its limit
    assert est.note == "from declared runtime limits; the latest is firm"


def test_a_start_behind_a_window_deadline_rests_on_that_limit() -> None:
    job = busy(1, "alice", started_min_ago=20)
    job.handle["deadline"] = (T0 + minutes(100)).isoformat()  # the window's batch limit
    est = estimate_for(job)
    assert est.basis == "limits" and est.at == est.latest == T0 + minutes(100)


def test_a_start_behind_a_job_past_its_deadline_is_any_moment() -> None:
    job = busy(1, "alice", started_min_ago=70, max_runtime_s=3600)  # being stopped
    job.handle["deadline"] = (T0 - minutes(10)).isoformat()
    est = estimate_for(job)
    assert est.basis == "limits" and est.at == T0


def test_a_start_from_history_spans_the_owners_shortest_to_longest_runtime() -> None:
    est = estimate_for(busy(1, "carol", started_min_ago=5))
    assert est.basis == "history"
    assert est.at == T0 + minutes(15)  # 90th percentile: 20 min, 5 already run
    assert (est.earliest, est.latest) == (T0 + minutes(5), T0 + minutes(15))
    assert est.note == "from past runtimes of the owners' jobs (job 1)"


def test_a_job_that_fits_now_rests_on_nothing() -> None:
    waiting = make_job(10, gpus=2)
    out = start_estimates([waiting], [], {"a100-0": 8.0}, T0, runtime_of=runtime_of)
    assert out[10] == StartEstimate(T0, T0, T0, "free", "GPUs free for it then")


def test_a_guess_ahead_in_the_queue_carries_to_the_jobs_behind_it() -> None:
    queue = [make_job(10, gpus=8, user="bob"), make_job(11, gpus=8, max_runtime_s=600)]
    ends = busy(1, "alice", started_min_ago=20, max_runtime_s=3600)
    out = start_estimates(queue, [ends], {"a100-0": 0.0}, T0, runtime_of=runtime_of)
    head, behind = out[10], out[11]
    assert head is not None and behind is not None
    assert head.basis == "limits"
    assert behind.basis == "guess" and behind.at == T0 + minutes(40 + 240)
    assert "job 10 set no --max-runtime" in behind.note
    assert behind.latest is None


def test_a_job_with_no_limit_of_its_own_is_told_a_limit_could_start_it_sooner() -> None:
    est = estimate_for(busy(1, "alice", started_min_ago=1), make_job(10, gpus=8, user="bob"))
    assert est.note.endswith("with a --max-runtime this job could also start sooner, in gaps")


@pytest.mark.asyncio
async def test_the_api_says_unknown_behind_a_job_that_outlived_its_owners_runtimes(
    tmp_path: Path,
) -> None:
    """The queue said "starts any moment" while every GPU had 40+ min left (issue #32)."""
    async with memory_scheduler(tmp_path, start=SATURDAY_NIGHT) as h:  # no batch time limit
        quick = h.submit("bob", gpus=1, gpu_models=["T4"], run=Run(duration_s=600))
        await h.settle(quick.id, state=JobState.RUNNING)
        h.clock.advance(600)
        await h.settle(quick.id)  # bob's jobs run 10 minutes, he has learned
        hogs = [h.submit("bob", gpus=8, gpu_models=["A100"], run=Run(duration_s=9000))]
        hogs.append(h.submit("bob", gpus=8, gpu_models=["A100"], run=Run(duration_s=9000)))
        for hog in hogs:
            await h.settle(hog.id, state=JobState.RUNNING)
        h.clock.advance(45 * 60)  # bob's hogs have outlived every runtime his jobs had
        waiting = h.submit(gpus=8, gpu_models=["A100"], max_runtime_s=3600)
        await h.sched.tick()
        view = h.sched.job_view(h.job(waiting.id))
        assert view.estimated_start is None  # not "any moment"
        assert view.estimate is not None and view.estimate.basis == "unknown"
        named = f"jobs {hogs[0].id}, {hogs[1].id} ran longer than any estimate"
        assert named in view.estimate.note
        line = waiting_line(view, NOW, UTC)
        assert line.startswith(f"job {waiting.id}, 1st in line, starts unknown: ")
        assert line.splitlines()[1].startswith("    estimate: unknown: jobs ")


NOW = T0


def _queued(estimate: dict[str, Any] | None) -> JobView:
    return JobView.model_validate(
        {
            "id": 12,
            "state": "queued",
            "position": 1,
            "user": "alice",
            "priority_class": "batch",
            "submitted_at": T0,
            "spec": {"kind": "script", "command": ["python", "train.py"], "gpus": 8, "user": "a"},
            "reason": "waiting: needs 8 GPUs free on one node",
            "estimated_start": (estimate or {}).get("at"),
            "estimate": estimate,
        }
    )


GUESS = {
    "at": T0 + minutes(239),
    "earliest": T0,
    "latest": None,
    "basis": "guess",
    "note": "a guess: job 7 set no --max-runtime and has no past runtimes, so 4h is assumed",
}


def test_the_cli_queue_shows_a_guess_as_a_guess_with_the_nudge() -> None:
    assert format_queue([_queued(GUESS)], now=NOW, tz=UTC).split("\n\nwaiting:\n")[1] == (
        "  job 12, 1st in line, starts in 3h59m (12:59) by a guess: needs 8 GPUs free on one "
        f"node\n    estimate: {GUESS['note']}"
    )


def test_the_magic_waiting_line_shows_a_guess_as_a_guess_with_the_nudge() -> None:
    line = magic_waiting_line(_queued(GUESS), None, NOW, UTC)
    assert " | starts in 3h59m (12:59) by a guess | a guess: job 7 set no --max-runtime" in line


def test_the_widget_queue_shows_a_guess_as_a_guess() -> None:
    job = _queued(GUESS).model_dump(mode="json")
    assert _why(job, NOW, UTC) == (
        "1st in line, starts in 3h59m (12:59) by a guess: needs 8 GPUs free on one node "
        f"({GUESS['note']})"
    )
