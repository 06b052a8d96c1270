"""Submits committed by the store writer process: the same rows and events, errors that say
what happened, and a writer that dies or cannot start never costs a submit that could be
written."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
import urllib.error
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from _fixtures_polling import wait_for, wait_for_async
from _fixtures_postgres import store_url
from _fixtures_server import FAR_FUTURE
from _fixtures_service import ServiceProcess
from sqlalchemy import event

from jupyter_gpusched.core.clock import SystemClock
from jupyter_gpusched.core.errors import UnavailableError
from jupyter_gpusched.core.models import JobSpec, JobState, parse_spec
from jupyter_gpusched.scheduling.submits import GroupCommit
from jupyter_gpusched.store.leader import NotLeaderError, current_fence, fenced
from jupyter_gpusched.store.orm import JobRow
from jupyter_gpusched.store.store import Store
from jupyter_gpusched.store.writer import StoreWriter, usable_for

__all__ = ["store_url"]  # the fixture, imported for its tests


def spec(user: str = "alice", name: str = "train") -> JobSpec:
    return parse_spec(
        {"kind": "script", "command": ["python", name], "gpus": 1, "user": user, "name": name}
    )


class Wakes:
    """Counts the group commit's wakes (one per committed batch)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@pytest_asyncio.fixture
async def group(store_url: str) -> AsyncIterator[tuple[GroupCommit, Store]]:
    store = Store(store_url, clock=SystemClock())
    store.migrate()
    writer = StoreWriter(store.url)
    commit = GroupCommit(store, Wakes(), writer=writer)
    try:
        yield commit, store
    finally:
        await commit.close()
        await writer.close()
        store.close()


def writer_of(commit: GroupCommit) -> StoreWriter:
    writer = commit._writer
    assert writer is not None
    return writer


async def until_ready(writer: StoreWriter) -> int:
    """Wait for the child; its pid."""
    await wait_for_async(writer.ready, timeout_s=30, what="the store writer process")
    assert writer._proc is not None
    return writer._proc.pid


async def started(commit: GroupCommit) -> tuple[StoreWriter, int]:
    """Submit once (which starts the child) and wait for it; the writer and its pid."""
    await commit.submit(spec())
    writer = writer_of(commit)
    return writer, await until_ready(writer)


def refuse_thread_writes(monkeypatch: pytest.MonkeyPatch, store: Store) -> None:
    """Make the in-process write fail, so a submit that succeeds went through the child."""

    def no(*_: object, **__: object) -> None:
        raise AssertionError("written in the server's thread, not by the writer process")

    monkeypatch.setattr(store, "add_jobs", no)


