"""BM25 indexes on real bm25s + PyStemmer: matching, persistence, repair, isolation."""

from __future__ import annotations

import os
import random
import stat
import time

import numpy as np
import pytest

from hybridmem_local.indexes.bm25 import LexicalIndex, LexicalManifest, bm25_document
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Episode, MemoryStatus, RelationalTuple
from hybridmem_local.text.stems import tokenize
from tests.factories import make_episode, make_tuple

DOCS = {
    10: "Caroline went running by the lake every morning",
    20: "Melanie paints sunsets and sells her paintings",
    30: "The support group meets on Tuesdays",
    40: "Yes, of course.",
    50: "Caroline adopted a greyhound from the shelter",
}


def build(tmp_path, docs=DOCS, recipe="test") -> LexicalIndex:
    index = LexicalIndex(tmp_path / "ns", "tuple", recipe)
    index.sync(np.array(sorted(docs)), lambda ids: [docs[int(i)] for i in ids])
    return index


def ids_of(hits):
    return [i for i, _ in hits]


# ----------------------------------------------------------------------------- matching


def test_tokenizer_stems_and_drops_stopwords():
    assert tokenize(["The runners were running to the paintings"]) == [["runner", "were", "run", "paint"]]


def test_search_matches_stems_and_returns_only_documents_sharing_a_term(tmp_path):
    index = build(tmp_path)
    assert ids_of(index.search("who runs?", 10)) == [10]
    assert ids_of(index.search("painted sunset", 10)) == [20]
    assert set(ids_of(index.search("Caroline", 10))) == {10, 50}
    assert index.search("the of and", 10) == []  # stopwords only
    assert index.search("zeppelin", 10) == []  # unknown word
    assert index.search("Caroline", 0) == []
    assert len(index.search("Caroline greyhound", 1)) == 1
    scores = [s for _, s in index.search("Caroline greyhound shelter", 10)]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1] > 0


def test_episode_text_has_title_summary_details_once_each():
    episode = Episode(title="Zoo trip", summary="Saw pandas", details="Saw pandas", timestamp="2023-05-01")
    assert bm25_document(episode) == "Zoo trip\nSaw pandas"
    tup = RelationalTuple(entity="Ann", relation="likes", object="tea", timestamp="2023")
    assert bm25_document(tup) == tup.render()


def test_corpus_without_any_term_and_empty_corpus_find_nothing(tmp_path):
    index = build(tmp_path, {1: "Yes!", 2: "and the"})
    assert len(index) == 2 and ids_of(index.search("yes", 5)) == [1]
    index = build(tmp_path, {1: "the", 2: "of a"})
    assert index.search("the", 5) == []
    index.save()
    reloaded = LexicalIndex(tmp_path / "ns", "tuple", "test")
    assert not reloaded.sync(np.array([1, 2]), lambda ids: pytest.fail("should load, not rebuild")).rebuilt
    empty = build(tmp_path / "e", {})
    assert len(empty) == 0 and empty.search("anything", 5) == []


