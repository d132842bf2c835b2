"""Where a store's rows live: a SQLite file (the embedded default, SQLCipher when encrypted) or a
PostgreSQL database shared by several replicas and workers. One protocol, two backends, chosen by
the store's location (a path, or a ``postgresql://`` URL); the SQL itself is the same on both
(SQLAlchemy Core ``text()``, ``storage/connection.py``), so a backend only does what the two
engines really do differently: open a connection, begin a write, say whether a transaction is
open, mark changes for other processes' indexes, and record the schema version.

Writes are serialized on both: SQLite's ``BEGIN IMMEDIATE`` takes the file's write lock;
PostgreSQL's write transactions take one transaction-scoped advisory lock, so the store's
check-then-write steps (duplicate guards, the audit chain's previous hash) stay correct across
replicas exactly as they are across processes on one SQLite file. Reads take no lock.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.pool import NullPool, StaticPool

from hybridmem_local.config import is_postgres_url
from hybridmem_local.errors import ConfigError, StoreError
from hybridmem_local.storage import encryption
from hybridmem_local.storage.encryption import StoreKeys

#: The advisory lock every PostgreSQL write transaction holds (one per database: the store's
#: writer lock, as SQLite's file lock is). Any fixed bigint; this is b"hybridme" as an integer.
WRITER_LOCK = 0x687962726964_6D65
#: Seconds to wait for a PostgreSQL server to accept a connection.
CONNECT_TIMEOUT_S = 5


class StoreBackend(Protocol):
    """What differs between the engines a store can live on."""

    #: ``sqlite`` or ``postgresql`` (SQLAlchemy's dialect name).
    name: str
    #: The path the store's local files (index files, LLM cache, markers) are named after; None
    #: for a throwaway in-memory store. For SQLite it is the database file itself.
    files_base: Path | None

    def connect(self) -> sa.Connection:
        """A new connection in driver autocommit: the store begins and ends its transactions itself."""
        ...

    #: Appended to a claim's SELECT: rows another transaction holds are skipped, not waited for.
    skip_locked: str

    def begin_write(self, conn: sa.Connection) -> None:
        """Open a write transaction, holding the store's writer lock."""
        ...

    def begin_claim(self, conn: sa.Connection) -> None:
        """Open a transaction that only claims rows (its own row locks, not the writer lock)."""
        ...

    def in_transaction(self, conn: sa.Connection) -> bool:
        """Whether the driver connection is inside a transaction (also after a failed statement)."""
        ...

    def before_commit(self, conn: sa.Connection) -> None:
        """Mark the commit for other processes' indexes (``change_marker``)."""
        ...

    def change_marker(self, conn: sa.Connection) -> tuple[int, int]:
        """Moves on every commit of any connection that can change what an index holds."""
        ...

    def schema_version(self, conn: sa.Connection) -> int: ...

    def set_schema_version(self, conn: sa.Connection, version: int) -> None: ...

    def set_lock_wait(self, conn: sa.Connection, timeout_ms: int) -> None:
        """From now on, waiting for another writer's lock gives up after ``timeout_ms``."""
        ...


def dbapi(conn: sa.Connection) -> Any:
    """The driver's own connection under ``conn`` (sqlite3/sqlcipher3 or psycopg)."""
    return conn.connection.dbapi_connection


class SqliteBackend:
    """One SQLite file (``:memory:`` for a throwaway store), plain or SQLCipher."""

    name = "sqlite"

    def __init__(self, path: Path | None, keys: StoreKeys | None, busy_timeout_ms: int):
        self.path = path
        self.files_base = path
        self.keys = keys
        self.busy_timeout_ms = busy_timeout_ms

    def connect(self) -> sa.Connection:
        raw = encryption.connect(
            self.path or ":memory:",
            self.keys,
            timeout=self.busy_timeout_ms / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        raw.row_factory = None  # SQLAlchemy builds its own rows
        raw.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        encryption.use_wal(raw)
        for pragma in (
            "foreign_keys = ON",
            "synchronous = NORMAL",
            # Deleted rows are zeroed, not just unlinked: SQLite's own default (and sqlcipher3's)
            # is off, and forget promises that the text is gone from the file.
            "secure_delete = ON",
        ):
            raw.execute(f"PRAGMA {pragma}")
        # ``module``: the dialect's DBAPI is the one that opened the file, so SQLAlchemy wraps
        # sqlcipher3's errors as it wraps sqlite3's (sa.exc.OperationalError and friends).
        module = sqlite3 if self.keys is None else encryption.sqlcipher_module()
        engine = sa.create_engine("sqlite://", module=module, creator=lambda: raw, poolclass=StaticPool)
        return engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    #: ``BEGIN IMMEDIATE`` already makes one claimer at a time.
    skip_locked = ""

    def begin_write(self, conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    def begin_claim(self, conn: sa.Connection) -> None:
        self.begin_write(conn)

    def in_transaction(self, conn: sa.Connection) -> bool:
        return bool(dbapi(conn).in_transaction)

    def before_commit(self, conn: sa.Connection) -> None:
        """Nothing: ``PRAGMA data_version`` already moves when another connection commits."""

    def change_marker(self, conn: sa.Connection) -> tuple[int, int]:
        version = conn.exec_driver_sql("PRAGMA data_version").scalar_one()
        return version, conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM events").scalar_one()

    def schema_version(self, conn: sa.Connection) -> int:
        return int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())

    def set_schema_version(self, conn: sa.Connection, version: int) -> None:
        conn.exec_driver_sql(f"PRAGMA user_version = {int(version)}")

    def set_lock_wait(self, conn: sa.Connection, timeout_ms: int) -> None:
        conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(timeout_ms)}")


