"""Whole-store key operations: encrypt a plaintext store in place, rotate its master key, check
it (``hybridmem encrypt`` and ``hybridmem master-key``; docs/deployment.md, "Encryption at rest").

A store is several files (``storage/paths.py``): the database, its LLM call cache, the
exports it wrote (the ``exports`` table) and its index files. Each step
below changes one file with one commit point, so a crash (SIGKILL, power loss) leaves every
file readable with exactly one of the two keys (for ``encrypt``: plaintext or encrypted), and
running the same command again finishes the job:

* the index folder is deleted **first**: its files are a cache of the store (sealed with the
  old key, or plaintext) and rebuild from it on the next open, whatever key it then has;
* the LLM cache, then the database: ``encrypt`` writes an encrypted copy beside the file and
  ``os.replace``-s it over the original (design note §5); ``rotate`` runs ``PRAGMA rekey``,
  one rollback-journal transaction. Between the two steps the cache and the database have
  different keys; opening the store then fails on the cache with a wrong-key error naming
  both key ids, and ``check`` says so: run the command again to finish (a cache is not
  thrown away silently, it may hold hours of model calls);
* the exports, one ``os.replace`` each.

Both refuse to start while any other connection (the service, another command) has the
database or the cache open: switching to ``journal_mode=DELETE`` needs every other
connection gone and fails with "database is locked" otherwise (design note §5).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from hybridmem_local.errors import EncryptionKeyError, SealError, StoreError
from hybridmem_local.files.paths import create_owner_only
from hybridmem_local.files.sealing import is_sealed, seal, unseal
from hybridmem_local.files.session_files import EXPORT_CONTEXT
from hybridmem_local.storage import encryption
from hybridmem_local.storage.encryption import StoreKeys
from hybridmem_local.storage.paths import indexes_path, llm_cache_path

#: How long the exclusivity check waits for another connection before refusing.
CLAIM_TIMEOUT_S = 1.0


class EncryptReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key_id: str
    database: bool
    llm_cache: bool
    exports_sealed: list[str]
    indexes_removed: bool


class RotateReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    old_key_id: str
    new_key_id: str
    database: bool
    llm_cache: bool
    exports_resealed: list[str]
    #: Known exports that are missing (deleted by their owner): nothing to re-seal.
    exports_missing: list[str]
    indexes_removed: bool


class FileCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    recorded_key_id: str | None
    #: ``ok`` or what is wrong (a wrong key, failed HMAC pages, integrity_check's findings).
    status: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class CheckReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key_source: str
    key_id: str
    database: FileCheck
    llm_cache: FileCheck | None

    @property
    def ok(self) -> bool:
        return self.database.ok and (self.llm_cache is None or self.llm_cache.ok)


# --------------------------------------------------------------------------- encrypt


def encrypt_store(path: str | Path, keys: StoreKeys) -> EncryptReport:
    """Encrypt the plaintext store at ``path`` in place with ``keys``: its database, LLM cache
    and known exports; its plaintext index files are deleted (rebuilt, sealed, on next open).

    A crash at any point leaves the database either plaintext or encrypted, never both or
    neither; run it again to finish (a leftover ``<file>.encrypting`` is removed first)."""
    path = Path(path)
    cache = llm_cache_path(path)
    for file in (path, cache):
        _temp_path(file).unlink(missing_ok=True)
    if not path.exists():
        raise StoreError(f"cannot encrypt {path}: no such store")
    database_plain = not encryption.is_encrypted(path)
    cache_plain = cache.exists() and not encryption.is_encrypted(cache)
    with _claimed(path, None if database_plain else keys) as db:
        exports = _known_exports(db)
        plain_exports = [file for file in exports if file.exists() and not is_sealed(file.read_bytes())]
        if not (database_plain or cache_plain or plain_exports):
            raise EncryptionKeyError(
                f"{path} is already encrypted (key id {encryption.recorded_key_id(path) or 'unknown'}), "
                "and so are its LLM cache and exports"
            )
        with _claimed(cache, None) if cache_plain else _nothing() as cache_db:
            indexes_removed = database_plain and _remove_indexes(path)
            if cache_db is not None:
                _encrypt_file(cache_db, cache, keys)
            if database_plain:
                _encrypt_file(db, path, keys)
    for file in plain_exports:
        _replace_bytes(file, seal(keys.files, EXPORT_CONTEXT, file.read_bytes()))
    _restore_wal(path, keys, cache)
    return EncryptReport(
        key_id=keys.key_id,
        database=database_plain,
        llm_cache=cache_plain,
        exports_sealed=[str(file) for file in plain_exports],
        indexes_removed=indexes_removed,
    )


def _encrypt_file(conn: Any, path: Path, keys: StoreKeys) -> None:
    """``sqlcipher_export`` of the claimed plaintext ``conn`` into ``<path>.encrypting``, checked,
    synced and renamed over ``path`` (the single commit point), the folder synced after."""
    temp = _temp_path(path)
    create_owner_only(temp, exclusive=True)
    conn.execute(f"ATTACH DATABASE ? AS encrypted KEY \"x'{keys.sqlcipher.hex()}'\"", (str(temp),))
    conn.execute("SELECT sqlcipher_export('encrypted')")
    version = conn.execute("PRAGMA main.user_version").fetchone()[0]
    conn.execute(f"PRAGMA encrypted.user_version = {int(version)}")
    conn.execute("DETACH DATABASE encrypted")
    expected = _row_counts(conn)
    copy = _keyed(temp, keys)
    try:
        _check_integrity(copy, temp)
        if _row_counts(copy) != expected:
            raise StoreError(f"the encrypted copy {temp} does not hold the rows of {path}; {path} is unchanged")
    finally:
        copy.close()
    _fsync(temp)
    # The sidecar first: it is public, and the plaintext file never reads it.
    encryption.write_key_id(path, keys)
    os.replace(temp, path)
    _fsync(path.parent)


# --------------------------------------------------------------------------- rotate


def rotate_key(path: str | Path, old: StoreKeys, new: StoreKeys) -> RotateReport:
    """Re-encrypt the store at ``path`` from ``old`` to ``new``: the LLM cache and database
    (``PRAGMA rekey``), the known exports (re-sealed); the index files are deleted (rebuilt,
    sealed with ``new``, on the next open).

    Resumable: a file already under ``new`` is left as it is, so after a crash the same call
    finishes the rotation."""
    path = Path(path)
    if old.key_id == new.key_id:
        raise EncryptionKeyError(
            f"the new key is the key in use (key id {new.key_id}); create one with `hybridmem master-key create`"
        )
    if not path.exists():
        raise StoreError(f"cannot rotate the key of {path}: no such store")
    cache = llm_cache_path(path)
    database_key = _which_key(path, old, new)
    cache_key = _which_key(cache, old, new) if cache.exists() else new
    # A rotation killed between a file's rekey and its sidecar's rename leaves the sidecar naming
    # the old key: record the key each file opens with before deciding what is left to do.
    for file, keys in ((path, database_key), (cache, cache_key)):
        if keys is new and file.exists():
            encryption.write_key_id(file, new)
    with _claimed(path, database_key) as db:
        exports = _known_exports(db)
        stale_exports = [file for file in exports if file.exists() and _export_key(file, old, new) is not new]
        if database_key is new and cache_key is new and not stale_exports:
            raise EncryptionKeyError(f"{path} already uses the new key (key id {new.key_id})")
        with _claimed(cache, cache_key) if cache.exists() else _nothing() as cache_db:
            indexes_removed = _remove_indexes(path)
            if cache_db is not None and cache_key is old:
                _rekey(cache_db, cache, new)
            if database_key is old:
                _rekey(db, path, new)
    for file in stale_exports:
        blob = file.read_bytes()
        plaintext = unseal(old.files, EXPORT_CONTEXT, blob) if is_sealed(blob) else blob
        _replace_bytes(file, seal(new.files, EXPORT_CONTEXT, plaintext))
    _restore_wal(path, new, cache)
    return RotateReport(
        old_key_id=old.key_id,
        new_key_id=new.key_id,
        database=database_key is old,
        llm_cache=cache_key is old and cache.exists(),
        exports_resealed=[str(file) for file in stale_exports],
        exports_missing=[str(file) for file in exports if not file.exists()],
        indexes_removed=indexes_removed,
    )


def _which_key(path: Path, old: StoreKeys, new: StoreKeys) -> StoreKeys:
    """The one of the two keys that opens ``path`` (new first: a resumed rotation)."""
    for keys in (new, old):
        try:
            encryption.connect(path, keys).close()
            return keys
        except EncryptionKeyError:
            continue
    raise EncryptionKeyError(
        f"cannot rotate {path}: neither the old key (id {old.key_id}, from {old.source}) nor the new one "
        f"(id {new.key_id}, from {new.source}) opens it; it was written with key id "
        f"{encryption.recorded_key_id(path) or 'unknown'}"
    )


def _export_key(path: Path, old: StoreKeys, new: StoreKeys) -> StoreKeys | None:
    """Which key seals the export at ``path`` (None: plaintext); an export neither opens is an error."""
    blob = path.read_bytes()
    if not is_sealed(blob):
        return None
    for keys in (new, old):
        try:
            unseal(keys.files, EXPORT_CONTEXT, blob)
            return keys
        except SealError:
            continue
    raise EncryptionKeyError(f"cannot re-seal the export {path}: damaged, or sealed with a third key")


def _rekey(conn: Any, path: Path, new: StoreKeys) -> None:
    conn.execute(f"PRAGMA rekey = \"x'{new.sqlcipher.hex()}'\"")
    encryption.write_key_id(path, new)


# --------------------------------------------------------------------------- check


def check_store(path: str | Path, keys: StoreKeys) -> CheckReport:
    """Open the store and its LLM cache with ``keys`` and run SQLCipher's page HMAC check and
    SQLite's integrity check on each; what is wrong is reported, not raised."""
    path = Path(path)
    if not path.exists():
        raise StoreError(f"cannot check {path}: no such store")
    cache = llm_cache_path(path)
    return CheckReport(
        key_source=keys.source,
        key_id=keys.key_id,
        database=(database := _check_file(path, keys)),
        llm_cache=_check_file(cache, keys, beside=database) if cache.exists() else None,
    )


