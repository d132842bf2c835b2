"""HybridMemory on a PostgreSQL store, and several of them on one database as the replicas of a
deployment are: each with its own local folder (``store.local_dir``: its index files and caches),
all of them seeing one another's writes, forgets and curation at once. The hashing embedder and
the echo LLM: this is plumbing, not ranking."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridmem_local.config import load_config
from hybridmem_local.errors import NotFoundError
from hybridmem_local.memory import HybridMemory
from tests.factories import EchoLLM, make_episode, make_session, make_tuple

pytestmark = pytest.mark.postgres

#: A word no hash, timestamp or random id can spell by chance (``z`` and ``q`` are no hex digits),
#: kept whole by BM25's tokenizer: a file that holds it holds the forgotten namespace.
SECRET = "zqpin4711"


@pytest.fixture
def replica(postgres_url, tmp_path, hashing_embedder) -> Iterator:
    """``replica(name)``: a HybridMemory on the test's database with its local files under
    ``tmp_path/name`` (another "host"), closed at the end."""
    opened: list[HybridMemory] = []

    def open_replica(name: str, **overrides) -> HybridMemory:
        settings = {
            "store.url": postgres_url,
            "store.local_dir": str(tmp_path / name),
            "curation.mode": "queue",
            "consolidation.every_n_sessions": 0,
            **overrides,
        }
        # The path is what a SQLite store would be; with store.url set it is never created.
        memory = HybridMemory.open(
            tmp_path / f"{name}.db", load_config(None, settings), embedder=hashing_embedder, llm=EchoLLM()
        )
        opened.append(memory)
        return memory

    yield open_replica
    for memory in opened:
        memory.close()


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def tuples_found(memory: HybridMemory, query: str, namespace: str) -> list[str]:
    return [hit.memory.render() for hit in memory.search(query, namespace=namespace).tuples]


def test_add_memories_and_search_round_trip(replica, tmp_path):
    memory = replica("r1")
    assert memory.store.backend.name == "postgresql"
    session = make_session("alice", 1)
    ids = memory.add_memories(
        "alice",
        episodes=[make_episode("Move", "Alice moved to Oslo.", ["s1:0"])],
        tuples=[make_tuple("Alice", "lives in", "Oslo", ["s1:1"])],
        session=session,
    )
    result = memory.search("Where does Alice live?", namespace="alice")
    assert {m.id for m in result.memories()} == set(ids)
    assert result.windows and {t.turn_id for h in result.windows for t in h.window.turns} <= {
        t.turn_id for t in session.turns
    }
    assert memory.get(ids[1], namespace="alice").source_turn_ids == ["s1:1"]
    assert [e.action for e in memory.history(ids[0])] == ["add"]
    assert memory.get_session("alice", "s1").session == session
    assert [m.id for m in memory.list("alice")] == ids
    memory.flush()
    # Nothing but caches on this host: the index files under the local folder, no SQLite store.
    assert not (tmp_path / "r1.db").exists()
    assert all(name.startswith("store.") for name in files_under(tmp_path / "r1"))
    assert any(name.startswith("store.indexes/alice/") for name in files_under(tmp_path / "r1"))


def test_a_second_replica_sees_the_first_ones_writes_at_once(replica):
    one, two = replica("r1"), replica("r2")
    (red,) = one.add_memories("alice", tuples=[make_tuple("Alice", "owns", "a red bicycle")])
    assert tuples_found(two, "bicycle", "alice") == [one.get(red).render()]  # two's indexes, built now
    # Written on one after two's indexes were built: two's next search has them, no wait.
    (blue,) = one.add_memories("alice", tuples=[make_tuple("Alice", "owns", "a blue bicycle")])
    assert {m.id for m in two.search("bicycle", namespace="alice").memories()} == {red, blue}
    one.enqueue([make_session("alice", 2)])
    windows = two.search("Session 2 turn 1 topic", namespace="alice").windows
    assert any(h.window.session_id == "s2" for h in windows)
    updated = one.update(blue, object="a green bicycle")
    one.delete(red)
    assert [m.id for m in two.search("bicycle", namespace="alice").memories()] == [updated.stored_id]
    # Two writes too, and one sees it.
    (tea,) = two.add_memories("alice", tuples=[make_tuple("Alice", "likes", "green tea")])
    assert tea in {m.id for m in one.search("green", namespace="alice").memories()}
    # A replica that starts late builds its indexes from the database.
    three = replica("r3")
    assert {m.id for m in three.search("green", namespace="alice").memories()} == {updated.stored_id, tea}


def test_curation_claimed_on_one_replica_is_searched_on_another(replica):
    """The shared queue: sessions enqueued through one replica, claimed and curated by a worker
    on another, searched through the first."""
    front, worker = replica("r1"), replica("w1")
    front.enqueue([make_session("alice", 1), make_session("bob", 1)])
    claimed = worker.claim_sessions("w1", 10, 60.0)
    assert sorted((s.namespace, s.session_id) for s in claimed) == [("alice", "s1"), ("bob", "s1")]
    assert front.claim_sessions("other", 10, 60.0) == []
    report = worker.curate_stored(claimed)
    assert report.curated == 2, report
    assert [r.curation_status for r in front.sessions("alice")] == ["curated"]
    said = front.search("Session 1 turn 2", namespace="alice").memories()
    assert said and all(m.source_session_id == "s1" for m in said)


def test_forget_on_one_replica_leaves_nothing_of_the_namespace_on_the_other(replica, tmp_path):
    one, two = replica("r1"), replica("r2")
    one.add_memories(
        "alice", tuples=[make_tuple("Alice", "has PIN", f"{SECRET} for her bank")], session=make_session("alice", 1)
    )
    one.add_memories("bob", tuples=[make_tuple("Bob", "likes", "tea")])
    for memory in (one, two):
        assert len(memory.search("PIN", namespace="alice").tuples) == 1
        memory.flush()
    two_alice = tmp_path / "r2" / "store.indexes" / "alice"
    assert files_under(two_alice), "replica two wrote no index files of alice"
    export = tmp_path / "alice.jsonl"
    one.export("alice", export)

    counts = one.forget("alice")
    assert counts["memories"] == 1 and counts["exports"] == 1
    assert not export.exists() and not (tmp_path / "r1" / "store.indexes" / "alice").exists()

    # Two's next use of any namespace sweeps what it holds of the forgotten one.
    assert tuples_found(two, "tea", "bob") == ["Bob — likes — tea (2023-05-01)"]
    assert files_under(two_alice) == []
    # Nothing of it through two.
    found = two.search("PIN", namespace="alice")
    assert found.memories() == [] and found.windows == []
    assert two.list("alice", status=None) == []
    with pytest.raises(NotFoundError):
        two.get_session("alice", "s1")
    assert list(two.store.sessions.select("alice")) == []
    for memory in (one, two):
        memory.close()
    left = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert left == []


def test_asking_a_replica_about_a_forgotten_namespace_brings_no_folder_back(replica, tmp_path):
    one, two = replica("r1"), replica("r2")
    one.add_memories("alice", tuples=[make_tuple("Alice", "has PIN", f"{SECRET} for her bank")])
    assert len(two.search("PIN", namespace="alice").tuples) == 1
    one.forget("alice")
    assert two.search("PIN", namespace="alice").memories() == []
    two.flush()
    assert not (tmp_path / "r2" / "store.indexes" / "alice").exists()


def test_an_export_of_one_replica_imports_on_another(replica, tmp_path):
    one, two = replica("r1"), replica("r2")
    session = make_session("alice", 1)
    ids = one.add_memories(
        "alice",
        episodes=[make_episode("Move", "Alice moved to Oslo.", ["s1:0"])],
        tuples=[make_tuple("Alice", "lives in", "Oslo", ["s1:1"]), make_tuple("Alice", "lives in", "Lima")],
        session=session,
    )
    one.delete(ids[2], reason="outdated")
    assert one.export("alice", tmp_path / "alice.jsonl") == 4
    before = [(m.kind, m.render(), m.status, m.source_turn_ids) for m in one.list("alice", status=None)]

    assert two.import_(tmp_path / "alice.jsonl", namespace="alice2") == {"sessions": 1, "memories": 3}
    after = [(m.kind, m.render(), m.status, m.source_turn_ids) for m in one.list("alice2", status=None)]
    assert after == before
    assert one.get_session("alice2", "s1").session.turns == session.turns
    assert tuples_found(one, "Where does Alice live?", "alice2")[:1] == ["Alice — lives in — Oslo (2023-05-01)"]
    assert one.export_records("alice2") == two.export_records("alice2")
