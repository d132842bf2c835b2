"""The openai-server backend against a real HTTP server on 127.0.0.1 speaking vLLM's endpoints.

The server scripts its replies per test case (named in the user message) and attempt, and
records every request body, so the tests see exactly what the official client sends.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import BaseModel, Field

from hybridmem_local.config import LLMConfig
from hybridmem_local.llm import ChatMessage, LLMError, LLMRequest, build_llm

SERVED_MODEL = "qwen3-8b"


class Fact(BaseModel):
    entity: str = Field(max_length=40)
    year: int


GOOD = '{"entity": "Caroline", "year": 2023}'


class ScriptedServer:
    """``script[case]`` lists what to do on attempt 1, 2, …: a reply text, ``("sleep", s)``,
    ``("status", code)`` or ``("barrier", text)`` (wait until the whole batch is in flight)."""

    def __init__(self, script: dict[str, list], batch_size: int = 1):
        self.script = script
        self.bodies: list[dict] = []
        self.attempts: dict[str, int] = {}
        self.barrier = threading.Barrier(batch_size, timeout=10)
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _send(self, status: int, payload) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [
                        {"id": SERVED_MODEL, "object": "model", "created": 0, "owned_by": "test"}
                    ]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    self._send(200, {"count": len(body["prompt"].split()), "max_model_len": 4096, "tokens": []})
                    return
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                case = body["messages"][0]["content"]
                with server.lock:
                    server.bodies.append(body)
                    attempt = server.attempts.get(case, 0)
                    server.attempts[case] = attempt + 1
                steps = server.script[case]
                action = steps[min(attempt, len(steps) - 1)]
                if isinstance(action, tuple) and action[0] == "sleep":
                    time.sleep(action[1])
                    action = GOOD
                if isinstance(action, tuple) and action[0] == "status":
                    self._send(action[1], {"error": {"message": "scripted failure", "type": "BadRequestError"}})
                    return
                if isinstance(action, tuple) and action[0] == "barrier":
                    server.barrier.wait()
                    action = action[1]
                self._send(200, {
                    "id": f"chatcmpl-{attempt}",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{
                        "index": 0,
                        "message": {"role": "assistant", "content": action},
                        "finish_reason": "stop",
                    }],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                })

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def bodies_for(self, case: str) -> list[dict]:
        return [b for b in self.bodies if b["messages"][0]["content"] == case]


@pytest.fixture
def serve():
    servers: list[ScriptedServer] = []

    def start(script, batch_size=1) -> ScriptedServer:
        servers.append(ScriptedServer(script, batch_size))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def client(server: ScriptedServer, **overrides):
    config = LLMConfig(backend="openai-server", model=SERVED_MODEL, base_url=server.base_url, **overrides)
    return build_llm(config)


def ask(case: str, schema=Fact, **fields) -> LLMRequest:
    return LLMRequest(messages=[ChatMessage(role="user", content=case)], output_schema=schema, **fields)


def test_batch_is_sent_concurrently_with_schema_and_thinking_switch(serve):
    cases = [f"batch-{i}" for i in range(4)]
    server = serve({case: [("barrier", f'{{"entity": "{case}", "year": {i}}}')] for i, case in enumerate(cases)},
                   batch_size=len(cases))
    results = client(server, max_retries=0).generate([ask(case) for case in cases])

    # The barrier only opens when all four requests are in flight at once.
    assert [r.error for r in results] == [None] * 4
    assert [r.parsed for r in results] == [Fact(entity=case, year=i) for i, case in enumerate(cases)]
    assert all((r.prompt_tokens, r.completion_tokens) == (11, 7) for r in results)
    schema = Fact.model_json_schema()
    for body in server.bodies:
        assert body["model"] == SERVED_MODEL
        assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "Fact", "schema": schema}}
        assert body["structured_outputs"] == {"json": schema}
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["temperature"] == 0.0 and body["max_tokens"] == LLMConfig().max_new_tokens


def test_thinking_request_sends_the_switch_and_the_think_block_is_stripped(serve):
    server = serve({"think": ["<think>\nThe user wants a fact.\n</think>\n\n" + GOOD]})
    [result] = client(server).generate([ask("think", enable_thinking=True)])
    assert server.bodies[0]["chat_template_kwargs"] == {"enable_thinking": True}
    assert result.ok and result.parsed == Fact(entity="Caroline", year=2023)
    assert result.text == GOOD


def test_invalid_json_is_retried_with_the_error_and_fixed(serve):
    server = serve({"truncated": ['{"entity": "Caroli', GOOD]})
    [result] = client(server, max_retries=2).generate([ask("truncated")])
    assert result.ok and result.parsed == Fact(entity="Caroline", year=2023)
    first, retry = server.bodies_for("truncated")
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
    assert len(server.bodies_for("wrong")) == 2


def test_empty_reply_is_an_error_after_retries(serve):
    server = serve({"empty": [""]})
    [result] = client(server, max_retries=2).generate([ask("empty")])
    assert result.error == "empty reply"
    assert len(server.bodies_for("empty")) == 3


def test_timeout_is_retried_then_reported(serve):
    server = serve({"slow": [("sleep", 2.0)]})
    start = time.perf_counter()
    [result] = client(server, timeout_s=0.3, max_retries=1).generate([ask("slow")])
    assert result.error == "no reply within 0.3s (llm.timeout_s)"
    assert len(server.bodies_for("slow")) == 2
    assert time.perf_counter() - start < 2.0  # two 0.3 s attempts and a 0.5 s pause, not the server's 2 s


def test_client_error_is_not_retried_and_good_requests_still_succeed(serve):
    server = serve({"bad": [("status", 400)], "good": [GOOD]})
    bad, good = client(server, max_retries=2).generate([ask("bad"), ask("good")])
    assert bad.error.startswith("server answered HTTP 400")
    assert len(server.bodies_for("bad")) == 1
    assert good.ok and good.parsed.entity == "Caroline"


def test_text_request_has_no_schema_and_keeps_the_answer(serve):
    server = serve({"text": ["<think>short</think>Caroline went in May 2023."]})
    [result] = client(server).generate([ask("text", schema=None, max_new_tokens=32)])
    assert result.ok and result.parsed is None and result.text == "Caroline went in May 2023."
    body = server.bodies[0]
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
