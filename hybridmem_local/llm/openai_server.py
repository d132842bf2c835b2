"""OpenAI-compatible server backend (``vllm serve``, see scripts/serve_vllm.sh), via the official
``openai`` client.

Each request asks for the schema twice, in the two forms vLLM reads: the standard
``response_format={"type": "json_schema", ...}`` and vLLM's ``extra_body["structured_outputs"]``
(what ``outlines.from_vllm`` sends; servers before 0.12 ignore it silently). vLLM 0.32 merges
the two (``response_format`` sets ``json``, the other fields of ``structured_outputs`` stay), and
both are enforced; the legacy ``guided_json`` field is accepted and silently ignored, so it is
not sent (tests/vllm/test_server.py proves which fields constrain a real server). A server may
still ignore both, so every reply is validated and a failure is retried with the error in a
follow-up message. Qwen3's thinking switch travels as ``chat_template_kwargs``. A batch is
sent as concurrent requests, which the server batches itself.

Run for real against ``vllm serve`` (vLLM 0.32.0 CPU build, SmolLM2-135M; tests/vllm/). What the
real server showed beyond the stand-in (tests/fake_vllm_server.py):

* with free whitespace in the JSON grammar a small model can spend ``max_tokens`` on newlines
  inside a valid-so-far object; the per-request ``structured_outputs.disable_any_whitespace``
  is silently ignored by vLLM 0.32 (it is engine-wide): with ``llm.compact_json`` (off by
  default: it made SmolLM2's curation much worse), scripts/serve_vllm.sh --config starts the
  server with ``--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'``;
* a prompt over ``--max-model-len`` is HTTP 400 (permanent: not retried), and the server stops a
  reply at the context window rather than refusing ``max_tokens`` past it.

Not exercised here: a GPU server, tensor/pipeline parallelism, Ray, Qwen3's reasoning parser.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from hybridmem_local.config import LLMConfig
from hybridmem_local.errors import LLMError
from hybridmem_local.llm.base import LLMRequest
from hybridmem_local.llm.replies import ChatBackend, Completion, schema_json

#: Client errors that asking again cannot fix (408 timeout and 429 overload can be retried).
_RETRYABLE_STATUS = {408, 409, 429}


class OpenAIServerLLM(ChatBackend):
    def __init__(self, config: LLMConfig):
        super().__init__(config)
        import openai

        if not config.base_url:
            raise LLMError("the openai-server backend needs llm.base_url, e.g. http://127.0.0.1:8000/v1")
        self._openai = openai
        self._client = openai.OpenAI(
            base_url=config.base_url,
            api_key=os.environ.get(config.api_key_env) or "EMPTY",
            timeout=config.timeout_s,
            max_retries=0,  # retries are ours: bounded by llm.max_retries, with validation feedback
        )
        # Several rounds of concurrent requests per chunk, so a slow reply stalls few others.
        self.cache_chunk_size = 4 * config.max_concurrent_requests
        self._check_served_model()

    def _check_served_model(self) -> None:
        try:
            served = [model.id for model in self._client.models.list()]
        except self._openai.APIError as exc:
            raise LLMError(
                f"cannot reach the OpenAI-compatible server at {self.config.base_url}: {exc} "
                "(is it running? see scripts/serve_vllm.sh)"
            ) from exc
        if self.config.model not in served:
            raise LLMError(f"server at {self.config.base_url} serves {served}, not llm.model={self.config.model!r}")

    def _complete(self, requests: list[LLMRequest]) -> list[Completion]:
        workers = min(len(requests), self.config.max_concurrent_requests)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llm-request") as pool:
            return list(pool.map(self._complete_one, requests))

    def _request_body(self, request: LLMRequest) -> dict:
        body: dict = {
            "model": self.config.model,
            "messages": [message.model_dump() for message in request.messages],
            "max_tokens": self.max_new_tokens(request),
            "temperature": self.config.temperature,
            "seed": self.config.seed,
            "extra_body": {"chat_template_kwargs": {"enable_thinking": request.enable_thinking}},
        }
        if request.output_schema is not None:
            schema = schema_json(request.output_schema)
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": request.output_schema.__name__, "schema": schema},
            }
            body["extra_body"]["structured_outputs"] = {"json": schema}
        return body

    def _complete_one(self, request: LLMRequest) -> Completion:
        openai = self._openai
        start = time.perf_counter()

        def failed(error: str, permanent: bool = False) -> Completion:
            return Completion(error=error, permanent=permanent, latency_s=time.perf_counter() - start)

        try:
            response = self._client.chat.completions.create(**self._request_body(request))
        except openai.APITimeoutError:
            return failed(f"no reply within {self.config.timeout_s}s (llm.timeout_s)")
        except openai.APIConnectionError as exc:
            return failed(f"cannot reach {self.config.base_url}: {exc}")
        except openai.APIStatusError as exc:
            return failed(
                f"server answered HTTP {exc.status_code}: {exc.message}",
                permanent=400 <= exc.status_code < 500 and exc.status_code not in _RETRYABLE_STATUS,
            )
        except openai.APIError as exc:  # e.g. a body that is not a chat completion
            return failed(f"unusable server response: {exc}")
        if not response.choices:
            return failed("server response has no choices")
        choice = response.choices[0]
        usage = response.usage
        return Completion(
            text=choice.message.content or "",
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            latency_s=time.perf_counter() - start,
            truncated=choice.finish_reason == "length",
        )

    def count_tokens(self, text: str) -> int:
        """Asks the server's ``/tokenize`` endpoint (vLLM's; not part of the OpenAI API)."""
        root = str(self._client.base_url).rstrip("/").removesuffix("/v1")
        try:
            reply = self._client.post(
                f"{root}/tokenize",
                body={"model": self.config.model, "prompt": text, "add_special_tokens": False},
                cast_to=object,
            )
        except self._openai.APIError as exc:
            raise LLMError(f"cannot count tokens with {root}/tokenize: {exc}") from exc
        if not isinstance(reply, dict) or not isinstance(reply.get("count"), int):
            raise LLMError(f"{root}/tokenize answered without a token count: {str(reply)[:200]}")
        return reply["count"]

    def close(self) -> None:
        """Close the client's pooled connections to the server."""
        self._client.close()
