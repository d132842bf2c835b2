"""The openai-server backend against a real HTTP server on 127.0.0.1 speaking vLLM's endpoints.

The server (tests/fake_vllm_server.py) scripts its replies per test case (named in the user
message) and attempt, and records every request body, so the tests see exactly what the
official client sends.
"""

from __future__ import annotations

import time

import pytest
from pydantic import BaseModel, Field

from hybridmem_local.config import LLMConfig
from hybridmem_local.errors import LLMError
from hybridmem_local.llm import ChatMessage, LLMRequest, build_llm
from tests.fake_vllm_server import SERVED_MODEL, Action, Barrier, ChatServer, Sleep, Status


class Fact(BaseModel):
    entity: str = Field(max_length=40)
    year: int


GOOD = '{"entity": "Caroline", "year": 2023}'


def scripted(script: dict[str, list[Action]]):
    """A responder: ``script[case]`` lists the action for attempt 1, 2, … (the last repeats);
    the case is the request's first message."""

    def respond(body: dict, attempt: int) -> Action:
        steps = script[body["messages"][0]["content"]]
        return steps[min(attempt, len(steps)) - 1]

    return respond


def first_message(body: dict) -> str:
    return body["messages"][0]["content"]


def bodies_for(server: ChatServer, case: str) -> list[dict]:
    return [b for b in server.requests if first_message(b) == case]


@pytest.fixture
def serve():
    servers: list[ChatServer] = []

    def start(script: dict[str, list[Action]], batch_size: int = 1) -> ChatServer:
        servers.append(ChatServer(scripted(script), key=first_message, usage=(11, 7), barrier_parties=batch_size))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def client(server: ChatServer, **overrides):
    config = LLMConfig(backend="openai-server", model=SERVED_MODEL, base_url=server.base_url, **overrides)
    return build_llm(config)


def ask(case: str, schema=Fact, **fields) -> LLMRequest:
    return LLMRequest(messages=[ChatMessage(role="user", content=case)], output_schema=schema, **fields)


def test_batch_is_sent_concurrently_with_schema_and_thinking_switch(serve):
    cases = [f"batch-{i}" for i in range(4)]
    server = serve(
        {case: [Barrier(f'{{"entity": "{case}", "year": {i}}}')] for i, case in enumerate(cases)}, batch_size=len(cases)
    )
    results = client(server, max_retries=0).generate([ask(case) for case in cases])

    # The barrier only opens when all four requests are in flight at once.
    assert [r.error for r in results] == [None] * 4
    assert [r.parsed for r in results] == [Fact(entity=case, year=i) for i, case in enumerate(cases)]
    assert all((r.prompt_tokens, r.completion_tokens) == (11, 7) for r in results)
    schema = Fact.model_json_schema()
    for body in server.requests:
        assert body["model"] == SERVED_MODEL
        assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "Fact", "schema": schema}}
        assert body["structured_outputs"] == {"json": schema}
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["temperature"] == 0.0 and body["max_tokens"] == LLMConfig().max_new_tokens


def test_thinking_request_sends_the_switch_and_the_think_block_is_stripped(serve):
    server = serve({"think": ["<think>\nThe user wants a fact.\n</think>\n\n" + GOOD]})
    [result] = client(server).generate([ask("think", enable_thinking=True)])
    assert server.requests[0]["chat_template_kwargs"] == {"enable_thinking": True}
    assert result.ok and result.parsed == Fact(entity="Caroline", year=2023)
    assert result.text == GOOD


def test_invalid_json_is_retried_with_the_error_and_fixed(serve):
    server = serve({"truncated": ['{"entity": "Caroli', GOOD]})
    [result] = client(server, max_retries=2).generate([ask("truncated")])
    assert result.ok and result.parsed == Fact(entity="Caroline", year=2023)
    first, retry = bodies_for(server, "truncated")
    assert len(first["messages"]) == 1
    assert retry["messages"][1] == {"role": "assistant", "content": '{"entity": "Caroli'}
    assert retry["messages"][2]["role"] == "user" and "does not match Fact" in retry["messages"][2]["content"]
    # Tokens of both attempts are counted.
    assert (result.prompt_tokens, result.completion_tokens) == (22, 14)


def test_wrong_types_are_retried_then_reported_without_raising(serve):
    server = serve({"wrong": ['{"entity": ["a"], "year": "soon"}']})
    [result] = client(server, max_retries=1).generate([ask("wrong")])
    assert not result.ok and result.parsed is None
    assert "entity" in result.error and "year" in result.error
    assert result.text == '{"entity": ["a"], "year": "soon"}'
    assert len(bodies_for(server, "wrong")) == 2


