"""The one write unit of memory content, used by the facade's writes, consolidation runs and
redactions alike:

    embedded = writer.embed(namespace, [memory.index_text() for memory in new])
    with writer.transaction(embedded):
        store.memories.insert(namespace, new)          # or store.memories.supersede(...)

The texts are embedded first, outside any lock (an embedding failure changes nothing); the
write's transaction then stores the vectors the embedding cache lacked, so they land with the
rows or not at all, and the indexes find them there when they catch up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from hybridmem_local.embedding import Embedder
from hybridmem_local.indexes.store_indexes import StoreIndexes


@dataclass(frozen=True)
class Embedded:
    """Texts embedded for one write."""

    namespace: str
    #: Every text's vector, in the order given.
    vectors: np.ndarray
    #: The texts the embedding cache lacked, and their vectors: the write's transaction stores them.
    uncached: list[str]
    uncached_vectors: np.ndarray


class MemoryWriter:
    """Embeds before a write and caches the new vectors inside its transaction (module docstring)."""

    def __init__(self, indexes: StoreIndexes, embedder: Callable[[], Embedder]):
        self.indexes = indexes
        self.store = indexes.store
        self._embedder = embedder

    def embed(self, namespace: str, texts: Sequence[str]) -> Embedded:
        uncached, uncached_vectors, vectors = self.indexes.for_write(namespace, texts)
        return Embedded(namespace, vectors, uncached, uncached_vectors)

    @contextmanager
    def transaction(self, embedded: Embedded) -> Iterator[None]:
        """The write's transaction (the caller's, when inside one), caching ``embedded``'s new vectors."""
        with self.store.transaction():
            self.store.embedding_cache.put(
                embedded.namespace, self._embedder().model_id, embedded.uncached, embedded.uncached_vectors
            )
            yield
