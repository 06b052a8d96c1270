from __future__ import annotations

import asyncio
import os
import stat
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from _fixtures_postgres import postgres_server_url, postgres_url  # noqa: F401
from sqlalchemy import event

from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.errors import (
    ConflictError,
    IllegalTransitionError,
    InvalidSpecError,
    NotFoundError,
)
from jupyter_gpusched.core.models import (
    ARRAY_BEING_QUEUED,
    TRANSITIONS,
    JobKind,
    JobSpec,
    JobState,
    Placement,
    PriorityClass,
)
from jupyter_gpusched.store.engine import exposure
from jupyter_gpusched.store.eventlog import EventCompaction
from jupyter_gpusched.store.jobcache import JobCache
from jupyter_gpusched.store.orm import JobRow
from jupyter_gpusched.store.store import Store

S = JobState


@pytest.fixture
def store(store_url: str, clock: ManualClock) -> Iterator[Store]:
    st = Store(store_url, clock=clock)
    st.migrate()
    yield st
    st.close()


def script(user: str = "ann", **kw: object) -> JobSpec:
    return JobSpec.model_validate(
        {"kind": "script", "command": ["python", "train.py"], "user": user, **kw}
    )


FULL_SPEC = JobSpec(
    kind=JobKind.NOTEBOOK,
    name="sweep lr",
    notebook="nb/train.ipynb",
    parameters={"lr": 0.1, "layers": [1, 2], "tag": "ü", "nested": {"a": None}},
    kernel_name="python3",
    gpus=2,
    gpu_mem_gb=12.5,
    cpus=3.5,
    mem_gb=64,
    gpu_models=["A100", "H100"],
    priority=PriorityClass.INTERACTIVE,
    user="bob",
    max_runtime_s=7200,
    not_before=datetime(2026, 11, 23, 22, 0, tzinfo=timezone(timedelta(hours=1))),
    labels={"team": "vision"},
    workdir="/scratch/bob",
    env={"WANDB_MODE": "offline"},
    files=["data.csv", "cfg.yaml"],
    retries=3,
    lease_name="mylease",
)


# -- round trips ---------------------------------------------------------------------------------


def test_every_spec_field_round_trips(store: Store) -> None:
    job = store.add_job(FULL_SPEC)
    back = store.get_job(job.id)
    assert back.spec == FULL_SPEC
    assert back.spec.not_before == datetime(2026, 11, 23, 21, 0, tzinfo=UTC)
    assert back == job
    assert back.state is S.QUEUED and back.submitted_at.tzinfo is not None


def test_every_job_field_round_trips(store: Store, clock: ManualClock) -> None:
    job = store.add_job(script())
    placement = Placement(
        node="gpu-a",
        gpu_indices=[1, 3],
        gpu_uuids=["GPU-1", "GPU-3"],
        share_per_gpu=0.5,
        gpu_mem_gb=20,
    )
    started = clock.now() + timedelta(seconds=5)
    store.transition(
        job.id,
        S.STARTING,
        placement=placement,
        attempt=2,
        handle={"pid": 4242, "pgid": 4242, "kernel": {"id": "k1"}},
    )
    store.update_job(job.id, held=True, last_activity_at=started + timedelta(minutes=3))
    finished = started + timedelta(hours=1, microseconds=7)
    store.transition(job.id, S.RUNNING, started_at=started)
    store.transition(job.id, S.FAILED, exit_code=137, finished_at=finished, reason="OOM killed")
    back = store.get_job(job.id)
    assert back.model_dump() == {
        "id": job.id,
        "spec": script().model_dump(),
        "state": S.FAILED,
        "held": True,
        "submitted_at": clock.now(),
        "started_at": started,
        "finished_at": finished,
        "last_activity_at": started + timedelta(minutes=3),
        "placement": placement.model_dump(),
        "exit_code": 137,
        "reason": "OOM killed",
        "attempt": 2,
        "handle": {"pid": 4242, "pgid": 4242, "kernel": {"id": "k1"}},
    }
    assert all(t.tzinfo == UTC for t in (back.started_at, back.finished_at))


