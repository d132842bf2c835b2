"""The SQLite store on its own: round trips, atomicity, history, permissions, forget."""

from __future__ import annotations

import json
import sqlite3
import stat

import pytest

from hybridmem_local.errors import NotFoundError, StoreError
from hybridmem_local.schema import MemoryStatus
from hybridmem_local.storage.migrations import MIGRATIONS, SCHEMA_VERSION
from hybridmem_local.storage.store import MemoryStore
from tests.factories import make_episode, make_session, make_tuple


@pytest.fixture
def store(tmp_path):
    s = MemoryStore(tmp_path / "m.db")
    yield s
    s.close()


def test_session_round_trip(store):
    session = make_session("alice", 1, n_turns=5)
    store.sessions.insert(session)
    record = store.sessions.get("alice", "s1")
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
    store.sessions.insert(make_session("alice", 1))
    with pytest.raises(StoreError, match="already exists"):
        store.sessions.insert(make_session("alice", 1))
    clash = make_session("alice", 2)
    clash.turns[0].turn_id = "s1:0"
    with pytest.raises(StoreError, match="turn ids already used"):
        store.sessions.insert(clash)
    assert store.counts("alice")["sessions"] == 1
    assert store.counts("alice")["turns"] == 4


def test_transaction_rolls_back_session_and_memories_together(store):
    session = make_session("alice", 1)
    with pytest.raises(RuntimeError), store.transaction():
        store.sessions.insert(session)
        store.memories.insert("alice", [make_tuple("Alice", "likes", "tea", ["s1:0"])])
        raise RuntimeError("crash before commit")
    assert not store.sessions.exists("alice", "s1")
    assert store.memories.select("alice") == []


def test_an_inner_failure_rolls_back_only_its_savepoint(store):
    """A transaction inside another is a savepoint: when it fails, its own writes go, and the
    outer transaction keeps what it wrote before and after and commits it."""
    with store.transaction():
        (kept,) = store.memories.insert("alice", [make_episode("Trip", "Alice went to Paris.")])
        with pytest.raises(RuntimeError, match="inner"), store.transaction():
            store.sessions.insert(make_session("bob", 1))
            store.memories.insert("bob", [make_tuple("Bob", "likes", "tea")])
            raise RuntimeError("inner")
        store.sessions.insert(make_session("alice", 1))
    assert store.namespaces.names() == ["alice"]
    assert [m.id for m in store.memories.select("alice")] == [kept]
    assert store.sessions.exists("alice", "s1") and not store.sessions.exists("bob", "s1")
    assert [e.action for e in store.events.history(kept)] == ["add"]
    assert store.conn.execute("SELECT count(*) FROM events WHERE namespace = 'bob'").fetchone()[0] == 0


def test_a_write_that_fails_inside_a_transaction_leaves_no_half_of_itself(store):
    """supersede fails on its second source after writing the merged row and superseding the
    first: all of its own work is undone, the caller's transaction goes on with the rest."""
    (first,) = store.memories.insert("alice", [make_episode("Trip", "Alice went to Paris.")])
    merged = store.memories.get(first).model_copy(update={"details": "Alice went to Paris in May."})
    with store.transaction():
        store.sessions.insert(make_session("alice", 1))
        with pytest.raises(NotFoundError, match="no memory with id 999"):
            store.memories.supersede("alice", [first, 999], merged, reason="merged", action="merge")
    assert store.memories.get(first).status == MemoryStatus.active
    assert [m.id for m in store.memories.select("alice", status=None)] == [first]
    assert [e.action for e in store.events.history(first)] == ["add"]
    assert store.sessions.exists("alice", "s1")


def test_an_outer_failure_rolls_back_every_savepoint_it_held(store):
    with pytest.raises(RuntimeError, match="outer"), store.transaction():
        store.sessions.insert(make_session("alice", 1))  # a savepoint, released into the outer one
        with store.transaction():
            store.memories.insert("alice", [make_episode("Trip", "Alice went to Paris.")])
        raise RuntimeError("outer")
    assert not store.conn.in_transaction
    assert store.namespaces.names() == [] and store.counts() == {"sessions": 0, "turns": 0}
    assert store.conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0


def test_status_changes_are_events_and_content_is_kept(store):
    (mid,) = store.memories.insert("alice", [make_episode("Trip", "Alice went to Paris.")])
    store.memories.set_status(mid, MemoryStatus.deleted, reason="outdated")
    memory = store.memories.get(mid)
    assert memory.status == MemoryStatus.deleted and memory.details == "Alice went to Paris."
    actions = [e.action for e in store.events.history(mid)]
    assert actions == ["add", "deleted"]
    last = store.events.history(mid)[-1]
    assert last.before["status"] == "active" and last.after["status"] == "deleted" and last.reason == "outdated"


def test_unknown_memory_is_a_clear_error(store):
    with pytest.raises(NotFoundError, match="no memory with id 999"):
        store.memories.get(999)


def test_files_are_owner_only(tmp_path):
    s = MemoryStore(tmp_path / "private.db")
    s.sessions.insert(make_session("alice", 1))
    for path in tmp_path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    s.close()


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        MemoryStore(tmp_path / "nope" / "m.db")


