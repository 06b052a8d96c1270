"""A private PostgreSQL for the tests: one cluster per session, one fresh database per test.

Register with ``pytest_plugins = ["_fixtures_postgres"]`` in conftest, or import the fixtures
into a test module. Fixtures:

* ``postgres_server_url`` (session) -- URL of a server we may create databases on: env
  ``GPUSCHED_TEST_PG_URL`` when set (its role needs CREATEDB), else a throw-away cluster
  started from Debian's ``/usr/lib/postgresql/*/bin`` in a temp dir, listening on 127.0.0.1
  with a free port and trust auth, stopped at the end of the session.
* ``postgres_url`` -- an empty database of its own for one test, dropped afterwards.

Without PostgreSQL binaries the tests that need them are skipped, saying how to install them.
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

PG_URL_ENV = "GPUSCHED_TEST_PG_URL"
_CLUSTER_KEY = pytest.StashKey["_Cluster"]()


class _Cluster:
    """A PostgreSQL cluster in a temp dir, run as the ``postgres`` OS user when we are root."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="gpusched-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root.
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *argv: str) -> None:
        proc = subprocess.run(
            [*self._as_user, *argv], capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{shlex.join(argv)} failed:\n{proc.stdout}{proc.stderr}{tail}")

    def start(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--locale=C",
        )
        self.start_again()

    def _options(self) -> str:
        # fsync off: test data need not survive a power cut, and it makes CREATE DATABASE fast.
        return shlex.join(
            [
                "-c",
                "listen_addresses=127.0.0.1",
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ]
        )

    def halt(self) -> None:
        """Stop the server as a crash would, keeping its data (``start_again`` resumes it)."""
        pg_ctl = str(self.bindir / "pg_ctl")
        self._run(pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def start_again(self) -> None:
        """Start a halted server on its old port and data."""
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60",
            "-l", str(self.root / "server.log"), "-o", self._options(), "start",
        )  # fmt: skip

    def stop(self) -> None:
        try:
            self._run(
                str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"
            )
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _find_bindir() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="session")
def postgres_server_url(request: pytest.FixtureRequest) -> str:
    """URL of a PostgreSQL server for this session (see the module docstring)."""
    if os.environ.get(PG_URL_ENV):
        return str(
            make_url(os.environ[PG_URL_ENV])
            .set(drivername="postgresql+psycopg")
            .render_as_string(hide_password=False)
        )
    config = request.config
    # One cluster per session even when several modules import this fixture.
    cluster = config.stash.get(_CLUSTER_KEY, None)
    if cluster is None:
        bindir = _find_bindir()
        if bindir is None:
            pytest.skip(
                "PostgreSQL is not installed; run `make system-deps` (or set "
                f"{PG_URL_ENV} to a server URL)"
            )
        if os.geteuid() == 0 and (not shutil.which("runuser") or not _has_user("postgres")):
            pytest.skip(
                "running as root needs runuser and a 'postgres' OS user; run `make system-deps`"
            )
        cluster = _Cluster(bindir)
        config.add_cleanup(cluster.stop)
        cluster.start()
        config.stash[_CLUSTER_KEY] = cluster
    return cluster.url


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def create_database(server_url: str, name: str) -> str:
    """Create an empty database ``name`` on the server; its URL (for benches and fixtures)."""
    import psycopg

    server = make_url(server_url)
    dsn = server.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.set(database=name).render_as_string(hide_password=False)


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """An empty database for one test, dropped (forcibly) when the test ends."""
    import psycopg

    server = make_url(postgres_server_url)
    name = f"gpusched_test_{uuid.uuid4().hex[:12]}"
    dsn = server.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        yield create_database(postgres_server_url, name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh empty database: a SQLite file, then (second param) a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpusched.db'}"
    return str(request.getfixturevalue("postgres_url"))
