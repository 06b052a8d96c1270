"""Idempotency keys in the store: committed with what they make or not at all, one per owner,
kept for the keep time and then purged in batches by the leader's upkeep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest
import pytest_asyncio
from _fixtures_polling import wait_for_async
from _fixtures_postgres import store_url
from sqlalchemy import func, select

from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.errors import KeyTakenError
from jupyter_gpusched.core.models import ARRAY_BEING_QUEUED, JobSpec, parse_spec
from jupyter_gpusched.scheduling.submits import GroupCommit
from jupyter_gpusched.store.idempotency import KeyClaim, KeyPurge
from jupyter_gpusched.store.orm import IdempotencyRow, JobRow
from jupyter_gpusched.store.store import Store
from jupyter_gpusched.store.writer import StoreWriter

__all__ = ["store_url"]  # the fixture, imported for its tests


def spec(user: str = "alice", name: str = "train") -> JobSpec:
    return parse_spec({"kind": "script", "command": ["python", name], "user": user, "name": name})


def claim(key: str, owner: str = "alice", body: str = "a") -> KeyClaim:
    return KeyClaim(owner, key, body * 64)


def count(store: Store, table: type) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


@pytest.fixture
def store(store_url: str, clock: ManualClock) -> Iterator[Store]:
    st = Store(store_url, clock=clock)
    st.migrate()
    yield st
    st.close()


def test_a_key_is_stored_with_its_job_and_names_it(store: Store, clock: ManualClock) -> None:
    job = store.add_job(spec(), claim("k1"))
    found = store.find_key("alice", "k1")
    assert found is not None
    assert (found.target, found.target_id, found.fingerprint) == ("job", job.id, "a" * 64)
    assert found.created_at == clock.now()
    assert store.find_key("bob", "k1") is None  # keys are their owner's


def test_a_taken_key_rolls_back_the_whole_create(store: Store) -> None:
    store.add_job(spec(), claim("k1"))
    with pytest.raises(KeyTakenError):
        store.add_job(spec(name="second"), claim("k1", body="b"))
    with pytest.raises(KeyTakenError):
        store.add_jobs([spec(), spec()], array=True, claim=claim("k1"))
    assert count(store, JobRow) == 1 and count(store, IdempotencyRow) == 1
    store.add_job(spec(user="bob"), claim("k1", owner="bob"))  # another owner's key is free
    assert count(store, JobRow) == 2


def test_an_arrays_key_names_its_first_task_and_goes_when_its_cut_submit_is_cancelled(
    store: Store,
) -> None:
    jobs = store.add_jobs([spec()] * 3, array=True, claim=claim("whole"))
    found = store.find_key("alice", "whole")
    assert found is not None and (found.target, found.target_id) == ("array", jobs[0].id)

    head = store.add_array_head(spec(), claim("cut"))  # then the server was killed
    found = store.find_key("alice", "cut")
    assert found is not None and (found.target, found.target_id) == ("array", head.id)
    assert store.get_job(head.id).reason == ARRAY_BEING_QUEUED
    assert store.cancel_unfinished_arrays("cut off", array_id=head.id) == 1
    assert store.find_key("alice", "cut") is None  # a retry queues it afresh
    assert store.find_key("alice", "whole") is not None


def test_keys_past_the_keep_time_are_purged_in_batches_and_younger_ones_stay(
    store: Store, clock: ManualClock
) -> None:
    for i in range(5):
        store.add_job(spec(), claim(f"old{i}"))
    clock.advance(7200)
    store.add_job(spec(), claim("young"))
    assert store.purge_keys(clock.now() - timedelta(hours=1), batch=2) == 5
    assert store.find_key("alice", "young") is not None
    assert count(store, IdempotencyRow) == 1 and count(store, JobRow) == 6  # jobs stay


@pytest.mark.asyncio
async def test_the_upkeep_purges_keys_a_day_old_at_most_every_ten_minutes(
    store: Store, clock: ManualClock
) -> None:
    purge = KeyPurge(store, keep_s=86400.0, every_s=600.0)
    store.add_job(spec(), claim("k"))
    await purge(clock.now())
    clock.advance(86400 - 60)
    await purge(clock.now())
    assert store.find_key("alice", "k") is not None  # not a day yet
    clock.advance(120)
    await purge(clock.now())
    assert store.find_key("alice", "k") is not None  # a day old, but purged 2 minutes ago
    clock.advance(600)
    await purge(clock.now())
    assert store.find_key("alice", "k") is None


# -- the group commit: a taken key fails its own submit, not the others in its batch ----------


@pytest_asyncio.fixture
async def group(store_url: str) -> AsyncIterator[tuple[GroupCommit, Store]]:
    store = Store(store_url, clock=SystemClock())
    store.migrate()
    writer = StoreWriter(store.url)
    commit = GroupCommit(store, lambda: None, writer=writer)
    try:
        yield commit, store
    finally:
        await commit.close()
        await writer.close()
        store.close()


@pytest.mark.asyncio
async def test_in_a_shared_commit_only_the_submit_whose_key_was_taken_fails(
    group: tuple[GroupCommit, Store],
) -> None:
    commit, store = group
    first = await commit.submit(spec(), claim("taken"))  # as if by another server
    answers = await asyncio.gather(
        commit.submit(spec(name="a"), claim("fresh-a")),
        commit.submit(spec(name="b"), claim("taken")),
        commit.submit(spec(name="c")),
        return_exceptions=True,
    )
    assert isinstance(answers[1], KeyTakenError), answers
    made = [a for a in answers if not isinstance(a, BaseException)]
    assert [job.spec.name for job in made] == ["a", "c"]
    taken = store.find_key("alice", "taken")
    assert taken is not None and taken.target_id == first.id
    assert count(store, JobRow) == 3


@pytest.mark.asyncio
async def test_the_store_writer_process_commits_the_key_with_the_job(
    group: tuple[GroupCommit, Store],
) -> None:
    commit, store = group
    await commit.submit(spec())  # starts the child
    writer = commit._writer
    assert writer is not None
    await wait_for_async(writer.ready, timeout_s=30, what="the store writer process")
    job = await commit.submit(spec(), claim("by-the-child"))
    found = store.find_key("alice", "by-the-child")
    assert found is not None and found.target_id == job.id
    with pytest.raises(KeyTakenError):  # raised in the child, as itself
        await commit.submit(spec(), claim("by-the-child"))
