"""One connection to the store's database with the store's settings: the schema migrated, SQL
run the same way on every backend, and transactions that nest.

The SQL of every part is SQLAlchemy Core ``text()`` with named parameters (``:name``; a list or
tuple value binds an ``IN :name`` list), so one statement runs on SQLite and PostgreSQL alike
(``storage/backends.py`` holds what differs). :meth:`Database.transaction` is one atomic unit of
work holding the store's writer lock; nested inside another it is a SAVEPOINT (as sqlite-utils
does), so a failure inside it undoes its own work only, and the outer transaction decides about
the rest. Every write runs inside one; a read outside any sees the latest commit.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from typing_extensions import Unpack

from hybridmem_local.errors import StoreError, StoreUnavailableError
from hybridmem_local.storage import encryption
from hybridmem_local.storage.backends import SqliteBackend, StoreBackend, backend_for, dbapi
from hybridmem_local.storage.encryption import StoreKeys
from hybridmem_local.storage.migrations import SCHEMA_VERSION, upgrade
from hybridmem_local.storage.paths import database_files
from hybridmem_local.storage.scrub import ScrubResult, is_pending, scrub

Params = Mapping[str, Any] | None
T = TypeVar("T")
#: Any statement's result (SQLAlchemy 2.1 types a result by its columns; the store's are many).
Result = sa.CursorResult[Unpack[tuple[Any, ...]]]


class Database:
    """One store database: a SQLite file (``":memory:"`` works for throwaway use), encrypted with
    SQLCipher when ``keys`` are given (``storage/encryption.py``), or a PostgreSQL URL."""

    def __init__(
        self,
        location: str | Path,
        busy_timeout_ms: int = 30_000,
        keys: StoreKeys | None = None,
        local_dir: Path | None = None,
    ):
        #: The master key's derived keys when the store is encrypted, else None; index files
        #: and exports next to the store are sealed with ``keys.files``.
        self.keys = keys
        self.busy_timeout_ms = busy_timeout_ms
        self._location, self._local_dir = location, local_dir
        self.backend: StoreBackend = backend_for(location, keys, busy_timeout_ms, local_dir)
        #: What the store's local files (index files, LLM cache) are named after: the SQLite
        #: file, or a folder of this host for a PostgreSQL store; None in memory.
        self.path = self.backend.files_base
        if isinstance(self.backend, SqliteBackend) and self.path is not None:
            _create_owner_only(self.path)
        elif self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        #: Names the savepoints of nested transactions (unique, so they never shadow each other).
        self._savepoints = itertools.count()
        #: How deep in transactions this connection is (0: none), and whether it was lost.
        self._depth = 0
        self._lost = False
        try:
            self.conn = self.backend.connect()
        except sa.exc.DBAPIError as exc:
            raise StoreError(f"cannot open store {location}: {exc.orig}") from exc
        except encryption.DatabaseError as exc:  # a PRAGMA on the driver's connection, before SQLAlchemy wraps it
            raise StoreError(f"cannot open store {location}: {exc}") from exc
        try:
            self._migrate()
            # A forget whose scrub another connection blocked finishes here, once it is gone.
            self.retry_pending_scrub()
        except BaseException as exc:
            Database.close(self)  # a store that cannot open keeps no connection (or file handle) behind
            if isinstance(exc, sa.exc.DBAPIError):
                raise StoreError(f"cannot open store {location}: {exc.orig}") from exc
            raise
        if isinstance(self.backend, SqliteBackend) and self.path is not None:
            _owner_only(self.path)

    def _migrate(self) -> None:
        """Bring the schema to ``SCHEMA_VERSION`` (``storage/migrations.py``); when it is there
        already, no lock is taken."""
        if self.backend.schema_version(self.conn) == SCHEMA_VERSION:
            return
        with self.transaction():
            version = self.backend.schema_version(self.conn)  # again, under the lock: another may have migrated
            upgrade(self.conn, version)
            if version < SCHEMA_VERSION:
                self.backend.set_schema_version(self.conn, SCHEMA_VERSION)

    # ------------------------------------------------------------------ SQL

    def execute(self, sql: str, params: Params = None) -> Result:
        """Run one statement with ``:name`` parameters; list and tuple values expand ``IN :name``."""
        return self._run(lambda: self.conn.execute(_statement(sql, _expanding(params)), dict(params or {})))

    def executemany(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self._run(lambda: self.conn.execute(_statement(sql, ()), [dict(row) for row in rows]))

    def _run(self, call: Callable[[], T]) -> T:
        """``call`` on a reachable connection. Outside a transaction a connection found dead (the
        server restarted, the connection dropped while idle) is replaced and ``call`` run once
        more: nothing ran on the dead one (every write is inside a transaction, whose BEGIN is
        such a call), so the request that meets a drop still succeeds."""
        retry = not self._depth
        try:
            with self._reachable():
                return call()
        except StoreUnavailableError:
            if not (retry and self._lost):
                raise
        with self._reachable():  # reconnects first; StoreUnavailableError while the database is away
            return call()

    @contextmanager
    def _reachable(self, committing: bool = False) -> Iterator[None]:
        """A lost connection (a PostgreSQL server restarted or gone, the connection dropped) is a
        :class:`StoreUnavailableError` (503 from the service) and the connection is replaced at the
        next call outside a transaction: the store recovers by itself once the database is back.
        Lost before the COMMIT, nothing was stored; lost during it (``committing``), the client
        cannot know whether the server committed, and the message says so."""
        if self._lost and not self._depth:
            self._reconnect()
        try:
            yield
        except sa.exc.DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            self._lost = True
            cause = _first_line(exc.orig or exc)
            outcome = (
                "during its commit, so whether the operation was stored is unknown: read it back before "
                "retrying (a stored write sent again is refused as a duplicate)"
                if committing
                else "the operation was not stored, retry it"
            )
            raise StoreUnavailableError(f"the store's database went away ({cause}); {outcome}") from exc
        except (sa.exc.PendingRollbackError, sa.exc.ResourceClosedError) as exc:
            # SQLAlchemy's own word for a connection invalidated or closed by an earlier failure.
            if not (self.conn.invalidated or self.conn.closed):
                raise
            self._lost = True
            raise StoreUnavailableError(f"the store's database went away ({exc}); retry it") from exc

    def _reconnect(self) -> None:
        with contextlib.suppress(sa.exc.DBAPIError):  # it is gone already
            self.conn.close()
        try:
            self.conn = self.backend.connect()
        except StoreError as exc:
            raise StoreUnavailableError(str(exc)) from exc
        self._lost = False

    def scalar(self, sql: str, params: Params = None) -> Any:
        """The first column of the first row (None when there is none)."""
        return self.execute(sql, params).scalar()

    @property
    def in_transaction(self) -> bool:
        return self._depth > 0

    @contextmanager
    def transaction(self, *, claim: bool = False, indexed: bool = True) -> Iterator[Database]:
        """One atomic unit of work: all of it is stored or none of it. Inside another
        transaction it is a savepoint of that one: a failure rolls back this unit's changes
        only, and they are stored when (and if) the outermost transaction commits.

        ``claim``: the unit only claims rows (``SELECT ... {backend.skip_locked}`` then marks
        them), so on PostgreSQL it takes their row locks rather than the writer lock; it must
        write nothing else. ``indexed=False``: the unit changes nothing an index holds (an audit
        entry, a claim), so other replicas' indexes need not look again."""
        if self._depth:
            yield from self._savepoint()
            return

        def begin() -> None:
            try:
                (self.backend.begin_claim if claim else self.backend.begin_write)(self.conn)
            except BaseException:
                # BEGIN went through but the writer lock did not (its wait timed out): end it.
                if not self._lost and _alive(self.conn) and self.backend.in_transaction(self.conn):
                    self.conn.exec_driver_sql("ROLLBACK")
                raise

        self._run(begin)  # safe to run again on a new connection: nothing happened yet
        self._depth = 1
        try:
            yield self
            with self._reachable():
                if indexed and not claim:
                    self.backend.before_commit(self.conn)
            with self._reachable(committing=True):
                self.conn.exec_driver_sql("COMMIT")
        except BaseException:
            # Some errors (SQLITE_FULL, SQLITE_IOERR, a dropped connection) end the transaction
            # by themselves; a second ROLLBACK would raise and hide the real cause.
            if not self._lost and _alive(self.conn) and self.backend.in_transaction(self.conn):
                self.conn.exec_driver_sql("ROLLBACK")
            raise
        finally:
            self._depth = 0

    def _savepoint(self) -> Iterator[Database]:
        name = f"nested_{next(self._savepoints)}"
        with self._reachable():
            self.conn.exec_driver_sql(f"SAVEPOINT {name}")
        self._depth += 1
        try:
            yield self
        except BaseException:
            # After an automatic rollback of the whole transaction the savepoint is gone too.
            if not self._lost and _alive(self.conn) and self.backend.in_transaction(self.conn):
                self.conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {name}")
                self.conn.exec_driver_sql(f"RELEASE SAVEPOINT {name}")
            raise
        else:
            with self._reachable():
                self.conn.exec_driver_sql(f"RELEASE SAVEPOINT {name}")
        finally:
            self._depth -= 1

    def change_marker(self) -> tuple[int, int]:
        """Moves on every commit that can change what an index holds, by this connection or any
        other (``storage/backends.py``). The one staleness check of ``indexes/store_indexes.py``."""
        return self._run(lambda: self.backend.change_marker(self.conn))

    @contextmanager
    def lock_wait(self, timeout_ms: int) -> Iterator[None]:
        """Inside it, waiting for another writer gives up after ``timeout_ms``."""
        self._run(lambda: self.backend.set_lock_wait(self.conn, timeout_ms))
        try:
            yield
        finally:
            if not self._lost and _alive(self.conn):
                with contextlib.suppress(StoreUnavailableError):  # a new connection starts with the default
                    self._run(lambda: self.backend.set_lock_wait(self.conn, self.busy_timeout_ms))

    def reopen(self) -> Database:
        """Another connection to the same store, with the same settings (e.g. for a writer thread)."""
        return Database(self._location, self.busy_timeout_ms, self.keys, self._local_dir)

    def close(self) -> None:
        engine = self.conn.engine
        self.conn.close()
        # The driver's connection itself (a SQLite file's last close checkpoints its WAL).
        engine.dispose()

    # ------------------------------------------------------------------ SQLite files only

    @property
    def sqlite(self) -> Any:
        """The sqlite3/sqlcipher3 connection of a SQLite store (for what only SQLite has: VACUUM,
        checkpoints, online backup)."""
        if not isinstance(self.backend, SqliteBackend):
            raise StoreError(f"this needs a SQLite store; the store is on {self.backend.name}")
        return dbapi(self.conn)

    def integrity_check(self) -> str:
        if not isinstance(self.backend, SqliteBackend):
            return "ok"  # PostgreSQL checks its own pages (data checksums, amcheck)
        return self.sqlite.execute("PRAGMA integrity_check").fetchone()[0]

    @property
    def encrypted(self) -> bool:
        return self.keys is not None

    def backup_to(self, path: Path) -> None:
        """A consistent copy of a SQLite database at ``path`` (owner-only), even while others
        write; encrypted with the same key when the store is. (PostgreSQL: pg_dump.)"""
        source = self.sqlite
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        target = encryption.connect(path, self.keys)
        try:
            source.backup(target)
        finally:
            target.close()

    def scrub(self) -> ScrubResult:
        """Leave no deleted row readable in the file, its WAL or its freed pages: checkpoint,
        VACUUM, checkpoint, the last one checked (``storage/scrub.py``). Call it after the
        deleting transaction commits. ``done`` False means another connection still reads an
        older snapshot: the scrub is then pending, and retried by :meth:`retry_pending_scrub`.
        On PostgreSQL there is no file of ours to scrub: the database's WAL and backups are the
        operator's (docs/deployment.md says what forget can promise there)."""
        if not isinstance(self.backend, SqliteBackend):
            return ScrubResult(True, (0, 0, 0), "PostgreSQL: deleted rows are left to the database's vacuum")
        return scrub(self.sqlite, self.path)

    @property
    def scrub_pending(self) -> bool:
        return isinstance(self.backend, SqliteBackend) and is_pending(self.path)

    def retry_pending_scrub(self) -> ScrubResult | None:
        """Run a pending scrub again, without waiting for readers; None when none was pending."""
        if not self.scrub_pending or self.in_transaction:
            return None
        return scrub(self.sqlite, self.path, wait=False)


