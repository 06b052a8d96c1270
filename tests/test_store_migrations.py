from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from _fixtures_postgres import postgres_server_url, postgres_url  # noqa: F401
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.models import JobSpec, JobState
from jupyter_gpusched.store.engine import alembic_config
from jupyter_gpusched.store.orm import Base
from jupyter_gpusched.store.store import VERSION_TABLE, Store

TABLES = {"jobs", "events", "usage", "nodes"}


@pytest.fixture
def store(store_url: str, clock: ManualClock) -> Iterator[Store]:
    st = Store(store_url, clock=clock)
    yield st
    st.close()


def current_revision(store: Store) -> str | None:
    with store.engine.connect() as conn:
        return MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()


def tables(store: Store) -> set[str]:
    return set(inspect(store.engine).get_table_names()) - {VERSION_TABLE}


def head() -> str:
    return str(ScriptDirectory.from_config(alembic_config()).get_current_head())


def test_chain_is_linear_and_numbered() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    revisions = list(reversed(list(script.walk_revisions())))
    assert len(script.get_heads()) == 1
    assert [r.revision for r in revisions] == [f"{i:04d}" for i in range(1, len(revisions) + 1)]


def test_migrate_from_empty_to_head_and_again(store: Store) -> None:
    assert tables(store) == set() and current_revision(store) is None
    store.migrate()
    assert tables(store) >= TABLES and current_revision(store) == head()
    store.migrate()
    assert current_revision(store) == head()


def test_models_match_the_migrated_schema(store: Store) -> None:
    store.migrate()
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
        )
        assert compare_metadata(ctx, Base.metadata) == []


def test_every_step_downgrades_and_upgrades_again(store: Store, clock: ManualClock) -> None:
    script = ScriptDirectory.from_config(alembic_config())
    steps = list(reversed(list(script.walk_revisions())))
    with store.engine.begin() as conn:
        config = alembic_config(conn)
        for step in steps:
            command.upgrade(config, step.revision)
            command.downgrade(config, step.down_revision or "base")
            command.upgrade(config, step.revision)
    assert current_revision(store) == head()
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert tables(store) == set()
    store.migrate()
    job = store.add_job(JobSpec(kind="lease"))
    assert store.transition(job.id, JobState.CANCELLED).state is JobState.CANCELLED


def test_two_servers_migrating_at_once_both_succeed(store_url: str, clock: ManualClock) -> None:
    stores = [Store(store_url, clock=clock) for _ in range(2)]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def start(st: Store) -> None:
        barrier.wait()
        try:
            st.migrate()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(st,)) for st in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert current_revision(stores[0]) == head()
    finally:
        for st in stores:
            st.close()