def test_only_jobs_with_earlier_attempts_are_read_for_reaping(store: Store) -> None:
    plain, requeued, ended = (store.add_job(script()).id for _ in range(3))
    # as a requeue leaves them: the earlier attempts kept, the attempt counted up
    store.update_job(requeued, handle={"previous": [{"node": "n0", "pgid": 7}]}, attempt=1)
    store.update_job(ended, handle={"previous": [{"node": "n1"}]}, attempt=1)
    store.transition(ended, S.CANCELLED, expect=S.QUEUED)
    found = store.jobs_with_earlier_attempts([S.QUEUED, S.STARTING, S.RUNNING])
    assert [j.id for j in found] == [requeued]
    assert found[0].handle["previous"] == [{"node": "n0", "pgid": 7}]
    assert plain not in {j.id for j in found}


def test_a_short_pass_reads_the_active_jobs_and_only_the_newer_queued_ones(
    store: Store,
) -> None:
    old = store.add_job(script()).id
    starting, running = put_in(store, S.STARTING), put_in(store, S.RUNNING)
    put_in(store, S.SUCCEEDED)
    seen = store.add_job(script()).id
    new = [store.add_job(script()).id for _ in range(2)]
    active, queued = store.active_and_queued_since(seen)
    assert [j.id for j in active] == [starting, running]
    assert [j.id for j in queued] == new
    assert old not in {j.id for j in queued}


def test_ended_jobs_missing_a_step_are_found_without_reading_the_rest(
    store: Store, clock: ManualClock
) -> None:
    long_ago = store.add_job(script()).id
    store.transition(long_ago, S.STARTING, expect=S.QUEUED)
    store.transition(long_ago, S.RUNNING, expect=S.STARTING)
    store.transition(long_ago, S.SUCCEEDED, expect=S.RUNNING)
    clock.advance(3600)
    since = clock.now()
    never_ran, done, pending, running = (store.add_job(script()).id for _ in range(4))
    store.transition(never_ran, S.CANCELLED, expect=S.QUEUED)
    for job_id in (done, pending, running):
        store.transition(job_id, S.STARTING, expect=S.QUEUED)
        store.transition(job_id, S.RUNNING, expect=S.STARTING)
    for job_id in (done, pending):
        store.transition(job_id, S.SUCCEEDED, expect=S.RUNNING)
    store.update_job(done, handle={"ended_hooks_done": True})
    assert store.ended_without("ended_hooks_done", since=since) == [pending]
    assert long_ago in store.ended_without("ended_hooks_done", since=since - timedelta(hours=2))


def test_a_job_changed_by_another_store_is_read_afresh_and_callers_changes_stay_theirs(
    store: Store, store_url: str, clock: ManualClock
) -> None:
    job_id = store.add_job(script()).id
    (first,), _ = store.list_jobs(states=[S.QUEUED])
    first.handle["mine"] = True  # a caller's change in place, never written
    other = Store(store_url, clock=clock)  # another server on the same store
    try:
        other.update_job(job_id, reason="no room", held=True)
    finally:
        other.close()
    (again,), _ = store.list_jobs(states=[S.QUEUED])
    assert (again.reason, again.held, again.handle) == ("no room", True, {})
    assert store.get_jobs([job_id])[job_id].handle == {}
    store.transition(job_id, S.CANCELLED, expect=S.QUEUED)
    assert store.list_jobs(states=[S.QUEUED]) == ([], 0)


def test_shared_reads_hand_out_the_kept_job_and_a_change_makes_a_new_one(
    store: Store,
) -> None:
    job_id = store.add_job(script()).id
    (a,), _ = store.list_jobs(states=[S.QUEUED], shared=True)
    (b,), _ = store.list_jobs(states=[S.QUEUED], shared=True)
    (copy,), _ = store.list_jobs(states=[S.QUEUED])
    assert a is b and copy is not a and copy == a  # a pass reads thousands: no copies
    store.set_reasons({job_id: "waiting: no room"})
    (after,), _ = store.list_jobs(states=[S.QUEUED], shared=True)
    assert after is not a and (a.reason, after.reason) == (None, "waiting: no room")


def test_jobs_kept_from_a_bulk_submit_read_back_as_their_rows(
    store: Store, store_url: str, clock: ManualClock
) -> None:
    added = store.add_jobs([script(), FULL_SPEC], array=True)
    kept, _ = store.list_jobs(states=[S.QUEUED])
    fresh = Store(store_url, clock=clock)  # nothing kept: every job rebuilt from its row
    try:
        read, _ = fresh.list_jobs(states=[S.QUEUED])
    finally:
        fresh.close()
    assert [j.model_dump() for j in kept] == [j.model_dump() for j in read]
    assert [j.id for j in read] == [j.id for j in added]


