"""One SQLite connection with the store's settings: an owner-only file, WAL, foreign keys, the
schema migrated, and transactions that nest.

WAL mode + busy timeout: concurrent readers and writers in several processes wait for each
other instead of failing. :meth:`Database.transaction` is one atomic unit of work; nested
inside another it is a SAVEPOINT (as sqlite-utils does), so a failure inside it undoes its own
work only, and the outer transaction decides about the rest.
"""

from __future__ import annotations

import errno
import itertools
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hybridmem_local.errors import EncryptionKeyError, StoreError
from hybridmem_local.storage import encryption
from hybridmem_local.storage.encryption import StoreKeys
from hybridmem_local.storage.migrations import MIGRATIONS, SCHEMA_VERSION, split_sql
from hybridmem_local.storage.paths import database_files
from hybridmem_local.storage.scrub import ScrubResult, is_pending, scrub


class Database:
    """One SQLite database file (``":memory:"`` works for throwaway use), opened and migrated;
    encrypted with SQLCipher when ``keys`` are given (``storage/encryption.py``)."""

    def __init__(self, path: str | Path, busy_timeout_ms: int = 30_000, keys: StoreKeys | None = None):
        #: The master key's derived keys when the store is encrypted, else None; index files
        #: and exports next to the store are sealed with ``keys.files``.
        self.keys = keys
        self.busy_timeout_ms = busy_timeout_ms
        self.path = Path(path) if str(path) != ":memory:" else None
        if self.path is not None:
            if not self.path.parent.exists():
                raise StoreError(f"cannot open store {self.path}: directory {self.path.parent} does not exist")
            # Create the file ourselves so it is never world-readable, even for an instant. Only
            # when it is missing: closing any descriptor of an open database file drops every
            # POSIX lock this process holds on it, so another connection of the process (the
            # service opens several) would lose its locks and another process could, e.g.,
            # checkpoint and delete the WAL under it (sqlite.org/howtocorrupt.html, 2.2).
            try:
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                # Without opening it, still refuse a store this process cannot write, naming the
                # file, rather than fail at the first write.
                if not os.access(self.path, os.W_OK):
                    code = errno.EROFS if os.statvfs(self.path).f_flag & os.ST_RDONLY else errno.EACCES
                    raise OSError(code, os.strerror(code), str(self.path)) from None
        #: Names the savepoints of nested transactions (unique, so they never shadow each other).
        self._savepoints = itertools.count()
        try:
            self.conn = encryption.connect(
                path, keys, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
            )
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA foreign_keys = ON")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            # Deleted rows are zeroed, not just unlinked: SQLite's own default (and sqlcipher3's)
            # is off, and forget promises that the text is gone from the file.
            self.conn.execute("PRAGMA secure_delete = ON")
            self._migrate()
            # A forget whose scrub another connection blocked finishes here, once it is gone.
            self.retry_pending_scrub()
        except EncryptionKeyError:
            raise
        except encryption.DatabaseError as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from exc
        if self.path is not None:
            _owner_only(self.path)

    def _migrate(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store schema version {version} is newer than this library ({SCHEMA_VERSION}); upgrade hybridmem-local"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self.transaction():
                for statement in split_sql(MIGRATIONS[target]):
                    self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {target}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic unit of work: all of it is stored or none of it. Inside another
        transaction it is a savepoint of that one: a failure rolls back this unit's changes
        only, and they are stored when (and if) the outermost transaction commits."""
        if self.conn.in_transaction:
            yield from self._savepoint()
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            # Some errors (SQLITE_FULL, SQLITE_IOERR) make SQLite roll back by itself; a second
            # ROLLBACK would raise and hide the real cause.
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        else:
            self.conn.execute("COMMIT")

    def _savepoint(self) -> Iterator[sqlite3.Connection]:
        name = f"nested_{next(self._savepoints)}"
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield self.conn
        except BaseException:
            # After an automatic rollback of the whole transaction the savepoint is gone too.
            if self.conn.in_transaction:
                self.conn.execute(f"ROLLBACK TO {name}")
                self.conn.execute(f"RELEASE {name}")
            raise
        else:
            self.conn.execute(f"RELEASE {name}")

    def change_marker(self) -> tuple[int, int]:
        """Moves on every commit that can change what an index holds: ``PRAGMA data_version``
        changes when another connection commits, the last event id when this one writes a
        memory or a session (each logs an event). The one staleness check of ``indexes/store_indexes.py``."""
        version = self.conn.execute("PRAGMA data_version").fetchone()[0]
        return version, self.conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]

    def close(self) -> None:
        self.conn.close()

    def integrity_check(self) -> str:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]

    @property
    def encrypted(self) -> bool:
        return self.keys is not None

    def backup_to(self, path: Path) -> None:
        """A consistent copy of the database at ``path`` (owner-only), even while others write;
        encrypted with the same key when the store is."""
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        target = encryption.connect(path, self.keys)
        try:
            self.conn.backup(target)
        finally:
            target.close()

    def scrub(self) -> ScrubResult:
        """Leave no deleted row readable in the file, its WAL or its freed pages: checkpoint,
        VACUUM, checkpoint, the last one checked (``storage/scrub.py``). Call it after the
        deleting transaction commits. ``done`` False means another connection still reads an
        older snapshot: the scrub is then pending, and retried by :meth:`retry_pending_scrub`."""
        return scrub(self.conn, self.path)

    @property
    def scrub_pending(self) -> bool:
        return is_pending(self.path)

    def retry_pending_scrub(self) -> ScrubResult | None:
        """Run a pending scrub again, without waiting for readers; None when none was pending."""
        if not self.scrub_pending or self.conn.in_transaction:
            return None
        return scrub(self.conn, self.path, wait=False)


def inserted_id(cursor: sqlite3.Cursor) -> int:
    """The rowid of the row an INSERT just wrote (sqlite3 types ``lastrowid`` optional)."""
    if cursor.lastrowid is None:
        raise StoreError("SQLite reported no rowid for an INSERT")
    return cursor.lastrowid


def chunks(ids: Sequence[Any], size: int = 500) -> Iterator[list[Any]]:
    """SQLite limits the host parameters of one statement; ``IN (...)`` lists go in slices."""
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])


def _owner_only(path: Path) -> None:
    """Database files hold private conversations: readable by their owner alone."""
    for candidate in database_files(path):
        if candidate.exists():
            os.chmod(candidate, 0o600)