def test_forget_namespace_removes_every_row(store):
    for ns in ("alice", "bob"):
        store.sessions.insert(make_session(ns, 1))
        store.memories.insert(ns, [make_tuple("X", "likes", ns, ["s1:0"])], source_session_id="s1")
    store.forget_namespace("alice")
    for table in ("sessions", "turns", "memories", "events", "embeddings", "consolidation_runs", "exports"):
        n = store.conn.execute(f"SELECT count(*) FROM {table} WHERE namespace = 'alice'").fetchone()[0]
        assert n == 0, table
    assert store.namespaces.names() == ["bob"]
    assert len(store.memories.select("bob")) == 1


# --------------------------------------------------------------------------- provenance, duplicates


def test_provenance_is_stored_and_read_back(store):
    store.sessions.insert(make_session("alice", 1))
    cited = make_episode("Trip", "Alice went to Paris.", ["s1:0"])
    aligned = make_episode("Tea", "Alice likes tea.", ["s1:1"]).model_copy(update={"provenance": "aligned"})
    bare = make_tuple("Alice", "likes", "tea")
    ids = store.memories.insert("alice", [cited, aligned, bare], source_session_id="s1")
    got = store.memories.get_many(ids)
    assert [got[i].provenance for i in ids] == ["cited", "aligned", None]
    assert store.events.history(ids[1])[0].after["provenance"] == "aligned"


def test_a_version_2_store_is_migrated_and_its_rows_with_turns_become_cited(tmp_path):
    """A store written before provenance existed (schema 2) opens, and its rows keep their content."""
    path = tmp_path / "v2.db"
    conn = sqlite3.connect(path)
    for version in (1, 2):
        conn.executescript(MIGRATIONS[version])
    conn.execute("INSERT INTO namespaces (name, created_at) VALUES ('alice', '2023-05-08T00:00:00+00:00')")
    for turns, details in (('["s1:0", "s1:2"]', "Alice went to Paris."), ("[]", "Alice likes tea.")):
        conn.execute(
            "INSERT INTO memories (namespace, kind, title, summary, details, timestamp, source_session_id, "
            "source_turn_ids, created_at) VALUES ('alice', 'episode', 't', 's', ?, '2023-05-07', 's1', ?, "
            "'2023-05-08T00:00:00+00:00')",
            (details, turns),
        )
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()

    migrated = MemoryStore(path)
    assert migrated.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with_turns, without = migrated.memories.select("alice")
    assert (with_turns.source_turn_ids, with_turns.provenance) == (["s1:0", "s1:2"], "cited")
    assert (without.source_turn_ids, without.provenance) == ([], None)
    assert with_turns.details == "Alice went to Paris."
    indexes = {r[0] for r in migrated.conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "memories_timestamp" in indexes
    migrated.close()
    MemoryStore(path).close()  # opening again migrates nothing


def test_add_source_turns_is_a_union_with_an_event(store):
    store.sessions.insert(make_session("alice", 1))
    (mid,) = store.memories.insert("alice", [make_episode("Trip", "Alice went to Paris.", ["s1:0", "s1:1"])])
    store.memories.add_source_turns(mid, ["s1:1", "s1:3"], "aligned", reason="repeats memory 1 (the same content)")
    memory = store.memories.get(mid)
    assert memory.source_turn_ids == ["s1:0", "s1:1", "s1:3"]
    assert memory.provenance == "aligned"  # part of its turns were found by alignment now
    assert memory.details == "Alice went to Paris." and memory.status == MemoryStatus.active
    event = store.events.history(mid)[-1]
    assert event.action == "duplicate" and event.reason == "repeats memory 1 (the same content)"
    assert json.loads(event.before["source_turn_ids"]) == ["s1:0", "s1:1"]
    assert json.loads(event.after["source_turn_ids"]) == ["s1:0", "s1:1", "s1:3"]


def test_a_memory_without_turns_takes_the_provenance_of_the_turns_it_gains(store):
    store.sessions.insert(make_session("alice", 1))
    (mid,) = store.memories.insert("alice", [make_episode("Trip", "Alice went to Paris.")])
    store.memories.add_source_turns(mid, ["s1:2"], "cited", reason="r")
    assert store.memories.get(mid).provenance == "cited"


def test_duplicate_candidates_share_kind_and_timestamp_or_session_and_are_active(store):
    store.sessions.insert(make_session("alice", 1))
    same_day, other_day, same_session, retired = store.memories.insert(
        "alice",
        [
            make_episode("A", "a", day=1),
            make_episode("B", "b", day=2),
            make_episode("C", "c", day=3),
            make_episode("D", "d", day=1),
        ],
        source_session_id="s1",
    )
    store.memories.insert("alice", [make_episode("E", "e", day=2)], source_session_id="s2")
    store.memories.insert("alice", [make_tuple("Alice", "likes", "tea", day=1)], source_session_id="s1")
    store.memories.insert("bob", [make_episode("F", "f", day=1)], source_session_id="s1")
    store.memories.set_status(retired, MemoryStatus.deleted)
    found = store.memories.duplicate_candidates("alice", "episode", "2023-05-01", "s1")
    assert [m.id for m in found] == [same_day, other_day, same_session]
    assert [m.title for m in store.memories.duplicate_candidates("alice", "episode", "2023-05-02", None)] == ["B", "E"]