def test_unknown_job_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError, match="job 7 does not exist"):
        store.get_job(7)
    with pytest.raises(NotFoundError):
        store.transition(7, S.CANCELLED)


def test_naive_datetimes_are_refused(store: Store) -> None:
    job = store.add_job(script())
    with pytest.raises(Exception, match="no timezone"):
        store.update_job(job.id, last_activity_at=datetime(2026, 11, 23, 9, 0))


# -- listing -------------------------------------------------------------------------------------


def test_list_filters_and_pages_with_totals(store: Store, clock: ManualClock) -> None:
    ids = []
    for i in range(7):
        spec = (
            script("ann" if i % 2 == 0 else "bob") if i != 6 else JobSpec(kind="lease", user="ann")
        )
        ids.append(store.add_job(spec).id)
        clock.advance(60)
    store.transition(ids[0], S.STARTING, placement=Placement(node="n1", gpu_indices=[0]))
    store.transition(ids[1], S.STARTING, placement=Placement(node="n2", gpu_indices=[0]))
    store.transition(ids[2], S.CANCELLED)

    page, total = store.list_jobs(limit=3)
    assert [j.id for j in page] == ids[:3] and total == 7
    page, total = store.list_jobs(limit=3, offset=6)
    assert [j.id for j in page] == ids[6:] and total == 7
    page, total = store.list_jobs(limit=2, order="-submitted_at")
    assert [j.id for j in page] == [ids[6], ids[5]] and total == 7

    assert store.list_jobs(user="bob")[1] == 3
    assert [j.id for j in store.list_jobs(states=[S.STARTING])[0]] == ids[:2]
    assert [j.id for j in store.list_jobs(states=[S.QUEUED], user="ann")[0]] == [ids[4], ids[6]]
    assert [j.id for j in store.list_jobs(kind=JobKind.LEASE)[0]] == [ids[6]]
    assert [j.id for j in store.list_jobs(node="n2")[0]] == [ids[1]]
    assert [j.id for j in store.list_jobs(priority=PriorityClass.INTERACTIVE)[0]] == [ids[6]]
    assert store.list_jobs(states=[], limit=5) == ([], 0)
    assert len(store.list_jobs(limit=None)[0]) == 7


def test_list_rejects_unknown_order(store: Store) -> None:
    with pytest.raises(InvalidSpecError, match="order"):
        store.list_jobs(order="password")


# -- transitions and the audit log ---------------------------------------------------------------

LEGAL = [(a, b) for a, nxt in TRANSITIONS.items() for b in nxt]
ILLEGAL = [(a, b) for a in S for b in S if b not in TRANSITIONS[a]]

#: A legal path from queued to each state, to put a job there.
PATH_TO = {
    S.QUEUED: [],
    S.STARTING: [S.STARTING],
    S.RUNNING: [S.STARTING, S.RUNNING],
    S.SUCCEEDED: [S.STARTING, S.RUNNING, S.SUCCEEDED],
    S.FAILED: [S.STARTING, S.FAILED],
    S.CANCELLED: [S.CANCELLED],
    S.PREEMPTED: [S.STARTING, S.RUNNING, S.PREEMPTED],
    S.LOST: [S.STARTING, S.LOST],
}


def put_in(store: Store, state: JobState) -> int:
    job = store.add_job(script())
    for step in PATH_TO[state]:
        store.transition(job.id, step)
    assert store.get_job(job.id).state is state
    return job.id


def test_every_state_change_writes_exactly_one_event(store: Store) -> None:
    for from_state, to_state in LEGAL:
        job_id = put_in(store, from_state)
        before = store.list_events(job_id=job_id)
        store.transition(job_id, to_state, reason=f"to {to_state.value}")
        after = store.list_events(job_id=job_id)
        assert len(after) == len(before) + 1
        new = after[-1]
        assert (new.kind, new.from_state, new.to_state) == ("state", from_state, to_state)
        assert new.detail["reason"] == f"to {to_state.value}"


