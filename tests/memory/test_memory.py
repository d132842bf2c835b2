"""HybridMemory end to end on real hnswlib and BM25 indexes over SQLite: the plumbing on the
hashing embedder, what ranks first for a paraphrased question on the real MiniLM."""

from __future__ import annotations

import random
from datetime import date

import pytest

from hybridmem_local.config import load_config
from hybridmem_local.errors import DuplicateSessionError, NotFoundError, QueueFullError
from hybridmem_local.llm.cache import CachedLLM
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import MemoryStatus
from tests.factories import make_episode, make_session, make_tuple

CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Dakar", "Bern", "Riga"]
THINGS = ["bicycle", "violin", "garden", "kayak", "novel", "camera", "telescope", "puppy", "quilt", "drone"]
PEOPLE = ["Ann", "Ben", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jon"]


def filler_tuples(n: int, seed: int = 0):
    rng = random.Random(seed)
    return [
        make_tuple(
            rng.choice(PEOPLE),
            rng.choice(["bought", "visited", "painted", "sold", "lent"]),
            f"a {rng.choice(THINGS)} in {rng.choice(CITIES)} #{i}",
            day=1 + i % 28,
        )
        for i in range(n)
    ]


@pytest.mark.slow
def test_search_finds_planted_memory_among_thousands(minilm_memory):
    memory = minilm_memory
    memory.add_memories("alice", tuples=filler_tuples(2000))
    memory.add_memories(
        "alice",
        episodes=[
            make_episode(f"Day {i}", f"{PEOPLE[i % 10]} spent the day on chores number {i}.") for i in range(300)
        ],
    )
    planted_tuple = make_tuple("Margaret", "adopted", "a three-legged greyhound named Biscuit", day=7)
    planted_episode = make_episode(
        "Greyhound adoption", "Margaret adopted Biscuit, a three-legged greyhound, from the shelter in Leeds."
    )
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
        ids = memory.add_memories(
            ns,
            tuples=filler_tuples(rng.randint(1, 30), seed=seed * 100 + round_),
            episodes=[make_episode(f"E{round_}", f"{ns} event {round_} in {rng.choice(CITIES)}")],
        )
        owned[ns].update(ids)
        for query_ns in ("a", "b"):
            got = {
                m.id
                for m in memory.search(
                    f"{rng.choice(PEOPLE)} {rng.choice(THINGS)}", namespace=query_ns, k=50
                ).memories()
            }
            assert got <= owned[query_ns]
            assert bool(got) == bool(owned[query_ns])


def test_deleted_memories_leave_search_and_keep_history(memory):
    ids = memory.add_memories(
        "alice", tuples=[make_tuple("Alice", "lives in", "Paris"), make_tuple("Alice", "lives in", "Rome")]
    )
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
    return [
        [
            (h.memory.id, round(h.score, 5))
            for h in mem.search(q, namespace=ns).episodes + mem.search(q, namespace=ns).tuples
        ]
        for q in queries
    ]


@pytest.mark.parametrize("damage", ["delete", "truncate", "garbage", "stale", "foreign_model"])
def test_damaged_index_is_repaired_on_open(tmp_path, hashing_embedder, damage):
    path = tmp_path / "m.db"
    queries = ["Who bought a bicycle in Oslo?", "Which city did Eve visit?", "painted a quilt"]
    with HybridMemory.open(path, embedder=hashing_embedder) as mem:
        ids = mem.add_memories(
            "alice", tuples=filler_tuples(300), episodes=[make_episode("Trip", "Eve visited Oslo by kayak.")]
        )
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
        with HybridMemory.open(path, embedder=hashing_embedder) as other:
            other.store.memories.set_status(ids[0], MemoryStatus.deleted, reason="test")
            other.store.memories.insert("alice", [make_tuple("Zed", "bought", "a bicycle in Oslo")])
    elif damage == "foreign_model":
        manifest = index_dir / "tuple.manifest.json"
        built = manifest.read_text()
        assert hashing_embedder.model_id in built
        manifest.write_text(built.replace(hashing_embedder.model_id, "some-other-model"))
    with HybridMemory.open(path, embedder=hashing_embedder) as mem:
        repaired = _search_ids(mem, queries)
        memory_ids = {m.id for m in mem.list("alice")}
    fresh_path = tmp_path / "m.db.indexes"
    import shutil

    shutil.rmtree(fresh_path)
    with HybridMemory.open(path, embedder=hashing_embedder) as mem:
        assert _search_ids(mem, queries) == repaired
        assert {m.id for q in queries for m in mem.search(q, namespace="alice").memories()} <= memory_ids


def test_index_sees_other_process_writes(tmp_path, hashing_embedder):
    path = tmp_path / "m.db"
    with (
        HybridMemory.open(path, embedder=hashing_embedder) as reader,
        HybridMemory.open(path, embedder=hashing_embedder) as writer,
    ):
        reader.add_memories("alice", tuples=[make_tuple("Alice", "owns", "a red bicycle")])
        assert len(reader.search("bicycle", namespace="alice").tuples) == 1
        (new_id,) = writer.add_memories("alice", tuples=[make_tuple("Alice", "owns", "a blue bicycle")])
        assert new_id in {m.id for m in reader.search("bicycle", namespace="alice").memories()}


#: What forget must leave no byte of: a word that no hex digest, random id or timestamp can spell
#: by chance (``z`` and ``q`` are not hex digits), kept whole by BM25's tokenizer and stemmer so
#: that an index file would show it too. The bare "4711" this test looked for before turned up in
#: 10 of 1,000 runs although nothing of alice was left: in the audit chain's SHA-256 hashes, a
#: microsecond timestamp and an index file's random generation id, all new on every run.
SECRET = "zqpin4711"


def test_forget_leaves_nothing_of_the_namespace(tmp_path, hashing_embedder):
    path = tmp_path / "m.db"
    with HybridMemory.open(path, embedder=hashing_embedder) as mem:
        mem.add_memories(
            "alice", tuples=[make_tuple("Alice", "has PIN", f"{SECRET} for her bank")], session=make_session("alice", 1)
        )
        mem.add_memories("bob", tuples=[make_tuple("Bob", "likes", "tea")])
        mem.search("PIN", namespace="alice")
        export = tmp_path / "alice.jsonl"
        mem.export("alice", export)
        counts = mem.forget("alice")
        assert counts["memories"] == 1 and counts["exports"] == 1
        assert counts["scrub_pending"] == 0  # no other connection: the WAL was checkpointed and truncated
        assert not export.exists()
        assert not (tmp_path / "m.db.indexes" / "alice").exists()
        assert mem.search("PIN", namespace="alice").memories() == []
        assert len(mem.search("tea", namespace="bob").tuples) == 1
    raw = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert SECRET.encode() not in raw


def test_export_import_round_trip(tmp_path, hashing_embedder):
    src, dst = tmp_path / "a.db", tmp_path / "b.db"
    with HybridMemory.open(src, embedder=hashing_embedder) as mem:
        session = make_session("alice", 1)
        ids = mem.add_memories(
            "alice",
            episodes=[make_episode("Move", "Alice moved to Oslo.", ["s1:0"])],
            tuples=[make_tuple("Alice", "lives in", "Oslo", ["s1:1"]), make_tuple("Alice", "lives in", "Lima")],
            session=session,
        )
        mem.delete(ids[2], reason="outdated")
        mem.export("alice", tmp_path / "alice.jsonl")
        before = [(m.kind, m.render(), m.status, m.source_turn_ids) for m in mem.list("alice", status=None)]
    with HybridMemory.open(dst, embedder=hashing_embedder) as mem:
        assert mem.import_(tmp_path / "alice.jsonl", namespace="alice2") == {"sessions": 1, "memories": 3}
        after = [(m.kind, m.render(), m.status, m.source_turn_ids) for m in mem.list("alice2", status=None)]
        assert after == before
        assert mem.store.sessions.get("alice2", "s1").session.turns == session.turns
        assert {h.memory.render() for h in mem.search("Where does Alice live?", namespace="alice2").tuples[:1]} == {
            "Alice — lives in — Oslo (2023-05-01)"
        }


# ----------------------------------------------------------------------------- API: update, filters, list, add_session


def test_update_supersedes_with_history_and_search_follows(memory):
    (old_id,) = memory.add_memories(
        "alice", tuples=[make_tuple("Alice", "lives in", "Paris", ["s1:0"])], session=make_session("alice", 1)
    )
    assert memory.search("Where does Alice live?", namespace="alice").tuples[0].memory.id == old_id
    new = memory.update(old_id, object="Rome", reason="moved")
    assert new.id != old_id and new.object == "Rome" and new.status == MemoryStatus.active
    assert new.source_turn_ids == ["s1:0"] and new.source_session_id == "s1"  # provenance carried over
    old = memory.get(old_id)
    assert old.status == MemoryStatus.superseded and old.superseded_by == new.id
    assert [e.action for e in memory.history(old_id)] == ["add", "superseded"]
    (event,) = memory.history(new.id)
    assert event.action == "update" and event.before["object"] == "Paris" and event.after["object"] == "Rome"
    assert memory.history(old_id)[-1].reason == "moved"
    assert [h.memory.id for h in memory.search("Where does Alice live?", namespace="alice").tuples] == [new.id]
    assert memory.update(new.id, object="Rome") == new  # no change, nothing written
    assert len(memory.history(new.id)) == 1
    with pytest.raises(ValueError, match="superseded.*successor"):
        memory.update(old_id, object="Oslo")
    with pytest.raises(ValueError, match="title"):
        memory.update(new.id, title="tuples have no title")
    with pytest.raises(ValueError, match="s9:9"):
        memory.update(new.id, source_turn_ids=["s9:9"])
    with pytest.raises(NotFoundError):
        memory.update(10_000, object="x")


def test_search_filters_by_kind_date_and_score(memory):
    memory.add_memories(
        "alice",
        episodes=[make_episode("Kayak trip", "Alice paddled her kayak on the lake.", day=3)],
        tuples=[make_tuple("Alice", "bought", "a kayak", day=2), make_tuple("Alice", "sold", "her kayak", day=20)]
        + filler_tuples(60),
    )
    query = "Alice kayak"
    assert memory.search(query, namespace="alice", kinds=["tuple"]).episodes == []
    assert memory.search(query, namespace="alice", kinds=["episode"]).tuples == []
    late = memory.search(query, namespace="alice", k=2, since=date(2023, 5, 20))
    assert [h.memory.object for h in late.tuples[:1]] == ["her kayak"]
    assert all(h.memory.timestamp >= "2023-05-20" for h in late.tuples) and late.episodes == []
    # Filler tuples rank above the matches deep down: the search goes deeper until k pass.
    early = memory.search(query, namespace="alice", k=1, until=date(2023, 5, 2))
    assert all(h.memory.timestamp <= "2023-05-02" for h in early.tuples) and len(early.tuples) == 2
    everything = memory.search(query, namespace="alice", k=50)
    cut = sorted(h.score for h in everything.tuples)[len(everything.tuples) // 2]
    strong = memory.search(query, namespace="alice", k=50, min_score=cut)
    assert strong.tuples and all(h.score >= cut for h in strong.tuples)
    assert len(strong.tuples) < len(everything.tuples)


def test_list_pages_by_kind_and_status(memory):
    ids = memory.add_memories("alice", episodes=[make_episode("One", "First.")], tuples=filler_tuples(5))
    memory.delete(ids[1])
    assert [m.id for m in memory.list("alice")] == [ids[0], *ids[2:]]
    assert [m.id for m in memory.list("alice", kind="tuple", limit=2, offset=1)] == ids[3:5]
    assert [m.id for m in memory.list("alice", status=MemoryStatus.deleted)] == [ids[1]]
    assert len(memory.list("alice", status=None)) == 6
    with pytest.raises(ValueError, match="negative"):
        memory.list("alice", offset=-1)


def test_add_session_returns_what_it_stored_and_curated(tmp_path, hashing_embedder):
    from tests.curation.test_curator import ScriptedLLM, reply_citing

    llm = ScriptedLLM(reply_citing(lambda shown: shown[:2]))
    with HybridMemory.open(tmp_path / "m.db", embedder=hashing_embedder, llm=llm) as mem:
        session = make_session("alice", 1)
        result = mem.add_session(session)
        assert result.session.curation_status == "curated" and result.session.session.turns == session.turns
        assert {m.kind for m in result.memories} == {"episode", "tuple"}
        assert {m.id for m in result.memories} == {m.id for m in mem.list("alice")}
        assert all(m.source_session_id == "s1" for m in result.memories)
        assert result.report.curated == 1 and result.report.memories == 2 and result.report.usage.requests >= 1
        again = mem.add_session(session)
        assert again.report.skipped == 1 and again.memories == [] and len(llm.batches) == 1
        mem.config.curation.mode = "queue"
        queued = mem.add_session(make_session("alice", 2))
        assert queued.session.curation_status == "pending" and queued.memories == [] and queued.report.stored == 1


def test_answer_many_retrieves_per_question_and_answers_in_one_batch(tmp_path, hashing_embedder):
    import json

    from tests.curation.test_curator import ScriptedLLM

    llm = ScriptedLLM(
        lambda request: json.dumps(
            {
                "answer": "tea" if "What does Alice drink?" in request.messages[-1].content else "Rome",
                "cited_memory_ids": ["T1"],
            }
        )
    )
    # The scripted model writes the JSON answer schema.
    with HybridMemory.open(
        tmp_path / "m.db", load_config(overrides={"answering.mode": "json"}), embedder=hashing_embedder, llm=llm
    ) as mem:
        mem.add_memories(
            "alice", tuples=[make_tuple("Alice", "lives in", "Rome"), make_tuple("Alice", "drinks", "tea")]
        )
        answers = mem.answer_many(["Where does Alice live?", "What does Alice drink?"], namespace="alice")
    assert [a.answer for a in answers] == ["Rome", "tea"]
    assert len(llm.batches) == 1 and len(llm.batches[0]) == 2
    assert all(len(a.cited) == 1 and a.cited[0].namespace == "alice" for a in answers)  # "T1" resolved per question


def test_ids_checked_against_a_namespace_and_stats_of_one_namespace(memory):
    [alice_id] = memory.add_memories("alice", tuples=[make_tuple("Alice", "lives in", "Paris")])
    [bob_id] = memory.add_memories("bob", tuples=[make_tuple("Bob", "lives in", "Rome")])
    assert memory.get(alice_id, namespace="alice").id == alice_id
    assert memory.get(bob_id).namespace == "bob"  # no namespace: any
    # Another namespace's memory is reported exactly as a missing one.
    for missing in (bob_id, 10_000):
        for call in (memory.get, memory.history, memory.delete):
            with pytest.raises(NotFoundError, match=f"no memory with id {missing} in namespace 'alice'"):
                call(missing, namespace="alice")
    assert memory.get(bob_id).status == MemoryStatus.active  # the refused delete changed nothing
    with pytest.raises(NotFoundError, match="no consolidation run 1 in namespace 'alice'"):
        memory.undo(1, namespace="alice")
    stats = memory.stats("alice")
    assert stats.namespaces == ["alice"] and stats.counts["tuples_active"] == 1
    assert all(name.startswith("alice/") for name in stats.index_sizes)
    assert memory.stats().namespaces == ["alice", "bob"]


def test_enqueue_stores_all_or_none_within_the_queue_bound(tmp_path):
    with HybridMemory.open(tmp_path / "m.db") as memory:  # no embedder: raw turns only
        first = [make_session("alice", 1), make_session("bob", 2)]
        records = memory.enqueue(first, max_pending=3)
        assert [(r.session, r.curation_status) for r in records] == [(s, "pending") for s in first]
        assert memory.get_session("bob", "s2") == records[1]
        with pytest.raises(QueueFullError, match="holds 2 sessions; adding 2 would pass"):
            memory.enqueue([make_session("alice", 3), make_session("alice", 4)], max_pending=3)
        with pytest.raises(DuplicateSessionError):  # s5 is new, s1 is not: neither is stored
            memory.enqueue([make_session("alice", 5), make_session("alice", 1)])
        for session_id in ("s3", "s4", "s5"):
            with pytest.raises(NotFoundError):
                memory.get_session("alice", session_id)
        assert memory.sessions_to_curate() == first
        assert memory.mark_curation_failed(first, "LLMError: down") == 2
        assert memory.get_session("alice", "s1").curation_error == "LLMError: down"
        assert memory.sessions_to_curate() == [] and memory.sessions_to_curate(retry_failed=True) == first


class OwnedLLM:
    """An LLM that records whether it was closed (the real backends free a model or a connection)."""

    model_id = "test:owned"
    closed = False

    def generate(self, requests):
        raise AssertionError("not called")

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def close(self) -> None:
        self.closed = True


def test_a_given_llm_stays_the_callers_to_close(tmp_path):
    given = OwnedLLM()
    HybridMemory.open(tmp_path / "m.db", llm=given).close()
    assert not given.closed
    inner = OwnedLLM()
    CachedLLM(inner, tmp_path / "cache.sqlite").close()
    assert not inner.closed
    CachedLLM(inner, tmp_path / "cache.sqlite", owns_inner=True).close()  # what build_llm makes
    assert inner.closed
