"""Encryption at rest: where the master key comes from, the keys derived from it, and the one
place that opens SQLite files (plain ``sqlite3`` or SQLCipher through ``sqlcipher3``).

Key hierarchy (docs/deployment.md)::

    master key (32 bytes: systemd credential, key file or environment; never argv or a config)
     ├─ key id = HMAC-SHA256(master, "hybridmem/key-id/v1")[:8], public, shown to operators
     ├─ HKDF("hybridmem/sqlcipher/v1") → the raw SQLCipher key of the store and its LLM cache
     └─ HKDF("hybridmem/files/v1")     → AES-256-GCM key that seals index files and exports

SQLCipher is keyed with a raw 256-bit key, so no PBKDF2 runs per connection (192 ms per open
measured with a passphrase, 0.3 ms raw; docs/design/encryption-at-rest.md §3b). SQLCipher
cannot tell a wrong key from a damaged file; a public ``<db>.keyid`` sidecar and the file's
header let :func:`connect` say which it is before anything is written.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import sqlite3
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridmem_local.errors import EncryptionKeyError, StoreError
from hybridmem_local.files.paths import create_owner_only
from hybridmem_local.storage.paths import keyid_path

if TYPE_CHECKING:
    from hybridmem_local.config import StoreConfig

#: The file name a systemd unit gives the key (``LoadCredential=hybridmem-master-key:/path``).
CREDENTIAL_NAME = "hybridmem-master-key"
KEY_ENV = "HYBRIDMEM_MASTER_KEY"
KEY_BYTES = 32
#: The first 16 bytes of every plaintext SQLite file; a SQLCipher file starts with random salt.
SQLITE_HEADER = b"SQLite format 3\x00"


def _sqlcipher() -> Any:
    try:
        import sqlcipher3
    except ImportError as exc:
        raise StoreError(
            "store.encryption is sqlcipher but the sqlcipher3 module is not installed: "
            "pip install 'hybridmem-local[encryption]'"
        ) from exc
    return sqlcipher3


def sqlcipher_module() -> Any:
    """The ``sqlcipher3`` module, for what :func:`connect` does not do (``sqlcipher_export`` of a
    plaintext file: ``storage/rekey.py``); a clear error when the extra is not installed."""
    return _sqlcipher()


def _sqlcipher_classes(name: str) -> tuple[type[Exception], ...]:
    try:
        import sqlcipher3
    except ImportError:
        return ()
    return (getattr(sqlcipher3, name),)


#: Exception classes of both modules: sqlcipher3's are its own, not subclasses of sqlite3's.
Error: tuple[type[Exception], ...] = (sqlite3.Error, *_sqlcipher_classes("Error"))
DatabaseError: tuple[type[Exception], ...] = (sqlite3.DatabaseError, *_sqlcipher_classes("DatabaseError"))
OperationalError: tuple[type[Exception], ...] = (sqlite3.OperationalError, *_sqlcipher_classes("OperationalError"))
IntegrityError: tuple[type[Exception], ...] = (sqlite3.IntegrityError, *_sqlcipher_classes("IntegrityError"))


@dataclass(frozen=True)
class StoreKeys:
    """The keys of one master key, each derived once. ``repr`` never shows key bytes."""

    master: bytes = field(repr=False)
    #: Where the master key was read from (a path or ``$HYBRIDMEM_MASTER_KEY``), for messages.
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.master) != KEY_BYTES:
            raise EncryptionKeyError(f"the master key from {self.source or 'the caller'} is not {KEY_BYTES} bytes")

    @cached_property
    def key_id(self) -> str:
        return key_id(self.master)

    @cached_property
    def sqlcipher(self) -> bytes:
        return derive(self.master, "hybridmem/sqlcipher/v1")

    @cached_property
    def files(self) -> bytes:
        return derive(self.master, "hybridmem/files/v1")


def key_id(master: bytes) -> str:
    """16 hex digits naming a master key without revealing it (sidecars, messages, ``keys check``)."""
    return hmac.new(master, b"hybridmem/key-id/v1", hashlib.sha256).hexdigest()[:16]


def derive(master: bytes, purpose: str) -> bytes:
    """A 256-bit subkey of the master key for one purpose (HKDF-SHA256)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=purpose.encode()).derive(master)