@pytest.mark.parametrize("from_state", list(S))
def test_illegal_transitions_are_refused_and_write_nothing(
    store: Store, from_state: JobState
) -> None:
    targets = [b for a, b in ILLEGAL if a is from_state]
    job_id = put_in(store, from_state)
    before_job, before_events = store.get_job(job_id), store.list_events()
    for to_state in targets:
        with pytest.raises(IllegalTransitionError):
            store.transition(job_id, to_state, exit_code=1, reason="nope")
    assert store.get_job(job_id) == before_job
    assert store.list_events() == before_events


def test_expect_guards_against_a_state_changed_meanwhile(store: Store) -> None:
    job_id = put_in(store, S.STARTING)
    with pytest.raises(ConflictError, match="not queued"):
        store.transition(job_id, S.CANCELLED, expect=S.QUEUED)
    assert store.get_job(job_id).state is S.STARTING


def test_submission_and_updates_are_logged(store: Store, clock: ManualClock) -> None:
    job = store.add_job(script())
    clock.advance(30)
    store.update_job(job.id, held=True)
    store.update_job(job.id, event=None, last_activity_at=clock.now())
    store.update_job(job.id, event="priority", spec=script(priority="interactive"))
    events = store.list_events(job_id=job.id)
    assert [(e.kind, e.to_state) for e in events] == [
        ("submitted", S.QUEUED),
        ("updated", None),
        ("priority", None),
    ]
    assert events[1].detail == {"fields": {"held": True}} and events[1].at == clock.now()
    assert store.get_job(job.id).spec.priority_class is PriorityClass.INTERACTIVE
    assert [j.id for j in store.list_jobs(priority=PriorityClass.INTERACTIVE)[0]] == [job.id]


def test_update_cannot_change_state_or_owner(store: Store) -> None:
    job = store.add_job(script())
    with pytest.raises(TypeError, match="state"):
        store.update_job(job.id, state=S.RUNNING)
    with pytest.raises(ConflictError, match="user"):
        store.update_job(job.id, spec=script("mallory"))


def test_events_page_after_an_id(store: Store) -> None:
    first = store.add_job(script())
    second = store.add_job(script())
    store.transition(first.id, S.CANCELLED)
    note = store.add_event("window", detail={"name": "night"})
    everything = store.list_events()
    assert [e.job_id for e in everything] == [first.id, second.id, first.id, None]
    assert store.list_events(after_id=everything[1].id) == everything[2:]
    assert store.list_events(after_id=0, limit=1) == everything[:1]
    assert everything[-1] == note and store.last_event_id() == note.id
    with pytest.raises(NotFoundError):
        store.add_event("note", job_id=999)


def test_timestamps_come_from_the_clock(store: Store, clock: ManualClock) -> None:
    job = store.add_job(script())
    clock.advance(10)
    store.transition(job.id, S.STARTING)
    clock.advance(20)
    running = store.transition(job.id, S.RUNNING)
    clock.advance(30)
    done = store.transition(job.id, S.SUCCEEDED, exit_code=0)
    assert running.started_at == job.submitted_at + timedelta(seconds=30)
    assert done.finished_at == job.submitted_at + timedelta(seconds=60)
    assert [e.at for e in store.list_events(job_id=job.id)] == [
        job.submitted_at + timedelta(seconds=s) for s in (0, 10, 30, 60)
    ]


# -- usage ---------------------------------------------------------------------------------------


def test_usage_counts_every_attempt_share_weighted(store: Store, clock: ManualClock) -> None:
    t0 = clock.now()
    job = store.add_job(script("ann"))
    store.transition(job.id, S.STARTING, placement=Placement(node="n", gpu_indices=[0, 1]))
    store.transition(job.id, S.RUNNING)
    clock.advance(3600)
    store.transition(job.id, S.PREEMPTED)
    store.transition(job.id, S.QUEUED, placement=None)
    clock.advance(600)
    store.transition(
        job.id,
        S.STARTING,
        attempt=1,
        placement=Placement(node="m", gpu_indices=[2], share_per_gpu=0.5),
    )
    clock.advance(1800)
    other = store.add_job(script("bob"))
    store.transition(other.id, S.STARTING, placement=Placement(node="n", gpu_indices=[0]))
    clock.advance(100)

    records = list(store.usage_stretches(since=t0).values())
    assert records == [
        ("ann", 2.0, t0, t0 + timedelta(seconds=3600)),
        ("ann", 0.5, t0 + timedelta(seconds=4200), None),
        ("bob", 1.0, t0 + timedelta(seconds=6000), None),
    ]
    assert store.usage_by_user(since=t0) == {"ann": 2.0 * 3600 + 0.5 * 1900, "bob": 100.0}
    late = t0 + timedelta(seconds=5000)
    assert len(store.usage_stretches(since=late)) == 2
    assert store.usage_by_user(since=late)["ann"] == 0.5 * 1100


