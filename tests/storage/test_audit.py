"""The audit trail of the store (storage/audit.py) through the Python API and ``hybridmem audit``:
entries for each operation with their ids and never their text, the hash chain and what
``verify`` says of an edited, deleted or swapped entry, trimming, and writers of several
connections, processes and replicas appending at once. Each behaviour runs on a SQLite file and
on a PostgreSQL database (``store_location``); the tampering goes around the store, through a
plain connection with the append-only triggers dropped, as someone editing the database would.
SQLCipher is SQLite's alone."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from hybridmem_local.cli.main import app
from hybridmem_local.errors import AuditChainError, ConflictError
from hybridmem_local.memory import UNAUDITED, HybridMemory, audited_action
from hybridmem_local.schema import EpisodeDraft, Session, TupleDraft, Turn, utcnow
from hybridmem_local.storage.audit import AuditScope, PendingEntry, acting_as
from hybridmem_local.storage.store import MemoryStore
from tests.curation.test_redaction import ASKS_TO_FORGET, SSN, STATES_SSN
from tests.curation.test_redaction import session as chat
from tests.factories import EchoLLM
from tests.storage.conftest import StoreLocation

CONFIG = {"embedder.backend": "hashing", "curation.mode": "queue"}


def open_memory(location: StoreLocation, embedder, **overrides) -> HybridMemory:
    return HybridMemory.open(location.location, location.config({**CONFIG, **overrides}), embedder=embedder)


def audit(location: StoreLocation, *args: str):
    return CliRunner().invoke(app, ["audit", *args, *location.cli_args()])


#: The append-only triggers, and how each backend drops one.
TRIGGERS = ("audit_log_no_update", "audit_log_trim_only")


@contextmanager
def raw(location: StoreLocation) -> Iterator[sa.Connection]:
    """A plain connection in one transaction, as someone editing the database would use; the
    append-only triggers dropped first, as they would be."""
    engine = location.engine()
    try:
        with engine.begin() as conn:
            for trigger in TRIGGERS:
                on = " ON audit_log" if location.postgres else ""
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trigger}{on}")
            yield conn
    finally:
        engine.dispose()


def fill(location: StoreLocation, count: int, days_ago: float = 0) -> None:
    store = location.open()
    at = (utcnow() - timedelta(days=days_ago)).isoformat()
    store.audit.append(
        [
            PendingEntry(at=at, actor=f"k{i % 3}", action="test", namespace="alice", refs={"read": [i]}, outcome="ok")
            for i in range(count)
        ]
    )
    store.close()


def audit_table(store: MemoryStore) -> str:
    return repr(store.execute("SELECT * FROM audit_log ORDER BY id").fetchall())


def test_each_facade_operation_leaves_one_entry_with_ids_and_no_text(store_location, hashing_embedder):
    markers = [f"MARKER{i}x{i * 7919}" for i in range(8)]
    with open_memory(store_location, hashing_embedder) as memory:
        ids = memory.add_memories(
            "alice",
            episodes=[EpisodeDraft(title=markers[0], summary=markers[1], details=markers[2], timestamp="2023-05-05")],
            tuples=[TupleDraft(entity="Alice", relation="likes", object=markers[3], timestamp="2023-05-05")],
        )
        memory.enqueue(
            [
                Session(
                    namespace="alice",
                    session_id="s1",
                    started_at=utcnow(),
                    turns=[Turn(turn_id="s1:0", speaker="Alice", text=markers[4])],
                )
            ]
        )
        found = memory.search(f"where is {markers[5]}", namespace="alice")
        memory.history(ids[0], namespace="alice")  # calls get inside: still one entry
        updated = memory.update(ids[1], object=markers[6])
        memory.delete(ids[0], reason=markers[7], namespace="alice")
        with pytest.raises(Exception, match="no memory"):
            memory.get(10**6, namespace="alice")
        memory.stats("alice")
        rows = memory.store.audit.entries()
        table = audit_table(memory.store)
    by_action = [(e.action, e.namespace, e.refs, e.outcome) for e in rows]
    assert by_action[0] == ("HybridMemory.add_memories", "alice", {"changed": ids}, "ok")
    assert by_action[1] == ("HybridMemory.enqueue", "alice", {"sessions": ["s1"]}, "ok")
    assert by_action[2][:2] == ("HybridMemory.search", "alice")
    assert by_action[2][2]["read"] == [h.memory.stored_id for h in [*found.episodes, *found.tuples]]
    assert by_action[2][2]["windows"] == [h.window.id for h in found.windows]
    assert by_action[3] == ("HybridMemory.history", "alice", {"read": [ids[0]]}, "ok")
    # The old row superseded and its successor stored; the successor is what the call returned.
    assert by_action[4][0] == "HybridMemory.update"
    assert sorted(by_action[4][2]["changed"]) == [ids[1], updated.stored_id]
    assert by_action[4][2]["read"] == [updated.stored_id]
    assert by_action[5] == ("HybridMemory.delete", "alice", {"changed": [ids[0]]}, "ok")
    assert by_action[6] == ("HybridMemory.get", "alice", {}, "not_found")
    assert by_action[7] == ("HybridMemory.stats", "alice", {}, "ok")
    assert len(rows) == 8
    assert {e.actor for e in rows} == {rows[0].actor} and rows[0].actor.startswith("local")
    assert not [m for m in markers if m in table]


def test_forget_keeps_the_namespaces_audit_entries_and_disabled_records_nothing(store_location, hashing_embedder):
    with open_memory(store_location, hashing_embedder) as memory:
        memory.add_memories(
            "bob", tuples=[TupleDraft(entity="Bob", relation="ran", object="10K", timestamp="2023-05-07")]
        )
        memory.forget("bob")
        assert [e.action for e in memory.store.audit.entries(namespace="bob")] == [
            "HybridMemory.add_memories",
            "HybridMemory.forget",
        ]
    with open_memory(store_location, hashing_embedder, **{"audit.enabled": False}) as memory:
        memory.search("anything", namespace="bob")
        assert len(memory.store.audit.entries()) == 2


#: How the tests call each exempt member of HybridMemory (``close`` last: it ends the facade).
EXEMPT_CALLS: dict[str, Callable[[HybridMemory], object]] = {
    # (On PostgreSQL store.path is a local folder's; the config's store.url names the database.)
    "open": lambda m: HybridMemory.open(m.store.path, m.config, embedder=m.embedder, llm=m.llm).close(),
    "flush": lambda m: m.flush(),
    "embedder": lambda m: m.embedder,
    "llm": lambda m: m.llm,
    "scrub_pending": lambda m: m.scrub_pending,
    "answer_options": lambda m: m.answer_options(),
    "sessions_to_curate": lambda m: m.sessions_to_curate(retry_failed=True),
    "claim_sessions": lambda m: m.claim_sessions("worker-1", 10, 60.0),
    "close": lambda m: m.close(),
}


def test_every_public_member_of_the_facade_is_audited_unless_listed_as_exempt():
    public = {name: member for name, member in vars(HybridMemory).items() if not name.startswith("_")}
    audited = {name for name, member in public.items() if audited_action(member) == f"HybridMemory.{name}"}
    assert audited | UNAUDITED.keys() == public.keys()
    assert not audited & UNAUDITED.keys()
    assert {"redactions", "undo_redaction", "confirm_redaction", "retry_pending_scrubs"} <= audited


def test_the_exempt_members_change_nothing_in_the_store(store_location, hashing_embedder):
    memory = HybridMemory.open(
        store_location.location, store_location.config(CONFIG), embedder=hashing_embedder, llm=EchoLLM()
    )
    memory.add_memories(
        "alice", tuples=[TupleDraft(entity="Alice", relation="ran", object="10K", timestamp="2023-05-07")]
    )
    memory.enqueue([chat("s1", ("Alice", "I ran a 10K on Sunday."))])
    memory.search("Alice", namespace="alice")  # loads indexes, so flush and close have some to save
    assert EXEMPT_CALLS.keys() == UNAUDITED.keys()
    engine = store_location.engine()
    # Every table (and a SQLite file's schema), read on a connection of its own.
    tables = sorted(sa.inspect(engine).get_table_names()) + ([] if store_location.postgres else ["sqlite_master"])
    assert {"audit_log", "sessions", "store_changes"} <= set(tables)

    def rows() -> dict[str, list[str]]:
        """Every row, a worker's claims left out: who curates a session until when is no content.
        On PostgreSQL ``store_changes`` is in it: a commit that could change an index moves it."""
        with engine.connect() as conn:
            dump = {table: sorted(map(repr, conn.exec_driver_sql(f"SELECT * FROM {table}"))) for table in tables}
            dump["sessions"] = sorted(
                map(repr, conn.exec_driver_sql("SELECT id, namespace, session_id, curation_status FROM sessions"))
            )
        return dump

    def claimed() -> list[tuple[str, str]]:
        with engine.connect() as conn:
            query = "SELECT session_id, claimed_by FROM sessions WHERE claimed_by IS NOT NULL"
            return [tuple(row) for row in conn.exec_driver_sql(query)]

    try:
        for name, call in EXEMPT_CALLS.items():
            before = rows()
            call(memory)
            assert rows() == before, f"HybridMemory.{name} changed the store"
        assert claimed() == [("s1", "worker-1")]  # the claim itself is stored
    finally:
        engine.dispose()


def test_listing_undoing_and_confirming_redactions_leave_entries_without_text(store_location, hashing_embedder):
    with open_memory(store_location, hashing_embedder) as memory:
        memory.enqueue([STATES_SSN, ASKS_TO_FORGET])
        memory.enqueue([chat("s3", ("user", "My email is dana@example.org. Forget that."), day=2)])
        first, second = memory.redactions("alice")
        start = len(memory.store.audit.entries())
        memory.redactions("alice", status="pending")
        memory.undo_redaction(first.id, namespace="alice")
        memory.confirm_redaction(second.id)  # no namespace given: the entry still names the redaction's
        with pytest.raises(ConflictError):
            memory.confirm_redaction(first.id, namespace="alice")
        memory.retry_pending_scrubs()
        entries = memory.store.audit.entries()[start:]
        table = audit_table(memory.store)
    assert [(e.action, e.namespace, e.refs.get("redactions"), e.outcome) for e in entries] == [
        ("HybridMemory.redactions", "alice", [first.id, second.id], "ok"),
        ("HybridMemory.undo_redaction", "alice", [first.id], "ok"),
        ("HybridMemory.confirm_redaction", "alice", [second.id], "ok"),
        ("HybridMemory.confirm_redaction", "alice", None, "conflict"),
        ("HybridMemory.retry_pending_scrubs", None, None, "ok"),
    ]
    assert SSN not in table and "dana@example.org" not in table


def test_the_worker_and_other_actors_are_named(store_location):
    store = store_location.open()
    with acting_as("worker"):
        scope = AuditScope(actor="worker", action="HybridMemory.curate_stored")
        scope.note("alice", changed=[1, 2])
        scope.note("bob", changed=[3])
        store.audit.record(scope)
    store.audit.flush()
    # One entry per namespace an operation touched.
    assert [(e.actor, e.namespace, e.refs) for e in store.audit.entries()] == [
        ("worker", "alice", {"changed": [1, 2]}),
        ("worker", "bob", {"changed": [3]}),
    ]
    store.close()


def test_the_table_refuses_updates_and_deletes(store_location):
    fill(store_location, 3)
    statements = (
        ("UPDATE audit_log SET actor = 'someone' WHERE id = 2", "append-only"),
        ("DELETE FROM audit_log WHERE id = 2", "trim"),
    )
    # On a plain connection (the triggers are the database's, not the library's) ...
    engine = store_location.engine()
    try:
        for statement, says in statements:
            with pytest.raises(sa.exc.DBAPIError, match=says), engine.begin() as conn:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()
    # ... and through the store (the driver's error comes wrapped by SQLAlchemy); nothing changed.
    store = store_location.open()
    for statement, says in statements:
        with pytest.raises(sa.exc.DBAPIError, match=says), store.transaction() as c:
            c.execute(statement)
    assert [e.actor for e in store.audit.entries()] == ["k0", "k1", "k2"]
    assert store.audit.verify().ok
    store.close()


@pytest.mark.parametrize(
    ("tamper", "first_bad", "says"),
    [
        (["UPDATE audit_log SET actor = 'someone-else' WHERE id = 4"], 4, "does not match its hash"),
        (["UPDATE audit_log SET refs = '{\"read\":[99]}' WHERE id = 7"], 7, "does not match its hash"),
        (["DELETE FROM audit_log WHERE id = 5"], 5, "missing"),
        (["DELETE FROM audit_log WHERE id IN (3, 4)"], 3, "3-4 is missing"),
        # Two entries swapped: each takes the other's place (id).
        (
            [
                "UPDATE audit_log SET id = -6 WHERE id = 6",
                "UPDATE audit_log SET id = 6 WHERE id = 2",
                "UPDATE audit_log SET id = 2 WHERE id = -6",
            ],
            2,
            "moved",
        ),
        # Contents swapped, ids kept, hashes recomputed by someone who knows the recipe: the link breaks.
        ("SWAP_RECOMPUTED 3 8", 3, "does not follow"),
    ],
    ids=["edited", "refs-edited", "deleted", "two-deleted", "swapped", "swapped-recomputed"],
)
def test_verify_names_the_first_edited_deleted_or_swapped_entry(store_location, tamper, first_bad, says):
    fill(store_location, 10)
    assert audit(store_location, "verify").exit_code == 0
    with raw(store_location) as conn:
        if isinstance(tamper, str):
            from hybridmem_local.storage.audit import entry_hash

            a, b = map(int, tamper.split()[1:])
            rows = {
                r[0]: tuple(r)
                for r in conn.execute(sa.text("SELECT * FROM audit_log WHERE id IN (:a, :b)"), {"a": a, "b": b})
            }
            for target, source in ((a, b), (b, a)):
                _, at, actor, action, namespace, refs, outcome, prev_hash, _ = rows[source]
                digest = entry_hash(target, at, actor, action, namespace, json.loads(refs), outcome, prev_hash)
                conn.execute(
                    sa.text(
                        "UPDATE audit_log SET at = :at, actor = :actor, refs = :refs, prev_hash = :prev_hash, "
                        "hash = :hash WHERE id = :id"
                    ),
                    {"at": at, "actor": actor, "refs": refs, "prev_hash": prev_hash, "hash": digest, "id": target},
                )
        else:
            for statement in tamper:
                conn.exec_driver_sql(statement)
    result = audit(store_location, "verify")
    assert result.exit_code == 1
    assert f"broken at entry {first_bad}:" in result.output and says in result.output, result.output
    verdict = json.loads(audit(store_location, "verify", "--json").stdout)
    assert (verdict["ok"], verdict["first_bad_id"]) == (False, first_bad)


def test_trim_keeps_the_chain_verifiable_and_is_an_entry_itself(store_location):
    fill(store_location, 6, days_ago=40)
    fill(store_location, 4, days_ago=1)
    result = audit(store_location, "trim", "--older-than-days", "30")
    assert result.exit_code == 0 and "trimmed 6 entries" in result.output, result.output
    store = store_location.open()
    entries = store.audit.entries()
    assert [e.id for e in entries] == [7, 8, 9, 10, 11]
    assert entries[-1].action == "audit.trim" and entries[-1].refs["trimmed"] == [6]
    verdict = store.audit.verify()
    assert verdict.ok and verdict.anchor_id == 6 and verdict.entries == 5
    store.audit.append(
        [PendingEntry(at=utcnow().isoformat(), actor="k", action="a", namespace=None, refs={}, outcome="ok")]
    )
    assert store.audit.verify().ok
    store.close()
    # After a trim, tampering is still found, and a broken chain is not trimmed (that would hide it).
    with raw(store_location) as conn:
        conn.exec_driver_sql("UPDATE audit_log SET outcome = 'forbidden' WHERE id = 8")
    assert "broken at entry 8" in audit(store_location, "verify").output
    result = audit(store_location, "trim", "--older-than-days", "1")
    assert result.exit_code == 1 and "does not verify" in result.output
    store = store_location.open()
    with pytest.raises(AuditChainError):
        store.audit.trim(utcnow())
    store.close()


def test_trim_takes_its_default_from_audit_retention_days(store_location):
    fill(store_location, 3, days_ago=10)
    config = store_location.tmp / "config.yaml"
    config.write_text("audit:\n  retention_days: 5\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["audit", "trim", *store_location.cli_args(), "--config", str(config)])
    assert result.exit_code == 0 and "trimmed 3 entries" in result.output, result.output
    assert "retention_days" in audit(store_location, "trim").output  # neither given: says what to set


def test_list_filters_by_key_namespace_and_time(store_location):
    fill(store_location, 3, days_ago=10)
    fill(store_location, 3)
    listed = json.loads(audit(store_location, "list", "--key", "k1", "--json").output)
    assert [e["id"] for e in listed] == [2, 5] and {e["actor"] for e in listed} == {"k1"}
    since = (utcnow() - timedelta(days=1)).date().isoformat()
    assert [e["id"] for e in json.loads(audit(store_location, "list", "--since", since, "--json").output)] == [4, 5, 6]
    assert json.loads(audit(store_location, "list", "--namespace", "bob", "--json").output) == []
    table = audit(store_location, "list", "--limit", "2")
    assert table.exit_code == 0 and "read: 0" in table.output


def test_a_missing_store_file_is_an_error_and_stays_missing(tmp_path):
    """SQLite only: ``audit verify`` of a file that is not there creates no empty store."""
    result = CliRunner().invoke(app, ["audit", "verify", "--db", str(tmp_path / "missing.db")])
    assert result.exit_code == 1 and "no store at" in result.output
    assert not (tmp_path / "missing.db").exists()


def _append_many(
    location: str, local_dir: Path | None, actor: str, count: int, start: multiprocessing.synchronize.Event
) -> None:
    store = MemoryStore(location, local_dir=local_dir)
    start.wait()
    for i in range(count):
        scope = AuditScope(actor=actor, action="concurrent")
        scope.note("alice", read=[i])
        store.audit.record(scope)
    store.audit.flush()
    store.close()


def assert_one_linear_chain(store: MemoryStore, per_actor: dict[str, int]) -> None:
    """The chain verifies, its ids run 1..n without a gap or a repeat, no two entries follow the
    same one (no fork), and each writer's entries keep its own order."""
    entries = store.audit.entries()
    verdict = store.audit.verify()
    assert verdict.ok, verdict
    total = sum(per_actor.values())
    assert [e.id for e in entries] == list(range(1, total + 1))
    assert len({e.prev_hash for e in entries}) == total
    assert {e.actor for e in entries} == set(per_actor)
    for actor, count in per_actor.items():
        assert [e.refs["read"][0] for e in entries if e.actor == actor] == list(range(count))