class PostgresBackend:
    """One PostgreSQL database, shared by every replica and worker pointed at it. Index files
    and the LLM cache stay local to each process, under ``local_dir``."""

    name = "postgresql"

    def __init__(self, url: str, busy_timeout_ms: int, local_dir: Path | None = None):
        self.url = sa.engine.make_url(_with_driver(url))
        self.busy_timeout_ms = busy_timeout_ms
        self.files_base: Path | None = (local_dir or default_local_dir(self.url)) / "store"
        # NullPool: each store holds its one connection for its lifetime; pooling across
        # processes is PgBouncer's job (docs/deployment.md), not a per-process pool's.
        # A host that does not answer (rather than refuses) fails within seconds, not minutes;
        # keepalives find a connection a dead peer or a NAT dropped.
        self._engine = sa.create_engine(
            self.url,
            poolclass=NullPool,
            connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1, "keepalives_idle": 30},
        )

    def connect(self) -> sa.Connection:
        try:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except sa.exc.OperationalError as exc:
            raise StoreError(f"cannot reach the store's database {self.display}: {exc.orig}") from exc
        self.set_lock_wait(conn, self.busy_timeout_ms)
        return conn

    @property
    def display(self) -> str:
        """The URL without its password (for messages and logs)."""
        return self.url.render_as_string(hide_password=True)

    skip_locked = " FOR UPDATE SKIP LOCKED"

    def begin_write(self, conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN")
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": WRITER_LOCK})

    def begin_claim(self, conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    def in_transaction(self, conn: sa.Connection) -> bool:
        from psycopg.pq import TransactionStatus  # the postgres extra; only this backend needs it

        return dbapi(conn).info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    def before_commit(self, conn: sa.Connection) -> None:
        # Under the writer lock, so versions follow commit order; another replica compares it
        # with the version its indexes were built at before every search.
        conn.exec_driver_sql("UPDATE store_changes SET version = version + 1")

    def change_marker(self, conn: sa.Connection) -> tuple[int, int]:
        return conn.exec_driver_sql("SELECT version FROM store_changes").scalar_one(), 0

    def schema_version(self, conn: sa.Connection) -> int:
        # A catalog query under the statement's snapshot (to_regclass reads a cache that another
        # replica's migration, committed while this one waited for the lock, may not have reached).
        exists = conn.exec_driver_sql(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables "
            "WHERE schemaname = current_schema() AND tablename = 'schema_version')"
        ).scalar()
        if not exists:
            return 0  # a new database
        return int(conn.exec_driver_sql("SELECT coalesce(max(version), 0) FROM schema_version").scalar_one())

    def set_schema_version(self, conn: sa.Connection, version: int) -> None:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        conn.exec_driver_sql("DELETE FROM schema_version")
        conn.execute(sa.text("INSERT INTO schema_version (version) VALUES (:v)"), {"v": int(version)})

    def set_lock_wait(self, conn: sa.Connection, timeout_ms: int) -> None:
        conn.exec_driver_sql(f"SET lock_timeout = {int(timeout_ms)}")


def backend_for(
    location: str | Path, keys: StoreKeys | None, busy_timeout_ms: int, local_dir: Path | None = None
) -> StoreBackend:
    """The backend a store location names: a ``postgresql://`` URL, else a SQLite file."""
    if is_postgres_url(location):
        if keys is not None:
            raise ConfigError(
                "store.encryption: sqlcipher encrypts SQLite files; a PostgreSQL store is encrypted by the "
                "database's own disk or tablespace encryption and TLS (docs/deployment.md): set store.encryption: none"
            )
        return PostgresBackend(str(location), busy_timeout_ms, local_dir)
    path = None if str(location) == ":memory:" else Path(location)
    return SqliteBackend(path, keys, busy_timeout_ms)


def default_local_dir(url: sa.engine.URL) -> Path:
    """Per user and database: ``$XDG_CACHE_HOME/hybridmem/postgres/<host>-<port>-<db>-<hash>``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    name = f"{url.host or 'local'}-{url.port or 5432}-{url.database or 'postgres'}"
    digest = hashlib.sha256(url.render_as_string(hide_password=True).encode()).hexdigest()[:8]
    return cache / "hybridmem" / "postgres" / f"{name}-{digest}"


def _with_driver(url: str) -> str:
    """``postgresql://`` and ``postgres://`` mean psycopg 3 here (SQLAlchemy's default is psycopg2)."""
    scheme, rest = url.split("://", 1)
    return f"postgresql+psycopg://{rest}" if scheme in ("postgresql", "postgres") else url
