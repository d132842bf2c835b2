"""The SQLite store on its own: round trips, atomicity, history, permissions, forget."""

from __future__ import annotations

import sqlite3
import stat

import pytest

from hybridmem_local.schema import MemoryStatus
from hybridmem_local.store import SCHEMA_VERSION, MemoryStore, NotFoundError, StoreError
from tests.factories import make_episode, make_session, make_tuple


@pytest.fixture
def store(tmp_path):
    s = MemoryStore(tmp_path / "m.db")
    yield s
    s.close()


def test_session_round_trip(store):
    session = make_session("alice", 1, n_turns=5)
    store.insert_session(session)
    record = store.get_session("alice", "s1")
    assert record.session == session
    assert record.curation_status == "pending"
    assert store.counts("alice")["turns"] == 5


def test_schema_version_and_wal(store):
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this library"):
        MemoryStore(path)


def test_duplicate_session_and_turn_ids_are_refused_without_change(store):
    store.insert_session(make_session("alice", 1))
    with pytest.raises(StoreError, match="already exists"):
        store.insert_session(make_session("alice", 1))
    clash = make_session("alice", 2)
    clash.turns[0].turn_id = "s1:0"
    with pytest.raises(StoreError, match="turn ids already used"):
        store.insert_session(clash)
    assert store.counts("alice")["sessions"] == 1
    assert store.counts("alice")["turns"] == 4


def test_transaction_rolls_back_session_and_memories_together(store):
    session = make_session("alice", 1)
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.insert_session(session)
            store.insert_memories("alice", [make_tuple("Alice", "likes", "tea", ["s1:0"])])
            raise RuntimeError("crash before commit")
    assert not store.has_session("alice", "s1")
    assert store.list_memories("alice") == []


def test_status_changes_are_events_and_content_is_kept(store):
    (mid,) = store.insert_memories("alice", [make_episode("Trip", "Alice went to Paris.")])
    store.set_status(mid, MemoryStatus.deleted, reason="outdated")
    memory = store.get_memory(mid)
    assert memory.status == MemoryStatus.deleted and memory.details == "Alice went to Paris."
    actions = [e.action for e in store.history(mid)]
    assert actions == ["add", "deleted"]
    last = store.history(mid)[-1]
    assert last.before["status"] == "active" and last.after["status"] == "deleted" and last.reason == "outdated"


def test_unknown_memory_is_a_clear_error(store):
    with pytest.raises(NotFoundError, match="no memory with id 999"):
        store.get_memory(999)


def test_files_are_owner_only(tmp_path):
    s = MemoryStore(tmp_path / "private.db")
    s.insert_session(make_session("alice", 1))
    for path in tmp_path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    s.close()


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        MemoryStore(tmp_path / "nope" / "m.db")


def test_forget_namespace_removes_every_row(store):
    for ns in ("alice", "bob"):
        store.insert_session(make_session(ns, 1))
        store.insert_memories(ns, [make_tuple("X", "likes", ns, ["s1:0"])], source_session_id="s1")
    store.forget_namespace("alice")
    for table in ("sessions", "turns", "memories", "events", "embeddings", "consolidation_runs", "exports"):
        n = store.conn.execute(f"SELECT count(*) FROM {table} WHERE namespace = 'alice'").fetchone()[0]
        assert n == 0, table
    assert store.namespaces() == ["bob"]
    assert len(store.list_memories("bob")) == 1
