"""HybridMemory end to end on the real MiniLM embedder and real hnswlib indexes."""

from __future__ import annotations

import random

import pytest

from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import MemoryStatus
from hybridmem_local.store import NotFoundError
from tests.factories import make_episode, make_session, make_tuple

CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Dakar", "Bern", "Riga"]
THINGS = ["bicycle", "violin", "garden", "kayak", "novel", "camera", "telescope", "puppy", "quilt", "drone"]
PEOPLE = ["Ann", "Ben", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jon"]


def filler_tuples(n: int, seed: int = 0):
    rng = random.Random(seed)
    return [
        make_tuple(rng.choice(PEOPLE), rng.choice(["bought", "visited", "painted", "sold", "lent"]),
                   f"a {rng.choice(THINGS)} in {rng.choice(CITIES)} #{i}", day=1 + i % 28)
        for i in range(n)
    ]


@pytest.mark.slow
def test_search_finds_planted_memory_among_thousands(memory):
    memory.add_memories("alice", tuples=filler_tuples(2000))
    memory.add_memories("alice", episodes=[make_episode(f"Day {i}", f"{PEOPLE[i % 10]} spent the day on chores number {i}.") for i in range(300)])
    planted_tuple = make_tuple("Margaret", "adopted", "a three-legged greyhound named Biscuit", day=7)
    planted_episode = make_episode("Greyhound adoption", "Margaret adopted Biscuit, a three-legged greyhound, from the shelter in Leeds.")
    (tid, eid) = memory.add_memories("alice", episodes=[planted_episode], tuples=[planted_tuple])[::-1]
    result = memory.search("Which dog did Margaret adopt?", namespace="alice")
    assert result.tuples[0].memory.id == tid
    assert result.episodes[0].memory.id == eid
    assert len(result.episodes) == 10 and len(result.tuples) == 20
    result = memory.search("Which dog did Margaret adopt?", namespace="alice", k=3)
    assert len(result.episodes) == 3 and len(result.tuples) == 6
    scores = [h.score for h in result.tuples]
    assert scores == sorted(scores, reverse=True)


def test_results_respect_k_when_store_is_small(memory):
    memory.add_memories("alice", tuples=filler_tuples(5), episodes=[make_episode("One", "Only one episode.")])
    result = memory.search("anything", namespace="alice", k=10)
    assert len(result.tuples) == 5 and len(result.episodes) == 1
    assert memory.search("anything", namespace="nobody").memories() == []
    with pytest.raises(ValueError, match="k must be at least 1"):
        memory.search("anything", namespace="alice", k=0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_namespaces_never_see_each_other(memory, seed):
    rng = random.Random(seed)
    owned: dict[str, set[int]] = {"a": set(), "b": set()}
    for round_ in range(6):
        ns = rng.choice(["a", "b"])
        ids = memory.add_memories(ns, tuples=filler_tuples(rng.randint(1, 30), seed=seed * 100 + round_),
                                  episodes=[make_episode(f"E{round_}", f"{ns} event {round_} in {rng.choice(CITIES)}")])
        owned[ns].update(ids)
        for query_ns in ("a", "b"):
            got = {m.id for m in memory.search(f"{rng.choice(PEOPLE)} {rng.choice(THINGS)}", namespace=query_ns, k=50).memories()}
            assert got <= owned[query_ns]
            assert bool(got) == bool(owned[query_ns])


def test_deleted_memories_leave_search_and_keep_history(memory):
    ids = memory.add_memories("alice", tuples=[make_tuple("Alice", "lives in", "Paris"), make_tuple("Alice", "lives in", "Rome")])
    memory.delete(ids[0], reason="moved")
    found = {m.id for m in memory.search("Where does Alice live?", namespace="alice").memories()}
    assert found == {ids[1]}
    assert memory.get(ids[0]).status == MemoryStatus.deleted
    assert [e.action for e in memory.history(ids[0])] == ["add", "deleted"]
    with pytest.raises(NotFoundError):
        memory.history(10_000)


def test_provenance_must_name_real_turns(memory):
    session = make_session("alice", 1)
    memory.add_memories("alice", tuples=[make_tuple("Alice", "said", "hi", ["s1:0"])], session=session)
    memory.add_memories("alice", tuples=[make_tuple("Alice", "said", "hello again", ["s1:1"])])
    with pytest.raises(ValueError, match="s9:9"):
        memory.add_memories("alice", tuples=[make_tuple("Alice", "said", "bye", ["s9:9"])])
    assert len(memory.list("alice")) == 2


def _search_ids(mem, queries, ns="alice"):
    return [[(h.memory.id, round(h.score, 5)) for h in mem.search(q, namespace=ns).episodes + mem.search(q, namespace=ns).tuples] for q in queries]


@pytest.mark.parametrize("damage", ["delete", "truncate", "garbage", "stale", "foreign_model"])
def test_damaged_index_is_repaired_on_open(tmp_path, minilm, damage):
    path = tmp_path / "m.db"
    queries = ["Who bought a bicycle in Oslo?", "Which city did Eve visit?", "painted a quilt"]
    with HybridMemory.open(path, embedder=minilm) as mem:
        ids = mem.add_memories("alice", tuples=filler_tuples(300), episodes=[make_episode("Trip", "Eve visited Oslo by kayak.")])
        mem.search("warm up", namespace="alice")  # load + persist indexes
    index_dir = tmp_path / "m.db.indexes" / "alice"
    (graph,) = index_dir.glob("tuple.*.hnsw")
    if damage == "delete":
        for f in index_dir.iterdir():
            f.unlink()
    elif damage == "truncate":
        graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 3])
    elif damage == "garbage":
        graph.write_bytes(b"\x00garbage" * 100)
    elif damage == "stale":
        # Another writer changes SQLite while the saved index stays as it was.
        with HybridMemory.open(path, embedder=minilm) as other:
            other.store.set_status(ids[0], MemoryStatus.deleted, reason="test")
            other.store.insert_memories("alice", [make_tuple("Zed", "bought", "a bicycle in Oslo")])
    elif damage == "foreign_model":
        manifest = index_dir / "tuple.manifest.json"
        manifest.write_text(manifest.read_text().replace("all-minilm-l6-v2", "some-other-model"))
    with HybridMemory.open(path, embedder=minilm) as mem:
        repaired = _search_ids(mem, queries)
        memory_ids = {m.id for m in mem.list("alice")}
    fresh_path = tmp_path / "m.db.indexes"
    import shutil

    shutil.rmtree(fresh_path)
    with HybridMemory.open(path, embedder=minilm) as mem:
        assert _search_ids(mem, queries) == repaired
        assert {m.id for q in queries for m in mem.search(q, namespace="alice").memories()} <= memory_ids


