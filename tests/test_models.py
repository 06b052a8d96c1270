from __future__ import annotations

from datetime import datetime

import pytest

from jupyter_gpusched.core.errors import IllegalTransitionError, InvalidSpecError
from jupyter_gpusched.core.models import (
    TERMINAL_STATES,
    TRANSITIONS,
    JobKind,
    JobState,
    PriorityClass,
    check_transition,
    parse_spec,
)


def test_script_spec_from_api_json() -> None:
    spec = parse_spec(
        {"kind": "script", "command": ["python", "train.py"], "gpus": 2, "gpu_mem_gb": 16}
    )
    assert spec.kind is JobKind.SCRIPT
    assert spec.gpus == 2 and spec.gpu_mem_gb == 16
    assert spec.priority_class is PriorityClass.BATCH


def test_lease_defaults_to_interactive() -> None:
    assert parse_spec({"kind": "lease"}).priority_class is PriorityClass.INTERACTIVE


@pytest.mark.parametrize(
    ("data", "field", "hint"),
    [
        ({"kind": "script"}, "command", "needs a command"),
        ({"kind": "notebook"}, "notebook", "path"),
        ({"kind": "script", "command": ["x"], "gpus": -1}, "gpus", "must be at least 0, not -1"),
        ({"kind": "lease", "gpu_share": 0.5, "gpus": 2}, "gpus", "gpus = 1"),
        ({"kind": "lease", "gpu_share": 0.5, "gpu_mem_gb": 4}, "gpu_share", "not both"),
        ({"kind": "lease", "gpuz": 1}, "gpuz", "unknown field"),
        ({"kind": "nope"}, "kind", "'lease', 'script' or 'notebook'"),
        ({"kind": "script", "command": []}, "command", "non-empty"),
        ({"kind": "lease", "env": {"1BAD": "x"}}, "env", "environment variable"),
        ({"kind": "lease", "not_before": "2026-11-23T22:00:00"}, "not_before", "timezone"),
    ],
)
def test_invalid_spec_names_field_and_fix(data: dict, field: str, hint: str) -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_spec(data)
    assert err.value.field == field
    assert hint in err.value.message


def test_non_object_body_is_refused() -> None:
    with pytest.raises(InvalidSpecError, match="JSON object"):
        parse_spec(["kind", "lease"])  # type: ignore[arg-type]


def test_not_before_is_normalised_to_utc() -> None:
    spec = parse_spec({"kind": "lease", "not_before": "2026-11-23T22:00:00+01:00"})
    assert spec.not_before == datetime.fromisoformat("2026-11-23T21:00:00+00:00")


@pytest.mark.parametrize("state", list(JobState))
def test_every_illegal_transition_is_refused(state: JobState) -> None:
    for target in JobState:
        if target in TRANSITIONS[state]:
            check_transition(state, target)
        else:
            with pytest.raises(IllegalTransitionError):
                check_transition(state, target, job_id=7)


def test_terminal_states_and_requeue_paths() -> None:
    assert TERMINAL_STATES == {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    assert JobState.QUEUED in TRANSITIONS[JobState.PREEMPTED]
    assert JobState.QUEUED in TRANSITIONS[JobState.LOST]
