"""The audit trail of the store (storage/audit.py) through the Python API and ``hybridmem audit``:
entries for each operation with their ids and never their text, the hash chain and what
``verify`` says of an edited, deleted or swapped entry, trimming, and writers of several
processes appending at once. Real SQLite files, raw ``sqlite3`` for the tampering."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridmem_local.cli.main import app
from hybridmem_local.config import load_config
from hybridmem_local.errors import AuditChainError, ConflictError
from hybridmem_local.memory import UNAUDITED, HybridMemory, audited_action
from hybridmem_local.schema import EpisodeDraft, Session, TupleDraft, Turn, utcnow
from hybridmem_local.storage.audit import AuditScope, PendingEntry, acting_as
from hybridmem_local.storage.store import MemoryStore
from tests.curation.test_redaction import ASKS_TO_FORGET, SSN, STATES_SSN
from tests.curation.test_redaction import session as chat
from tests.factories import EchoLLM

CONFIG = {"embedder.backend": "hashing", "curation.mode": "queue"}


def open_memory(path: Path, embedder, **overrides) -> HybridMemory:
    return HybridMemory.open(path, load_config(None, {**CONFIG, **overrides}), embedder=embedder)


def audit(path: Path, *args: str):
    return CliRunner().invoke(app, ["audit", *args, "--db", str(path)])


def raw(path: Path) -> sqlite3.Connection:
    """A plain connection, as someone editing the file would use; the append-only triggers
    dropped first, as they would be."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS audit_log_no_update")
    conn.execute("DROP TRIGGER IF EXISTS audit_log_trim_only")
    return conn


def fill(path: Path, count: int, days_ago: float = 0) -> None:
    store = MemoryStore(path)
    at = (utcnow() - timedelta(days=days_ago)).isoformat()
    store.audit.append(
        [
            PendingEntry(at=at, actor=f"k{i % 3}", action="test", namespace="alice", refs={"read": [i]}, outcome="ok")
            for i in range(count)
        ]
    )
    store.close()


def test_each_facade_operation_leaves_one_entry_with_ids_and_no_text(tmp_path, hashing_embedder):
    db = tmp_path / "memory.db"
    markers = [f"MARKER{i}x{i * 7919}" for i in range(8)]
    with open_memory(db, hashing_embedder) as memory:
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
    table = repr(sqlite3.connect(db).execute("SELECT * FROM audit_log").fetchall())
    assert not [m for m in markers if m in table]


def test_forget_keeps_the_namespaces_audit_entries_and_disabled_records_nothing(tmp_path, hashing_embedder):
    db = tmp_path / "memory.db"
    with open_memory(db, hashing_embedder) as memory:
        memory.add_memories(
            "bob", tuples=[TupleDraft(entity="Bob", relation="ran", object="10K", timestamp="2023-05-07")]
        )
        memory.forget("bob")
        assert [e.action for e in memory.store.audit.entries(namespace="bob")] == [
            "HybridMemory.add_memories",
            "HybridMemory.forget",
        ]
    with open_memory(db, hashing_embedder, **{"audit.enabled": False}) as memory:
        memory.search("anything", namespace="bob")
        assert len(memory.store.audit.entries()) == 2


#: How the tests call each exempt member of HybridMemory (``close`` last: it ends the facade).
EXEMPT_CALLS: dict[str, Callable[[HybridMemory], object]] = {
    "open": lambda m: HybridMemory.open(m.store.path, m.config, embedder=m.embedder, llm=m.llm).close(),
    "flush": lambda m: m.flush(),
    "embedder": lambda m: m.embedder,
    "llm": lambda m: m.llm,
    "scrub_pending": lambda m: m.scrub_pending,
    "answer_options": lambda m: m.answer_options(),
    "sessions_to_curate": lambda m: m.sessions_to_curate(retry_failed=True),
    "close": lambda m: m.close(),
}


def test_every_public_member_of_the_facade_is_audited_unless_listed_as_exempt():
    public = {name: member for name, member in vars(HybridMemory).items() if not name.startswith("_")}
    audited = {name for name, member in public.items() if audited_action(member) == f"HybridMemory.{name}"}
    assert audited | UNAUDITED.keys() == public.keys()
    assert not audited & UNAUDITED.keys()
    assert {"redactions", "undo_redaction", "confirm_redaction", "retry_pending_scrubs"} <= audited


