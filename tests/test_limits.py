"""Per-user limits as configuration and as pure rules: precedence, defaults, rate, admission.

What a server does with them (429, Retry-After, the counts) is tested against a live server
in ``tests/inproc/test_limits.py``; the lab-wide service's defaults in ``tests/test_service.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from _fixtures_policy import T0, make_job
from traitlets import TraitError

from jupyter_gpusched.core.limits import (
    SERVICE_LIMITS,
    Bucket,
    LimitPolicy,
    Limits,
    take_token,
)
from jupyter_gpusched.core.models import JobState
from jupyter_gpusched.core.policy import AdmissionContext, add_to_context, admit
from jupyter_gpusched.core.windows import DEFAULT_WINDOWS, PolicyConfig, explain
from jupyter_gpusched.server.config import GpuSchedPolicy
from jupyter_gpusched.server.userlimits import UploadLedger

DAY = DEFAULT_WINDOWS[0]


def test_limits_are_on_in_the_service_and_off_in_a_personal_server_unless_told() -> None:
    traits = GpuSchedPolicy()
    assert traits.to_policy_config(service=True).limits.everyone == SERVICE_LIMITS
    assert traits.to_policy_config().limits.off
    assert GpuSchedPolicy(limit_defaults="on").to_policy_config().limits.everyone == (
        SERVICE_LIMITS
    )
    off = GpuSchedPolicy(limit_defaults="off").to_policy_config(service=True).limits
    assert off.off
    # a key given replaces the default, None lifts it, the others stay
    mine = GpuSchedPolicy(limits={"queued_jobs": 50, "streams": None, "upload_bytes": "512M"})
    everyone = mine.to_policy_config(service=True).limits.everyone
    assert (everyone.queued_jobs, everyone.streams, everyone.upload_bytes) == (50, None, 512 << 20)
    assert everyone.leases == SERVICE_LIMITS.leases


@pytest.mark.parametrize(
    ("traits", "quoted"),
    [
        ({"limits": {"queued": 5}}, "unknown limit 'queued'"),
        ({"limits": {"leases": -1}}, "leases -1 must be a whole number >= 0"),
        ({"limits": {"leases": 2.5}}, "leases 2.5 must be a whole number"),
        ({"limits": {"upload_bytes": "lots"}}, "upload_bytes 'lots' must be bytes or a size"),
        ({"limits": {"submits_per_s": "fast"}}, "submits_per_s 'fast' must be a number"),
        ({"group_limits": {"nlp": {"streams": True}}}, "group_limits['nlp']: streams True"),
        ({"user_groups": {"bob": "nlp"}}, "user_groups['bob'] 'nlp' must be a list"),
    ],
)
def test_bad_limits_are_refused_with_the_value_quoted(traits: dict[str, Any], quoted: str) -> None:
    with pytest.raises(TraitError, match=quoted.replace("[", r"\[").replace("(", r"\(")):
        GpuSchedPolicy(**traits)


POLICY = LimitPolicy(
    everyone=Limits(queued_jobs=100, leases=2, streams=8),
    groups={"nlp": {"queued_jobs": 500}, "vision": {"queued_jobs": None}, "tiny": {"leases": 1}},
    users={"dave": {"queued_jobs": 5}},
    admins={"streams": 64, "leases": 4},
    user_groups={"bob": frozenset({"nlp"})},
)


@pytest.mark.parametrize(
    ("user", "groups", "admin", "queued", "leases", "streams", "source"),
    [
        ("alice", (), False, 100, 2, 8, "GpuSchedPolicy.limits"),
        ("bob", (), False, 500, 2, 8, "GpuSchedPolicy.group_limits['nlp']"),  # user_groups
        ("carol", ("nlp", "vision"), False, None, 2, 8, "GpuSchedPolicy.group_limits['vision']"),
        ("carol", ("tiny",), False, 100, 1, 8, "GpuSchedPolicy.limits"),
        ("erin", ("tiny",), True, 100, 4, 64, "GpuSchedPolicy.limits"),  # admins over groups
        ("dave", ("vision",), True, 5, 4, 64, "GpuSchedPolicy.user_limits['dave']"),
    ],
)
def test_a_users_own_over_admins_over_the_most_generous_group_over_everyones(
    user: str,
    groups: tuple[str, ...],
    admin: bool,
    queued: int | None,
    leases: int,
    streams: int,
    source: str,
) -> None:
    mine = POLICY.for_user(user, groups, admin)
    assert (mine.limits.queued_jobs, mine.limits.leases, mine.limits.streams) == (
        queued,
        leases,
        streams,
    )
    assert mine.named("queued_jobs") == f"{source} queued_jobs"


def test_the_rate_holds_a_burst_then_refills_at_its_pace() -> None:
    limits = Limits(submits_per_s=2.0, submit_burst=3)
    bucket: Bucket | None = None
    waits = []
    for at in (0.0, 0.0, 0.0, 0.0, 0.25, 0.5):
        bucket, wait_s = take_token(bucket, limits, at)
        waits.append(wait_s)
    assert waits == [0.0, 0.0, 0.0, 0.5, 0.25, 0.0]
    assert take_token(None, Limits(), 0.0) == (None, 0.0)  # no rate, no bucket
    assert Limits(submits_per_s=0.5).burst() == 1.0  # a second's worth, at least one


def test_a_job_past_its_owners_running_jobs_waits_and_others_are_admitted() -> None:
    config = PolicyConfig(
        limits=LimitPolicy(everyone=Limits(running_jobs=2), groups={"big": {"running_jobs": 3}})
    )
    running = [make_job(i, state=JobState.RUNNING, node="n") for i in (1, 2)]
    ctx = AdmissionContext.build(
        config=config, window=DAY, now=T0, total_gpus=32, running=running, hours_today={}
    )
    waits = admit(make_job(3, kind="lease"), ctx)
    assert (waits.ok, waits.reason, waits.blocked_by) == (
        False,
        "waiting: limit (alice runs 2 of 2 jobs)",
        "limit",
    )
    assert admit(make_job(4, kind="lease", user="bob"), ctx).ok
    # who the caller is (their groups) comes from their requests
    in_big = AdmissionContext.build(
        config=config, window=DAY, now=T0, total_gpus=32, running=running, hours_today={},
        callers={"alice": (frozenset({"big"}), False)},
    )  # fmt: skip
    assert admit(make_job(3, kind="lease"), in_big).ok
    full = add_to_context(in_big, make_job(3, kind="lease", state=JobState.RUNNING, node="n"))
    assert admit(make_job(5, kind="lease"), full).reason == (
        "waiting: limit (alice runs 3 of 3 jobs)"
    )


def test_the_explanation_lists_the_limits_and_the_callers_own() -> None:
    config = GpuSchedPolicy(
        group_limits={"nlp": {"running_jobs": 1000}}, user_limits={"dave": {"leases": 8}}
    ).to_policy_config(service=True)
    text = explain(config, T0, config.limits.for_user("bob", ["nlp"]))
    assert (
        "  - limits per user (GpuSchedPolicy.limits): queued jobs 10,000, running jobs 500, "
        "array size 10,000, leases 4, streams 16, uploads 2G, submits 20/s, burst 100\n"
        "      group 'nlp': running jobs 1,000\n"
        "      1 users with limits of their own\n"
        "      yours (bob in nlp): queued jobs 10,000, running jobs 1,000,"
    ) in text
    assert "limits per user: none" in explain(GpuSchedPolicy().to_policy_config(), T0)


def test_uploads_of_ended_jobs_go_unless_a_live_job_names_them(tmp_path: Path) -> None:
    ledger = UploadLedger(str(tmp_path), grace_s=3600)
    folder = Path(ledger.folder("alice"))
    array, single, stray = (folder / name for name in ("a1", "s1", "x1"))
    for request in (array, single, stray):
        request.mkdir(parents=True)
        (request / "data.bin").write_bytes(b"x" * 100)
    assert ledger.held("alice") == 300
    # an array's tasks share their request's files: one task ended, another still queued
    live = [str(array / "data.bin")]
    assert ledger.release("alice", {str(array), str(single)}, live) == 100
    assert sorted(os.listdir(folder)) == ["a1", "x1"]
    # a directory no job names is swept only after its grace (its request may be under way)
    assert ledger.sweep("alice", live) == 0
    ledger.answered.add(str(stray))  # ... unless this server answered its request already
    assert ledger.sweep("alice", live) == 100
    assert (sorted(os.listdir(folder)), ledger.held("alice")) == (["a1"], 100)