def _expanding(params: Params) -> tuple[str, ...]:
    return tuple(sorted(k for k, v in (params or {}).items() if isinstance(v, (list, tuple))))


@functools.lru_cache(maxsize=1024)
def _statement(sql: str, expanding: tuple[str, ...]) -> sa.TextClause:
    statement = sa.text(sql)
    return statement.bindparams(*(sa.bindparam(name, expanding=True) for name in expanding)) if expanding else statement


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _alive(conn: sa.Connection) -> bool:
    return not conn.closed and not conn.invalidated


def _create_owner_only(path: Path) -> None:
    if not path.parent.exists():
        raise StoreError(f"cannot open store {path}: directory {path.parent} does not exist")
    # Create the file ourselves so it is never world-readable, even for an instant. Only
    # when it is missing: closing any descriptor of an open database file drops every
    # POSIX lock this process holds on it, so another connection of the process (the
    # service opens several) would lose its locks and another process could, e.g.,
    # checkpoint and delete the WAL under it (sqlite.org/howtocorrupt.html, 2.2).
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        # Without opening it, still refuse a store this process cannot write, naming the
        # file, rather than fail at the first write.
        if not os.access(path, os.W_OK):
            code = errno.EROFS if os.statvfs(path).f_flag & os.ST_RDONLY else errno.EACCES
            raise OSError(code, os.strerror(code), str(path)) from None


def inserted_id(result: Result) -> int:
    """The id an ``INSERT ... RETURNING id`` wrote."""
    value = result.scalar()
    if value is None:
        raise StoreError("the database returned no id for an INSERT")
    return int(value)


def chunks(ids: Sequence[Any], size: int = 500) -> Iterator[list[Any]]:
    """SQLite limits the host parameters of one statement; ``IN (...)`` lists go in slices."""
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])


def _owner_only(path: Path) -> None:
    """Database files hold private conversations: readable by their owner alone."""
    for candidate in database_files(path):
        if candidate.exists():
            os.chmod(candidate, 0o600)