def test_empty_reply_is_an_error_after_retries(serve):
    server = serve({"empty": [""]})
    [result] = client(server, max_retries=2).generate([ask("empty")])
    assert result.error == "empty reply"
    assert len(bodies_for(server, "empty")) == 3


def test_timeout_is_retried_then_reported(serve):
    server = serve({"slow": [Sleep(2.0, GOOD)]})
    start = time.perf_counter()
    [result] = client(server, timeout_s=0.3, max_retries=1).generate([ask("slow")])
    assert result.error == "no reply within 0.3s (llm.timeout_s)"
    assert len(bodies_for(server, "slow")) == 2
    assert time.perf_counter() - start < 2.0  # two 0.3 s attempts and a 0.5 s pause, not the server's 2 s


def test_client_error_is_not_retried_and_good_requests_still_succeed(serve):
    server = serve({"bad": [Status(400)], "good": [GOOD]})
    bad, good = client(server, max_retries=2).generate([ask("bad"), ask("good")])
    assert bad.error.startswith("server answered HTTP 400")
    assert len(bodies_for(server, "bad")) == 1
    assert good.ok and good.parsed.entity == "Caroline"


def test_text_request_has_no_schema_and_keeps_the_answer(serve):
    server = serve({"text": ["<think>short</think>Caroline went in May 2023."]})
    [result] = client(server).generate([ask("text", schema=None, max_new_tokens=32)])
    assert result.ok and result.parsed is None and result.text == "Caroline went in May 2023."
    body = server.requests[0]
    assert "response_format" not in body and "structured_outputs" not in body
    assert body["max_tokens"] == 32


def test_server_going_away_is_a_result_error(serve):
    server = serve({"late": [GOOD]})
    llm = client(server, max_retries=1)
    server.stop()
    [result] = llm.generate([ask("late")])
    assert result.error.startswith(f"cannot reach {server.base_url}")


def test_unreachable_server_or_unknown_model_fail_at_build_time(serve):
    server = serve({})
    with pytest.raises(LLMError, match=r"serves \['qwen3-8b'\], not llm.model='qwen3-32b'"):
        build_llm(LLMConfig(backend="openai-server", model="qwen3-32b", base_url=server.base_url))
    server.stop()
    with pytest.raises(LLMError, match="cannot reach the OpenAI-compatible server"):
        build_llm(LLMConfig(backend="openai-server", model=SERVED_MODEL, base_url=server.base_url))
    with pytest.raises(LLMError, match="needs llm.base_url"):
        build_llm(LLMConfig(backend="openai-server", model=SERVED_MODEL))


def test_api_key_comes_from_the_named_environment_variable(serve, monkeypatch):
    seen = []
    server = serve({"key": [GOOD]})
    original = server.httpd.RequestHandlerClass.do_POST

    def record_key(handler):
        seen.append(handler.headers["Authorization"])
        original(handler)

    monkeypatch.setattr(server.httpd.RequestHandlerClass, "do_POST", record_key)
    monkeypatch.setenv("MY_VLLM_KEY", "sk-local")
    client(server, api_key_env="MY_VLLM_KEY").generate([ask("key")])
    monkeypatch.delenv("MY_VLLM_KEY")
    client(server, api_key_env="MY_VLLM_KEY").generate([ask("key")])
    assert seen == ["Bearer sk-local", "Bearer EMPTY"]


def test_count_tokens_uses_the_server_tokenizer(serve):
    server = serve({})
    assert client(server).count_tokens("one two three") == 3


def test_the_call_cache_sends_several_rounds_of_concurrent_requests_per_commit(serve, tmp_path):
    cases = [f"chunk-{i}" for i in range(9)]
    server = serve({case: [GOOD] for case in cases})
    config = LLMConfig(backend="openai-server", model=SERVED_MODEL, base_url=server.base_url, max_concurrent_requests=2)
    llm = build_llm(config, cache_path=tmp_path / "cache.sqlite")
    seen_sizes = []
    inner_generate = llm.inner.generate
    llm.inner.generate = lambda requests: seen_sizes.append(len(requests)) or inner_generate(requests)
    assert all(r.ok for r in llm.generate([ask(case) for case in cases]))
    assert seen_sizes == [8, 1]  # 4 rounds of 2 concurrent requests, then the rest