@pytest.mark.asyncio
async def test_once_the_writer_is_up_submits_commit_in_it_with_their_events_and_cached_jobs(
    group: tuple[GroupCommit, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    commit, store = group
    first = await commit.submit(spec(name="first"))  # the thread writes while the child starts
    pid = await until_ready(writer_of(commit))
    assert pid != os.getpid()
    refuse_thread_writes(monkeypatch, store)
    wakes = commit._written
    assert isinstance(wakes, Wakes)
    woken = wakes.count

    jobs = await asyncio.gather(*(commit.submit(spec(f"u{i}", f"n{i}")) for i in range(6)))

    assert 1 <= wakes.count - woken < 6  # the scheduler is woken once per shared commit

    assert [job.spec.user for job in jobs] == [f"u{i}" for i in range(6)]
    assert len({job.id for job in jobs}) == 6 and min(job.id for job in jobs) > first.id
    for job in jobs:
        stored = store.get_job(job.id)
        assert stored.state is JobState.QUEUED and stored.spec == job.spec
        assert stored.submitted_at == job.submitted_at
    submitted = [e for e in store.list_events() if e.kind == "submitted"]
    assert [(e.job_id, e.detail["user"]) for e in submitted][1:] == [
        (job.id, job.spec.user) for job in jobs
    ]
    queue, _ = store.list_jobs(states=[JobState.QUEUED])
    assert [job.id for job in queue] == [first.id, *(job.id for job in jobs)]


@pytest.mark.asyncio
async def test_a_deposed_leaders_submit_is_refused_by_the_writer_with_not_leader(
    group: tuple[GroupCommit, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    commit, store = group
    await started(commit)
    refuse_thread_writes(monkeypatch, store)
    with fenced("someone-else:1:abc", 99), pytest.raises(NotLeaderError, match="no longer"):
        await commit.submit(spec(name="late"))
    assert all(job.spec.name != "late" for job in store.list_jobs()[0])


@pytest.mark.asyncio
async def test_waiting_reasons_written_by_the_writer_are_stored_logged_and_kept_in_the_cache(
    group: tuple[GroupCommit, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    commit, store = group
    writer, _ = await started(commit)
    jobs = [await commit.submit(spec(name=f"n{i}")) for i in range(3)]
    reasons = {job.id: f"waiting: reason {job.id}" for job in jobs}
    monkeypatch.setattr(store, "write_reasons", lambda *_: pytest.fail("written in-process"))

    changes = await writer.write_reasons(reasons, None)
    store.reasons_written(changes)

    assert sorted(job_id for job_id, _, _ in changes) == sorted(reasons)
    loads: list[object] = []

    def loaded(target: object, _: object) -> None:
        loads.append(target)

    event.listen(JobRow, "load", loaded)
    try:  # the kept jobs are current: reading them rebuilds no row
        read = {job.id: job.reason for job in store.list_jobs(limit=None)[0] if job.reason}
    finally:
        event.remove(JobRow, "load", loaded)
    assert (read, loads) == (reasons, [])
    waiting = [e for e in store.list_events() if e.kind == "waiting"]
    assert {e.job_id: e.detail["fields"]["reason"] for e in waiting} == reasons
    assert await writer.write_reasons(reasons, None) == []  # unchanged: nothing written
    with fenced("someone-else:1:abc", 99), pytest.raises(NotLeaderError, match="no longer"):
        await writer.write_reasons({jobs[0].id: "waiting: late"}, current_fence())


@pytest.mark.asyncio
async def test_a_writer_killed_mid_batch_fails_that_batch_with_503_and_the_next_submit_is_queued(
    group: tuple[GroupCommit, Store],
) -> None:
    commit, store = group
    writer, pid = await started(commit)
    os.kill(pid, signal.SIGSTOP)  # it reads nothing more: the next batch waits on it
    pending = asyncio.ensure_future(commit.submit(spec(name="lost")))
    await asyncio.sleep(0.2)
    assert not pending.done()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(UnavailableError, match="writer process exited.*list your jobs"):
        await pending

    again = await commit.submit(spec(name="after"))  # in the thread while a new child starts
    assert store.get_job(again.id).spec.name == "after"
    assert await until_ready(writer) != pid
    third = await commit.submit(spec(name="third"))
    assert store.get_job(third.id).spec.name == "third"


@pytest.mark.asyncio
async def test_a_writer_that_exited_between_batches_costs_no_submit(
    group: tuple[GroupCommit, Store],
) -> None:
    commit, store = group
    writer, pid = await started(commit)
    os.kill(pid, signal.SIGKILL)
    assert writer._proc is not None
    await writer._proc.wait()
    job = await commit.submit(spec(name="next"))
    assert store.get_job(job.id).spec.name == "next"


@pytest.mark.asyncio
async def test_a_writer_that_cannot_start_leaves_submits_to_the_servers_thread(
    group: tuple[GroupCommit, Store],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    commit, store = group
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    first = await commit.submit(spec(name="a"))
    writer = writer_of(commit)
    assert writer._starting is not None
    await asyncio.gather(writer._starting, return_exceptions=True)
    assert "store writer process did not start" in caplog.text
    second = await commit.submit(spec(name="b"))
    assert not writer.ready()  # and no new try before the retry pause
    assert [store.get_job(j.id).spec.name for j in (first, second)] == ["a", "b"]


@pytest.mark.asyncio
async def test_closing_lets_the_writer_finish_and_exit_by_itself(
    group: tuple[GroupCommit, Store],
) -> None:
    commit, _ = group
    writer, _ = await started(commit)
    proc = writer._proc
    assert proc is not None
    await commit.close()
    await writer.close()
    assert proc.returncode == 0  # not killed: its stdin closed and it returned


def test_only_stores_a_second_process_can_open_get_a_writer() -> None:
    assert usable_for("sqlite:////tmp/x/gpusched.db")
    assert usable_for("postgresql+psycopg://u:p@db/gpusched")
    assert not usable_for("sqlite://")
    assert not usable_for("sqlite:///:memory:")


# ------------------------------------------------------------------ a service killed mid-stream


def writer_children(pid: int) -> list[int]:
    """Pids of the store writer processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"jupyter_gpusched.store.writer" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.slow  # a service in a subprocess
def test_kill_9_while_four_clients_submit_loses_no_acknowledged_job_and_leaves_no_writer(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'gpusched.db'}"
    service = ServiceProcess(tmp_path / "service", store_url=url).start()
    acked: list[tuple[str, int]] = []  # (name, id) of every submit answered 201
    failed: list[str] = []
    stop = threading.Event()

    def client(k: int) -> None:
        i = 0
        while not stop.is_set():
            name = f"c{k}-{i}"
            i += 1
            body = {"kind": "script", "command": ["true"], "gpus": 1, "name": name}
            body["not_before"] = FAR_FUTURE
            try:
                job = service.api("POST", "jobs", body, token=service.admin_token)
            except (OSError, urllib.error.HTTPError) as exc:  # the kill, then nobody there
                failed.append(f"{name}: {exc}")
                time.sleep(0.05)
                continue
            acked.append((name, job["id"]))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        assert service.proc is not None
        pid = service.proc.pid
        wait_for(lambda: writer_children(pid), what="the service's store writer process")
        wait_for(lambda: len(acked) >= 300, what="300 submits answered")
        (child,) = writer_children(pid)
        service.stop(signal.SIGKILL)
        wait_for(
            lambda: (
                not Path(f"/proc/{child}").exists()
                or "Z" in Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            ),
            what="the orphaned writer to exit",
        )
        wait_for(lambda: failed, what="a client to feel the kill")
        stop.set()
        for t in threads:
            t.join()
        assert failed  # the kill was felt mid-stream

        service.start()
        after = service.api(
            "POST",
            "jobs",
            {
                "kind": "script",
                "command": ["true"],
                "gpus": 1,
                "not_before": FAR_FUTURE,
            },
            token=service.admin_token,
        )
        store = Store(url, clock=SystemClock())
        try:
            jobs, _ = store.list_jobs(limit=None)
        finally:
            store.close()
        names = [job.spec.name for job in jobs]
        assert len(names) == len(set(names))  # none stored twice
        stored = {job.spec.name: job.id for job in jobs}
        assert all(stored.get(name) == job_id for name, job_id in acked)  # none lost
        assert after["id"] == max(stored.values())
    finally:
        stop.set()
        for t in threads:
            t.join()
        service.stop()
