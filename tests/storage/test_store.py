"""The store on its own, on both backends (``store_location``: a SQLite file and a PostgreSQL
database): round trips, atomicity, history, forget, provenance, duplicates, migrations and the
curation queue's claims. What only a SQLite file has (WAL, PRAGMAs, file modes, a missing folder)
and what only PostgreSQL has (its schema_version row, concurrent claims that skip locked rows, an
unreachable server) is tested on that backend alone."""

from __future__ import annotations

import json
import sqlite3
import stat
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations

from hybridmem_local.errors import AlreadyCuratedError, NotFoundError, StoreError
from hybridmem_local.schema import MemoryStatus, utcnow
from hybridmem_local.storage import sessions as sessions_module
from hybridmem_local.storage.migrations import MIGRATIONS, SCHEMA_VERSION
from hybridmem_local.storage.store import MemoryStore
from tests.factories import make_episode, make_session, make_tuple
from tests.sqlite_locks import open_while_write_locked
from tests.storage.conftest import StoreLocation


@pytest.fixture
def store(store_location):
    s = store_location.open()
    yield s
    s.close()


def test_session_round_trip(store):
    session = make_session("alice", 1, n_turns=5)
    store.sessions.insert(session)
    record = store.sessions.get("alice", "s1")
    assert record.session == session
    assert record.curation_status == "pending"
    assert store.counts("alice")["turns"] == 5


# --------------------------------------------------------------------------- schema and migrations


def test_sqlite_schema_version_and_wal(tmp_path):
    """SQLite only: the version is ``PRAGMA user_version``, the file is in WAL mode with foreign keys on."""
    store = MemoryStore(tmp_path / "m.db")
    assert store.scalar("PRAGMA user_version") == SCHEMA_VERSION
    assert store.scalar("PRAGMA journal_mode") == "wal"
    assert store.scalar("PRAGMA foreign_keys") == 1
    store.close()


def test_sqlite_store_opened_while_another_connection_holds_the_write_lock_waits(tmp_path):
    """SQLite only: a store opening a file still in rollback mode while another connection holds
    its write lock (as one switching a new file to WAL does) waits for the lock instead of failing.
    Switching to WAL takes a read lock and then the write lock, an upgrade SQLite refuses at once,
    busy timeout or not; four stores opening one new file together hit it now and then."""
    store = open_while_write_locked(tmp_path / "m.db", lambda: MemoryStore(tmp_path / "m.db"))
    assert store.scalar("PRAGMA journal_mode") == "wal"
    assert store.scalar("PRAGMA user_version") == SCHEMA_VERSION
    store.close()


@pytest.mark.postgres
def test_postgresql_schema_version_is_one_row(postgres_url):
    """PostgreSQL only: the version is the one row of ``schema_version``; ``store_changes`` holds
    the one counter the replicas' indexes watch."""
    store = MemoryStore(postgres_url)
    assert [tuple(r) for r in store.execute("SELECT version FROM schema_version")] == [(SCHEMA_VERSION,)]
    assert store.scalar("SELECT count(*) FROM store_changes") == 1
    assert store.backend.name == "postgresql"
    store.close()


def test_newer_schema_is_refused(tmp_path):
    """SQLite: a file whose ``PRAGMA user_version`` is past this library's."""
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this library"):
        MemoryStore(path)


