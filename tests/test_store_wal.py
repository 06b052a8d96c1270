"""SQLite's write-ahead log stays small, so a fresh store fits in 2 MB (issue #31, item 3).

Seen before: SQLite checkpoints its WAL only past 1000 pages and never shrinks the file, so a
fresh store on a 5 MB volume grew to ~1 MB of database plus ~4.2 MB of WAL within a minute of
work, and then the disk was full. Each test works a real store file the way a scheduler does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.models import JobSpec, JobState, Placement
from jupyter_gpusched.store.engine import WAL_LIMIT_BYTES, wal_bytes
from jupyter_gpusched.store.leader import LeaderLease
from jupyter_gpusched.store.store import Store

S = JobState
#: What a fresh store may take on disk, database and WAL together, after a burst of work.
FRESH_STORE_BYTES = 2 << 20
JOBS = 400  # the burst that left a 4.2 MB WAL


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "gpusched.db"


@pytest.fixture
def store(db: Path, clock: ManualClock) -> Iterator[Store]:
    st = Store(f"sqlite:///{db}", clock=clock)
    st.migrate()
    yield st
    st.close()


def work(store: Store, clock: ManualClock, jobs: int, each: object = None) -> None:
    """A burst: jobs submitted, started, run and ended, the leader lease renewed meanwhile."""
    lease = LeaderLease(store)
    for i in range(jobs):
        spec = JobSpec(kind="script", command=["python", "train.py", str(i)], user="ann")
        job = store.add_job(spec)
        store.transition(job.id, S.STARTING, placement=Placement(node="g0", gpu_indices=[0]))
        store.transition(job.id, S.RUNNING)
        clock.advance(1)
        store.transition(job.id, S.SUCCEEDED, exit_code=0)
        lease.hold()
        if callable(each):
            each()


def test_a_burst_of_work_keeps_the_wal_bounded_and_the_store_under_2_mb(
    store: Store, clock: ManualClock, db: Path
) -> None:
    peak_wal = 0

    def look() -> None:
        nonlocal peak_wal
        peak_wal = max(peak_wal, wal_bytes(str(db)))

    work(store, clock, JOBS, each=look)
    assert peak_wal <= WAL_LIMIT_BYTES, peak_wal
    on_disk = db.stat().st_size + wal_bytes(str(db))
    assert on_disk <= FRESH_STORE_BYTES, (db.stat().st_size, wal_bytes(str(db)))


def test_a_wal_a_reader_kept_growing_is_emptied_once_the_reader_is_done(
    store: Store, clock: ManualClock, db: Path
) -> None:
    reader = sqlite3.connect(db, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM jobs").fetchone()  # holds its snapshot
        work(store, clock, 40)  # ~6 MB of WAL: every commit's pages stay in it
        assert wal_bytes(str(db)) > WAL_LIMIT_BYTES  # no checkpoint could restart it
        assert store.trim_wal() is False  # it waits for the reader only briefly
        reader.execute("COMMIT")
    finally:
        reader.close()
    assert store.trim_wal() is True
    assert wal_bytes(str(db)) == 0
    assert store.trim_wal() is False  # nothing left to do
    assert store.list_jobs(limit=1)[1] == 40  # nothing lost on the way
