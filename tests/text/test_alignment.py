"""Provenance alignment (text/alignment.py) on the demo conversation with the real MiniLM embedder,
and the provenance field's rules (schema.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import hybridmem_local
from hybridmem_local.curation.replies import reply_schema
from hybridmem_local.schema import Episode, EpisodeDraft, Session, TupleDraft, combine_provenance, turn_line
from hybridmem_local.text.alignment import Aligner, AlignmentSettings, align, alignment_scores, content_text, select

DEMO = Path(hybridmem_local.__file__).parent / "examples" / "demo_sessions.jsonl"
SETTINGS = AlignmentSettings(max_turns=2, min_score=0.6, lexical_weight=0.75)


@pytest.fixture(scope="module")
def demo_session() -> Session:
    return Session.model_validate(json.loads(DEMO.read_text(encoding="utf-8").splitlines()[0]))


@pytest.fixture(scope="module")
def aligner(minilm) -> Aligner:
    return Aligner(minilm.embed, SETTINGS)


def test_a_memory_is_aligned_to_the_turn_it_came_from(aligner, demo_session):
    texts = [
        "Bob ran the Riverside 10K in Portland and finished in 52 minutes.",
        "Alice adopted a beagle puppy named Biscuit.",
        "Bob's coach Maria thinks he can run under 50 minutes by autumn.",
    ]
    found = aligner.align_all(texts, demo_session.turns)
    assert found[0][0] == "s1:1"
    assert found[1][0] == "s1:4"
    assert found[2][0] == "s1:3"
    assert all(1 <= len(ids) <= SETTINGS.max_turns for ids in found)


def test_align_is_a_pure_function_of_texts_and_vectors(minilm, demo_session):
    text = "Alice is taking Biscuit to the vet at Dr. Chen's clinic."
    vectors = minilm.embed([text, *(turn_line(t) for t in demo_session.turns)])
    first = align([text], vectors[:1], demo_session.turns, vectors[1:], SETTINGS)
    again = align([text], vectors[:1], demo_session.turns, vectors[1:], SETTINGS)
    assert first == again
    assert first[0][0] == "s1:6"


def test_the_best_turn_is_kept_even_below_the_threshold_and_others_only_above_it():
    scores = np.array([0.10, 0.30, 0.20, 0.25])
    assert select(scores, AlignmentSettings(max_turns=3, min_score=0.9, lexical_weight=0.5)) == [1]
    scores = np.array([0.70, 0.95, 0.65, 0.10])
    assert select(scores, AlignmentSettings(max_turns=3, min_score=0.6, lexical_weight=0.5)) == [0, 1, 2]
    # The bound holds however many turns reach the threshold; chosen turns come in turn order.
    assert select(scores, AlignmentSettings(max_turns=2, min_score=0.6, lexical_weight=0.5)) == [0, 1]
    assert select(np.array([]), SETTINGS) == []


def test_the_lexical_weight_mixes_stem_overlap_and_cosine():
    turns = ["Bob: I ran the 10K race", "Alice: my puppy Biscuit"]
    vectors = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    memory_vector = np.array([[0.0, 1.0]], dtype=np.float32)  # the embedding points at turn 2 ...
    text = ["Bob ran a race"]  # ... the words at turn 1
    lexical_only = alignment_scores(text, memory_vector, turns, vectors, lexical_weight=1.0)[0]
    cosine_only = alignment_scores(text, memory_vector, turns, vectors, lexical_weight=0.0)[0]
    assert lexical_only[0] == pytest.approx(1.0) and lexical_only[1] == pytest.approx(0.0)
    assert cosine_only.tolist() == pytest.approx([0.0, 1.0])
    half = alignment_scores(text, memory_vector, turns, vectors, lexical_weight=0.5)[0]
    assert half.tolist() == pytest.approx([0.5, 0.5])


def test_nothing_to_align_gives_no_turns(aligner, demo_session):
    assert aligner.align_all([], demo_session.turns) == []
    assert aligner.align_all(["anything"], []) == [[]]


def test_content_text_holds_the_content_fields_once():
    episode = EpisodeDraft(title="Run", summary="Bob ran", details="Bob ran", timestamp="2023-05-07")
    assert content_text(episode) == "Run\nBob ran"
    fact = TupleDraft(entity="Bob", relation="ran", object="10K", timestamp="2023-05-07", context="")
    assert content_text(fact) == "Bob\nran\n10K"


def test_provenance_follows_the_turns():
    cited = EpisodeDraft(title="t", summary="s", details="d", timestamp="2023", source_turn_ids=["s1:1"])
    assert cited.provenance == "cited"
    assert Episode(**cited.model_dump()).provenance == "cited"
    aligned = cited.model_copy(update={"provenance": "aligned"})
    assert Episode(**aligned.model_dump()).provenance == "aligned"
    assert EpisodeDraft(title="t", summary="s", details="d", timestamp="2023", provenance="aligned").provenance is None


def test_merged_provenance_is_aligned_when_any_part_was():
    assert combine_provenance(["cited", "cited"]) == "cited"
    assert combine_provenance(["cited", "aligned", None]) == "aligned"
    assert combine_provenance([None, None]) is None


def test_llm_reply_schemas_do_not_ask_for_provenance():
    assert "provenance" not in json.dumps(reply_schema(3, 6).model_json_schema())
    assert "provenance" not in EpisodeDraft.model_json_schema()["properties"]
