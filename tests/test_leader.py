"""One scheduler acts on a store: the leader lease, its takeover, and fenced writes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
from _fixtures_postgres import postgres_server_url, postgres_url  # noqa: F401

from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.models import JobKind, JobSpec, JobState
from jupyter_gpusched.store import tokens
from jupyter_gpusched.store.leader import LeaderLease, NotLeaderError, fenced, new_holder_id
from jupyter_gpusched.store.store import Store


@pytest.fixture
def store(store_url: str, clock: ManualClock) -> Iterator[Store]:
    st = Store(store_url, clock=clock)
    st.migrate()
    yield st
    st.close()


def remote_holder() -> str:
    """A holder on another host: only its lease's expiry frees the row."""
    return "gpu-head.example:4242:abcdef12"


def test_the_first_claim_leads_and_renewing_keeps_the_epoch(
    store: Store, clock: ManualClock
) -> None:
    lease = LeaderLease(store, ttl_s=6)
    first = lease.hold()
    clock.advance(4)
    again = lease.hold()
    assert first.mine and again.mine
    assert first.epoch == again.epoch == 1
    assert again.expires_at == clock.now() + timedelta(seconds=6)


def test_a_second_scheduler_stands_by_until_the_lease_lapses(
    store: Store, clock: ManualClock
) -> None:
    leader = LeaderLease(store, ttl_s=6, holder=remote_holder())
    standby = LeaderLease(store, ttl_s=6)
    assert leader.hold().mine
    clock.advance(5.9)
    assert not standby.hold().mine
    clock.advance(0.2)
    took = standby.hold()
    assert took.mine and took.epoch == 2
    assert not leader.hold().mine  # the old leader learns it lost


def test_a_released_lease_is_taken_at_once(store: Store) -> None:
    leader = LeaderLease(store, ttl_s=60, holder=remote_holder())
    leader.hold()
    leader.release()
    assert LeaderLease(store, ttl_s=60).hold().mine


def test_a_dead_holder_on_this_host_is_replaced_without_waiting(store: Store) -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    host, _, _ = new_holder_id().partition(":")
    LeaderLease(store, ttl_s=600, holder=f"{host}:{proc.stdout.strip()}:00000000").hold()
    assert LeaderLease(store, ttl_s=600).hold().mine


def test_a_live_holder_on_this_host_is_not_replaced(store: Store) -> None:
    import os
    import socket

    LeaderLease(store, ttl_s=600, holder=f"{socket.gethostname()}:{os.getppid()}:x").hold()
    assert not LeaderLease(store, ttl_s=600).hold().mine


def test_a_deposed_leaders_writes_are_refused_and_leave_nothing(
    store: Store, clock: ManualClock
) -> None:
    old = LeaderLease(store, ttl_s=6, holder=remote_holder())
    epoch = old.hold().epoch
    job = store.add_job(JobSpec(kind=JobKind.SCRIPT, command=["true"], user="ann"))
    clock.advance(7)
    assert LeaderLease(store, ttl_s=6).hold().epoch == epoch + 1
    with fenced(old.holder, epoch), pytest.raises(NotLeaderError, match="no longer the leader"):
        store.transition(job.id, JobState.STARTING)
    assert store.get_job(job.id).state is JobState.QUEUED
    events = store.list_events(after_id=0)
    assert [e.kind for e in events] == ["submitted"]


def test_the_leaders_fenced_writes_go_through(store: Store) -> None:
    lease = LeaderLease(store, ttl_s=6)
    epoch = lease.hold().epoch
    job = store.add_job(JobSpec(kind=JobKind.SCRIPT, command=["true"], user="ann"))
    with fenced(lease.holder, epoch):
        assert store.transition(job.id, JobState.STARTING).state is JobState.STARTING


def test_minted_tokens_name_their_user_until_revoked(store: Store) -> None:
    alice = tokens.mint(store, "alice", note="laptop")
    bob = tokens.mint(store, "bob")
    assert alice != bob and alice.startswith(tokens.TOKEN_PREFIX)
    assert tokens.user_for(store, alice) == "alice"
    assert tokens.user_for(store, bob) == "bob"
    assert tokens.user_for(store, alice + "x") is None
    listed = tokens.list_tokens(store, "alice")
    assert [(t.username, t.note) for t in listed] == [("alice", "laptop")]
    assert alice not in repr(listed)  # only a prefix is kept
    assert tokens.revoke(store, "alice") == 1
    assert tokens.user_for(store, alice) is None
    assert tokens.user_for(store, bob) == "bob"