def test_a_finished_usage_stretch_is_read_once_and_an_open_one_every_time(
    store: Store, clock: ManualClock
) -> None:
    # Every pass asks for a fortnight of usage: a busy lab's 10,000 finished jobs were read
    # whole on every pass (150 ms). Count the rows the full-row read asks for.
    t0 = clock.now()
    asked: list[int] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def _count(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "usage.username" in statement:
            asked.extend(params)

    done, running = store.add_job(script("ann")), store.add_job(script("bob"))
    for job in (done, running):
        store.transition(job.id, S.STARTING, placement=Placement(node="n", gpu_indices=[0]))
        store.transition(job.id, S.RUNNING)
    clock.advance(60)
    store.transition(done.id, S.SUCCEEDED)
    first = list(store.usage_stretches(since=t0).values())
    assert len(asked) == 2
    assert list(store.usage_stretches(since=t0).values()) == first
    assert len(asked) == 3  # only the open one again
    clock.advance(60)
    store.transition(running.id, S.FAILED)
    assert list(store.usage_stretches(since=t0).values())[1] == (
        "bob",
        1.0,
        t0,
        t0 + timedelta(seconds=120),
    )
    asked.clear()
    assert len(store.usage_stretches(since=t0)) == 2
    assert asked == []  # both finished, both kept
    assert list(store.usage_stretches(since=t0 + timedelta(seconds=90)).values()) == [
        first[1][:3] + (t0 + timedelta(seconds=120),)
    ]
    event.remove(store.engine, "before_cursor_execute", _count)


# -- nodes ---------------------------------------------------------------------------------------


def test_node_status_is_kept_and_up_down_is_logged(store: Store, clock: ManualClock) -> None:
    store.set_node_status("gpu-a", up=True, failures=0)
    store.set_node_status("gpu-b", up=True, failures=0)
    clock.advance(5)
    store.set_node_status("gpu-a", up=True, failures=1, detail="timeout")
    store.set_node_status("gpu-a", up=False, failures=3, detail="unreachable")
    status = store.node_status()
    assert list(status) == ["gpu-a", "gpu-b"]
    assert (status["gpu-a"].up, status["gpu-a"].failures, status["gpu-a"].detail) == (
        False,
        3,
        "unreachable",
    )
    assert status["gpu-a"].updated_at == clock.now()
    node_events = [e.detail for e in store.list_events() if e.kind == "node"]
    assert node_events == [
        {"node": "gpu-a", "up": True, "detail": None},
        {"node": "gpu-b", "up": True, "detail": None},
        {"node": "gpu-a", "up": False, "detail": "unreachable"},
    ]


# -- restart and concurrency ---------------------------------------------------------------------


def test_a_second_store_on_the_same_url_sees_everything(
    store_url: str, store: Store, clock: ManualClock
) -> None:
    job = store.add_job(FULL_SPEC)
    store.transition(job.id, S.STARTING, placement=Placement(node="n", gpu_indices=[0]))
    store.close()
    again = Store(store_url, clock=clock)
    again.migrate()
    try:
        assert again.get_job(job.id) == store.get_job(job.id)
        assert len(again.list_events()) == 2
    finally:
        again.close()


def test_racing_starts_have_exactly_one_winner(
    store_url: str, store: Store, clock: ManualClock
) -> None:
    # Two stores = two engines and pools, as two servers sharing one database would have.
    other = Store(store_url, clock=clock)
    racers = [store, other, store, other]
    job_ids = [store.add_job(script()).id for _ in range(10)]
    try:
        for job_id in job_ids:
            barrier = threading.Barrier(len(racers))
            outcomes: list[str] = []

            def race(
                st: Store,
                job_id: int = job_id,
                barrier: threading.Barrier = barrier,
                outcomes: list[str] = outcomes,
            ) -> None:
                barrier.wait()
                try:
                    st.transition(job_id, S.STARTING, expect=S.QUEUED)
                    outcomes.append("won")
                except ConflictError:
                    outcomes.append("conflict")

            threads = [threading.Thread(target=race, args=(st,)) for st in racers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(outcomes) == ["conflict"] * (len(racers) - 1) + ["won"]
            assert [e.to_state for e in store.list_events(job_id=job_id)] == [S.QUEUED, S.STARTING]
    finally:
        other.close()


def test_default_url_is_a_sqlite_file_in_the_jupyter_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    url = Store.default_url()
    assert url == f"sqlite:///{tmp_path / 'data' / 'gpusched' / 'gpusched.db'}"
    st = Store(url, clock=clock)
    st.migrate()
    st.add_job(script())
    with st.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    st.close()


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The common umask 022, which leaves what a process makes readable by everyone."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def test_a_new_sqlite_store_is_0600_in_a_0700_folder_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: ManualClock, open_umask: None
) -> None:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    url = Store.default_url()
    st = Store(url, clock=clock)
    st.migrate()
    st.add_job(script(env={"WANDB_API_KEY": "s3cret"}))
    folder = tmp_path / "data" / "gpusched"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (folder, *folder.iterdir())}
    st.close()
    # SQLite gives the WAL and its index the database file's mode
    assert modes == {
        "gpusched": 0o700,
        "gpusched.db": 0o600,
        "gpusched.db-wal": 0o600,
        "gpusched.db-shm": 0o600,
    }
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700  # made here: ours too
    assert exposure(url) == []