def test_documents_added_and_removed_one_by_one_score_as_a_fresh_build(tmp_path):
    rng = random.Random(3)
    words = [f"w{i}" for i in range(40)] + ["kayak", "Lima", "violin"]
    docs = {i: " ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for i in range(1, 300)}
    queries = ("kayak Lima", "w1 w1 w2", "violin w30", "w7")
    index = build(tmp_path, docs)
    # Searching between the changes fills the per-query state they must drop.
    [index.search(query, 25) for query in queries]
    gone = sorted(docs)[::5]
    index.remove(gone)
    [index.search(query, 25) for query in queries]
    added = {1000 + i: " ".join(rng.choice(words) for _ in range(8)) for i in range(40)}
    index.add(np.array(sorted(added)), [added[i] for i in sorted(added)])
    current = {**{i: t for i, t in docs.items() if i not in gone}, **added}
    fresh = build(tmp_path / "fresh", current)
    index.save()
    reloaded = LexicalIndex(tmp_path / "ns", "tuple", "test")
    assert reloaded.sync(np.array(sorted(current)), lambda ids: pytest.fail("should load, not rebuild")).added == 0
    for query in queries:
        expected = fresh.search(query, 25)
        for candidate in (index, reloaded):
            got = candidate.search(query, 25)
            assert [i for i, _ in got] == [i for i, _ in expected]
            assert np.allclose([s for _, s in got], [s for _, s in expected])
    assert len(index) == len(reloaded) == len(current)


# ----------------------------------------------------------------------------- persistence and repair


def builds(index: LexicalIndex) -> set[str]:
    return {p.name.split(".")[2] for p in index.files() if p.name != "tuple.bm25.json"}


def test_saved_index_loads_without_rebuild_and_is_private(tmp_path):
    index = build(tmp_path)
    index.save()
    files = index.files()
    assert len(builds(index)) == 1 and (tmp_path / "ns" / "tuple.bm25.json") in files
    assert {p.name.split(".", 3)[3] for p in files if p.name != "tuple.bm25.json"} >= {
        "labels.npy",
        "vocab.json",
        "data.npy",
    }
    assert stat.S_IMODE((tmp_path / "ns").stat().st_mode) == 0o700
    for path in files:
        assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600, path
    reloaded = LexicalIndex(tmp_path / "ns", "tuple", "test")
    report = reloaded.sync(np.array(sorted(DOCS)), lambda ids: pytest.fail("should load, not rebuild"))
    assert not report.rebuilt
    assert reloaded.search("Caroline greyhound", 5) == index.search("Caroline greyhound", 5)


@pytest.mark.parametrize("damage", ["manifest_gone", "build_gone", "truncated", "garbage", "recipe", "stale"])
def test_damaged_index_is_rebuilt_and_stale_one_caught_up(tmp_path, damage):
    index = build(tmp_path)
    index.save()
    expected = index.search("Caroline greyhound running", 5)
    directory = tmp_path / "ns"
    (build_id,) = builds(index)
    docs, recipe = dict(DOCS), "test"
    if damage == "manifest_gone":
        (directory / "tuple.bm25.json").unlink()
    elif damage == "build_gone":
        for path in directory.glob(f"tuple.bm25.{build_id}.*"):
            path.unlink()
    elif damage == "truncated":
        data = directory / f"tuple.bm25.{build_id}.data.npy"
        data.write_bytes(data.read_bytes()[:20])
    elif damage == "garbage":
        (directory / f"tuple.bm25.{build_id}.vocab.json").write_bytes(b"\x00not json")
    elif damage == "recipe":
        recipe = "another recipe"
    elif damage == "stale":
        del docs[50]  # SQLite no longer holds memory 50 as active
        expected = [hit for hit in build(tmp_path / "fresh", docs).search("Caroline greyhound running", 5)]
    repaired = LexicalIndex(directory, "tuple", recipe)
    report = repaired.sync(np.array(sorted(docs)), lambda ids: [docs[int(i)] for i in ids])
    # A stale index is caught up (the document SQLite dropped removed), anything else rebuilt.
    assert (report.removed == 1 and not report.rebuilt) if damage == "stale" else report.rebuilt
    assert repaired.search("Caroline greyhound running", 5) == expected
    repaired.save()
    # The manifest names the new build; a build it replaced is removed, a fresh one no manifest
    # names any more (manifest gone) stays until it is old (it could be a concurrent save's).
    committed = LexicalManifest.model_validate_json((directory / "tuple.bm25.json").read_text()).build
    assert committed in builds(repaired) and committed != build_id
    assert builds(repaired) <= {committed, build_id}


def test_a_crashed_save_leaves_the_previous_index_usable(tmp_path):
    index = build(tmp_path)
    index.save()
    expected = index.search("Caroline", 5)
    orphan = tmp_path / "ns" / "tuple.bm25.deadbeef0000.labels.npy"  # a build whose manifest was never written
    orphan.write_bytes(b"partial")
    old_orphan = tmp_path / "ns" / "tuple.bm25.json.0badc0ffee00.tmp"  # a manifest a crashed save never switched to
    old_orphan.write_bytes(b"{")
    an_hour_ago = time.time() - 3600
    os.utime(old_orphan, (an_hour_ago, an_hour_ago))
    reloaded = LexicalIndex(tmp_path / "ns", "tuple", "test")
    assert not reloaded.sync(np.array(sorted(DOCS)), lambda ids: pytest.fail("no rebuild")).rebuilt
    assert reloaded.search("Caroline", 5) == expected
    reloaded.build(np.array(sorted(DOCS)), [DOCS[i] for i in sorted(DOCS)])
    reloaded.save()
    # A save removes unnamed files only once they are old: a fresh one may be a concurrent save's.
    assert reloaded.search("Caroline", 5) == expected
    assert orphan.exists() and not old_orphan.exists()
    reloaded.delete_files()
    assert not orphan.exists()


# ----------------------------------------------------------------------------- through HybridMemory


@pytest.fixture
def lexical_memory(tmp_path, hashing_embedder):
    with HybridMemory.open(tmp_path / "m.db", embedder=hashing_embedder) as mem:
        mem.config.retrieval.mode = "lexical"
        yield mem


def test_deleted_memory_leaves_the_lexical_index(lexical_memory):
    mem = lexical_memory
    ids = mem.add_memories(
        "alice", tuples=[make_tuple("Alice", "lives in", "Paris"), make_tuple("Alice", "lives in", "Rome")]
    )
    assert {m.id for m in mem.search("Where does Alice live?", namespace="alice").memories()} == set(ids)
    mem.delete(ids[0], reason="moved")
    assert [m.id for m in mem.search("Where does Alice live?", namespace="alice").memories()] == [ids[1]]
    assert mem.search("Paris", namespace="alice").memories() == []


def test_writes_are_caught_up_without_rebuilding_the_index(lexical_memory, monkeypatch):
    mem = lexical_memory
    mem.add_memories("alice", tuples=[make_tuple("Alice", "lives in", "Paris")])
    assert len(mem.search("Paris", namespace="alice").tuples) == 1  # first use: built
    monkeypatch.setattr(LexicalIndex, "build", lambda *args: pytest.fail("a write must not rebuild the BM25 index"))
    (rome,) = mem.add_memories("alice", tuples=[make_tuple("Alice", "moved to", "Rome")])
    assert [h.memory.id for h in mem.search("Rome", namespace="alice").tuples] == [rome]
    mem.delete(rome)
    assert mem.search("Rome", namespace="alice").tuples == []


def test_another_writer_is_caught_up_and_saved_indexes_are_reused(tmp_path, hashing_embedder):
    path = tmp_path / "m.db"
    with HybridMemory.open(path, embedder=hashing_embedder) as reader:
        reader.config.retrieval.mode = "lexical"
        reader.add_memories("alice", episodes=[make_episode("Bakery", "Alice opened a bakery in Lyon.")])
        assert len(reader.search("bakery", namespace="alice").episodes) == 1
        with HybridMemory.open(path, embedder=hashing_embedder) as writer:
            (new_id,) = writer.add_memories("alice", episodes=[make_episode("Second bakery", "Bob bought the bakery.")])
            old_id = next(m.id for m in writer.list("alice") if m.id != new_id)
            writer.store.memories.set_status(old_id, MemoryStatus.deleted, reason="test")
        assert [h.memory.id for h in reader.search("bakery", namespace="alice").episodes] == [new_id]
    manifest = tmp_path / "m.db.indexes" / "alice" / "episode.bm25.json"
    before = manifest.read_text()
    with HybridMemory.open(path, embedder=hashing_embedder) as again:
        again.config.retrieval.mode = "lexical"
        assert [h.memory.id for h in again.search("bakery", namespace="alice").episodes] == [new_id]
    assert manifest.read_text() == before  # loaded as saved, not rebuilt


@pytest.mark.parametrize("seed", [1, 2])
def test_namespaces_never_see_each_other_lexically(lexical_memory, seed):
    mem = lexical_memory
    rng = random.Random(seed)
    words = ["kayak", "violin", "garden", "Lima", "Oslo", "quilt", "drone", "Biscuit"]
    owned: dict[str, set[int]] = {"a": set(), "b": set()}
    for round_ in range(5):
        ns = rng.choice(["a", "b"])
        drafts = [
            make_tuple(rng.choice(["Ann", "Ben"]), "has", f"a {rng.choice(words)} {round_}")
            for _ in range(rng.randint(1, 6))
        ]
        owned[ns].update(mem.add_memories(ns, tuples=drafts))
        for query_ns in ("a", "b"):
            query = " ".join(rng.sample(words, 4)) + " Ann Ben"
            got = {m.id for m in mem.search(query, namespace=query_ns, k=50).memories()}
            assert got <= owned[query_ns]
            assert bool(got) == bool(owned[query_ns])


def test_forget_and_rebuild_remove_lexical_files(lexical_memory):
    mem = lexical_memory
    mem.add_memories("alice", tuples=[make_tuple("Alice", "keeps", "her PIN under the mat")])
    mem.add_memories("bob", tuples=[make_tuple("Bob", "drinks", "tea")])
    assert len(mem.search("PIN", namespace="alice").tuples) == 1
    index_dir = mem.indexes.directory("alice")
    assert list(index_dir.glob("tuple.bm25*"))
    mem.rebuild_indexes("alice")
    assert not list(index_dir.glob("*.bm25*"))
    assert len(mem.search("PIN", namespace="alice").tuples) == 1  # rebuilt on use
    mem.forget("alice")
    assert not index_dir.exists()
    assert mem.search("PIN", namespace="alice").memories() == []
    assert len(mem.search("tea", namespace="bob").tuples) == 1