def test_the_exempt_members_change_nothing_in_the_store(tmp_path, hashing_embedder):
    db = tmp_path / "memory.db"
    memory = HybridMemory.open(db, load_config(None, CONFIG), embedder=hashing_embedder, llm=EchoLLM())
    memory.add_memories(
        "alice", tuples=[TupleDraft(entity="Alice", relation="ran", object="10K", timestamp="2023-05-07")]
    )
    memory.enqueue([chat("s1", ("Alice", "I ran a 10K on Sunday."))])
    memory.search("Alice", namespace="alice")  # loads indexes, so flush and close have some to save
    assert EXEMPT_CALLS.keys() == UNAUDITED.keys()

    def rows() -> list[str]:
        conn = sqlite3.connect(db)
        try:
            return list(conn.iterdump())
        finally:
            conn.close()

    for name, call in EXEMPT_CALLS.items():
        before = rows()
        call(memory)
        assert rows() == before, f"HybridMemory.{name} changed the store"


def test_listing_undoing_and_confirming_redactions_leave_entries_without_text(tmp_path, hashing_embedder):
    db = tmp_path / "memory.db"
    with open_memory(db, hashing_embedder) as memory:
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
    assert [(e.action, e.namespace, e.refs.get("redactions"), e.outcome) for e in entries] == [
        ("HybridMemory.redactions", "alice", [first.id, second.id], "ok"),
        ("HybridMemory.undo_redaction", "alice", [first.id], "ok"),
        ("HybridMemory.confirm_redaction", "alice", [second.id], "ok"),
        ("HybridMemory.confirm_redaction", "alice", None, "conflict"),
        ("HybridMemory.retry_pending_scrubs", None, None, "ok"),
    ]
    table = repr(sqlite3.connect(db).execute("SELECT * FROM audit_log").fetchall())
    assert SSN not in table and "dana@example.org" not in table


def test_the_worker_and_other_actors_are_named(tmp_path):
    store = MemoryStore(tmp_path / "memory.db")
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


def test_the_table_refuses_updates_and_deletes(tmp_path):
    fill(tmp_path / "m.db", 3)
    conn = sqlite3.connect(tmp_path / "m.db")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE audit_log SET actor = 'someone' WHERE id = 2")
    with pytest.raises(sqlite3.IntegrityError, match="trim"):
        conn.execute("DELETE FROM audit_log WHERE id = 2")


@pytest.mark.parametrize(
    ("tamper", "first_bad", "says"),
    [
        ("UPDATE audit_log SET actor = 'someone-else' WHERE id = 4", 4, "does not match its hash"),
        ("UPDATE audit_log SET refs = '{\"read\":[99]}' WHERE id = 7", 7, "does not match its hash"),
        ("DELETE FROM audit_log WHERE id = 5", 5, "missing"),
        ("DELETE FROM audit_log WHERE id IN (3, 4)", 3, "3-4 is missing"),
        # Two entries swapped: each takes the other's place (id).
        (
            "UPDATE audit_log SET id = -6 WHERE id = 6; UPDATE audit_log SET id = 6 WHERE id = 2; "
            "UPDATE audit_log SET id = 2 WHERE id = -6",
            2,
            "moved",
        ),
        # Contents swapped, ids kept, hashes recomputed by someone who knows the recipe: the link breaks.
        ("SWAP_RECOMPUTED 3 8", 3, "does not follow"),
    ],
)
def test_verify_names_the_first_edited_deleted_or_swapped_entry(tmp_path, tamper, first_bad, says):
    db = tmp_path / "m.db"
    fill(db, 10)
    assert audit(db, "verify").exit_code == 0
    conn = raw(db)
    if tamper.startswith("SWAP_RECOMPUTED"):
        from hybridmem_local.storage.audit import entry_hash

        a, b = map(int, tamper.split()[1:])
        rows = {r[0]: r for r in conn.execute("SELECT * FROM audit_log WHERE id IN (?, ?)", (a, b))}
        for target, source in ((a, b), (b, a)):
            _, at, actor, action, namespace, refs, outcome, prev_hash, _ = rows[source]
            digest = entry_hash(target, at, actor, action, namespace, json.loads(refs), outcome, prev_hash)
            conn.execute(
                "UPDATE audit_log SET at = ?, actor = ?, refs = ?, prev_hash = ?, hash = ? WHERE id = ?",
                (at, actor, refs, prev_hash, digest, target),
            )
    else:
        conn.executescript(tamper)
    conn.close()
    result = audit(db, "verify")
    assert result.exit_code == 1
    assert f"broken at entry {first_bad}:" in result.output and says in result.output, result.output
    verdict = json.loads(audit(db, "verify", "--json").stdout)
    assert (verdict["ok"], verdict["first_bad_id"]) == (False, first_bad)


def test_trim_keeps_the_chain_verifiable_and_is_an_entry_itself(tmp_path):
    db = tmp_path / "m.db"
    fill(db, 6, days_ago=40)
    fill(db, 4, days_ago=1)
    result = audit(db, "trim", "--older-than-days", "30")
    assert result.exit_code == 0 and "trimmed 6 entries" in result.output, result.output
    store = MemoryStore(db)
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
    conn = raw(db)
    conn.execute("UPDATE audit_log SET outcome = 'forbidden' WHERE id = 8")
    conn.close()
    assert "broken at entry 8" in audit(db, "verify").output
    result = audit(db, "trim", "--older-than-days", "1")
    assert result.exit_code == 1 and "does not verify" in result.output
    store = MemoryStore(db)
    with pytest.raises(AuditChainError):
        store.audit.trim(utcnow())
    store.close()


