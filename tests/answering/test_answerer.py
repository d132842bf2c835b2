"""Answering: the request, citation checking, failures; then SmolLM2 on a hand-made search result.

The fast tests script the model's reply text (its free choice of answer and citations) to
check the post-processing exactly; the reply is validated with the real backends'
``check_reply``. The real SmolLM2 GGUF answers in the ``slow`` test.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone

import pytest

from hybridmem_local.answering.answerer import (
    ANSWER_MAX_NEW_TOKENS,
    ANSWER_TEXT_MAX_NEW_TOKENS,
    AnswerDraft,
    TextCiter,
    _text_answer,
    answer_from_context,
    answer_many,
    build_answer_request,
)
from hybridmem_local.answering.context import format_context
from hybridmem_local.config import AnsweringConfig, load_config
from hybridmem_local.errors import LLMError
from hybridmem_local.llm.base import LLMRequest, LLMResult
from hybridmem_local.llm.replies import check_reply
from hybridmem_local.schema import Episode, Hit, RelationalTuple, SearchResult

QUESTION_DATE = datetime(2023, 6, 20, 9, 15, tzinfo=timezone.utc)


def search_result() -> SearchResult:
    """Two episodes and two tuples; format_context orders each block by timestamp."""
    episodes = [
        Episode(
            id=11,
            namespace="alice",
            title="Biscuit's vet visit",
            summary="Checkup",
            details="Alice took her beagle puppy Biscuit to Dr. Chen's clinic; he weighs 4.2 kg.",
            timestamp="2023-05-09",
            source_turn_ids=["s1:6", "s2:1"],
        ),
        Episode(
            id=10,
            namespace="alice",
            title="Riverside 10K",
            summary="Bob ran a 10K",
            details="Bob ran the Riverside 10K in Portland and finished in 52 minutes.",
            timestamp="2023-05-07",
            source_turn_ids=["s1:1"],
        ),
    ]
    tuples = [
        RelationalTuple(
            id=20,
            namespace="alice",
            entity="Alice",
            relation="adopted",
            object="a beagle puppy named Biscuit",
            timestamp="2023-05-05",
            context="Alice told Bob about her new puppy.",
            source_turn_ids=["s1:4"],
        ),
        RelationalTuple(
            id=21,
            namespace="alice",
            entity="Alice",
            relation="moved to",
            object="an apartment on Oak Avenue",
            timestamp="2023-05-29",
            context="",
            source_turn_ids=["s3:6"],
        ),
    ]
    return SearchResult(
        query="q",
        namespace="alice",
        episodes=[Hit(memory=m, score=0.9 - i / 10) for i, m in enumerate(episodes)],
        tuples=[Hit(memory=m, score=0.8 - i / 10) for i, m in enumerate(tuples)],
    )


class ScriptedLLM:
    """A StructuredLLM that replies with fixed text (validated like the real backends do)."""

    model_id = "scripted:test"

    def __init__(self, reply: str | LLMResult):
        self.reply = reply
        self.batches: list[list[LLMRequest]] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        self.batches.append(list(requests))
        if isinstance(self.reply, LLMResult):
            return [self.reply for _ in requests]
        results = []
        for request in requests:
            parsed, problem = check_reply(self.reply, request.output_schema)
            results.append(
                LLMResult(text=self.reply, parsed=parsed, error=problem, prompt_tokens=321, completion_tokens=12)
            )
        return results


def draft(answer: str, cited: list[str]) -> str:
    return json.dumps({"answer": answer, "cited_memory_ids": cited})


def test_request_shows_memories_question_and_question_date():
    result = search_result()
    context = format_context(result)
    request = build_answer_request("When did Alice adopt Biscuit?", context, QUESTION_DATE, enable_thinking=False)
    user = request.messages[-1].content
    assert context.text in user
    assert "[E1] (2023-05-07) Riverside 10K:" in user  # the block as format_context renders it
    assert "Question: When did Alice adopt Biscuit?" in user
    assert "Question date: 2023-06-20 (Tuesday)" in user
    assert request.output_schema is AnswerDraft
    assert request.prompt_version == "answer/v3"
    assert request.max_new_tokens == ANSWER_MAX_NEW_TOKENS and request.enable_thinking is False
    assert "I don't know" in request.messages[0].content


def test_without_a_question_date_no_date_line_is_shown():
    request = build_answer_request("Who is Biscuit?", format_context(search_result()), None, enable_thinking=False)
    assert "Question date" not in request.messages[-1].content


def test_thinking_requests_leave_the_token_budget_to_the_backend():
    request = build_answer_request("Who is Biscuit?", format_context(search_result()), None, enable_thinking=True)
    assert request.enable_thinking is True and request.max_new_tokens is None


def test_an_empty_question_is_rejected():
    with pytest.raises(ValueError, match="question is empty"):
        build_answer_request("  ", format_context(search_result()), None, enable_thinking=False)


def test_citations_resolve_to_memories_and_unknown_ones_are_dropped_and_counted():
    result = search_result()
    context = format_context(result)
    llm = ScriptedLLM(draft(" 5 May 2023 ", ["T1", "e2", "[E2]", "E9", "X1", "T1"]))
    answer = answer_from_context(llm, "When did Alice adopt Biscuit?", result, question_date=QUESTION_DATE)
    assert answer.error is None
    assert answer.answer == "5 May 2023"
    assert [m.id for m in answer.cited] == [context.short_ids["T1"], context.short_ids["E2"]] == [20, 11]
    assert answer.invalid_citations == ["E9", "X1"]
    assert answer.cited_turn_ids == ["s1:4", "s1:6", "s2:1"]
    assert answer.context_text == context.text
    assert (answer.prompt_tokens, answer.completion_tokens) == (321, 12)
    assert answer.prompt_version == "answer/v3"
    # Exactly one LLM call, filed under the namespace for the call cache.
    assert len(llm.batches) == 1 and len(llm.batches[0]) == 1
    assert llm.batches[0][0].tag == "alice"


def test_answer_many_answers_every_question_in_one_batched_call():
    result = search_result()
    rendered = format_context(result)
    llm = ScriptedLLM(draft("Biscuit", ["[t1]", "E9"]))
    first, second = answer_many(
        llm, ["Who is Biscuit?", "What did Alice adopt?"], [result, rendered], [QUESTION_DATE, None], tag="eval-run"
    )
    assert len(llm.batches) == 1 and [r.tag for r in llm.batches[0]] == ["eval-run", "eval-run"]
    assert "Question date: 2023-06-20" in llm.batches[0][0].messages[-1].content
    assert "Question date" not in llm.batches[0][1].messages[-1].content
    # A search result resolves citations to memories; a rendered block to memory ids only.
    assert [m.id for m in first.cited] == first.cited_memory_ids == [20]
    assert second.cited == [] and second.cited_memory_ids == [20]
    assert first.citations == second.citations == ["[t1]", "E9"] and first.invalid_citations == ["E9"]
    assert (first.answer, first.context_text) == ("Biscuit", rendered.text)
    # Without a tag, each request is filed under its search result's namespace.
    answer_many(llm, ["Who is Biscuit?"], [result])
    assert llm.batches[-1][0].tag == "alice"


def test_answer_many_lets_a_backend_failure_through_and_checks_its_lists():
    class DownLLM(ScriptedLLM):
        def generate(self, requests):
            raise LLMError("connection refused")

    with pytest.raises(LLMError, match="connection refused"):
        answer_many(DownLLM(""), ["Who is Biscuit?"], [search_result()])
    with pytest.raises(ValueError, match="2 questions, 1 contexts"):
        answer_many(ScriptedLLM(""), ["a?", "b?"], [search_result()])
    assert answer_many(ScriptedLLM(""), [], []) == []


def test_an_answer_without_memories_still_gets_one_call():
    empty = SearchResult(query="q", namespace="alice")
    llm = ScriptedLLM(draft("I don't know", ["E1"]))
    answer = answer_from_context(llm, "Where does Bob live?", empty)
    assert answer.answer == "I don't know" and answer.cited == [] and answer.invalid_citations == ["E1"]
    assert "(no memories)" in llm.batches[0][0].messages[-1].content


def test_a_failed_reply_gives_an_answer_with_the_error():
    llm = ScriptedLLM(
        LLMResult(text="{", error="reply does not match AnswerDraft", prompt_tokens=300, completion_tokens=256)
    )
    answer = answer_from_context(llm, "Who is Biscuit?", search_result())
    assert answer.answer == "" and answer.cited == []
    assert answer.error == "reply does not match AnswerDraft"
    assert answer.completion_tokens == 256


def test_an_unreachable_backend_gives_an_answer_with_the_error():
    class DownLLM(ScriptedLLM):
        def generate(self, requests):
            raise LLMError("connection refused")

    answer = answer_from_context(DownLLM(""), "Who is Biscuit?", search_result())
    assert answer.answer == "" and "connection refused" in answer.error


# --------------------------------------------------------------------------- text mode


def test_text_requests_ask_for_plain_text_with_their_own_prompt():
    context = format_context(search_result())
    request = build_answer_request(
        "How long was Bob's 10K?", context, QUESTION_DATE, enable_thinking=False, mode="text"
    )
    assert request.output_schema is None and request.prompt_version == "answer-text/v2"
    assert request.max_new_tokens == ANSWER_TEXT_MAX_NEW_TOKENS
    user = request.messages[-1].content
    assert context.text in user and "Question: How long was Bob's 10K?" in user and "2023-06-20" in user
    assert "JSON" not in request.messages[0].content + user
    thinking = build_answer_request("How long?", context, None, enable_thinking=True, mode="text")
    assert thinking.max_new_tokens is None


def test_text_answers_need_a_citer():
    with pytest.raises(ValueError, match="TextCiter"):
        answer_many(ScriptedLLM("52 minutes"), ["How long was Bob's 10K?"], [search_result()], mode="text")


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        # Replies SmolLM2 wrote in scripts/bench_answer_modes.py: a speaker label copied from
        # the transcript, an answer label, a label loop, a list announced on its own line.
        ("Jon: He lost his job as a banker.", "He lost his job as a banker."),
        ("The answer is: 2023-07-03", "2023-07-03"),
        ("Jon: Jon: Jon: Jon:", ""),
        ("The activities Melanie participates in are:\n1. Pottery\n2. Camping", "Pottery, Camping"),
        ("1. Painting landscapes and still life", "Painting landscapes and still life"),
        # Kept: a time, a yes/no with a colon, a lower-case phrase before a colon, later lines.
        ("13:56", "13:56"),
        ("Yes: she adopted him", "Yes: she adopted him"),
        ("the time was: 5pm", "the time was: 5pm"),
        ("Mary Ann: Rome\nShe said so in May.", "Rome"),
    ],
)
def test_a_text_reply_loses_the_labels_small_models_put_before_the_answer(reply, answer):
    assert _text_answer(reply) == answer


def _citer(minilm, **settings) -> TextCiter:
    return TextCiter.from_config(AnsweringConfig(mode="text", **settings), minilm.embed)


@pytest.mark.slow
def test_a_text_answer_cites_the_memories_it_aligns_to(minilm):
    result = search_result()
    llm = ScriptedLLM("Answer: 52 minutes\nBob said so after the race.")
    answer = answer_from_context(
        llm, "How long did Bob take to run the Riverside 10K?", result, mode="text", citer=_citer(minilm)
    )
    # The first line, without the label; no schema was asked for.
    assert answer.answer == "52 minutes" and answer.mode == "text" and answer.error is None
    assert llm.batches[0][0].output_schema is None and answer.prompt_version == "answer-text/v2"
    # Only the race episode holds the question's words and the answer; the others score < 0.6.
    assert answer.citations == ["E1"] and [m.id for m in answer.cited] == [10]
    assert answer.cited_turn_ids == ["s1:1"] and answer.invalid_citations == []


@pytest.mark.slow
def test_text_citations_are_bounded_and_an_abstention_cites_nothing(minilm):
    result = search_result()
    question = "What is the name of the beagle puppy Alice adopted?"
    # With no score threshold every memory qualifies: the bound alone decides how many are cited,
    # and bounded to one, the best is kept (the adoption tuple holds 6 of the 7 query stems).
    wide = answer_from_context(
        ScriptedLLM("Biscuit"), question, result, mode="text", citer=_citer(minilm, cite_min_score=0.0)
    )
    narrow = answer_from_context(
        ScriptedLLM("Biscuit"),
        question,
        result,
        mode="text",
        citer=_citer(minilm, cite_min_score=0.0, cite_max_memories=1),
    )
    assert len(wide.cited_memory_ids) == 3 and 20 in wide.cited_memory_ids
    assert narrow.cited_memory_ids == [20] and narrow.citations == ["T1"]
    for reply in ("I don't know.", "i do not know"):
        abstained = answer_from_context(ScriptedLLM(reply), question, result, mode="text", citer=_citer(minilm))
        assert abstained.answer == reply and abstained.citations == [] and abstained.error is None
    empty = answer_from_context(ScriptedLLM("\n  \n"), question, result, mode="text", citer=_citer(minilm))
    assert empty.answer == "" and empty.error == "the reply holds no answer"
    failed = answer_from_context(
        ScriptedLLM(LLMResult(error="timed out")), question, result, mode="text", citer=_citer(minilm)
    )
    assert failed.answer == "" and failed.error == "timed out" and failed.citations == []


# --------------------------------------------------------------------------- SmolLM2 (real model)


@pytest.mark.slow
def test_smollm2_answers_with_valid_citations_only(smollm2):
    result = search_result()
    shown = set(format_context(result).short_ids)
    answer = answer_from_context(smollm2, "What is the name of Alice's puppy?", result, question_date=QUESTION_DATE)
    print(
        f"\nSmolLM2 answer: {answer.answer!r}, cited {[m.id for m in answer.cited]}, "
        f"invalid {answer.invalid_citations}, {answer.latency_s:.2f} s, "
        f"{answer.prompt_tokens} prompt / {answer.completion_tokens} completion tokens"
    )
    assert answer.error is None
    assert answer.answer
    memories = {m.id: m for m in result.memories()}
    for memory in answer.cited:
        assert memories[memory.id] == memory
    for raw in answer.invalid_citations:
        assert raw.strip().strip("[]").strip().upper() not in shown
    assert answer.prompt_tokens > 0 and answer.completion_tokens > 0 and answer.latency_s > 0


@pytest.mark.slow
def test_smollm2_answers_in_text_from_memories_and_their_turns(tmp_path, smollm2, minilm):
    """The library's answer path as the config sets it: text mode, evidence turns, a budget."""
    from hybridmem_local.memory import HybridMemory
    from hybridmem_local.schema import Session, Turn
    from tests.factories import BASE_DATE, make_episode

    session = Session(
        session_id="s1",
        namespace="bob",
        started_at=BASE_DATE,
        turns=[
            Turn(turn_id="s1:0", speaker="Alice", text="How did the Riverside 10K go?"),
            Turn(turn_id="s1:1", speaker="Bob", text="Great, I finished in 52 minutes!"),
        ],
    )
    config = load_config(
        overrides={"answering.mode": "text", "answering.evidence_turns": True, "retrieval.context_budget": 512}
    )
    with HybridMemory.open(tmp_path / "m.db", config, embedder=minilm, llm=smollm2) as memory:
        memory.ingest([session], curate=False)
        memory.add_memories("bob", episodes=[make_episode("Riverside 10K", "Bob ran the Riverside 10K.", ["s1:1"])])
        [answer] = memory.answer_many(["How long did Bob need for the Riverside 10K?"], namespace="bob")
    print(f"\nSmolLM2 text answer: {answer.answer!r}, citations {answer.citations}")
    assert answer.mode == "text" and answer.prompt_version == "answer-text/v2" and answer.error is None
    assert "Bob: Great, I finished in 52 minutes!" in answer.context_text  # the memory's turn, shown
    assert set(answer.citations) <= {"E1"} and answer.invalid_citations == []
    assert answer.completion_tokens <= ANSWER_TEXT_MAX_NEW_TOKENS