def _check_file(path: Path, keys: StoreKeys, beside: FileCheck | None = None) -> FileCheck:
    """``beside``: the check of the database a cache belongs to; a cache under another key than
    a sound database is what an interrupted rotation or encryption leaves."""
    recorded = encryption.recorded_key_id(path)
    try:
        conn = encryption.connect(path, keys)
    except EncryptionKeyError as exc:
        hint = ""
        if beside is not None and beside.ok:
            hint = (
                " (the store opens with this key but its LLM cache does not: an interrupted "
                "`hybridmem master-key rotate` or `hybridmem encrypt`? run it again to finish)"
            )
        return FileCheck(path=str(path), recorded_key_id=recorded, status=f"{exc}{hint}")
    try:
        _check_integrity(conn, path)
    except StoreError as exc:
        return FileCheck(path=str(path), recorded_key_id=recorded, status=str(exc))
    except encryption.DatabaseError as exc:
        return FileCheck(path=str(path), recorded_key_id=recorded, status=f"{path}: damaged: {exc}")
    finally:
        conn.close()
    return FileCheck(path=str(path), recorded_key_id=recorded, status="ok")


# --------------------------------------------------------------------------- shared steps


@contextmanager
def _claimed(path: Path, keys: StoreKeys | None) -> Iterator[Any]:
    """A SQLCipher connection to ``path`` (plaintext when ``keys`` is None) that is the only one:
    switched to a rollback journal, which fails while any other connection has the file open."""
    if keys is None:
        conn = encryption.sqlcipher_module().connect(str(path), timeout=CLAIM_TIMEOUT_S, isolation_level=None)
    else:
        conn = encryption.connect(path, keys, timeout=CLAIM_TIMEOUT_S, isolation_level=None)
    try:
        try:
            # Leaving WAL mode checkpoints the whole WAL into the file and deletes it; it needs
            # an exclusive lock, so it is refused before anything is written.
            mode = conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
        except encryption.OperationalError as exc:
            raise StoreError(
                f"{path} is open in another process ({exc}): stop `hybridmem serve` and any other command "
                "using the store first; nothing was changed"
            ) from exc
        if mode != "delete":
            raise StoreError(f"{path}: could not leave WAL mode (journal mode {mode}); nothing was changed")
        yield conn
    finally:
        conn.close()


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _keyed(path: Path, keys: StoreKeys) -> Any:
    """A keyed connection that writes no key-id sidecar (for the temporary copy)."""
    conn = encryption.sqlcipher_module().connect(str(path))
    conn.execute("PRAGMA cipher_log_level = NONE")
    conn.execute(f"PRAGMA key = \"x'{keys.sqlcipher.hex()}'\"")
    return conn