def generate_master_key() -> bytes:
    return os.urandom(KEY_BYTES)


def parse_master_key(raw: bytes, source: str) -> bytes:
    """32 raw bytes, 64 hex digits or base64 of 32 bytes (surrounding whitespace ignored)."""
    if len(raw) == KEY_BYTES:
        return raw
    text = raw.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return binascii.unhexlify(text)
        except binascii.Error:
            pass
    try:
        decoded = base64.b64decode(text, validate=True)
    except binascii.Error:
        decoded = b""
    if len(decoded) == KEY_BYTES:
        return decoded
    raise EncryptionKeyError(
        f"the master key in {source} is not {KEY_BYTES} raw bytes, {2 * KEY_BYTES} hex digits "
        f"or base64 of {KEY_BYTES} bytes"
    )


def read_key_file(path: Path, source: str | None = None) -> bytes:
    """The master key in ``path``; refused when group or others can read it, or it is not ours."""
    source = source or str(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise EncryptionKeyError(f"the key file {source} does not exist") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise EncryptionKeyError(
            f"the key file {source} is readable by group or others (mode {stat.filemode(info.st_mode)}): chmod 600 it"
        )
    if info.st_uid != os.getuid():
        raise EncryptionKeyError(f"the key file {source} belongs to another user (uid {info.st_uid})")
    return parse_master_key(path.read_bytes(), source)


def load_keys(config: StoreConfig, environ: Mapping[str, str] | None = None) -> StoreKeys | None:
    """The store's keys (None when ``store.encryption`` is ``none``).

    Looked for in order: the systemd credential, ``store.key_file``, ``$HYBRIDMEM_MASTER_KEY``;
    when none holds one, the error names every place that was looked in."""
    if config.encryption == "none":
        return None
    env = os.environ if environ is None else environ
    looked: list[str] = []
    credentials = env.get("CREDENTIALS_DIRECTORY")
    if credentials:
        path = Path(credentials) / CREDENTIAL_NAME
        if path.exists():
            # systemd makes the credential readable by the unit's user only; its mode may be 0400/0440.
            return StoreKeys(parse_master_key(path.read_bytes(), str(path)), str(path))
        looked.append(f"{path} (no such credential)")
    else:
        looked.append("$CREDENTIALS_DIRECTORY (unset)")
    if config.key_file is not None:
        path = Path(config.key_file).expanduser()
        if path.exists():
            return StoreKeys(read_key_file(path), str(path))
        looked.append(f"store.key_file {path} (missing)")
    else:
        looked.append("store.key_file (unset)")
    value = env.get(KEY_ENV)
    if value:
        return StoreKeys(parse_master_key(value.encode(), f"${KEY_ENV}"), f"${KEY_ENV}")
    looked.append(f"${KEY_ENV} (unset)")
    raise EncryptionKeyError(
        "store.encryption is sqlcipher but no master key was found; looked in: " + ", ".join(looked)
    )


def recorded_key_id(path: Path) -> str | None:
    """The key id the store at ``path`` was encrypted with (its public sidecar), if known."""
    try:
        return keyid_path(path).read_text().strip() or None
    except FileNotFoundError:
        return None


def write_key_id(path: Path, keys: StoreKeys) -> None:
    sidecar = keyid_path(path)
    if recorded_key_id(path) == keys.key_id:
        return
    temp = Path(str(sidecar) + ".tmp")
    temp.unlink(missing_ok=True)
    create_owner_only(temp, exclusive=True)
    temp.write_text(keys.key_id + "\n")
    os.replace(temp, sidecar)


def file_header(path: Path) -> bytes:
    """The first 16 bytes of ``path`` (``b""`` for a missing or empty file: a new store).

    Only for a file no connection of this process has open: closing any descriptor of an open
    SQLite file drops every POSIX lock the process holds on it, and another process may then
    checkpoint and delete the WAL under it (sqlite.org/howtocorrupt.html, 2.2)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return b""


def is_encrypted(path: Path) -> bool:
    header = file_header(path)
    return bool(header) and header != SQLITE_HEADER


def connect(path: str | Path, keys: StoreKeys | None, *, timeout: float = 5.0, **kwargs: Any) -> Any:
    """Open a SQLite file: stdlib ``sqlite3`` when ``keys`` is None, else SQLCipher keyed with
    ``keys.sqlcipher``. The row factory is the connection module's ``Row``.

    A plaintext file opened with a key, an encrypted one opened without, and a wrong key are
    each a clear :class:`~hybridmem_local.errors.EncryptionKeyError`; none of them writes anything.
    The file's header is read only once SQLite failed to read it (see :func:`file_header`)."""
    name = str(path)
    file = None if name == ":memory:" else Path(name)
    # os.stat opens no descriptor, so it cannot drop the locks of this process's other connections.
    new_file = file is None or not file.exists() or file.stat().st_size == 0
    module = sqlite3 if keys is None else _sqlcipher()
    conn = module.connect(name, timeout=timeout, **kwargs)
    try:
        if keys is not None:
            # A wrong key makes SQLCipher log HMAC failures to stderr; the error below says it once.
            conn.execute("PRAGMA cipher_log_level = NONE")
            # PRAGMAs take no parameters; the key is bytes rendered as hex, nothing to inject.
            conn.execute(f"PRAGMA key = \"x'{keys.sqlcipher.hex()}'\"")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except module.DatabaseError as exc:
        conn.close()
        raise _unreadable(name, file, keys, exc) from None
    conn.row_factory = module.Row
    if keys is not None:
        # Pages are decrypted on every cache miss: a larger page cache keeps reads at plaintext
        # speed (design note §3a: select x1.36 with the default 2 MB, x1.0 with 64 MB).
        conn.execute("PRAGMA cache_size = -65536")
        if file is not None and (new_file or recorded_key_id(file) is None):
            write_key_id(file, keys)
    return conn


def use_wal(conn: Any) -> None:
    """Put a file opened by :func:`connect` in WAL mode (kept in the file: it writes once per file).

    Switching takes a read lock and then the write lock. Connections opening a new file at the
    same moment (replicas or workers starting together) each hold the read lock and want the write
    lock: SQLite breaks that deadlock by failing all but one at once with "database is locked",
    without calling the busy handler (sqlite.org/c3ref/busy_handler.html). A connection refused so
    waits, within its busy timeout, for the write lock the switching one holds, then switches a
    file already in WAL, which takes no lock.
    """
    if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
        return
    try:
        conn.execute("PRAGMA journal_mode = WAL")
    except OperationalError as exc:
        # sqlite_errorname exists from Python 3.11; SQLITE_BUSY's message is the same in every version.
        if getattr(exc, "sqlite_errorname", "SQLITE_BUSY") != "SQLITE_BUSY" or str(exc) != "database is locked":
            raise
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        conn.execute("PRAGMA journal_mode = WAL")


def _unreadable(name: str, file: Path | None, keys: StoreKeys | None, exc: Exception) -> Exception:
    """Why SQLite could not read ``file``: encrypted without a key, plaintext with one, a wrong
    key, or a damaged file."""
    header = file_header(file) if file is not None else b""
    recorded = recorded_key_id(file) if file is not None else None
    if keys is None:
        if header and header != SQLITE_HEADER:
            return EncryptionKeyError(
                f"cannot open {name}: it is encrypted (no SQLite header); set store.encryption: sqlcipher "
                f"and provide its master key (key id {recorded or 'unknown'})"
            )
        return StoreError(f"cannot open store {name}: {exc}")
    if header == SQLITE_HEADER:
        return EncryptionKeyError(f"cannot open {name}: it is not encrypted; run `hybridmem encrypt --db {name}` first")
    return EncryptionKeyError(
        f"cannot open {name}: wrong key or a damaged file (the key from {keys.source or 'the caller'} has id "
        f"{keys.key_id}; the store was written with key id {recorded or 'unknown'})"
    )