def test_index_sees_other_process_writes(tmp_path, minilm):
    path = tmp_path / "m.db"
    with HybridMemory.open(path, embedder=minilm) as reader, HybridMemory.open(path, embedder=minilm) as writer:
        reader.add_memories("alice", tuples=[make_tuple("Alice", "owns", "a red bicycle")])
        assert len(reader.search("bicycle", namespace="alice").tuples) == 1
        (new_id,) = writer.add_memories("alice", tuples=[make_tuple("Alice", "owns", "a blue bicycle")])
        assert new_id in {m.id for m in reader.search("bicycle", namespace="alice").memories()}


def test_forget_leaves_nothing_of_the_namespace(tmp_path, minilm):
    path = tmp_path / "m.db"
    with HybridMemory.open(path, embedder=minilm) as mem:
        secret = "Alice's bank PIN is 4711"
        mem.add_memories("alice", tuples=[make_tuple("Alice", "has PIN", "4711 for her bank")], session=make_session("alice", 1))
        mem.add_memories("bob", tuples=[make_tuple("Bob", "likes", "tea")])
        mem.search("PIN", namespace="alice")
        export = tmp_path / "alice.jsonl"
        mem.export("alice", export)
        counts = mem.forget("alice")
        assert counts["memories"] == 1 and counts["exports"] == 1
        assert not export.exists()
        assert not (tmp_path / "m.db.indexes" / "alice").exists()
        assert mem.search("PIN", namespace="alice").memories() == []
        assert len(mem.search("tea", namespace="bob").tuples) == 1
    raw = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert b"4711" not in raw and secret.encode() not in raw


def test_export_import_round_trip(tmp_path, minilm):
    src, dst = tmp_path / "a.db", tmp_path / "b.db"
    with HybridMemory.open(src, embedder=minilm) as mem:
        session = make_session("alice", 1)
        ids = mem.add_memories("alice", episodes=[make_episode("Move", "Alice moved to Oslo.", ["s1:0"])],
                               tuples=[make_tuple("Alice", "lives in", "Oslo", ["s1:1"]), make_tuple("Alice", "lives in", "Lima")],
                               session=session)
        mem.delete(ids[2], reason="outdated")
        mem.export("alice", tmp_path / "alice.jsonl")
        before = [(m.kind, m.render(), m.status, m.source_turn_ids) for m in mem.list("alice", status=None)]
    with HybridMemory.open(dst, embedder=minilm) as mem:
        assert mem.import_(tmp_path / "alice.jsonl", namespace="alice2") == {"sessions": 1, "memories": 3}
        after = [(m.kind, m.render(), m.status, m.source_turn_ids) for m in mem.list("alice2", status=None)]
        assert after == before
        assert mem.store.get_session("alice2", "s1").session.turns == session.turns
        assert {h.memory.render() for h in mem.search("Where does Alice live?", namespace="alice2").tuples[:1]} == {"Alice — lives in — Oslo (2023-05-01)"}
