"""The LLM of a store: the configured backend behind the store's own call cache.

Every process that works on a store builds its LLM here (the facade, the service), so they share
one cache file beside it, encrypted with its keys when the store is.
"""

from __future__ import annotations

from pathlib import Path

from hybridmem_local.config import LLMConfig
from hybridmem_local.llm import build_llm
from hybridmem_local.llm.base import StructuredLLM
from hybridmem_local.storage.encryption import StoreKeys
from hybridmem_local.storage.paths import llm_cache_path


def store_llm(config: LLMConfig, store_path: Path | None, keys: StoreKeys | None) -> StructuredLLM:
    """The backend ``config`` names, wrapped in the call cache beside the store at ``store_path``
    (``storage/paths.py``), encrypted with ``keys``; an in-memory store (None) has no cache."""
    cache_path = None if store_path is None else llm_cache_path(store_path)
    return build_llm(config, cache_path=cache_path, cache_keys=keys)
