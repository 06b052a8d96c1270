"""No job can stop the scheduler for everyone (issue #30, point 1).

Every number and time a job carries has a finite bound in the contract, refused with a 422
naming the field and the bound; and behind the bounds, a pass that fails on one job holds that
job (its reason says why, its failures are counted) and places everyone else's. The property
test drives the real pass with arbitrary specs the contract accepts: none stops another
user's job, and none needs the defence behind the bounds.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _fixtures_scheduler import MONDAY_9AM, Harness, memory_scheduler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_gpusched.batch.notebooks import MAX_RETRY_PAUSE_S, retry_pause_s
from jupyter_gpusched.core import windows
from jupyter_gpusched.core.api import NotebookSubmission, parse_body
from jupyter_gpusched.core.bounds import MAX_NOT_BEFORE_S, MAX_RUNTIME_S
from jupyter_gpusched.core.errors import InfeasibleError, InvalidSpecError
from jupyter_gpusched.core.models import (
    JobSpec,
    JobState,
    parse_spec,
    stored_spec,
)

NOW = MONDAY_9AM
#: What a lab configures: a month of runtime, a year ahead at most.
CONFIG = windows.PolicyConfig(max_runtime_s=30 * 86400.0, max_not_before_s=366 * 86400.0)
BOUNDS = CONFIG.spec_bounds(NOW)


def script(**fields: Any) -> dict[str, Any]:
    return {"kind": "script", "command": ["python", "train.py"], **fields}


# ------------------------------------------------------------------------------ the contract


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"max_runtime_s": 3e11}, "max_runtime_s", "at most 2592000 seconds (30d, GpuSchedPolicy"),
        ({"max_runtime_s": 1e308}, "max_runtime_s", "GpuSchedPolicy.max_runtime_s"),
        ({"max_runtime_s": math.inf}, "max_runtime_s", "not inf"),
        ({"max_runtime_s": math.nan}, "max_runtime_s", "more than 0"),
        ({"max_runtime_s": 0}, "max_runtime_s", "more than 0"),
        ({"not_before": "9999-12-31T23:59:59+00:00"}, "not_before", "max_not_before_s"),
        (
            {"not_before": "9999-12-31T23:59:59-05:00"},
            "not_before",
            "not 9999-12-31T23:59:59-05:00",
        ),
        ({"not_before": "1900-01-01T00:00:00+00:00"}, "not_before", "between 1970-01-01"),
        ({"not_before": (NOW + timedelta(days=367)).isoformat()}, "not_before", "366d ahead"),
        ({"command": ["echo", "a\x00b"]}, "command", "argument 1 contains the control character"),
        ({"env": {"TOKEN": "x\x00y"}}, "env", "variable 0 contains the control character"),
        ({"name": "ok\x1b[2J"}, "name", "control character '\\x1b'"),
        ({"labels": {"team": "a\nb"}}, "labels.team", "control character"),
        ({"workdir": "/tmp/a\x00"}, "workdir", "control character"),
        ({"gpu_models": ["A100\x07"]}, "gpu_models.0", "control character"),
    ],
)
def test_absurd_numbers_times_and_control_characters_are_refused_naming_field_and_bound(
    fields: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_spec(script(**fields), bounds=BOUNDS, user="bob")
    assert err.value.field == field
    assert says in err.value.message


def test_what_people_type_in_commands_and_values_still_goes_through() -> None:
    spec = parse_spec(
        script(
            command=["python", "-c", "import sys\nprint(1)\tprint(2)\r"],
            env={"PROMPT": "a\tb"},
            max_runtime_s=30 * 86400.0,
            not_before=(NOW + timedelta(days=366)).isoformat(),
        ),
        bounds=BOUNDS,
        user="bob",
    )
    assert spec.max_runtime_s == 30 * 86400.0


def test_without_a_server_the_hard_ceilings_hold() -> None:
    assert parse_spec(script(max_runtime_s=MAX_RUNTIME_S)).max_runtime_s == MAX_RUNTIME_S
    with pytest.raises(InvalidSpecError, match="the longest runtime any job may declare"):
        parse_spec(script(max_runtime_s=MAX_RUNTIME_S + 1))
    with pytest.raises(InvalidSpecError, match="2200-01-01"):
        parse_spec(script(not_before="2300-01-01T00:00:00+00:00"))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"retry_backoff_s": 1e308}, "retry_backoff_s"),
        ({"cell_timeout_s": 1e308}, "cell_timeout_s"),
        ({"cell_timeout_s": math.inf}, "cell_timeout_s"),
        ({"notebook": "nb\x00.ipynb"}, "notebook"),
        ({"cwd": "a\x1b"}, "cwd"),
    ],
)
def test_notebook_requests_are_bounded_too(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_body(NotebookSubmission, {"notebook": "nb.ipynb", **fields}, "{}")
    assert err.value.field == field


def test_a_retry_pause_never_passes_a_week_however_many_retries_or_whatever_was_stored() -> None:
    assert retry_pause_s("60", 0) == 60 and retry_pause_s("60", 3) == 480
    assert retry_pause_s("86400", 100) == MAX_RETRY_PAUSE_S
    assert retry_pause_s("inf", 0) == retry_pause_s(None, 0) == retry_pause_s("x", 0) == 60


def test_a_job_stored_under_looser_bounds_still_loads_as_stored() -> None:
    kept = {**script(max_runtime_s=3e11, name="a\x1b"), "user": "bob"}
    assert stored_spec(kept).max_runtime_s == 3e11
    with pytest.raises(InvalidSpecError):
        parse_spec({k: v for k, v in kept.items() if k != "user"}, user="bob")


def test_the_configured_bounds_are_checked_against_the_ceilings() -> None:
    with pytest.raises(ValueError, match="max_runtime_s"):
        windows.PolicyConfig(max_runtime_s=MAX_RUNTIME_S * 2)
    with pytest.raises(ValueError, match="max_not_before_s"):
        windows.PolicyConfig(max_not_before_s=MAX_NOT_BEFORE_S + 1)


# ------------------------------------------------------------------------------ the defence


def smuggle(h: Harness, user: str, **fields: Any) -> int:
    """Store a job past the contract's bounds (as one stored before they existed)."""
    spec = stored_spec({**script(**fields), "user": user})
    return h.sched.store.add_job(spec).id


