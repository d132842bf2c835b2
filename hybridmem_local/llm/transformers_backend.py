"""Hugging Face transformers backend, constrained with an Outlines logits processor.

Loads a model folder (``config.json`` + weights) or a GGUF file (``gguf_file=``, dequantised
to float32). Requests that share a schema and a token budget are generated as one padded
batch. Generation is driven here rather than through ``outlines.from_transformers(...)()``
so that the prompt goes through the chat template with ``enable_thinking`` and each result
gets its own prompt / completion token counts.
"""

from __future__ import annotations

import json
import time
import warnings
from itertools import groupby
from pathlib import Path

from hybridmem_local.config import LLMConfig
from hybridmem_local.errors import LLMError
from hybridmem_local.llm.base import LLMRequest
from hybridmem_local.llm.constrained import OutlinesProcessors
from hybridmem_local.llm.llamacpp import find_gguf
from hybridmem_local.llm.replies import ChatBackend, Completion, schema_json


def _locate(model_path: Path) -> tuple[Path, str | None]:
    """(folder to load from, gguf file name or None for a regular model folder)."""
    model_path = Path(model_path)
    if model_path.is_dir() and (model_path / "config.json").is_file():
        return model_path, None
    gguf = find_gguf(model_path)
    return gguf.parent, gguf.name


class TransformersLLM(ChatBackend):
    def __init__(self, config: LLMConfig, model_path: Path):
        super().__init__(config)
        import outlines
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder, gguf_file = _locate(model_path)
        load_args = {"gguf_file": gguf_file} if gguf_file else {}
        if config.n_threads:
            torch.set_num_threads(config.n_threads)
        self._torch = torch
        self._tokenizer = AutoTokenizer.from_pretrained(folder, **load_args)
        if not self._tokenizer.chat_template:
            raise LLMError(f"tokenizer in {model_path} has no chat template")
        self._model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **load_args)
        self._model.eval()
        # Also sets left padding and a pad token, which batched generation needs.
        # Outlines annotates the slow PreTrainedTokenizer; it documents and takes fast ones too.
        outlines_model = outlines.from_transformers(self._model, self._tokenizer)  # type: ignore[arg-type]
        self._processors = OutlinesProcessors(outlines_model)
        eos = self._model.generation_config.eos_token_id
        if eos is None:
            eos = self._tokenizer.eos_token_id
        self._eos_ids = set(eos if isinstance(eos, list) else [eos])

    def _prompt(self, request: LLMRequest) -> str:
        prompt = self._tokenizer.apply_chat_template(
            [message.model_dump() for message in request.messages],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=request.enable_thinking,
        )
        if not isinstance(prompt, str):  # tokenize=False renders text; anything else is a broken template
            raise LLMError(f"the chat template rendered {type(prompt).__name__}, not text")
        return prompt

    def _complete(self, requests: list[LLMRequest]) -> list[Completion]:
        def group_key(index: int) -> tuple[str, int]:
            request = requests[index]
            schema = request.output_schema
            return (json.dumps(schema_json(schema)) if schema else "", self.max_new_tokens(request))

        completions: dict[int, Completion] = {}
        for _, group in groupby(sorted(range(len(requests)), key=group_key), key=group_key):
            indices = list(group)
            completions.update(zip(indices, self._complete_group([requests[i] for i in indices]), strict=True))
        return [completions[i] for i in range(len(requests))]

    def _complete_group(self, requests: list[LLMRequest]) -> list[Completion]:
        """One padded ``generate`` call for requests sharing a schema and a token budget."""
        from transformers import LogitsProcessorList

        torch = self._torch
        schema = requests[0].output_schema
        logits_processor = LogitsProcessorList()
        if schema is not None:
            processor = self._processors.get(schema)
            processor.reset()
            logits_processor.append(processor)
        # The chat template already wrote the special tokens (BOS etc.).
        inputs = self._tokenizer(
            [self._prompt(r) for r in requests], padding=True, add_special_tokens=False, return_tensors="pt"
        )
        sampling: dict[str, bool | float | None]
        if self.config.temperature > 0:
            torch.manual_seed(self.config.seed)
            sampling = {"do_sample": True, "temperature": self.config.temperature}
        else:  # greedy; unset the model's own sampling defaults so transformers does not warn
            sampling = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        start = time.perf_counter()
        with torch.inference_mode(), warnings.catch_warnings():
            # generate feeds padding to the rows of a batch that have finished; their matcher
            # has stopped and Outlines warns of an error for each such token. Those tokens are
            # cut off below (a row ends at its first EOS).
            warnings.filterwarnings("ignore", message="Error in LLMatcher: parser stopped", category=UserWarning)
            output = self._model.generate(
                **inputs,
                logits_processor=logits_processor,
                max_new_tokens=self.max_new_tokens(requests[0]),
                pad_token_id=self._tokenizer.pad_token_id,
                **sampling,
            )
        latency = time.perf_counter() - start
        generated = output[:, inputs["input_ids"].shape[1] :].tolist()
        completions = []
        for row, prompt_mask in zip(generated, inputs["attention_mask"], strict=True):
            stop = next((i for i, token in enumerate(row) if token in self._eos_ids), None)
            tokens = row if stop is None else row[: stop + 1]
            # One row of ids decodes to one str (a list comes back only for a batch of rows).
            text: str = self._tokenizer.decode(tokens, skip_special_tokens=True)  # type: ignore[assignment]
            completions.append(
                Completion(
                    text=text,
                    prompt_tokens=int(prompt_mask.sum()),
                    completion_tokens=len(tokens),
                    # The batch ran as one call: each of its results reports the call's time.
                    latency_s=latency,
                    truncated=stop is None,
                )
            )
        return completions

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))
