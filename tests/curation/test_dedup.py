"""The write-time duplicate guard (curation/dedup.py) on a real store with real MiniLM vectors."""

from __future__ import annotations

import numpy as np
import pytest

from hybridmem_local.curation.dedup import content_key, numbers, plan_duplicates
from hybridmem_local.schema import Episode, EpisodeDraft, RelationalTuple, TupleDraft
from hybridmem_local.storage.store import MemoryStore
from tests.factories import make_episode, make_session, make_tuple

THRESHOLD = 0.95


@pytest.fixture
def store(tmp_path):
    s = MemoryStore(tmp_path / "m.db")
    s.sessions.insert(make_session("alice", 1))
    yield s
    s.close()


def plan(store, minilm, memories, session_id="s1", threshold=THRESHOLD):
    vectors = minilm.embed([index_text(m) for m in memories])
    return plan_duplicates(
        memories,
        vectors,
        candidates=lambda kind, timestamp: store.memories.duplicate_candidates("alice", kind, timestamp, session_id),
        vectors_of=minilm.embed,
        threshold=threshold,
        same_session=session_id is not None,
    )


def index_text(memory: EpisodeDraft | TupleDraft) -> str:
    """What dense search embeds of the memory once stored."""
    stored = Episode if isinstance(memory, EpisodeDraft) else RelationalTuple
    return stored(**memory.model_dump()).index_text()


def test_content_key_ignores_case_punctuation_and_spacing():
    a = make_episode("Run!", "Bob ran the 10K, in 52 minutes.")
    b = make_episode("run", "bob  ran the 10K in 52 minutes")
    assert content_key(a) == content_key(b)
    assert content_key(a) != content_key(make_episode("Run", "Bob ran the 10K in 61 minutes."))


@pytest.mark.parametrize(
    ("first", "copy"),
    [
        # SmolLM2 copies from LoCoMo sessions: turn ids, or list numbers, before the same text.
        (
            make_episode("D1:36", "D1:36: VR gaming is awesome! Let's do it next Saturday [2022-03-26]!"),
            make_episode("D1:37", "D1:37: VR gaming is awesome! Let's do it next Saturday [2022-03-26]!"),
        ),
        (
            make_episode("D7:1", "1. Use a pizza dough to make a pizza."),
            make_episode("D7:2", "2. Use a pizza dough to make a pizza."),
        ),
    ],
)
def test_copies_that_differ_in_turn_ids_or_list_numbers_are_the_same_content(first, copy):
    assert content_key(first) == content_key(copy) and numbers(first) == numbers(copy)


def test_times_steps_and_dates_in_the_text_still_tell_memories_apart():
    at_nine = make_episode("Meeting", "Bob met Ann at 9:30 after step 2. of the plan, on 2023-05-07.")
    at_ten = make_episode("Meeting", "Bob met Ann at 10:30 after step 2. of the plan, on 2023-05-07.")
    assert numbers(at_nine) == {"9:30", "2", "2023", "05", "07"} and content_key(at_nine) != content_key(at_ten)


def test_exact_repeats_within_one_batch_become_one_new_memory(store, minilm):
    episode = make_episode("Run", "Bob ran the Riverside 10K in 52 minutes.", ["s1:1"])
    again = make_episode("RUN", "Bob ran the Riverside 10K in 52 minutes!", ["s1:2"])
    other = make_episode("Puppy", "Alice adopted a beagle puppy named Biscuit.", ["s1:3"])
    result = plan(store, minilm, [episode, again, other])
    assert result.new == [episode, other]
    assert result.slots == [("new", 0), ("new", 0), ("new", 1)]
    (repeat,) = result.repeats
    assert repeat.of == ("new", 0) and repeat.turn_ids == ["s1:2"] and "the same content" in repeat.reason


def test_a_repeat_of_a_stored_memory_points_at_its_row(store, minilm):
    (stored,) = store.memories.insert(
        "alice", [make_episode("Run", "Bob ran the Riverside 10K in 52 minutes.", ["s1:1"])], source_session_id="s1"
    )
    result = plan(
        store, minilm, [make_episode("Run", "Bob ran the Riverside 10K in 52 minutes.", ["s1:0"])], session_id="s2"
    )
    assert result.new == [] and result.slots == [("existing", stored)]
    assert result.repeats[0].turn_ids == ["s1:0"] and f"repeats memory {stored}" in result.repeats[0].reason


def test_near_duplicates_above_the_threshold_are_repeats_and_distinct_facts_are_not(store, minilm):
    store.memories.insert("alice", [make_episode("Run", "Bob ran the Riverside 10K in Portland in 52 minutes.")])
    near = make_episode("Run", "Bob ran the Riverside 10K in Portland, in 52 minutes yesterday.")
    distinct = make_episode("Run", "Bob's coach Maria says he can run under 50 minutes by autumn.")
    vectors = minilm.embed([near.details, distinct.details, "Bob ran the Riverside 10K in Portland in 52 minutes."])
    assert float(vectors[0] @ vectors[2]) >= THRESHOLD > float(vectors[1] @ vectors[2])
    result = plan(store, minilm, [near, distinct], session_id="s2")
    assert [slot[0] for slot in result.slots] == ["existing", "new"]
    assert "cosine" in result.repeats[0].reason and result.new == [distinct]


def test_a_near_match_with_other_numbers_is_another_memory(store, minilm):
    """MiniLM hardly sees numbers: this year's time and last year's are two memories."""
    this_year = make_episode("Race", "Bob ran the 10K in 52 minutes.", ["s1:1"])
    last_year = make_episode("Race", "Bob ran the 10K in 61 minutes.", ["s1:3"])
    this, last = minilm.embed([this_year.details, last_year.details])
    assert float(this @ last) >= THRESHOLD
    result = plan(store, minilm, [this_year, last_year])
    assert result.repeats == [] and result.new == [this_year, last_year]


def test_the_same_text_at_another_date_in_another_session_is_another_event(store, minilm):
    store.memories.insert(
        "alice", [make_episode("Group", "Caroline went to the support group.", day=1)], source_session_id="s1"
    )
    result = plan(
        store, minilm, [make_episode("Group", "Caroline went to the support group.", day=20)], session_id="s2"
    )
    assert result.repeats == [] and len(result.new) == 1


def test_kinds_are_never_repeats_of_each_other(store, minilm):
    fact = make_tuple("Bob", "ran", "the Riverside 10K")
    episode = EpisodeDraft(
        title="Bob ran", summary="the Riverside 10K", details="the Riverside 10K", timestamp="2023-05-01"
    )
    assert content_key(fact) == content_key(episode)
    result = plan(store, minilm, [fact, episode])
    assert result.repeats == [] and len(result.new) == 2


def test_a_threshold_of_one_keeps_only_the_exact_guard(store, minilm):
    first = make_episode("Run", "Bob ran the Riverside 10K in Portland in 52 minutes.")
    near = make_episode("Run", "Bob ran the Riverside 10K in Portland, in 52 minutes yesterday.")
    assert [s[0] for s in plan(store, minilm, [first, near], threshold=1.0).slots] == ["new", "new"]
    vectors = np.stack([minilm.embed([first.details])[0]] * 2)
    exact = plan_duplicates(
        [first, first.model_copy()],
        vectors,
        candidates=lambda kind, ts: [],
        vectors_of=minilm.embed,
        threshold=1.0,
        same_session=True,
    )
    assert exact.slots == [("new", 0), ("new", 0)]
