"""The openai-server backend against a real ``vllm serve`` (vLLM 0.32.0 CPU build, SmolLM2-135M),
started once per session by ``scripts/serve_vllm.sh start`` (tests/vllm/conftest.py)."""

from __future__ import annotations

from typing import Literal

import openai
from pydantic import BaseModel, Field, ValidationError

from hybridmem_local.llm import ChatMessage, LLMRequest, build_llm


class Ticket(BaseModel):
    """Nothing a model writes unconstrained to "Say hello" validates against this."""

    code: str = Field(pattern=r"^ZQ[0-9]{3}$")
    priority: Literal["low", "high"]


HELLO = LLMRequest(
    messages=[ChatMessage(role="user", content="Say hello to Caroline.")], output_schema=Ticket, max_new_tokens=48
)


def _valid(text: str) -> bool:
    try:
        Ticket.model_validate_json(text)
        return True
    except ValidationError:
        return False


def test_the_server_enforces_the_backends_structured_output_fields_and_ignores_guided_json(server_config):
    llm = build_llm(server_config.llm)
    client = openai.OpenAI(base_url=server_config.llm.base_url, api_key="EMPTY", max_retries=0)

    def reply(body: dict) -> str:
        return client.chat.completions.create(**body).choices[0].message.content or ""

    body = llm._request_body(HELLO)
    constrained = reply(body)
    assert _valid(constrained), constrained
    # each of the two fields the backend sends constrains on its own
    only_response_format = {
        **body,
        "extra_body": {k: v for k, v in body["extra_body"].items() if k != "structured_outputs"},
    }
    only_structured_outputs = {k: v for k, v in body.items() if k != "response_format"}
    assert _valid(reply(only_response_format)) and _valid(reply(only_structured_outputs))
    # without them the same request is not a Ticket; the legacy field is accepted and ignored
    plain = {k: v for k, v in body.items() if k not in ("response_format", "extra_body")}
    assert not _valid(reply(plain))
    legacy = {**plain, "extra_body": {"guided_json": Ticket.model_json_schema()}}
    assert not _valid(reply(legacy))

    [result] = llm.generate([HELLO])
    assert result.ok and isinstance(result.parsed, Ticket)
    assert result.prompt_tokens > 0 and result.completion_tokens > 0
    assert llm.count_tokens("hello world") == 2  # vLLM's /tokenize


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)


def test_a_batch_of_eight_in_one_generate_call(server_config):
    llm = build_llm(server_config.llm)
    cities = ["Paris", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Oslo", "Dublin"]
    results = llm.generate(
        [
            LLMRequest(
                messages=[ChatMessage(role="user", content=f"Give the city {c} and its country as JSON.")],
                output_schema=City,
                max_new_tokens=64,
            )
            for c in cities
        ]
    )
    assert len(results) == 8 and all(r.ok and isinstance(r.parsed, City) for r in results), [r.error for r in results]


def test_curates_a_real_locomo_session_and_answers_and_judges(server_config, minilm_cpu, locomo_session, tmp_path):
    from hybridmem_local.eval.judge import JudgeVerdict, build_judge_request
    from hybridmem_local.memory import HybridMemory

    with HybridMemory.open(tmp_path / "m.db", server_config, minilm_cpu) as memory:
        added = memory.add_session(locomo_session)
        assert added.session.curation_status == "curated", added.session.curation_error
        turn_ids = {turn.turn_id for turn in locomo_session.turns}
        stored = memory.list(locomo_session.namespace, kind=None)
        assert stored
        assert all(
            m.source_turn_ids
            and set(m.source_turn_ids) <= turn_ids
            and m.source_session_id == locomo_session.session_id
            for m in stored
        )
        answer = memory.answer("What did Caroline go to?", namespace=locomo_session.namespace)
        assert answer.error is None and answer.answer.strip()
        assert {m.id for m in answer.cited} <= {m.id for m in stored}
        [verdict] = memory.llm.generate(
            [build_judge_request("What did Caroline go to?", "a support group", answer.answer, "locomo")]
        )
        assert verdict.ok and isinstance(verdict.parsed, JudgeVerdict)