@pytest.mark.asyncio
async def test_a_job_the_pass_fails_on_is_held_with_its_reason_and_the_others_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with memory_scheduler(tmp_path) as h:
        await h.drive()
        poison = smuggle(h, "mallory", max_runtime_s=3e11)  # overflows the deadline
        far = smuggle(h, "mallory", not_before="9999-12-31T23:00:00+00:00", gpus=64)
        fine = [h.submit("alice", gpus=1).id, h.submit("bob", gpus=2).id]
        await h.sched.tick()

        for job_id in fine:
            assert h.job(job_id).state in (JobState.STARTING, JobState.RUNNING), h.job(job_id)
        held = h.job(poison)
        assert held.state is JobState.QUEUED and held.held
        assert held.reason is not None and held.reason.startswith(
            "held: the scheduler could not handle this job: OverflowError"
        )
        assert held.handle["fault"]["count"] == 1
        assert h.job(far).state is JobState.QUEUED  # waits; the pass went on past it
        kinds = [e.kind for e in h.sched.store.list_events(job_id=poison)]
        assert "fault" in kinds
        assert "could not handle job" in caplog.text  # the admins' log says which and why

        # its owner releases it: it fails again, and is held again, counted
        h.sched.update(poison, user="mallory", held=False)
        assert not h.job(poison).held
        await h.sched.tick()
        again = h.job(poison)
        assert again.held and again.handle["fault"]["count"] == 2
        assert again.reason is not None and "(2 times)" in again.reason
        await h.sched.tick()  # the next pass keeps the reason (it is not "held by its owner")
        assert h.job(poison).reason == again.reason
        late = h.submit("carol", gpus=1).id
        await h.sched.tick()
        assert h.job(late).state in (JobState.STARTING, JobState.RUNNING)