def test_trim_takes_its_default_from_audit_retention_days(tmp_path):
    db = tmp_path / "m.db"
    fill(db, 3, days_ago=10)
    config = tmp_path / "config.yaml"
    config.write_text("audit:\n  retention_days: 5\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["audit", "trim", "--db", str(db), "--config", str(config)])
    assert result.exit_code == 0 and "trimmed 3 entries" in result.output
    assert "retention_days" in audit(db, "trim").output  # neither given: says what to set


def test_list_filters_by_key_namespace_and_time(tmp_path):
    db = tmp_path / "m.db"
    fill(db, 3, days_ago=10)
    fill(db, 3)
    listed = json.loads(audit(db, "list", "--key", "k1", "--json").output)
    assert [e["id"] for e in listed] == [2, 5] and {e["actor"] for e in listed} == {"k1"}
    since = (utcnow() - timedelta(days=1)).date().isoformat()
    assert [e["id"] for e in json.loads(audit(db, "list", "--since", since, "--json").output)] == [4, 5, 6]
    assert json.loads(audit(db, "list", "--namespace", "bob", "--json").output) == []
    table = audit(db, "list", "--limit", "2")
    assert table.exit_code == 0 and "read: 0" in table.output
    assert audit(tmp_path / "missing.db", "verify").exit_code == 1
    assert not (tmp_path / "missing.db").exists()


def _append_many(path: str, actor: str, count: int, start: multiprocessing.synchronize.Event) -> None:
    store = MemoryStore(path)
    start.wait()
    for i in range(count):
        scope = AuditScope(actor=actor, action="concurrent")
        scope.note("alice", read=[i])
        store.audit.record(scope)
    store.audit.flush()
    store.close()


def test_writers_of_two_processes_and_a_thread_at_once_extend_one_linear_chain(tmp_path):
    db = tmp_path / "m.db"
    MemoryStore(db).close()
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    processes = [context.Process(target=_append_many, args=(str(db), f"p{i}", 150, start)) for i in range(2)]
    for process in processes:
        process.start()
    thread = threading.Thread(target=_append_many, args=(str(db), "thread", 150, start))
    thread.start()
    start.set()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    thread.join(120)
    store = MemoryStore(db)
    entries = store.audit.entries()
    verdict = store.audit.verify()
    store.close()
    assert verdict.ok, verdict
    assert [e.id for e in entries] == list(range(1, 451))
    assert {e.actor for e in entries} == {"p0", "p1", "thread"}
    # Each writer's entries in its own order, interleaved with the others'.
    for actor in ("p0", "p1", "thread"):
        assert [e.refs["read"][0] for e in entries if e.actor == actor] == list(range(150))


def test_a_read_does_not_wait_for_another_connections_write_transaction(tmp_path, hashing_embedder):
    """While another connection holds the write lock, the search returns after the short lock
    wait; its entry is stored by the writer thread once the lock is free."""
    db = tmp_path / "memory.db"
    with open_memory(db, hashing_embedder) as memory:
        memory.add_memories("alice", tuples=[TupleDraft(entity="A", relation="b", object="c", timestamp="2023-05-05")])
        memory.search("warm up", namespace="alice")
        other = sqlite3.connect(db, isolation_level=None, timeout=0)
        other.execute("BEGIN IMMEDIATE")
        try:
            started = time.perf_counter()
            memory.search("while locked", namespace="alice")
            took = time.perf_counter() - started
        finally:
            time.sleep(0.2)
            other.execute("COMMIT")
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
    with open_memory(db, hashing_embedder, **{"store.encryption": "sqlcipher"}) as memory:
        memory.add_memories("alice", tuples=[TupleDraft(entity="A", relation="b", object="c", timestamp="2023-05-05")])
        other = memory.store.__class__.open(db, memory.config.store)
        other.conn.execute("BEGIN IMMEDIATE")
        memory.search("while locked", namespace="alice")  # handed to the writer thread
        other.conn.execute("COMMIT")
        other.close()
        assert memory.store.audit.flush(10)
        assert [e.action for e in memory.store.audit.entries()] == ["HybridMemory.add_memories", "HybridMemory.search"]
    assert b"HybridMemory" not in db.read_bytes()
    config = tmp_path / "config.yaml"
    config.write_text("store:\n  encryption: sqlcipher\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["audit", "verify", "--db", str(db), "--config", str(config)])
    assert result.exit_code == 0 and "ok: 2 entries" in result.output, result.output