def test_a_store_open_to_other_users_is_named_with_what_to_run(
    tmp_path: Path, clock: ManualClock, open_umask: None
) -> None:
    folder = tmp_path / "shared folder"
    folder.mkdir(mode=0o755)
    db = folder / "gpusched.db"
    db.touch(mode=0o644)  # as an earlier version made it
    url = f"sqlite:///{db}"
    Store(url, clock=clock).close()  # an existing file is left as it is
    said = exposure(url)
    assert len(said) == 2, said
    assert f"({db} 0644)" in said[0] and said[0].endswith(f"run: chmod 600 '{db}'")
    assert f"{folder} is open to other users (0755)" in said[1]
    assert f"run: chmod 700 '{folder}'" in said[1]
    db.chmod(0o600)
    folder.chmod(0o700)
    assert exposure(url) == []
    assert exposure("sqlite://") == exposure("postgresql://db/gpusched") == []


def test_only_waiting_reasons_commit_without_their_own_fsync(
    tmp_path: Path, clock: ManualClock
) -> None:
    # A reason the next pass would write again may skip its fsync (a submit paid two); the
    # connection must not keep that for the durable writes after it.
    st = Store(f"sqlite:///{tmp_path / 'g.db'}", clock=clock)
    st.migrate()
    modes: list[int] = []

    @event.listens_for(st.engine, "commit")
    def _commit(conn: Any) -> None:
        modes.append(conn.exec_driver_sql("PRAGMA synchronous").scalar())

    job = st.add_job(script())
    st.set_reasons({job.id: "waiting: no room"})
    st.update_job(job.id, handle={"note": 1})
    event.remove(st.engine, "commit", _commit)
    assert modes == [2, 1, 2]  # FULL, NORMAL, FULL
    assert st.get_job(job.id).reason == "waiting: no room"
    st.close()


def test_plain_postgresql_urls_use_psycopg3() -> None:
    from jupyter_gpusched.store.engine import normalize_url

    assert normalize_url("postgresql://u:p@db/x") == "postgresql+psycopg://u:p@db/x"
    assert normalize_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_started_at_given_when_starting_is_kept_when_running(
    store: Store, clock: ManualClock
) -> None:
    job = store.add_job(script())
    placed_at = clock.now()
    store.transition(job.id, S.STARTING, started_at=placed_at)
    clock.advance(45)
    assert store.transition(job.id, S.RUNNING).started_at == placed_at
    store.transition(job.id, S.PREEMPTED)
    requeued = store.transition(job.id, S.QUEUED, placement=None, started_at=None)
    assert requeued.started_at is None and requeued.placement is None


