"""Recurring definitions: cron in a timezone across DST, catch-up, exactly-once firing."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _fixtures_notebooks import NbHarness, nb_harness, nb_sim, write_notebook

from jupyter_gpusched.batch.cron import fire_times, next_fire_time
from jupyter_gpusched.batch.definitions import Definitions
from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.errors import (
    ForbiddenError,
    InvalidSpecError,
    NotFoundError,
    UnavailableError,
)
from jupyter_gpusched.core.models import JobSpec, JobState
from jupyter_gpusched.store.store import Store

__all__ = ["nb_harness", "nb_sim"]  # fixtures

UTC = UTC
BERLIN = "Europe/Berlin"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def spec(user: str = "alice") -> JobSpec:
    return JobSpec(kind="script", command=["true"], user=user, gpus=0)


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[Store]:
    st = Store(f"sqlite:///{tmp_path / 'gpusched.db'}", clock=clock)
    st.migrate()
    yield st
    st.close()


@pytest.fixture
def defs(store: Store, clock: ManualClock) -> Definitions:
    return Definitions(store, clock=clock, admins=frozenset({"root"}))


def fired(store: Store) -> list[tuple[str, str]]:
    jobs, _ = store.list_jobs(limit=None)
    return [(j.spec.labels["definition_id"], j.spec.labels["fire_at"]) for j in jobs]


# ---------------------------------------------------------------------------- cron and DST


def test_daily_times_inside_the_spring_gap_fire_at_the_jump_once() -> None:
    # Berlin 2026-03-29: 02:00 CET -> 03:00 CEST; 02:30 does not exist that day
    assert fire_times("30 2 * * *", BERLIN, utc(2026, 3, 27), utc(2026, 3, 31)) == [
        utc(2026, 3, 27, 1, 30),
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),  # the jump, 03:00 CEST
        utc(2026, 3, 30, 0, 30),
    ]
    assert fire_times("0,30 2 * * *", BERLIN, utc(2026, 3, 29), utc(2026, 3, 29, 12)) == [
        utc(2026, 3, 29, 1, 0)
    ]  # two local times in the gap: still one run
    assert fire_times("0 9 * * *", BERLIN, utc(2026, 3, 28), utc(2026, 3, 30, 12)) == [
        utc(2026, 3, 28, 8),
        utc(2026, 3, 29, 7),
        utc(2026, 3, 30, 7),
    ]


def test_ambiguous_autumn_times_fire_once_at_their_first_occurrence() -> None:
    # Berlin 2026-10-25: 03:00 CEST -> 02:00 CET; 02:00-03:00 happens twice
    assert fire_times("30 2 * * *", BERLIN, utc(2026, 10, 24), utc(2026, 10, 27)) == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]
    assert fire_times("0 * * * *", BERLIN, utc(2026, 10, 24, 22), utc(2026, 10, 25, 3)) == [
        utc(2026, 10, 24, 22),
        utc(2026, 10, 24, 23),
        utc(2026, 10, 25, 0),
        utc(2026, 10, 25, 2),
        utc(2026, 10, 25, 3),
    ]  # local 01, 02 (CEST), 03, 04 (CET)
    assert fire_times("0 9 * * *", BERLIN, utc(2026, 10, 24), utc(2026, 10, 26, 12)) == [
        utc(2026, 10, 24, 7),
        utc(2026, 10, 25, 8),
        utc(2026, 10, 26, 8),
    ]


def test_next_fire_time_is_strictly_later_even_inside_the_repeated_hour() -> None:
    second_pass = utc(2026, 10, 25, 1, 10)  # 02:10 CET, after 02:30 CEST already fired
    assert next_fire_time("30 2 * * *", BERLIN, second_pass) == utc(2026, 10, 26, 1, 30)
    assert next_fire_time("@hourly", "UTC", utc(2026, 1, 1, 5)) == utc(2026, 1, 1, 6)


@pytest.mark.parametrize(
    "start,expected",
    [
        (
            utc(2026, 3, 27, 12),
            [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)],
        ),
        (
            utc(2026, 10, 23, 12),
            [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
        ),
    ],
)
def test_a_definition_fires_one_job_per_local_time_across_a_dst_change(
    store: Store,
    start: datetime,
    expected: list[datetime],
    tmp_path: Path,
) -> None:
    clock = ManualClock(start)
    defs = Definitions(store, clock=clock)
    d = defs.create(spec(), schedule="30 2 * * *", timezone=BERLIN)
    for _ in expected:
        nxt = defs.get(d.id).next_fire_at
        assert nxt is not None
        clock.set(nxt - timedelta(minutes=1))
        assert defs.fire_due(clock.now()) == []
        clock.set(nxt + timedelta(seconds=5))
        assert len(defs.fire_due(clock.now())) == 1
        assert defs.fire_due(clock.now()) == []
    assert [r.fire_at for r in defs.runs(d.id)] == expected
    assert fired(store) == [(str(d.id), t.isoformat()) for t in expected]


# ---------------------------------------------------------------------------- catch-up


@pytest.mark.parametrize("catch_up,runs", [("skip", 0), ("once", 1)])
def test_after_downtime_missed_firings_are_skipped_or_run_once(
    defs: Definitions,
    store: Store,
    clock: ManualClock,
    catch_up: str,
    runs: int,
) -> None:
    d = defs.create(spec(), schedule="0 * * * *", catch_up=catch_up)  # hourly, from 10:00
    clock.set(utc(2026, 11, 23, 14, 20))  # down from 09:00 to 14:20: 10..14 missed
    made = defs.fire_due()

    assert len(made) == runs
    after = defs.get(d.id)
    assert after.next_fire_at == utc(2026, 11, 23, 15)
    if runs:
        assert made[0].spec.labels["fire_at"] == utc(2026, 11, 23, 14).isoformat()
        assert made[0].spec.labels["caught_up"] == "true"
        assert after.runs[0].caught_up
    skipped = [e.detail for e in store.list_events() if e.detail.get("action") == "skipped"]
    assert skipped[-1]["missed"] == 5 - runs
    clock.set(utc(2026, 11, 23, 15, 0, 30))  # back in business: on time again
    assert len(defs.fire_due()) == 1
    assert len(fired(store)) == runs + 1


def test_a_firing_a_little_late_is_on_time_not_missed(
    defs: Definitions,
    clock: ManualClock,
) -> None:
    d = defs.create(spec(), schedule="0 10 * * *", catch_up="skip")
    clock.set(utc(2026, 11, 23, 10, 0, 45))  # within the 60 s grace
    (job,) = defs.fire_due()
    assert "caught_up" not in job.spec.labels
    assert defs.get(d.id).last_job_id == job.id and defs.get(d.id).fire_count == 1


def test_a_store_outage_while_firing_is_raised_not_logged_as_a_broken_definition(
    defs: Definitions,
    store: Store,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It was caught as a broken definition: a traceback per definition in the server's log
    # at every tick of an outage, where the scheduler's loop says once that the store is away.
    d = defs.create(spec(), schedule="0 10 * * *", catch_up="skip")
    clock.set(utc(2026, 11, 23, 10, 0, 5))
    real = store.write_session

    @contextlib.contextmanager
    def away(**kw: Any) -> Iterator[Any]:
        raise UnavailableError("the store (PostgreSQL) cannot be reached")
        yield  # pragma: no cover

    monkeypatch.setattr(store, "write_session", away)
    with pytest.raises(UnavailableError):
        defs.fire_due()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    monkeypatch.setattr(store, "write_session", real)
    (job,) = defs.fire_due()  # back: it fires, once
    assert defs.get(d.id).last_job_id == job.id


# ---------------------------------------------------------------------------- management


def test_paused_definitions_do_not_fire_and_resume_from_the_next_time(
    defs: Definitions,
    clock: ManualClock,
    store: Store,
) -> None:
    d = defs.create(spec(), schedule="*/10 * * * *", catch_up="once")
    defs.update(d.id, user="alice", paused=True)
    clock.advance(3600)
    assert defs.fire_due() == [] and defs.get(d.id).next_fire_at is None
    resumed = defs.update(d.id, user="alice", paused=False)
    assert resumed.next_fire_at == utc(2026, 11, 23, 10, 10)  # no catch-up of the pause
    clock.set(utc(2026, 11, 23, 10, 10))
    assert len(defs.fire_due()) == 1


def test_only_owners_and_admins_change_definitions_and_deleting_keeps_the_jobs(
    defs: Definitions,
    clock: ManualClock,
    store: Store,
) -> None:
    d = defs.create(spec("alice"), schedule="0 * * * *")
    with pytest.raises(ForbiddenError):
        defs.update(d.id, user="bob", paused=True)
    with pytest.raises(ForbiddenError):
        defs.delete(d.id, user="bob")
    assert defs.update(d.id, user="root", schedule="30 * * * *").next_fire_at == utc(
        2026, 11, 23, 9, 30
    )
    clock.set(utc(2026, 11, 23, 9, 30))
    (job,) = defs.fire_due()
    defs.delete(d.id, user="alice")
    with pytest.raises(NotFoundError):
        defs.get(d.id)
    assert store.get_job(job.id).state is JobState.QUEUED
    assert defs.list() == ([], 0)


def test_bad_schedules_timezones_and_catch_up_name_their_field(defs: Definitions) -> None:
    for kwargs, field in [
        ({"schedule": "every day"}, "schedule"),
        ({"schedule": "0 2 * * * *"}, "schedule"),
        ({"schedule": "0 2 * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"schedule": "0 2 * * *", "catch_up": "all"}, "catch_up"),
    ]:
        with pytest.raises(InvalidSpecError) as err:
            defs.create(spec(), **kwargs)  # type: ignore[arg-type]
        assert err.value.field == field


# ---------------------------------------------------------------------------- exactly once


def race_firers(url: str, start: datetime, steps: int, n_defs: int = 3) -> Store:
    """Two firers (own Store, own engine, own thread) step through the same minutes."""
    setup = Store(url, clock=ManualClock(start))
    setup.migrate()
    maker = Definitions(setup, clock=ManualClock(start))
    for i in range(n_defs):
        maker.create(spec(f"u{i}"), schedule="* * * * *", catch_up="once")
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def firer() -> None:
        clock = ManualClock(start)
        store = Store(url, clock=clock)
        defs = Definitions(store, clock=clock)
        try:
            for minute in range(1, steps + 1):
                clock.set(start + timedelta(minutes=minute))
                barrier.wait(timeout=60)
                defs.fire_due()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            barrier.abort()
        finally:
            store.close()

    threads = [threading.Thread(target=firer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return setup


def assert_exactly_once(store: Store, steps: int, n_defs: int = 3) -> None:
    pairs = fired(store)
    assert len(pairs) == len(set(pairs)) == steps * n_defs
    defs = Definitions(store, clock=ManualClock())
    for d in defs.list()[0]:
        assert [r.fire_at.minute for r in defs.runs(d.id)] == [
            (m % 60) for m in range(1, steps + 1)
        ]
        assert d.fire_count == steps


@pytest.mark.slow  # two firer processes race over 60 steps
def test_two_firers_sharing_a_sqlite_store_never_fire_twice(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    store = race_firers(url, utc(2026, 11, 23, 9), steps=60)
    try:
        assert_exactly_once(store, steps=60)
    finally:
        store.close()


@pytest.mark.postgres
def test_two_firers_sharing_a_postgresql_store_never_fire_twice(postgres_url: str) -> None:
    store = race_firers(postgres_url, utc(2026, 11, 23, 9), steps=60)
    try:
        assert_exactly_once(store, steps=60)
    finally:
        store.close()


# ---------------------------------------------------------------------------- end to end


@pytest.mark.asyncio
async def test_a_definition_fires_from_the_scheduler_tick_and_its_notebook_runs(
    nb_harness: NbHarness,
) -> None:
    write_notebook(nb_harness.root / "nightly.ipynb", ["print(when)"], parameters="when = ''")
    from jupyter_gpusched.batch.requests import build_submission, parse_request

    sub = build_submission(
        parse_request(
            {
                "notebook": "nightly.ipynb",
                "at": "5 9 * * *",
                "parameters": {"when": "morning"},
                "gpus": 1,
            }
        ),
        user="alice",
        root_dir=str(nb_harness.root),
        config=nb_harness.config,
        now=nb_harness.clock.now(),
    )
    job, definition = nb_harness.plugin.submit(sub)
    assert job is None and definition.next_fire_at == utc(2026, 11, 23, 9, 5)

    await nb_harness.sched.tick()
    assert nb_harness.sched.list_jobs()[1] == 0
    nb_harness.clock.set(utc(2026, 11, 23, 9, 5))
    await nb_harness.sched.tick()
    (made,), _ = nb_harness.sched.list_jobs()
    assert made.spec.labels["definition_id"] == str(definition.id)
    (done,) = await nb_harness.settle(made.id)
    assert done.state is JobState.SUCCEEDED
    assert (nb_harness.root / done.handle["outputs"]["notebook"]).exists()
