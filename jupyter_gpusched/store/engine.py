"""Database engines: SQLite tuned to be the truth (WAL, fsync, write lock up front), or any URL.

SQLite runs in WAL mode with ``synchronous=FULL`` (``NORMAL`` for redoable writes, see
:mod:`.store`) and writers take the lock with ``BEGIN
IMMEDIATE`` (see :mod:`.store`); other URLs (PostgreSQL) get a pre-pinged pool.

The WAL stays small: SQLite's default checkpoints it only past 1000 pages and never shrinks
the file, so 400 submitted jobs left a 4.2 MB WAL beside a 1 MB database for good -- on a
5 MB volume, a full disk within a minute. Here it is checkpointed every
:data:`WAL_AUTOCHECKPOINT_PAGES`, cut back to :data:`WAL_LIMIT_BYTES` when it restarts, and
:func:`truncate_wal` empties one that readers kept from restarting. A connection that found
the file read-only stays read-only, so such an error drops the pool's connections
(:func:`_on_error`): the next transaction opens the file afresh and sees it writable again.

A SQLite file holds every job's env values and notebook parameters: whoever opens one first
creates it 0600 (SQLite gives its ``-wal`` and ``-shm`` files the same mode) in a folder made
0700, and :func:`exposure` says what to run when an existing one is open to other users.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    create_engine,
    event,
)
from sqlalchemy.engine import Connection, Engine, ExceptionContext, make_url
from sqlalchemy.pool import StaticPool

from jupyter_gpusched.node.stage import private_folder

from .availability import on_event_loop

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
#: A passive checkpoint after each commit that leaves the WAL this long (~0.5 MB of pages).
WAL_AUTOCHECKPOINT_PAGES = 128
#: What a restarting WAL is cut back to (``PRAGMA journal_size_limit``), and past which
#: :func:`truncate_wal` empties it.
WAL_LIMIT_BYTES = 1 << 20
#: How long :func:`truncate_wal` waits for readers and writers: it is tried again later.
_TRUNCATE_BUSY_MS = 200
#: How long a SQLite writer waits for another one's lock.
_BUSY_TIMEOUT_MS = 30_000
#: ... when it waits on the event loop, where waiting stalls every request of the server.
LOOP_BUSY_TIMEOUT_MS = 1_000
#: PostgreSQL connections: give up connecting after a few seconds, and notice a peer that
#: vanished (no answer to keepalives or unacknowledged data) within about ten.
_PG_CONNECT_ARGS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


def make_engine(url: str, *, echo: bool) -> Engine:
    """An engine for ``url``; SQLite files get WAL, full fsync and a busy timeout."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        connect_args = _PG_CONNECT_ARGS if parsed.get_backend_name() == "postgresql" else {}
        return create_engine(url, echo=echo, pool_pre_ping=True, connect_args=connect_args)
    memory = parsed.database in (None, "", ":memory:")
    if not memory and not str(parsed.database).startswith("file:"):
        create_private(str(parsed.database))
    engine = create_engine(
        url,
        echo=echo,
        connect_args={"check_same_thread": False, "timeout": _BUSY_TIMEOUT_MS / 1000},
        poolclass=StaticPool if memory else None,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Hand transaction control to SQLAlchemy's BEGIN below; the sqlite3 module's own
        # implicit transactions would start too late for a read-check-write.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        if not memory:
            _enable_wal(cursor)
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
        cursor.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
        cursor.close()

    event.listen(engine, "handle_error", _on_error)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A lock is waited on briefly on the event loop, and long in worker threads.
        busy_ms = LOOP_BUSY_TIMEOUT_MS if on_event_loop() else _BUSY_TIMEOUT_MS
        if conn.info.get("busy_ms") != busy_ms:
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {busy_ms}")
            conn.info["busy_ms"] = busy_ms
        options = conn.get_execution_options()
        sync = options.get("gpusched_sync", "FULL")  # NORMAL: a write that may be redone
        if conn.info.get("sync") != sync:
            conn.exec_driver_sql(f"PRAGMA synchronous = {sync}")
            conn.info["sync"] = sync
        conn.exec_driver_sql(f"BEGIN {options.get('gpusched_begin', 'DEFERRED')}")

    return engine


def _on_error(context: ExceptionContext) -> None:
    """A read-only SQLite file: drop the pool's connections, so the next one reopens the file.

    SQLite opens a file it may not write read-only, and the connection stays so after the
    file (its folder, its mount) becomes writable: without this a store read-only at start
    kept refusing writes until the server restarted.
    """
    code = getattr(context.original_exception, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == sqlite3.SQLITE_READONLY:
        context.is_disconnect = True


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite ``url``; None for other databases and in-memory ones."""
    parsed = make_url(url)
    database = str(parsed.database or "")
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    if database.startswith("file:"):
        return None
    return os.path.abspath(os.path.expanduser(database))


def wal_bytes(path: str) -> int:
    """The size of the WAL beside the SQLite file ``path`` (0 when there is none)."""
    try:
        return os.stat(f"{path}-wal").st_size
    except OSError:
        return 0


def truncate_wal(engine: Engine, path: str) -> bool:
    """Empty the WAL of the SQLite file ``path`` when it outgrew :data:`WAL_LIMIT_BYTES`.

    Passive checkpoints cannot restart a WAL that some reader still needs, so a busy server
    could grow it past its limit; a ``TRUNCATE`` checkpoint waits briefly for them and
    empties it. Whether it was emptied (False: it was small, or readers or a writer held it;
    the next call tries again). Call it from a worker thread.
    """
    if wal_bytes(path) <= WAL_LIMIT_BYTES:
        return False
    conn = engine.raw_connection()  # no BEGIN: a checkpoint runs outside any transaction
    try:
        conn.info.pop("busy_ms", None)  # the next transaction sets its own again
        cursor = conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {_TRUNCATE_BUSY_MS}")
        busy, _, _ = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        cursor.close()
    finally:
        conn.close()
    return not busy


def create_private(path: str) -> None:
    """Create a SQLite file 0600 (and its folder 0700) unless it exists.

    An empty file is an empty database to SQLite, which creates the file's ``-wal`` and
    ``-shm`` companions with the file's own mode.
    """
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.lexists(path):
        return
    private_folder(os.path.dirname(path))
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        pass  # another process created it meanwhile


def exposure(url: str) -> list[str]:
    """What other users may read of a SQLite store at ``url``, each with what to run; [] if none.

    The file (and its ``-wal``, ``-shm``) must give group and others nothing; its folder, no
    more than entering it. Other URLs (PostgreSQL) are the database server's to guard.
    """
    path = sqlite_path(url)
    if path is None:
        return []
    said = []
    files = [f for f in (path, f"{path}-wal", f"{path}-shm") if _mode(f) & 0o077]
    if files:
        modes = ", ".join(f"{f} {_mode(f):04o}" for f in files)
        said.append(
            f"the store's files are open to other users ({modes}): they hold every job's env "
            f"values and notebook parameters; run: chmod 600 {shlex.join(files)}"
        )
    folder = os.path.dirname(path)
    if _mode(folder) & 0o066:
        said.append(
            f"the store's folder {folder} is open to other users ({_mode(folder):04o}); "
            f"run: chmod 700 {shlex.quote(folder)} (or go-rw, when others share it)"
        )
    return said


def _mode(path: str) -> int:
    """Permission bits of ``path`` (0 when it does not exist)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0


def _enable_wal(cursor: Any) -> None:
    """Switch a file database to WAL, waiting for other first-time openers.

    Switching needs an exclusive lock, and SQLite answers "database is locked" at once instead
    of honouring ``busy_timeout`` when two processes open a fresh file together.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
    delay_s = 0.005
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode").fetchone()[0].lower()
            if mode != "wal":
                mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower()
            if mode == "wal":
                return
            if time.monotonic() > deadline:
                raise sqlite3.OperationalError(f"could not switch to WAL; journal mode is {mode}")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.2)


def normalize_url(url: str) -> str:
    """Pick the psycopg (v3) driver for plain ``postgresql://`` URLs; other URLs pass as is."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """An Alembic config for the migrations shipped in this package; no ``alembic.ini`` needed.

    Pass the ``connection`` to migrate on (its open transaction is used), or a ``url`` for
    Alembic commands that connect themselves (``revision --autogenerate``).
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config
