"""A store that is away: locked, down, corrupt, read-only or full (issues #15 and #31).

Seen before: a locked SQLite file (30 s busy timeout) stalled every request of the server,
kernels included; PostgreSQL down at start (or a corrupt file) gave 503 forever, even after it
came back; during an outage every route answered 500. A file read-only at start refused writes
after it was made writable (>= 106 s, until a restart), and a full disk turned every request,
reads included, into a 503. Each test runs a real server process on a real file or disk.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures_postgres import _Cluster, _find_bindir
from _fixtures_server import ServerProcess

pytestmark = pytest.mark.slow

#: Servers here retry a store that was away at start every second at most.
FAST_RETRY = {"store_retry_max_s": 1.0}


def call(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
    """(status, JSON body, headers) of one API call; errors are answers, not exceptions."""
    req = urllib.request.Request(
        server.url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null"), resp.headers
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read() or b"null"), err.headers


def until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def job(code: str = "pass") -> dict[str, Any]:
    return {"kind": "script", "command": [sys.executable, "-c", code], "gpus": 1}


def unavailable(answer: tuple[int, Any, Any], *words: str) -> None:
    status, body, headers = answer
    assert status == 503, (status, body)
    assert body["error"] == "UnavailableError" and int(headers["Retry-After"]) >= 1, body
    assert all(w in body["message"] for w in words), body["message"]


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.stop()


def test_a_locked_sqlite_store_cuts_writes_off_but_never_stalls_the_server(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    server = ServerProcess(tmp_path).start()
    servers.append(server)
    holder = sqlite3.connect(tmp_path / "gpusched.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        slowest_s, began = 0.0, time.monotonic()
        while time.monotonic() - began < 6.0:
            t0 = time.monotonic()
            with urllib.request.urlopen(server.url + f"api/status?token={server.token}") as r:
                assert r.status == 200  # the Jupyter server itself (kernels, contents...)
            slowest_s = max(slowest_s, time.monotonic() - t0)
            time.sleep(0.1)
        # A 30 s busy wait on the loop used to hold every request; now at most a bounded one.
        assert slowest_s < 2.5, slowest_s
        assert call(server, "GET", "gpusched/api/jobs")[0] == 200  # reads go on
        unavailable(call(server, "POST", "gpusched/api/jobs", job()), "locked", "gpusched.db")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    created: list[int] = []
    until(lambda: accepted(server, created), "writes work again once the lock is released", 30)
    until(lambda: state(server, created[0]) == "succeeded", "the queue runs again")


@pytest.fixture
def pg() -> Iterator[_Cluster]:
    bindir = _find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed; run `make system-deps`")
    cluster = _Cluster(bindir)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.postgres
def test_postgres_down_at_start_and_under_load_answers_503_and_recovers_by_itself(
    tmp_path: Path, servers: list[ServerProcess], pg: _Cluster
) -> None:
    pg.halt()
    server = ServerProcess(tmp_path, store_url=pg.url, **FAST_RETRY).start(expect=503)
    servers.append(server)
    unavailable(call(server, "GET", "gpusched/api/jobs"), "PostgreSQL", "cannot be reached")
    unavailable(call(server, "GET", "gpusched/api/cluster"), "PostgreSQL")
    assert "tries again by itself" in server.log_text()
    pg.start_again()
    until(lambda: call(server, "GET", "gpusched/api/jobs")[0] == 200, "recovered by itself")
    first = call(server, "POST", "gpusched/api/jobs", job())[1]["id"]
    until(
        lambda: call(server, "GET", f"gpusched/api/jobs/{first}")[1]["state"] == "succeeded",
        "a job runs once the store is back",
    )
    pg.halt()  # an outage while the server runs: 503 with Retry-After, never 500
    for method, path, body in [
        ("GET", "gpusched/api/jobs", None),
        ("POST", "gpusched/api/jobs", job()),
        ("GET", f"gpusched/api/jobs/{first}", None),
        ("DELETE", f"gpusched/api/jobs/{first}", None),
        ("GET", "gpusched/api/cluster", None),
    ]:
        unavailable(call(server, method, path, body), "PostgreSQL")
    pg.start_again()
    until(lambda: call(server, "POST", "gpusched/api/jobs", job())[0] == 201, "back after it")
    assert "Traceback" not in server.log_text().split("gpusched | scheduler started")[-1]


def test_a_corrupt_sqlite_file_says_what_to_do_and_recovers_once_moved_away(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    db = tmp_path / "gpusched.db"
    db.write_bytes(b"this is not a database, it was overwritten by mistake\n" * 100)
    server = ServerProcess(tmp_path, **FAST_RETRY).start(expect=503)
    servers.append(server)
    unavailable(call(server, "GET", "gpusched/api/jobs"), str(db), "move it away")
    assert "not a usable SQLite database" in server.log_text()
    db.rename(tmp_path / "gpusched.db.broken")
    until(lambda: call(server, "GET", "gpusched/api/jobs")[0] == 200, "recovered by itself")


def test_a_store_read_only_at_start_serves_reads_and_heals_by_itself_once_writable(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    first = ServerProcess(tmp_path / "one").start()  # a store made by an earlier run
    earlier = call(first, "POST", "gpusched/api/jobs", job())[1]["id"]
    until(lambda: state(first, earlier) == "succeeded", "the first run's job ends")
    first.stop()
    db = tmp_path / "one" / "gpusched.db"
    with read_only(db):
        server = ServerProcess(tmp_path / "one", **FAST_RETRY).start()  # reads answer
        servers.append(server)
        unavailable(call(server, "POST", "gpusched/api/jobs", job()), "read-only", str(db))
        log = server.log_text()
        assert "read-only" in log and "make the file and its directory writable" in log
        # Reads go on meanwhile, over several of the store's pauses; the connections they
        # open now are read-only, and used to refuse every write after the file was fixed.
        began = time.monotonic()
        while time.monotonic() - began < 5.0:
            assert call(server, "GET", f"gpusched/api/jobs/{earlier}")[0] == 200
            assert call(server, "GET", "gpusched/api/cluster")[0] == 200
            time.sleep(0.1)
        unavailable(call(server, "POST", "gpusched/api/jobs", job()), "read-only")
    fixed = time.monotonic()
    created: list[int] = []
    until(lambda: accepted(server, created), "writes work again once the file is writable", 60)
    healed_s = time.monotonic() - fixed
    assert healed_s < 15.0, f"writes came back {healed_s:.1f} s after the file became writable"
    until(lambda: state(server, created[0]) == "succeeded", "the queue runs again")
    assert state(server, earlier) == "succeeded"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 5 MB filesystem of its own (tmpfs, mounted as root); the test skips where it cannot."""
    folder = tmp_path / "small-disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=5m,mode=0700", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 5 MB tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


