"""What every job of the facade works with, built once per open store."""

from __future__ import annotations

from hybridmem_local.config import Config
from hybridmem_local.embedding import Embedder, build_embedder
from hybridmem_local.indexes.store_indexes import StoreIndexes
from hybridmem_local.indexes.writer import MemoryWriter
from hybridmem_local.llm.base import StructuredLLM
from hybridmem_local.llm.factory import store_llm
from hybridmem_local.retrieval.retriever import Retriever
from hybridmem_local.storage.store import MemoryStore


class Components:
    """The store and its config, the indexes and the retriever over them, the write unit, and the
    embedder and LLM, each built from the config on first use unless given."""

    def __init__(
        self, store: MemoryStore, config: Config, embedder: Embedder | None = None, llm: StructuredLLM | None = None
    ):
        self.store = store
        self.config = config
        self._embedder = embedder
        self._llm = llm
        # A given LLM belongs to the caller (the service shares one between two memories); one
        # built here from the config is closed here.
        self._owns_llm = llm is None
        self.indexes = StoreIndexes(store, config, lambda: self.embedder)
        self.retriever = Retriever(store, self.indexes, config.retrieval)
        self.writer = MemoryWriter(self.indexes, lambda: self.embedder)

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = build_embedder(self.config.embedder)
        return self._embedder

    @property
    def llm(self) -> StructuredLLM:
        """The configured LLM behind the call cache beside the store (``llm/factory.py``)."""
        if self._llm is None:
            self._llm = store_llm(self.config.llm, self.store.path, self.store.keys)
        return self._llm

    def close(self) -> None:
        """Save the indexes, stop the retriever's threads, close an LLM built here and the store."""
        self.indexes.flush()
        self.retriever.close()
        if self._owns_llm and self._llm is not None:
            self._llm.close()
        self.store.close()