def test_a_big_arrays_tasks_are_released_whole_or_cancelled_and_found_by_their_array(
    store: Store, clock: ManualClock
) -> None:
    def queue_held(base: JobSpec, n: int) -> list[Any]:
        head = store.add_array_head(base)
        specs, values = store.task_values(base, head.id, range(1, n), ARRAY_BEING_QUEUED)
        return [head, *store.queued(specs, values, store.insert_queued(values))]

    whole = queue_held(script(), 5)
    cut = queue_held(script("bob"), 3)
    assert all(j.held and j.reason == ARRAY_BEING_QUEUED for j in store.list_jobs()[0])
    assert store.release_array(whole[0].id, whole, "waiting: later") == 5
    released, total = store.list_jobs(array_id=whole[0].id, limit=None)
    assert total == 5 and {(j.held, j.reason) for j in released} == {(False, "waiting: later")}
    assert [j.spec.labels["array_index"] for j in released] == [str(i) for i in range(5)]

    clock.advance(60)
    assert store.cancel_unfinished_arrays("cut", before=clock.now() - timedelta(seconds=120)) == 0
    assert store.cancel_unfinished_arrays("cut", before=clock.now()) == 3
    assert {j.state for j in store.list_jobs(array_id=cut[0].id, limit=None)[0]} == {S.CANCELLED}
    assert {j.state for j in store.list_jobs(array_id=whole[0].id, limit=None)[0]} == {S.QUEUED}


def test_a_full_pass_reads_neither_held_jobs_nor_far_ones_once_they_have_their_reason(
    store: Store, clock: ManualClock
) -> None:
    soon = clock.now() + timedelta(days=1)
    fresh_far = store.add_job(script(not_before=clock.now() + timedelta(days=30)))
    told_far = store.add_job(script(not_before=clock.now() + timedelta(days=30)))
    near = store.add_job(script(not_before=clock.now() + timedelta(hours=2)))
    plain = store.add_job(script())
    held = store.add_job(script())
    store.set_reasons({told_far.id: "waiting: not before", near.id: "w", plain.id: "w"})
    store.update_job(held.id, held=True, reason="waiting: held by its owner")
    weighed = [j.id for j in store.queued_for_pass(soon)]
    assert weighed == [fresh_far.id, near.id, plain.id]


