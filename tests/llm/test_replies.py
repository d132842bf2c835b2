"""Shared reply handling: <think> stripping, validation messages, the bounded retry loop."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from hybridmem_local.llm import ChatMessage, LLMRequest
from hybridmem_local.llm.replies import (
    FEEDBACK_REPLY_CHARS,
    Completion,
    check_reply,
    feedback_request,
    generate_with_retries,
    salvage,
    strip_think,
)


class Fact(BaseModel):
    entity: str
    year: int


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ('<think>\nhm, a fact\n</think>\n\n{"a": 1}', '{"a": 1}'),
        ('reasoning the template opened</think>{"a": 1}', '{"a": 1}'),
        ("<think>cut off while thinking", ""),
        ("<think></think>Paris <think>x</think>is the answer", "Paris is the answer"),
        ("  no reasoning at all ", "no reasoning at all"),
    ],
)
def test_strip_think(raw, clean):
    assert strip_think(raw) == clean


def test_check_reply_names_the_fields_and_accepts_fenced_json():
    assert check_reply('```json\n{"entity": "Jon", "year": 2022}\n```', Fact) == (Fact(entity="Jon", year=2022), None)
    parsed, problem = check_reply('{"entity": 3}', Fact)
    assert parsed is None
    assert problem.startswith("reply does not match Fact: entity: ") and "year: Field required" in problem
    assert check_reply("", None) == (None, "empty reply")
    assert check_reply("Paris", None) == (None, None)


def test_retries_stop_at_the_bound_and_keep_good_results_in_place():
    calls: list[list[int]] = []
    replies = {0: ['{"entity": "a", "year": 1}'], 1: ["{", "{", "{"], 2: ["nope", '{"entity": "c", "year": 3}']}

    def complete(batch):
        calls.append([int(r.messages[0].content) for r in batch])
        out = []
        for r in batch:
            attempt = (len(r.messages) - 1) // 2
            out.append(
                Completion(text=replies[int(r.messages[0].content)][attempt], prompt_tokens=5, completion_tokens=1)
            )
        return out

    requests = [LLMRequest(messages=[ChatMessage(role="user", content=str(i))], output_schema=Fact) for i in range(3)]
    results = generate_with_retries(requests, complete, max_retries=2)
    assert calls == [[0, 1, 2], [1, 2], [1]]
    assert [r.parsed.entity if r.ok else None for r in results] == ["a", None, "c"]
    assert results[1].error.startswith("reply does not match Fact") and results[1].text == "{"
    assert [r.prompt_tokens for r in results] == [5, 15, 10]


def test_a_retry_quotes_a_short_reply_whole_and_clips_a_cut_off_one():
    request = LLMRequest(messages=[ChatMessage(role="user", content="a fact")], output_schema=Fact)
    short = feedback_request(request, '{"entity": 3}', "entity: not a string")
    assert [m.role for m in short.messages] == ["user", "assistant", "user"]
    assert short.messages[1].content == '{"entity": 3}'
    assert "entity: not a string" in short.messages[2].content and '"year"' in short.messages[2].content

    cut_off = '{"entity": "' + "loop " * 2000  # a reply that ran to max_new_tokens
    clipped = feedback_request(request, cut_off, "cut off at max_new_tokens").messages[1].content
    assert clipped.startswith(cut_off[:FEEDBACK_REPLY_CHARS])
    assert clipped.endswith(f"({len(cut_off) - FEEDBACK_REPLY_CHARS} more characters cut)")
    assert len(clipped) < FEEDBACK_REPLY_CHARS + 50


def test_permanent_errors_are_not_retried():
    calls = []

    def complete(batch):
        calls.append(len(batch))
        return [Completion(error="prompt exceeds the context window", permanent=True)]

    [result] = generate_with_retries([LLMRequest(messages=[ChatMessage(role="user", content="x")])], complete, 3)
    assert calls == [1] and result.error == "prompt exceeds the context window"


class Memory(BaseModel):
    text: str
    turn_ids: list[str]


class Memories(BaseModel):
    episodes: list[Memory]
    tuples: list[Memory]


FULL = (
    '{"episodes": [{"text": "ran a 10K", "turn_ids": ["s1:1"]}, '
    '{"text": "adopted Biscuit", "turn_ids": ["s1:4", "s1:5"]}],'
    ' "tuples": [{"text": "Bob ran", "turn_ids": ["s1:1"]}]}'
)


@pytest.mark.parametrize(
    ("cut_after", "episodes", "tuples"),
    [
        ('"adopted Bis', ["ran a 10K"], []),  # inside the second episode: the first is kept
        ('"s1:4", ', ["ran a 10K", "adopted Biscuit"], []),  # inside its id list: closed after "s1:4"
        ('"tuples": [{"text": "Bob', ["ran a 10K", "adopted Biscuit"], []),  # tuples begun: none complete
        ('"turn_ids": ["s1:1"]}', ["ran a 10K", "adopted Biscuit"], ["Bob ran"]),  # all but the closing brackets
    ],
)
def test_salvage_keeps_the_complete_items_of_a_cut_off_reply(cut_after, episodes, tuples):
    end = (
        FULL.rindex(cut_after) + len(cut_after)
        if cut_after.startswith('"turn_ids"')
        else FULL.index(cut_after) + len(cut_after)
    )
    saved = salvage(FULL[:end], Memories)
    assert saved is not None
    parsed, text = saved
    assert [m.text for m in parsed.episodes] == episodes
    assert [m.text for m in parsed.tuples] == tuples
    assert Memories.model_validate_json(text) == parsed


def test_salvage_keeps_an_item_whose_last_list_was_cut_and_gives_up_on_nothing_complete():
    # cut inside the last field (a list) of an item: closing the list completes the item
    parsed, _ = salvage('{"episodes": [{"text": "ran a 10K", "turn_ids": ["s1:1", "s1', Memories)
    assert parsed.episodes == [Memory(text="ran a 10K", turn_ids=["s1:1"])]
    # before any list began there is nothing to keep; the required lists must exist
    assert salvage('{"episo', Memories) is None
    assert salvage("not json at all", Memories) is None
    assert salvage('{"episodes": [], "tuples": [{"te', Memories) is None  # nothing complete: a failure


def test_cut_off_replies_are_salvaged_only_when_the_request_allows_it():
    cut = FULL[: FULL.index('"adopted Bis') + 5]
    allow = LLMRequest(messages=[ChatMessage(role="user", content="x")], output_schema=Memories, salvage_partial=True)
    strict = allow.model_copy(update={"salvage_partial": False})
    calls = []

    def complete(batch):
        calls.append(len(batch))
        return [Completion(text=cut, completion_tokens=50, truncated=True) for _ in batch]

    kept, failed = generate_with_retries([allow, strict], complete, max_retries=1)
    assert kept.ok and kept.salvaged and [m.text for m in kept.parsed.episodes] == ["ran a 10K"]
    assert kept.completion_tokens == 50  # not asked again
    assert not failed.ok and "cut off at max_new_tokens" in failed.error and failed.completion_tokens == 100
    assert calls == [2, 1]


def test_a_looping_reply_is_salvaged_and_says_why_when_it_cannot_be():
    request = LLMRequest(messages=[ChatMessage(role="user", content="x")], output_schema=Memories, salvage_partial=True)
    [result] = generate_with_retries([request], lambda batch: [Completion(text='{"episodes": [{"te', looped=True)], 0)
    assert not result.ok and "stopped: it began to loop" in result.error