def fill(path: Path) -> None:
    """Write zeros to ``path`` until its disk is full."""
    chunk = bytes(64 << 10)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def test_on_a_full_disk_reads_answer_writes_say_what_to_free_and_it_heals_once_freed(
    tmp_path: Path, small_disk: Path, servers: list[ServerProcess]
) -> None:  # the server stops before its disk is unmounted
    db = small_disk / "gpusched.db"
    server = ServerProcess(tmp_path, store_url=f"sqlite:///{db}", leader_ttl_s=3.0).start()
    servers.append(server)
    earlier = call(server, "POST", "gpusched/api/jobs", job())[1]["id"]
    until(lambda: state(server, earlier) == "succeeded", "a job runs while there is room")
    filler = small_disk / "filler"
    fill(filler)
    unavailable(
        call(server, "POST", "gpusched/api/jobs", job()), "full", "free space", str(small_disk)
    )
    # Reads answer all along: past the leader's lease (3 s), which it cannot renew either.
    began = time.monotonic()
    while time.monotonic() - began < 5.0:
        assert call(server, "GET", "gpusched/api/jobs")[0] == 200
        assert call(server, "GET", f"gpusched/api/jobs/{earlier}")[0] == 200
        assert call(server, "GET", "gpusched/api/cluster")[0] == 200
        time.sleep(0.1)
    unavailable(call(server, "POST", "gpusched/api/jobs", job()), "full")
    filler.unlink()
    freed = time.monotonic()
    created: list[int] = []
    until(lambda: accepted(server, created), "writes work again once there is room", 60)
    healed_s = time.monotonic() - freed
    assert healed_s < 15.0, f"writes came back {healed_s:.1f} s after space was freed"
    until(lambda: state(server, created[0]) == "succeeded", "the queue runs again")


def state(server: ServerProcess, job_id: int) -> str:
    return str(call(server, "GET", f"gpusched/api/jobs/{job_id}")[1]["state"])


def accepted(server: ServerProcess, created: list[int]) -> bool:
    """Submit a job; whether it was taken (its id then goes to ``created``)."""
    status, body, _ = call(server, "POST", "gpusched/api/jobs", job())
    if status == 201:
        created.append(body["id"])
    return status == 201


class read_only:  # noqa: N801 - a context manager named for what it makes
    """Make a file read-only for this process, root included (chattr +i); skip if impossible."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.immutable = False

    def __enter__(self) -> None:
        for extra in ("-wal", "-shm"):  # a clean stop leaves none; make sure
            Path(f"{self.path}{extra}").unlink(missing_ok=True)
        self.path.chmod(0o444)
        if os.access(self.path, os.W_OK):  # root: permissions do not stop it
            chattr = shutil.which("chattr")
            done = chattr and subprocess.run([chattr, "+i", str(self.path)], check=False)
            if not done or done.returncode != 0:
                pytest.skip("cannot make a file read-only for root here (chattr +i failed)")
            self.immutable = True

    def __exit__(self, *exc: object) -> None:
        if self.immutable:
            subprocess.run(["chattr", "-i", str(self.path)], check=False)
        self.path.chmod(0o644)
