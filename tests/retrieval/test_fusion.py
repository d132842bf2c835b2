"""Reciprocal rank fusion: the arithmetic, and hybrid search on real MiniLM + real bm25s."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridmem_local.config import RetrievalConfig
from hybridmem_local.retrieval.fusion import reciprocal_rank_fusion
from hybridmem_local.retrieval.retriever import fuse
from tests.factories import make_episode, make_session, make_tuple

# ----------------------------------------------------------------------------- arithmetic


def test_scores_are_weighted_reciprocal_ranks():
    fused = dict(reciprocal_rank_fusion({"dense": [7, 8], "lexical": [8, 9]}, k=60, weights={"lexical": 2.0}))
    assert fused[7] == pytest.approx(1 / 61)
    assert fused[8] == pytest.approx(1 / 62 + 2 / 61)
    assert fused[9] == pytest.approx(2 / 62)


def test_an_item_in_both_rankings_beats_items_in_one():
    fused = reciprocal_rank_fusion({"dense": [1, 2, 3], "lexical": [4, 5, 3]})
    assert fused[0][0] == 3


def test_ties_go_to_the_better_single_rank_then_to_the_first_ranking():
    # 1 and 2 are each first in one ranking: equal scores, dense named first wins.
    assert [i for i, _ in reciprocal_rank_fusion({"dense": [1, 3], "lexical": [2, 4]})] == [1, 2, 3, 4]
    assert [i for i, _ in reciprocal_rank_fusion({"lexical": [2, 4], "dense": [1, 3]})] == [2, 1, 4, 3]
    # 5 has ranks (1, 3) and 6 has (3, 1): the same score; 5 is first in the first-named ranking.
    fused = reciprocal_rank_fusion({"dense": [5, 9, 6], "lexical": [6, 8, 5]})
    assert [i for i, _ in fused][:2] == [5, 6]
    assert fused[0][1] == fused[1][1]


def test_empty_lexical_ranking_keeps_the_dense_order():
    dense = [(11, 0.9), (12, 0.5), (13, 0.1)]
    assert [i for i, _ in fuse(dense, [], RetrievalConfig())] == [11, 12, 13]
    assert fuse([], [], RetrievalConfig()) == []


def test_zero_weight_ignores_a_ranking_and_bad_weights_are_refused():
    assert [i for i, _ in reciprocal_rank_fusion({"dense": [1, 2], "lexical": [3, 2]}, weights={"lexical": 0})] == [
        1,
        2,
    ]
    with pytest.raises(ValueError, match="non-negative"):
        reciprocal_rank_fusion({"dense": [1]}, weights={"dense": -1})
    with pytest.raises(ValueError, match="not given"):
        reciprocal_rank_fusion({"dense": [1]}, weights={"lexcial": 1})
    with pytest.raises(ValueError, match="at least 1"):
        reciprocal_rank_fusion({"dense": [1]}, k=0)


def test_a_repeated_item_counts_at_its_first_rank():
    assert dict(reciprocal_rank_fusion({"dense": [1, 1, 2]}))[1] == pytest.approx(1 / 61)


@given(
    st.lists(st.integers(0, 30), max_size=25, unique=True),
    st.lists(st.integers(0, 30), max_size=25, unique=True),
    st.integers(1, 100),
)
def test_fusion_returns_the_union_best_first(dense, lexical, k):
    fused = reciprocal_rank_fusion({"dense": dense, "lexical": lexical}, k=k)
    assert sorted(i for i, _ in fused) == sorted(set(dense) | set(lexical))
    scores = [s for _, s in fused]
    assert scores == sorted(scores, reverse=True)
    # An item ahead of another in both rankings (and present in both) is ahead after fusion.
    position = {i: n for n, (i, _) in enumerate(fused)}
    both = [i for i in dense if i in lexical]
    for a in both:
        for b in both:
            if dense.index(a) < dense.index(b) and lexical.index(a) < lexical.index(b):
                assert position[a] < position[b]


# ----------------------------------------------------------------------------- hybrid search, real models

CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Dakar"]
THINGS = ["bicycle", "violin", "kayak", "novel", "camera", "telescope", "quilt", "drone"]
PEOPLE = ["Ann", "Ben", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal"]
QUERY = "Which dog did Margaret adopt from the shelter last spring?"


def _fillers(n: int):
    rng = random.Random(0)
    return [
        make_tuple(
            rng.choice(PEOPLE),
            rng.choice(["bought", "sold", "painted", "lent"]),
            f"a {rng.choice(THINGS)} in {rng.choice(CITIES)}",
        )
        for _ in range(n)
    ]


def test_hybrid_ranks_lexical_only_and_dense_only_finds_above_unrelated(minilm_memory):
    memory = minilm_memory
    # Only BM25 finds this one: it shares "shelter" and "spring" with the query, not its meaning.
    lexical_only = make_tuple("Checklist", "says", "spring cleaning: shelter the garden furniture")
    # Only the dense index finds this one: a paraphrase without a single query term.
    dense_only = make_tuple("Maggie", "took home", "a three-legged greyhound puppy")
    fillers = _fillers(60)
    ids = memory.add_memories("alice", tuples=[lexical_only, dense_only, *fillers])
    lexical_id, dense_id, filler_ids = ids[0], ids[1], set(ids[2:])

    memory.config.retrieval.mode = "dense"
    dense_ranks = [h.memory.id for h in memory.search(QUERY, namespace="alice", k=40).tuples]
    memory.config.retrieval.mode = "lexical"
    lexical_ranks = [h.memory.id for h in memory.search(QUERY, namespace="alice", k=40).tuples]
    # The premise: each document is found by one ranking only.
    assert dense_ranks[0] == dense_id and dense_ranks.index(lexical_id) > 3
    assert lexical_ranks == [lexical_id]

    memory.config.retrieval.mode = "hybrid"
    hybrid = [h.memory.id for h in memory.search(QUERY, namespace="alice", k=40).tuples]
    assert set(hybrid[:2]) == {lexical_id, dense_id}
    assert set(hybrid[2:]) <= filler_ids
    scores = [h.score for h in memory.search(QUERY, namespace="alice", k=40).tuples]
    assert scores == sorted(scores, reverse=True)


def test_search_ranks_every_store_as_its_indexes_do_one_by_one(memory):
    # Search runs the stores' BM25 and hnswlib rankings on threads; the hits must be exactly
    # the fusion of each store's two rankings, made here one after the other.
    memory.add_memories(
        "alice",
        episodes=[
            make_episode(f"Trip {i}", f"{p} flew to {c} with a {t}.")
            for i, (p, c, t) in enumerate(zip(PEOPLE, CITIES, THINGS, strict=True))
        ],
        tuples=[make_tuple("Margaret", "adopted", "a greyhound from the shelter"), *_fillers(30)],
    )
    memory.ingest([make_session("alice", i, n_turns=6) for i in range(3)], curate=False)
    config = memory.config.retrieval
    config.mode, config.sources = "hybrid", ["episodes", "tuples", "windows"]
    result = memory.search(QUERY, namespace="alice", k=4)
    vector = memory.indexes.embed_query(QUERY)
    found = {
        "episode": [(h.memory.id, h.score) for h in result.episodes],
        "tuple": [(h.memory.id, h.score) for h in result.tuples],
        "window": [(h.window.id, h.score) for h in result.windows],
    }
    for kind, limit in (("episode", 4), ("tuple", 8), ("window", 4)):
        dense = memory.indexes.dense("alice", kind).search(vector, config.candidate_depth)
        lexical = memory.indexes.lexical("alice", kind).search(QUERY, config.candidate_depth)
        assert found[kind] == fuse(dense, lexical, config)[:limit] and found[kind]

    # A forked child cannot use its parent's threads: the retriever starts a pool of its own.
    parents = memory.retriever._pool
    memory.retriever._pool_pid = -1
    assert memory.search(QUERY, namespace="alice", k=4) == result
    assert memory.retriever._pool is not parents