def test_writers_of_two_processes_and_a_thread_at_once_extend_one_linear_chain(store_location):
    store_location.open().close()
    location, local_dir = str(store_location.location), store_location.local_dir
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    processes = [
        context.Process(target=_append_many, args=(location, local_dir, f"p{i}", 150, start)) for i in range(2)
    ]
    for process in processes:
        process.start()
    thread = threading.Thread(target=_append_many, args=(location, local_dir, "thread", 150, start))
    thread.start()
    start.set()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    thread.join(120)
    store = store_location.open()
    try:
        assert_one_linear_chain(store, {"p0": 150, "p1": 150, "thread": 150})
    finally:
        store.close()


def test_two_replicas_appending_from_threads_leave_one_chain(store_location):
    """Two stores (two replicas, each with its own local folder on PostgreSQL) record entries
    from threads at once, each also through its writer thread whenever the other holds the lock
    past the short wait: one chain that verifies, no id twice."""
    per_actor = {"r1": 200, "r2": 200}
    replicas = {actor: store_location.replica(actor).open() for actor in per_actor}
    start = threading.Barrier(len(replicas))
    errors: list[BaseException] = []

    def append(actor: str) -> None:
        store = replicas[actor]
        try:
            start.wait(10)
            for i in range(per_actor[actor]):
                scope = AuditScope(actor=actor, action="concurrent")
                scope.note("alice", read=[i])
                store.audit.record(scope)
            assert store.audit.flush(60)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(actor,)) for actor in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert errors == []
        for store in replicas.values():
            assert_one_linear_chain(store, per_actor)
    finally:
        for store in replicas.values():
            store.close()


