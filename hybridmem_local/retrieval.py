"""Retrieval (paper §3.3): top-k episodes by ``details`` plus top-2k tuples as NL strings.

No LLM call happens here: one query embedding, one index lookup per store, one SQLite fetch.
``format_context`` renders the hits into the block an answer prompt shows the LLM, with
short ids (E1, T3, ...) the answer can cite.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from hybridmem_local.index import VectorIndex
from hybridmem_local.schema import Episode, Hit, MemoryKind, RelationalTuple, SearchResult
from hybridmem_local.store import MemoryStore

IndexProvider = Callable[[str, MemoryKind], VectorIndex]


class Retriever:
    """Dense search over both stores of one namespace."""

    def __init__(self, store: MemoryStore, index_for: IndexProvider, embed_query: Callable[[str], np.ndarray]):
        self.store = store
        self.index_for = index_for
        self.embed_query = embed_query

    def search(self, query: str, namespace: str, k: int, tuple_k: int) -> SearchResult:
        if not query.strip():
            raise ValueError("search query is empty")
        vector = self.embed_query(query)
        ranked = {
            "episode": self.index_for(namespace, "episode").search(vector, k),
            "tuple": self.index_for(namespace, "tuple").search(vector, tuple_k),
        }
        rows = self.store.get_memories([mid for hits in ranked.values() for mid, _ in hits])
        return SearchResult(
            query=query,
            namespace=namespace,
            episodes=_hits(ranked["episode"], rows),
            tuples=_hits(ranked["tuple"], rows),
        )


def _hits(ranked: Sequence[tuple[int, float]], rows: dict[int, Episode | RelationalTuple]) -> list[Hit]:
    # A row can vanish between index lookup and fetch only through another process's forget.
    return [Hit(memory=rows[mid], score=score) for mid, score in ranked if mid in rows]


class RenderedContext(BaseModel):
    """The memory block an answer prompt shows, and the short ids it uses."""

    model_config = ConfigDict(extra="forbid")

    text: str
    #: Short id shown to the LLM ("E1", "T4") → memory id.
    short_ids: dict[str, int]


def format_context(result: SearchResult) -> RenderedContext:
    """Episodes (with dates) then tuples, each block in chronological order."""
    short_ids: dict[str, int] = {}
    lines: list[str] = []
    for title, prefix, hits in (("Episodic memories", "E", result.episodes), ("Relational memories", "T", result.tuples)):
        if not hits:
            continue
        lines.append(f"## {title}")
        for i, hit in enumerate(sorted(hits, key=lambda h: (h.memory.timestamp, h.memory.id or 0)), start=1):
            short = f"{prefix}{i}"
            short_ids[short] = hit.memory.id
            lines.append(f"[{short}] {hit.memory.render()}")
        lines.append("")
    return RenderedContext(text="\n".join(lines).strip() or "(no memories)", short_ids=short_ids)