def test_the_reads_of_every_pass_and_tick_do_not_grow_with_a_far_future_backlog(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A lab's backlog of far-future (or ended) jobs must not be walked at every tick.

    Counted in SQLite's virtual-machine instructions (its progress handler), which do not
    depend on how busy the machine is: the same reads with 50 and with 5,000 backlog rows.
    """
    store = Store(f"sqlite:///{tmp_path / 'plan.db'}", clock=clock)
    store.migrate()
    far = clock.now() + timedelta(days=300)
    for _ in range(3):
        store.add_job(script())  # the live queue

    def backlog(n: int) -> None:
        store.add_jobs([script(not_before=far.isoformat()) for _ in range(n)])
        with store.engine.begin() as conn:  # as a pass leaves them: weighed, with a reason
            conn.execute(
                JobRow.__table__.update()
                .where(JobRow.__table__.c.not_before.is_not(None))
                .values(reason="waiting: its start time")
            )

    def instructions() -> int:
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0  # go on

        def watch(conn: Any, *args: Any) -> None:
            conn.connection.driver_connection.set_progress_handler(count, 100)

        event.listen(store.engine, "before_cursor_execute", watch)
        try:
            store.queued_for_pass(clock.now())
            store.jobs_with_earlier_attempts([S.QUEUED, S.STARTING, S.RUNNING])
            store.active_and_queued_since(10**9)
        finally:
            event.remove(store.engine, "before_cursor_execute", watch)
        return steps[0]

    backlog(50)
    small = instructions()
    backlog(4_950)
    assert len(store.queued_for_pass(clock.now())) == 3
    assert instructions() < 2 * small + 20, (small, instructions())
    store.close()


def test_the_total_of_all_jobs_stays_exact_while_the_older_part_is_counted_once(
    store: Store, clock: ManualClock
) -> None:
    totals = []
    for _round in range(6):
        for _ in range(3):
            store.add_job(script())
        totals.append(store.list_jobs(limit=1)[1])
        clock.advance(240)  # rows settle, then the kept count is redone
    assert totals == [3, 6, 9, 12, 15, 18]
    assert store.list_jobs(states=[S.QUEUED], limit=1)[1] == 18


def waited_and_ended(store: Store) -> int:
    """A job that was given a waiting reason (a ``waiting`` event), then cancelled."""
    job_id = store.add_job(script()).id
    store.set_reasons({job_id: "waiting: no GPU free"})
    store.transition(job_id, S.CANCELLED, expect=S.QUEUED)
    return job_id


def test_compaction_drops_only_the_commentary_of_jobs_ended_long_ago(
    store: Store, clock: ManualClock
) -> None:
    old = waited_and_ended(store)
    clock.advance(40 * 86400)
    recent, live = waited_and_ended(store), store.add_job(script()).id
    store.set_reasons({live: "waiting: no GPU free"})
    kinds = {j: [e.kind for e in store.list_events(job_id=j)] for j in (old, recent, live)}
    assert kinds[old] == kinds[recent] == ["submitted", "waiting", "state"]

    assert store.compact_events(clock.now() - timedelta(days=30), batch=1) == 1
    assert [e.kind for e in store.list_events(job_id=old)] == ["submitted", "state"]
    for job_id in (recent, live):
        assert [e.kind for e in store.list_events(job_id=job_id)] == kinds[job_id]
    assert store.compact_events(clock.now() - timedelta(days=30)) == 0


def test_ended_jobs_leave_the_live_cache_and_only_a_few_are_kept(store: Store) -> None:
    """The server's memory must not grow with the history it pages through."""
    store._cache = JobCache(size=100, ended_size=3)  # small, to see the bound
    ids = [store.add_job(script()).id for _ in range(6)]
    assert len(store.list_jobs(states=[S.QUEUED], limit=None)[0]) == 6
    assert len(store._cache._jobs) == 6
    for job_id in ids[:5]:
        store.transition(job_id, S.CANCELLED, expect=S.QUEUED)
    assert len(store._cache._jobs) == 1  # only the live one
    ended, _ = store.list_jobs(states=[S.CANCELLED], limit=None)
    assert [j.id for j in ended] == ids[:5]
    assert len(store._cache._ended) == 3 and len(store._cache._jobs) == 1
    again, _ = store.list_jobs(states=[S.CANCELLED], limit=None)  # read from the store again
    assert [j.state for j in again] == [S.CANCELLED] * 5


def test_the_leaders_compaction_walks_back_through_history_a_week_per_run(
    store: Store, clock: ManualClock
) -> None:
    start, ended = clock.now(), {}
    for age_days in (60, 45, 33, 1):  # ended that many days before the first run
        clock.set(start + timedelta(days=100 - age_days))
        ended[age_days] = waited_and_ended(store)
    clock.set(start + timedelta(days=100))

    def waits() -> dict[int, bool]:
        return {
            age: "waiting" in [e.kind for e in store.list_events(job_id=job_id)]
            for age, job_id in ended.items()
        }

    compaction = EventCompaction(store, timedelta(days=30), every_s=3600)
    asyncio.run(compaction(clock.now()))  # the first run: the week before its cut
    assert waits() == {60: True, 45: True, 33: False, 1: True}
    for _ in range(4):  # a week further back each hour
        clock.advance(3600)
        asyncio.run(compaction(clock.now()))
    assert waits() == {60: False, 45: False, 33: False, 1: True}


def test_a_page_of_history_walks_its_order_and_never_sorts_the_year(
    tmp_path: Path, clock: ManualClock
) -> None:
    """``GET jobs?state=succeeded,failed&order=-finished_at``: the page, not a sort of all."""
    store = Store(f"sqlite:///{tmp_path / 'plan.db'}", clock=clock)
    store.migrate()
    pages: list[tuple[str, Any]] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def _grab(conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool) -> None:
        if "ORDER BY" in sql and " jobs" in sql:
            pages.append((sql, params))

    for order in ("-finished_at", "-id", "submitted_at"):
        store.list_jobs(states=[S.SUCCEEDED, S.FAILED], order=order, limit=100)
    assert len(pages) == 3
    with store.engine.connect() as conn:
        raw = conn.connection.driver_connection
        for sql, params in pages:
            plan = [row[-1] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, params)]
            assert not any("TEMP B-TREE" in step for step in plan), (sql, plan)
    store.close()
