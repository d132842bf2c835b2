"""vLLM in-process backend (``vllm.LLM``): the GPU path for Qwen3-8B.

A whole batch is one ``LLM.chat`` call (vLLM schedules it with continuous batching), each
request carrying its own ``SamplingParams`` with ``StructuredOutputsParams(json=schema)``.
``chat_template_kwargs`` applies to a whole call, so requests are split into at most two calls
by their ``enable_thinking`` flag. With ``llm.reasoning_parser: qwen3`` vLLM starts enforcing
the schema after the ``</think>`` tag; the reasoning itself is stripped from the text.

vLLM is driven directly rather than through ``outlines.from_vllm_offline``: that wrapper takes
one output type per batch and returns bare strings, without the token counts reported here.

Written against the vLLM 0.33.0 source (``LLM.__init__``, ``LLM.chat``, ``SamplingParams``,
``StructuredOutputsParams``, ``RequestOutput``) and tested with a stand-in module of that
shape: it was not exercised on a GPU here.
"""

from __future__ import annotations

import time
from pathlib import Path

from hybridmem_local.config import LLMConfig
from hybridmem_local.llm.base import LLMError, LLMRequest
from hybridmem_local.llm.replies import ChatBackend, Completion, schema_json


class VLLMOfflineLLM(ChatBackend):
    #: Continuous batching needs many requests in flight to fill the GPU.
    cache_chunk_size = 512

    def __init__(self, config: LLMConfig, model_path: Path):
        super().__init__(config)
        try:
            from vllm import LLM
        except ImportError as exc:
            raise LLMError(
                f"the vllm-offline backend needs vllm ({exc}); install the 'vllm' extra on a GPU machine"
            ) from exc
        engine_args = {
            "model": str(model_path),
            "served_model_name": config.model,
            "tensor_parallel_size": config.tensor_parallel_size,
            "pipeline_parallel_size": config.pipeline_parallel_size,
            "gpu_memory_utilization": config.gpu_memory_utilization,
            "seed": config.seed,
        }
        optional = {
            "max_model_len": config.max_model_len,
            "distributed_executor_backend": config.distributed_executor_backend,
            "reasoning_parser": config.reasoning_parser,
        }
        engine_args.update({name: value for name, value in optional.items() if value is not None})
        self._llm = LLM(**engine_args)
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
        completions: list[Completion | None] = [None] * len(requests)
        for thinking in (False, True):
            indices = [i for i, request in enumerate(requests) if request.enable_thinking == thinking]
            if not indices:
                continue
            start = time.perf_counter()
            outputs = self._llm.chat(
                [[message.model_dump() for message in requests[i].messages] for i in indices],
                sampling_params=[self._sampling_params(requests[i]) for i in indices],
                use_tqdm=False,
                chat_template_kwargs={"enable_thinking": thinking},
            )
            latency = time.perf_counter() - start
            for i, output in zip(indices, outputs, strict=True):
                sample = output.outputs[0]
                completions[i] = Completion(
                    text=sample.text,
                    prompt_tokens=len(output.prompt_token_ids or ()),
                    completion_tokens=len(sample.token_ids),
                    # The batch ran as one call: each of its results reports the call's time.
                    latency_s=latency,
                    truncated=sample.finish_reason == "length",
                )
        return completions  # type: ignore[return-value]

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))
