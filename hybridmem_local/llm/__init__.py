"""Structured LLM backends behind one protocol, picked by ``LLMConfig.backend``.

>>> llm = build_llm(config.llm, cache_path=Path("runs/llm_cache.sqlite"))
>>> [result] = llm.generate([LLMRequest(messages=[...], output_schema=CurationResult)])
>>> result.parsed, result.error, result.prompt_tokens

Importing this package is cheap: each backend imports its engine (llama_cpp, torch, vllm,
openai) only when it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hybridmem_local.config import LLMConfig
from hybridmem_local.errors import LLMError
from hybridmem_local.llm.base import ChatMessage, LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.llm.cache import CachedLLM
from hybridmem_local.llm.llamacpp import LlamaCppLLM
from hybridmem_local.llm.openai_server import OpenAIServerLLM
from hybridmem_local.llm.replies import ChatBackend
from hybridmem_local.llm.transformers_backend import TransformersLLM
from hybridmem_local.llm.vllm_offline import VLLMOfflineLLM
from hybridmem_local.storage.encryption import StoreKeys

#: Backends that load weights from a local path.
LOCAL_BACKENDS: dict[str, Callable[[LLMConfig, Path], ChatBackend]] = {
    "llamacpp": LlamaCppLLM,
    "transformers": TransformersLLM,
    "vllm-offline": VLLMOfflineLLM,
}
#: Backends that talk to a server.
SERVER_BACKENDS: dict[str, Callable[[LLMConfig], ChatBackend]] = {"openai-server": OpenAIServerLLM}
#: Every backend name ``LLMConfig.backend`` accepts.
BACKENDS = {**LOCAL_BACKENDS, **SERVER_BACKENDS}


def build_llm(
    config: LLMConfig,
    model_path: Path | None = None,
    cache_path: Path | None = None,
    cache_keys: StoreKeys | None = None,
) -> StructuredLLM:
    """Build the configured backend, wrapped in the on-disk call cache when ``cache_path`` is given
    (encrypted with ``cache_keys``, the store's keys, when the store is).

    Local backends load ``model_path`` when given, else ``config.path``, else the manifest
    entry named ``config.model`` (see ``hybridmem_local.weights.resolve``).
    """
    if config.backend in SERVER_BACKENDS:
        llm: StructuredLLM = SERVER_BACKENDS[config.backend](config)
    else:
        from hybridmem_local.weights.offline import enforce_offline

        enforce_offline()  # before any engine import: hub libraries read the variables at import
        if model_path is None:
            from hybridmem_local.weights.resolve import resolve_model

            model_path = resolve_model(config.model, explicit_path=config.path).path
        llm = LOCAL_BACKENDS[config.backend](config, Path(model_path))
    if cache_path is not None:
        llm = CachedLLM(
            llm,
            Path(cache_path),
            settings=sampling_settings(config),
            chunk_size=getattr(llm, "cache_chunk_size", 32),
            owns_inner=True,
            keys=cache_keys,
        )
    return llm


def sampling_settings(config: LLMConfig) -> dict:
    """The settings besides the request that change a reply: part of every cache key."""
    return {
        "temperature": config.temperature,
        "seed": config.seed,
        "max_new_tokens": config.max_new_tokens,
        "context_tokens": config.context_tokens,
    }


__all__ = [
    "BACKENDS",
    "CachedLLM",
    "ChatMessage",
    "LLMError",
    "LLMRequest",
    "LLMResult",
    "StructuredLLM",
    "build_llm",
    "sampling_settings",
]
