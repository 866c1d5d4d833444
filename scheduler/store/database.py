"""Engine, sessions and migrations of the job store (SQLite by default, PostgreSQL by URL)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


# The job list is built by SQLite's JSON functions (built in since 3.38) with a MATERIALIZED
# common table expression (3.35).
MIN_SQLITE = (3, 38, 0)
# Each engine's pool: connections kept, and more lent at busy times; a checkout past both waits.
SQLITE_POOL = (5, 10)
POSTGRES_POOL = (10, 20)


def pool_limits(url: str) -> tuple[int, int]:
    """(pool_size, max_overflow) of the engine `make_engine(url)` builds."""
    return SQLITE_POOL if url.startswith("sqlite") else POSTGRES_POOL


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            wanted = ".".join(map(str, MIN_SQLITE))
            raise RuntimeError(
                f"the job store needs SQLite {wanted} or newer; this Python links "
                f"{sqlite3.sqlite_version}: upgrade it or set DATABASE_URL to a PostgreSQL server"
            )
        path = url.split("///", 1)[-1]
        pool: dict[str, int] = {}
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            size, overflow = pool_limits(url)
            pool = {"pool_size": size, "max_overflow": overflow}
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **pool
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):
            # WAL lets the API read while the ingester writes; foreign keys for cascades.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    size, overflow = pool_limits(url)
    return create_engine(url, pool_pre_ping=True, pool_size=size, max_overflow=overflow)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(url: str) -> None:
    """Bring the database to the newest schema (run at every start; a no-op when current)."""
    command.upgrade(alembic_config(url), "head")


class Database:
    """An engine and its session factory; one per process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        # The most connections its sessions hold at once (a session holds one at most).
        self.max_connections = sum(pool_limits(url))

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def dispose(self) -> None:
        self.engine.dispose()
