"""Alembic environment for jupyter-gpusched.

Run from :meth:`jupyter_gpusched.store.store.Store.migrate`, which passes an open connection in
``config.attributes["connection"]`` (its transaction is used as is). Given only a URL
(``alembic_config(url=...)``), this connects itself, e.g. for ``revision --autogenerate``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from jupyter_gpusched.store.orm import Base
from jupyter_gpusched.store.store import VERSION_TABLE

config = context.config
target_metadata = Base.metadata


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        **kwargs,
    )


def _run_on(connection: Connection) -> None:
    # SQLite alters tables by copying them ("batch mode"); autogenerate should write it so.
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    if context.is_offline_mode():
        _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.begin() as conn:
            _run_on(conn)
    finally:
        engine.dispose()


main()