def _check_integrity(conn: Any, path: Path) -> None:
    failures = conn.execute("PRAGMA cipher_integrity_check").fetchall()
    if failures:
        shown = "; ".join(str(row[0]) for row in failures[:3])
        raise StoreError(f"{path}: {len(failures)} page(s) fail SQLCipher's HMAC check (tampered or damaged): {shown}")
    result = conn.execute("PRAGMA integrity_check").fetchone()[0]
    if result != "ok":
        raise StoreError(f"{path}: integrity_check failed: {result}")


def _row_counts(conn: Any) -> dict[str, int]:
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    ]
    return {table: conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] for table in tables}


def _known_exports(conn: Any) -> list[Path]:
    has_table = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'exports'").fetchone()
    if not has_table:
        return []
    return [Path(row[0]) for row in conn.execute("SELECT DISTINCT path FROM exports ORDER BY path")]


def _remove_indexes(path: Path) -> bool:
    folder = indexes_path(path)
    if not folder.exists():
        return False
    shutil.rmtree(folder)
    return True


def _replace_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` over ``path`` atomically: a temporary file (0600), synced, renamed."""
    temp = Path(str(path) + ".sealing")
    temp.unlink(missing_ok=True)
    create_owner_only(temp, exclusive=True)
    with open(temp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)
    _fsync(path.parent)


def _restore_wal(path: Path, keys: StoreKeys, cache: Path) -> None:
    for file in (path, cache):
        if file.exists():
            conn = encryption.connect(file, keys)
            try:
                conn.execute("PRAGMA journal_mode = WAL")
            finally:
                conn.close()


def _temp_path(path: Path) -> Path:
    return Path(str(path) + ".encrypting")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