@pytest.mark.asyncio
async def test_a_job_that_breaks_expected_starts_is_held_and_the_others_keep_theirs(
    tmp_path: Path,
) -> None:
    async with memory_scheduler(tmp_path) as h:
        await h.drive()
        # every A100 taken, so 8-GPU jobs wait and get expected starts
        for _ in range(2):
            h.submit("alice", gpus=8, gpu_models=["A100"], max_runtime_s=3600)
        await h.sched.tick()
        waiting = h.submit("bob", gpus=8, gpu_models=["A100"]).id
        poison = smuggle(h, "mallory", gpus=8, gpu_models=["A100"], max_runtime_s=3e11)
        h.sched.wake()
        await h.sched.tick()
        assert h.job(poison).held, h.job(poison)
        view = h.sched.job_view(h.job(waiting))
        assert view.estimated_start is not None and view.estimated_start > NOW


# ------------------------------------------------------------------------------ the property


def _finite(lo: float, hi: float) -> st.SearchStrategy[float]:
    """Floats in (lo, hi], with the bounds themselves and tiny values likely."""
    return st.one_of(
        st.just(hi),
        st.floats(min_value=lo, max_value=hi, exclude_min=True, allow_nan=False),
    )


def _offsets() -> st.SearchStrategy[float]:
    return st.one_of(
        st.just(CONFIG.max_not_before_s),
        st.floats(min_value=-60 * 366 * 86400.0, max_value=CONFIG.max_not_before_s),
    )


SPECS = st.fixed_dictionaries(
    {"kind": st.just("script"), "command": st.just(["train"])},
    optional={
        "gpus": st.integers(0, 64),
        "gpu_share": _finite(0, 1),
        "gpu_mem_gb": _finite(0, 1024),
        "cpus": _finite(0, 1024),
        "mem_gb": _finite(0, 16384),
        "max_runtime_s": _finite(0, CONFIG.max_runtime_s),
        "not_before_offset_s": _offsets(),
        "priority": st.sampled_from(["interactive", "batch"]),
        "retries": st.integers(0, 100),
        "gpu_models": st.lists(st.sampled_from(["A100", "V100", "T4", "H100"]), max_size=2),
        "held": st.booleans(),
    },
)


async def _one_round(fields: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with memory_scheduler(Path(tmp), config=CONFIG) as h:
            await h.drive()
            body = dict(fields)
            held = body.pop("held", False)
            if (offset := body.pop("not_before_offset_s", None)) is not None:
                at = max(datetime(1970, 1, 1, tzinfo=UTC), NOW + timedelta(seconds=offset))
                body["not_before"] = at.isoformat()
            try:
                spec = parse_spec(body, bounds=CONFIG.spec_bounds(NOW), user="mallory")
            except InvalidSpecError:
                return  # the contract refused it: nothing reaches a pass
            try:
                theirs = h.sched.submit(spec).id
            except InfeasibleError:
                return  # refused at submit: it can never fit
            if held:
                h.sched.update(theirs, user="mallory", held=True)
            mine = h.sched.submit(JobSpec(kind="script", command=["x"], user="alice")).id
            for _ in range(3):
                await h.sched.tick()
                h.clock.advance(1)
            assert h.job(mine).state in (JobState.STARTING, JobState.RUNNING), h.job(mine)
            assert "fault" not in h.job(theirs).handle, h.job(theirs).reason  # bounds suffice


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(fields=SPECS)
def test_no_job_the_contract_accepts_stops_another_users_job(fields: dict[str, Any]) -> None:
    asyncio.run(_one_round(fields))