def test_a_read_does_not_wait_for_another_connections_write_transaction(store_location, hashing_embedder):
    """While another connection holds the write lock (SQLite's file lock, PostgreSQL's advisory
    lock), the search returns after the short lock wait; its entry is stored by the writer thread
    once the lock is free."""
    with open_memory(store_location, hashing_embedder) as memory:
        memory.add_memories("alice", tuples=[TupleDraft(entity="A", relation="b", object="c", timestamp="2023-05-05")])
        memory.search("warm up", namespace="alice")
        other = store_location.open()
        try:
            with other.transaction():  # holds the write lock
                started = time.perf_counter()
                memory.search("while locked", namespace="alice")
                took = time.perf_counter() - started
                time.sleep(0.2)
        finally:
            other.close()
        assert took < 1.0, took
        assert memory.store.audit.flush(10)
        assert [e.action for e in memory.store.audit.entries()][-1] == "HybridMemory.search"
        assert len(memory.store.audit.entries()) == 3
        assert memory.store.audit.verify().ok


def test_an_encrypted_store_keeps_its_audit_encrypted_and_verifiable(tmp_path, hashing_embedder, monkeypatch):
    """With SQLCipher on, entries go through both paths (the operation's connection, and the
    writer thread's own connection while the lock is held elsewhere), the file shows none of the
    chain in the clear, and ``audit verify`` opens it with the key from the environment."""
    from hybridmem_local.storage.encryption import generate_master_key

    monkeypatch.setenv("HYBRIDMEM_MASTER_KEY", generate_master_key().hex())
    db = tmp_path / "memory.db"
    sqlite = StoreLocation("sqlite", db, None, tmp_path)
    with open_memory(sqlite, hashing_embedder, **{"store.encryption": "sqlcipher"}) as memory:
        memory.add_memories("alice", tuples=[TupleDraft(entity="A", relation="b", object="c", timestamp="2023-05-05")])
        other = memory.store.__class__.open(db, memory.config.store)
        with other.transaction():  # holds the write lock
            memory.search("while locked", namespace="alice")  # handed to the writer thread
        other.close()
        assert memory.store.audit.flush(10)
        assert [e.action for e in memory.store.audit.entries()] == ["HybridMemory.add_memories", "HybridMemory.search"]
    assert b"HybridMemory" not in db.read_bytes()
    config = tmp_path / "config.yaml"
    config.write_text("store:\n  encryption: sqlcipher\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["audit", "verify", "--db", str(db), "--config", str(config)])
    assert result.exit_code == 0 and "ok: 2 entries" in result.output, result.output
