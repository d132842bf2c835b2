"""Builders for the encryption-at-rest tests: key files, configs that point at them, a store
with a session, memories, an LLM-cache entry and an export, and a snapshot of a folder's bytes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from hybridmem_local.config import Config, load_config
from hybridmem_local.errors import EncryptionKeyError
from hybridmem_local.llm.cache import _SCHEMA as LLM_CACHE_SCHEMA
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Session, Turn
from hybridmem_local.storage import encryption
from hybridmem_local.storage.encryption import StoreKeys
from hybridmem_local.storage.paths import llm_cache_path
from tests.factories import BASE_DATE, make_episode, make_tuple


def write_key_file(path: Path, mode: int = 0o600) -> StoreKeys:
    """A fresh master key as 64 hex digits in ``path`` (mode ``mode``); its keys."""
    master = encryption.generate_master_key()
    path.write_text(master.hex() + "\n")
    os.chmod(path, mode)
    return StoreKeys(master, str(path))


def config_for(key_file: Path | None, **overrides) -> Config:
    """The hashing embedder; ``store.encryption: sqlcipher`` with ``key_file`` unless it is None."""
    values = {"embedder.backend": "hashing", **overrides}
    if key_file is not None:
        values |= {"store.encryption": "sqlcipher", "store.key_file": str(key_file)}
    return load_config(None, values)


def marker_session(namespace: str, session_id: str, markers: list[str], padding: int = 0) -> Session:
    """A session whose turns each carry one marker (and ``padding`` characters of filler)."""
    filler = " ".join(f"filler{i}" for i in range(padding // 8))[:padding]
    return Session(
        session_id=session_id,
        namespace=namespace,
        started_at=BASE_DATE,
        turns=[
            Turn(turn_id=f"{session_id}:{i}", speaker="Alice", text=f"My code word is {marker}. {filler}")
            for i, marker in enumerate(markers)
        ],
    )


def fill_store(memory: HybridMemory, namespace: str, markers: list[str]) -> None:
    """One session with markers[0] and markers[1] in its turns, an episode with markers[2] and a
    tuple with markers[3], citing them."""
    session = marker_session(namespace, "s1", markers[:2])
    memory.add_memories(
        namespace,
        episodes=[make_episode("Code word", f"Alice's code word is {markers[2]}.", ["s1:0"])],
        tuples=[make_tuple("Alice", "has code word", markers[3], ["s1:1"])],
        session=session,
    )


def plant_llm_cache(db: Path, keys: StoreKeys | None, text: str, rows: int = 1) -> Path:
    """Write ``rows`` entries holding ``text`` to the store's LLM cache file with the cache's own
    schema (through ``encryption.connect``, the way ``CachedLLM`` opens it)."""
    conn = open_llm_cache(db, keys)
    try:
        add_cache_entries(conn, text, rows)
    finally:
        conn.close()
    return llm_cache_path(db)


def open_llm_cache(db: Path, keys: StoreKeys | None):
    """The store's LLM cache file as ``CachedLLM`` opens it: WAL, secure_delete, its schema."""
    conn = encryption.connect(llm_cache_path(db), keys)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA secure_delete=ON")
    conn.executescript(LLM_CACHE_SCHEMA)
    return conn


def add_cache_entries(conn, text: str, rows: int = 1) -> None:
    with conn:
        conn.executemany(
            "INSERT INTO llm_calls VALUES (?, ?, 'test-model', 'curation/v1', ?, 1, 1, 0.1, '2023-05-08')",
            [(f"{text}-{i}", "alice", f"{text} #{i}") for i in range(rows)],
        )


def cache_rows(db: Path, keys: StoreKeys | None) -> int:
    conn = encryption.connect(llm_cache_path(db), keys)
    try:
        return conn.execute("SELECT count(*) FROM llm_calls").fetchone()[0]
    finally:
        conn.close()


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``folder``: relative name → (size, sha256)."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def opens_with(path: Path, keys: StoreKeys | None) -> bool:
    """Whether ``path`` opens with ``keys`` (None: as plaintext), the way the store opens it."""
    try:
        conn = encryption.connect(path, keys)
    except EncryptionKeyError:
        return False
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return True
    except encryption.DatabaseError:
        return False
    finally:
        conn.close()