@pytest.mark.postgres
def test_newer_schema_is_refused_on_postgresql(postgres_url):
    """PostgreSQL: a database whose ``schema_version`` row is past this library's, left as it was."""
    MemoryStore(postgres_url).close()
    engine = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE schema_version SET version = :v"), {"v": SCHEMA_VERSION + 1})
        with pytest.raises(StoreError, match="newer than this library"):
            MemoryStore(postgres_url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version FROM schema_version")).scalar_one() == SCHEMA_VERSION + 1
    finally:
        engine.dispose()


def schema_rows(location: StoreLocation) -> dict[str, int]:
    """Rows a migration writes exactly once: ``store_changes`` (its counter), and on PostgreSQL
    the ``schema_version`` row; two migrations would have made more (or failed)."""
    engine = location.engine()
    try:
        with engine.connect() as conn:
            rows = {"store_changes": conn.execute(sa.text("SELECT count(*) FROM store_changes")).scalar_one()}
            if location.postgres:
                rows["schema_version"] = conn.execute(sa.text("SELECT count(*) FROM schema_version")).scalar_one()
            return rows
    finally:
        engine.dispose()


def test_a_store_opened_again_migrates_nothing(store_location):
    first = store_location.open()
    first.sessions.insert(make_session("alice", 1))
    first.close()
    for _ in range(2):
        again = store_location.open()
        assert again.sessions.exists("alice", "s1")
        again.close()
    assert set(schema_rows(store_location).values()) == {1}


def test_stores_opened_at_once_on_an_empty_database_create_the_schema_once(store_location):
    """Several stores (replicas starting together) open one empty database at the same moment:
    every one opens, the schema is created once (the migration runs under the writer lock and
    looks at the version again once it holds it)."""
    opened: list[MemoryStore] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_one() -> None:
        try:
            start.wait(10)
            opened.append(store_location.open())
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert errors == [] and len(opened) == 4
        opened[0].sessions.insert(make_session("alice", 1))
        assert all(store.sessions.exists("alice", "s1") for store in opened)
    finally:
        for store in opened:
            store.close()
    assert set(schema_rows(store_location).values()) == {1}


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
    assert store.scalar("SELECT count(*) FROM events WHERE namespace = 'bob'") == 0


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
    assert not store.in_transaction
    assert store.namespaces.names() == [] and store.counts() == {"sessions": 0, "turns": 0}
    assert store.scalar("SELECT count(*) FROM events") == 0


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
    """SQLite: the database file and its WAL and shared-memory files."""
    s = MemoryStore(tmp_path / "private.db")
    s.sessions.insert(make_session("alice", 1))
    for path in tmp_path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    s.close()


@pytest.mark.postgres
def test_postgresql_local_folder_is_created_owner_only(postgres_url, tmp_path):
    """PostgreSQL: the folder of this host's index files and caches is made, readable by its owner alone."""
    local = tmp_path / "deep" / "local"
    store = MemoryStore(postgres_url, local_dir=local)
    assert store.path == local / "store"
    assert stat.S_IMODE(local.stat().st_mode) == 0o700
    store.close()


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        MemoryStore(tmp_path / "nope" / "m.db")


@pytest.mark.postgres
def test_missing_database_or_server_is_a_clear_error(postgres_cluster, tmp_path):
    """PostgreSQL: a database that does not exist, or a port nobody listens on, is a StoreError
    naming the URL without its password."""
    with pytest.raises(StoreError, match="cannot reach the store's database.*does not exist"):
        MemoryStore(postgres_cluster.url_for("no_such_database"), local_dir=tmp_path)
    with pytest.raises(StoreError, match="cannot reach the store's database") as caught:
        MemoryStore("postgresql://someone:secret@127.0.0.1:1/db", local_dir=tmp_path)
    assert "secret" not in str(caught.value)


def test_forget_namespace_removes_every_row(store):
    for ns in ("alice", "bob"):
        store.sessions.insert(make_session(ns, 1))
        store.memories.insert(ns, [make_tuple("X", "likes", ns, ["s1:0"])], source_session_id="s1")
    store.forget_namespace("alice")
    for table in ("sessions", "turns", "memories", "events", "embeddings", "consolidation_runs", "exports"):
        n = store.scalar(f"SELECT count(*) FROM {table} WHERE namespace = 'alice'")
        assert n == 0, table
    assert store.namespaces.names() == ["bob"]
    assert len(store.memories.select("bob")) == 1
    assert store.counts("bob")["sessions"] == 1
    # The tombstone other processes sweep their own copies by: the name, nothing of the content.
    assert [namespace for _, namespace, _ in store.forgotten(0)] == ["alice"]


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


def test_a_version_2_store_is_migrated_and_its_rows_with_turns_become_cited(store_location):
    """A store written before provenance existed (schema 2) opens, and its rows keep their content:
    one migration history, run on either backend."""
    with old_store(store_location, 2) as conn:
        conn.execute(sa.text("INSERT INTO namespaces (name, created_at) VALUES ('alice', '2023-05-08T00:00:00+00:00')"))
        for turns, details in (('["s1:0", "s1:2"]', "Alice went to Paris."), ("[]", "Alice likes tea.")):
            conn.execute(
                sa.text(
                    "INSERT INTO memories (namespace, kind, title, summary, details, timestamp, source_session_id, "
                    "source_turn_ids, created_at) VALUES ('alice', 'episode', 't', 's', :details, '2023-05-07', 's1', "
                    ":turns, '2023-05-08T00:00:00+00:00')"
                ),
                {"details": details, "turns": turns},
            )

    migrated = store_location.open()
    assert migrated.backend.schema_version(migrated.conn) == SCHEMA_VERSION
    with_turns, without = migrated.memories.select("alice")
    assert (with_turns.source_turn_ids, with_turns.provenance) == (["s1:0", "s1:2"], "cited")
    assert (without.source_turn_ids, without.provenance) == ([], None)
    assert with_turns.details == "Alice went to Paris."
    # The rows written before keep their ids; new ones follow them.
    (new_id,) = migrated.memories.insert("alice", [make_episode("Later", "Alice came back.")])
    assert new_id == 3
    indexes = {
        r.name
        for r in migrated.execute(
            "SELECT indexname AS name FROM pg_indexes WHERE schemaname = current_schema()"
            if store_location.postgres
            else "SELECT name FROM sqlite_master WHERE type = 'index'"
        )
    }
    assert {"memories_timestamp", "memories_superseded_by", "sessions_queue"} <= indexes
    migrated.close()
    store_location.open().close()  # opening again migrates nothing
    assert set(schema_rows(store_location).values()) == {1}


@contextmanager
def old_store(location: StoreLocation, version: int) -> Iterator[sa.Connection]:
    """A store at schema ``version`` (the migrations up to it, as that library wrote them), and a
    connection to fill it in one transaction; the store migrates it when opened. The version is
    recorded as each backend keeps it: ``PRAGMA user_version``, or the ``schema_version`` row."""
    engine = location.engine()
    try:
        with engine.begin() as conn:
            operations = Operations(MigrationContext.configure(connection=conn))
            for step in range(1, version + 1):
                MIGRATIONS[step](operations)
            if location.postgres:
                conn.exec_driver_sql("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                conn.exec_driver_sql(f"INSERT INTO schema_version (version) VALUES ({version})")
            else:
                conn.exec_driver_sql(f"PRAGMA user_version = {version}")
            yield conn
    finally:
        engine.dispose()


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


# --------------------------------------------------------------------------- the curation queue's claims


def queue(store: MemoryStore, count: int) -> list[str]:
    """``count`` pending sessions over two namespaces, in arrival order; their ``namespace/id``."""
    names = []
    for i in range(count):
        namespace = ("alice", "bob")[i % 2]
        store.sessions.insert(make_session(namespace, i + 1))
        names.append(f"{namespace}/s{i + 1}")
    return names


def names(records) -> list[str]:
    return [f"{r.session.namespace}/{r.session.session_id}" for r in records]


@pytest.fixture
def later(monkeypatch):
    """``later(seconds)``: from now on the claims' clock reads that much after the real one (a
    lease running out without the test waiting for it)."""

    def shift(seconds: float) -> None:
        monkeypatch.setattr(sessions_module, "utcnow", lambda: utcnow() + timedelta(seconds=seconds))

    return shift


def test_a_claim_takes_the_oldest_pending_sessions_and_other_workers_skip_them(store):
    pending = queue(store, 5)
    first = store.sessions.claim("w1", 2, lease_s=60)
    assert names(first) == pending[:2]
    assert [r.curation_status for r in first] == ["pending", "pending"]
    assert first[0].session == store.sessions.get("alice", "s1").session  # with its turns
    assert names(store.sessions.claim("w2", 10, lease_s=60)) == pending[2:]
    assert store.sessions.claim("w3", 10, lease_s=60) == []
    # A worker's own unexpired claims are its again (a worker that restarts under the same name).
    assert names(store.sessions.claim("w1", 10, lease_s=60)) == pending[:2]
    claimed = dict(store.execute("SELECT session_id, claimed_by FROM sessions").fetchall())
    assert claimed == {"s1": "w1", "s2": "w1", "s3": "w2", "s4": "w2", "s5": "w2"}


def test_two_workers_claiming_at_once_get_disjoint_sessions_and_each_is_curated_once(store_location):
    """Two workers, each on its own connection, claim and curate in a loop until the queue is
    empty: every session is claimed by one of them exactly once, and curated once."""
    setup = store_location.open()
    pending = queue(setup, 40)
    setup.close()
    claims: dict[str, list[str]] = {"w1": [], "w2": []}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(worker: str) -> None:
        store = store_location.open()
        try:
            start.wait(10)
            while batch := store.sessions.claim(worker, 3, lease_s=60):
                claims[worker] += names(batch)
                for record in batch:
                    store.sessions.set_curation_status(
                        record.session.namespace, record.session.session_id, "curated", require_uncurated=True
                    )
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=work, args=(worker,)) for worker in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    both = claims["w1"] + claims["w2"]
    assert sorted(both) == sorted(pending), Counter(both).most_common(3)
    assert not set(claims["w1"]) & set(claims["w2"])
    check = store_location.open()
    assert check.sessions.count("curated") == 40 and check.sessions.count("pending") == 0
    assert check.scalar("SELECT count(*) FROM sessions WHERE claimed_by IS NOT NULL") == 0
    check.close()


def test_an_expired_lease_makes_the_sessions_anyones_and_renewing_keeps_them(store, later):
    pending = queue(store, 3)
    assert names(store.sessions.claim("w1", 2, lease_s=60)) == pending[:2]
    later(59)
    assert names(store.sessions.claim("w2", 10, lease_s=60)) == pending[2:]
    # w1 is alive: its heartbeat renews the leases of what it still holds.
    assert store.sessions.renew_claims("w1", lease_s=60) == 2
    later(100)  # past the first lease, within the renewed one
    assert store.sessions.claim("w3", 10, lease_s=60) == []
    later(59 + 61)  # past the renewed lease of w1 and w2's lease: w1 and w2 died
    assert names(store.sessions.claim("w3", 10, lease_s=60)) == pending
    assert store.sessions.renew_claims("w1", lease_s=60) == 0  # they are w3's now


def test_released_claims_are_claimable_at_once(store):
    pending = queue(store, 4)
    assert names(store.sessions.claim("w1", 3, lease_s=3600)) == pending[:3]
    assert names(store.sessions.claim("w2", 3, lease_s=3600)) == pending[3:]
    assert store.sessions.release_claims("w1") == 3
    assert store.sessions.release_claims("w1") == 0
    assert names(store.sessions.claim("w2", 10, lease_s=3600)) == pending


def test_curated_or_failed_sessions_are_never_claimed_again(store, later):
    """Storing a session's curation (or its failure) ends the claim on it: no lease running out
    brings it back to any worker, and a heartbeat no longer counts it."""
    pending = queue(store, 4)
    claimed = store.sessions.claim("w1", 3, lease_s=60)
    assert names(claimed) == pending[:3]
    store.sessions.set_curation_status("alice", "s1", "curated", require_uncurated=True)
    store.sessions.set_curation_status("bob", "s2", "curation_failed", error="the model said nothing")
    rows = dict(store.execute("SELECT session_id, claimed_by FROM sessions WHERE claim_expires_at IS NULL").fetchall())
    assert rows == {"s1": None, "s2": None, "s4": None}
    assert store.sessions.renew_claims("w1", lease_s=60) == 1  # s3 only
    later(3600)
    assert names(store.sessions.claim("w2", 10, lease_s=60)) == pending[2:]
    # A second curator of s1 (its claim long gone) cannot store it again.
    with pytest.raises(AlreadyCuratedError):
        store.sessions.set_curation_status("alice", "s1", "curated", require_uncurated=True)
    assert store.sessions.release_claims("w2") == 2
    assert names(store.sessions.claim("w3", 10, lease_s=60)) == pending[2:]


@pytest.mark.postgres
def test_a_claim_skips_the_rows_another_claim_holds_without_waiting(postgres_url, tmp_path):
    """PostgreSQL: while worker A's claim transaction is open and holds its rows (``FOR UPDATE``),
    worker B's claim returns the next sessions at once (``SKIP LOCKED``) instead of waiting for
    A's commit; after it, no session is both A's and B's."""
    store_a = MemoryStore(postgres_url, local_dir=tmp_path / "a")
    store_b = MemoryStore(postgres_url, local_dir=tmp_path / "b")
    pending = queue(store_a, 6)
    try:
        with store_a.transaction(claim=True) as c:
            held = c.execute(
                "SELECT id, namespace, session_id FROM sessions WHERE curation_status = 'pending' "
                f"ORDER BY id LIMIT 3{store_a.backend.skip_locked}"
            ).fetchall()
            assert [f"{r.namespace}/{r.session_id}" for r in held] == pending[:3]
            # If B waited for A's row locks, it would give up after 5 s rather than the test hang.
            with store_b.lock_wait(5_000):
                started = time.perf_counter()
                got_b = store_b.sessions.claim("B", 3, lease_s=60)
                took = time.perf_counter() - started
            c.execute(
                "UPDATE sessions SET claimed_by = 'A', claim_expires_at = :expires WHERE id IN :ids",
                {
                    "expires": (utcnow() + timedelta(seconds=60)).isoformat(timespec="microseconds"),
                    "ids": [r.id for r in held],
                },
            )
        assert took < 1.0, took
        assert names(got_b) == pending[3:]
        owners = dict(store_b.execute("SELECT session_id, claimed_by FROM sessions").fetchall())
        assert owners == {"s1": "A", "s2": "A", "s3": "A", "s4": "B", "s5": "B", "s6": "B"}
        assert store_b.sessions.claim("C", 10, lease_s=60) == []
    finally:
        store_a.close()
        store_b.close()


@pytest.mark.postgres
def test_a_claim_does_not_wait_for_another_replicas_write(postgres_url, tmp_path):
    """PostgreSQL: a claim takes row locks, not the writer lock, so a long write of another
    replica (an ingest, a consolidation) holds up no worker's claim."""
    writer = MemoryStore(postgres_url, local_dir=tmp_path / "a")
    worker = MemoryStore(postgres_url, local_dir=tmp_path / "b")
    pending = queue(writer, 2)
    try:
        with writer.transaction():
            writer.sessions.insert(make_session("carol", 9))  # not committed yet: no one sees it
            with worker.lock_wait(5_000):
                started = time.perf_counter()
                got = worker.sessions.claim("w", 10, lease_s=60)
                took = time.perf_counter() - started
        assert took < 1.0, took
        assert names(got) == pending
    finally:
        writer.close()
        worker.close()


@pytest.mark.postgres
def test_a_connection_lost_before_or_during_commit_says_what_was_stored(postgres_cluster, postgres_url, tmp_path):
    """PostgreSQL: lost before the COMMIT, the write was not stored and the error says so; lost
    during the COMMIT, the client cannot know, and the error says that instead of "not stored"."""
    from hybridmem_local.errors import StoreUnavailableError

    database = postgres_url.rsplit("/", 1)[1]
    store = MemoryStore(postgres_url, local_dir=tmp_path / "local")
    try:
        lost = pytest.raises(StoreUnavailableError, match="the operation was not stored, retry it")
        with lost, store.transaction() as c:
            c.execute("INSERT INTO namespaces (name, created_at) VALUES ('lost', 'now')")
            postgres_cluster.terminate_connections(database)
            c.execute("SELECT 1")
        assert store.namespaces.names() == []  # the next call reconnects
        original = store.conn.exec_driver_sql

        def drop_at_commit(sql, *args, **kwargs):
            if sql == "COMMIT":
                postgres_cluster.terminate_connections(database)
            return original(sql, *args, **kwargs)

        store.conn.exec_driver_sql = drop_at_commit
        unknown = pytest.raises(StoreUnavailableError, match="whether the operation was stored is unknown")
        with unknown, store.transaction() as c:
            c.execute("INSERT INTO namespaces (name, created_at) VALUES ('unknown', 'now')")
        assert store.namespaces.names() == []  # the server rolled both back; the store works again
    finally:
        store.close()
