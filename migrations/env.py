"""Alembic environment: the database URL comes from packyard's Settings.

``packyard.workers.records.upgrade_database(settings)`` passes the URL in
``config.attributes["database_url"]``; the plain ``alembic`` command falls back
to ``PACKYARD_DATABASE_URL`` / the embedded SQLite default via Settings.
"""
from __future__ import annotations

from alembic import context

from packyard.workers.records.db import make_engine
from packyard.workers.records.models import Base
from packyard.workers.settings import Settings

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    return config.attributes.get("database_url") or Settings.from_env().database_url


def run_migrations_offline() -> None:
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(database_url())
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=target_metadata,
                              render_as_batch=connection.dialect.name == "sqlite")
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
