"""A writer killed with SIGKILL mid-stream leaves a consistent, working store.

Run as a script, this module *is* the writer: ``python test_store_crash.py URL SEED MODE``
writes in a loop and prints one line per committed write, until it is killed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fixtures_polling import scaled
from _fixtures_postgres import postgres_server_url, postgres_url  # noqa: F401
from alembic import command
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select

from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.errors import ConflictError, IllegalTransitionError
from jupyter_gpusched.core.models import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    JobSpec,
    JobState,
    Placement,
)
from jupyter_gpusched.store.engine import alembic_config
from jupyter_gpusched.store.orm import Base, EventRow, JobRow, UsageRow
from jupyter_gpusched.store.store import VERSION_TABLE, Store

ROUNDS = 3
WRITERS = 2
TABLES = set(Base.metadata.tables)
HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


# -- the writer ----------------------------------------------------------------------------------


def write_forever(url: str, seed: int) -> None:
    """Submit, move and update jobs at random; print ``job ID STATE`` after each commit."""
    rng = random.Random(seed)
    store = Store(url, clock=SystemClock())
    open_states = [s for s in JobState if s not in TERMINAL_STATES]
    while True:
        roll = rng.random()
        if roll < 0.3:
            # Specs of up to ~40 kB, so that a transaction spans many database pages.
            blob = "x" * rng.choice([0, 100, 5000, 40000])
            job = store.add_job(
                JobSpec(
                    kind="script",
                    command=["python", "t.py"],
                    user=f"u{rng.randrange(4)}",
                    parameters={"blob": blob},
                )
            )
            print("job", job.id, job.state.value, flush=True)
            continue
        if roll < 0.35:
            store.set_node_status(f"n{rng.randrange(3)}", up=rng.random() < 0.5, failures=1)
            continue
        jobs, _ = store.list_jobs(states=open_states, limit=20, order="-id")
        if not jobs:
            continue
        job = rng.choice(jobs)
        if roll < 0.4:
            store.update_job(job.id, held=not job.held, handle={"pid": rng.randrange(1 << 16)})
            continue
        to_state = rng.choice(sorted(TRANSITIONS[job.state]))
        fields: dict[str, object] = {}
        if to_state is JobState.STARTING:
            fields["placement"] = Placement(node=f"n{rng.randrange(3)}", gpu_indices=[0, 1])
        try:
            moved = store.transition(
                job.id, to_state, expect=job.state, reason="crash test", **fields
            )
        except (ConflictError, IllegalTransitionError):
            continue  # the other writer moved it first
        print("job", moved.id, moved.state.value, flush=True)


def migrate_forever(url: str) -> None:
    """Downgrade to base and upgrade to head over and over; print the revision after each."""
    store = Store(url, clock=SystemClock())
    while True:
        for target in ("base", "head"):
            with store.engine.begin() as conn:
                (command.downgrade if target == "base" else command.upgrade)(
                    alembic_config(conn), target
                )
            print("at", target, flush=True)


# -- the tests -----------------------------------------------------------------------------------


@pytest.fixture
def store(store_url: str, clock: ManualClock) -> Iterator[Store]:
    st = Store(store_url, clock=clock)
    st.migrate()
    yield st
    st.close()


def start_writer(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent,
    )


def read_then_kill(procs: list[subprocess.Popen[str]], lines: int) -> list[str]:
    """Read ``lines`` acknowledgements from each writer, then SIGKILL them all mid-write."""
    acked: list[str] = []
    late: list[str] = []
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stderr is not None
            for _ in range(lines):
                line = proc.stdout.readline()
                if not line:
                    raise AssertionError(f"writer died on its own: {proc.stderr.read()[-3000:]}")
                acked.append(line.strip())
    finally:  # every writer killed, waited for and its pipes closed, whatever happened
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=scaled(30))
            # What it printed between our last read and the kill was committed too.
            late += proc.stdout.read().splitlines()  # type: ignore[union-attr]
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
    assert [proc.returncode for proc in procs] == [-signal.SIGKILL] * len(procs)
    return acked + [ln.strip() for ln in late if ln.strip()]


def assert_consistent(store: Store) -> None:
    """Every job's state is what replaying its events gives; no orphan rows."""
    if store.dialect == "sqlite":
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalars().all() == ["ok"]
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
    with store.engine.connect() as conn:
        jobs = {r.id: r for r in conn.execute(select(JobRow))}
        events = list(conn.execute(select(EventRow).order_by(EventRow.id)))
        usage = list(conn.execute(select(UsageRow)))
    chains: dict[int, list[tuple[str, str | None, str | None]]] = defaultdict(list)
    for ev in events:
        if ev.job_id is not None:
            assert ev.job_id in jobs, f"event {ev.id} names a missing job"
            if ev.to_state is not None:
                chains[ev.job_id].append((ev.kind, ev.from_state, ev.to_state))
    for job_id, row in jobs.items():
        chain = chains[job_id]
        assert chain and chain[0] == ("submitted", None, "queued"), f"job {job_id}: {chain}"
        state = JobState.QUEUED
        for kind, from_state, to_state in chain[1:]:
            assert kind == "state" and from_state == state.value, f"job {job_id}: {chain}"
            assert JobState(to_state) in TRANSITIONS[state], f"job {job_id}: {chain}"
            state = JobState(to_state)
        assert row.state == state.value, f"job {job_id} is {row.state}, its events say {state}"
        open_usage = [u for u in usage if u.job_id == job_id and u.finished_at is None]
        assert len(open_usage) == (1 if state in ACTIVE_STATES else 0), f"job {job_id}"


@pytest.mark.slow
def test_killed_writers_leave_a_consistent_store(store_url: str, store: Store) -> None:
    rng = random.Random(1234)
    acked: list[str] = []
    for round_ in range(ROUNDS):
        writers = [start_writer(store_url, str(round_ * 10 + w), "jobs") for w in range(WRITERS)]
        acked += read_then_kill(writers, lines=rng.randrange(5, 40))
        assert_consistent(store)

    # Everything a writer reported as committed survived its death.
    states_seen = {(e.job_id, e.to_state) for e in store.list_events(limit=1_000_000)}
    for line in acked:
        _, job_id, state = line.split()
        assert (int(job_id), JobState(state)) in states_seen, line
    assert len(acked) >= ROUNDS * WRITERS * 5

    # And the store keeps working.
    job = store.add_job(JobSpec(kind="lease"))
    store.transition(job.id, JobState.STARTING)
    store.transition(job.id, JobState.RUNNING)
    assert_consistent(store)


@pytest.mark.slow
def test_a_migration_killed_midway_leaves_base_or_head(store_url: str, store: Store) -> None:
    rng = random.Random(99)
    for _ in range(3):
        writer = start_writer(store_url, "0", "migrate")
        read_then_kill([writer], lines=rng.randrange(1, 12))
        with store.engine.connect() as conn:
            revision = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE}
            ).get_current_revision()
        tables = set(inspect(store.engine).get_table_names()) - {VERSION_TABLE}
        assert (revision, tables) in [(None, set()), (HEAD, TABLES)]
        store.engine.dispose()
        store.migrate()
        assert_consistent(store)
    store.add_job(JobSpec(kind="lease"))


if __name__ == "__main__":
    url_arg, seed_arg, mode = sys.argv[1:4]
    if mode == "migrate":
        migrate_forever(url_arg)
    else:
        write_forever(url_arg, int(seed_arg))
