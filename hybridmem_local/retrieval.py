"""Retrieval (paper §3.3, extended): per store, dense and/or BM25 rankings, fused by RRF.

No LLM call happens here. For each store named in ``retrieval.sources`` (episodes, tuples,
raw-turn evidence windows) the retriever ranks by

* ``dense``: one query embedding, one hnswlib lookup — the paper's setting;
* ``lexical``: BM25 over stemmed words (``lexical.py``);
* ``hybrid``: both, each ``candidate_depth`` deep, fused by reciprocal rank fusion (``fusion.py``).

By default it keeps the paper's fixed selection — top-k episodes, top-2k tuples, top-k
windows; with ``retrieval.context_budget`` set it returns every candidate, and
``format_context(result, budget=..., count_tokens=...)`` fills the budget in fused rank order
across stores (``context.py``). ``format_context`` renders the block an answer prompt shows,
with short ids (E1, T3, W2) the answer can cite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from hybridmem_local.config import RetrievalConfig
from hybridmem_local.context import RenderedContext, assemble_context
from hybridmem_local.fusion import reciprocal_rank_fusion
from hybridmem_local.index import VectorIndex
from hybridmem_local.lexical import LexicalIndex
from hybridmem_local.schema import Episode, Hit, MemoryKind, RelationalTuple, SearchResult, WindowHit
from hybridmem_local.store import MemoryStore

if TYPE_CHECKING:
    from hybridmem_local.windows import WindowSource

IndexProvider = Callable[[str, MemoryKind], VectorIndex]
LexicalProvider = Callable[[str, MemoryKind], LexicalIndex]
WindowProvider = Callable[[str], "WindowSource"]

Ranking = list[tuple[int, float]]

_STORE_KINDS: dict[str, MemoryKind] = {"episodes": "episode", "tuples": "tuple"}


class Retriever:
    """Dense, lexical or hybrid search over the stores of one namespace."""

    def __init__(
        self,
        store: MemoryStore,
        index_for: IndexProvider,
        embed_query: Callable[[str], np.ndarray],
        config: RetrievalConfig | None = None,
        lexical_for: LexicalProvider | None = None,
        windows_for: WindowProvider | None = None,
    ):
        self.store = store
        self.index_for = index_for
        self.embed_query = embed_query
        # Dense over episodes and tuples, as the paper, when no config is given.
        self.config = config if config is not None else RetrievalConfig(mode="dense")
        self.lexical_for = lexical_for
        self.windows_for = windows_for

    def search(self, query: str, namespace: str, k: int, tuple_k: int, window_k: int | None = None) -> SearchResult:
        """Top-``k`` episodes, top-``tuple_k`` tuples and top-``window_k`` (default k) windows.

        In budget mode (``context_budget`` set) every store returns its whole candidate list
        (``candidate_depth``, at least the k asked for), ranked, for ``format_context`` to cut.
        """
        if not query.strip():
            raise ValueError("search query is empty")
        config = self.config
        if config.mode != "dense" and self.lexical_for is None:
            raise ValueError(f"retrieval.mode {config.mode!r} needs lexical indexes; this Retriever has none")
        if "windows" in config.sources and self.windows_for is None:
            raise ValueError("retrieval.sources includes 'windows' but this Retriever has no window source")
        limits = {"episodes": k, "tuples": tuple_k, "windows": k if window_k is None else window_k}
        if config.context_budget is not None:
            limits = {name: max(limit, config.candidate_depth) for name, limit in limits.items()}
        vector = self.embed_query(query) if config.mode != "lexical" else None

        result = SearchResult(query=query, namespace=namespace)
        memory_rankings: dict[str, Ranking] = {}
        for name in config.sources:
            if name == "windows":
                source = self.windows_for(namespace)
                ranking = self._rank(query, vector, source.dense, source.lexical, limits[name])
                windows = source.get([wid for wid, _ in ranking])
                result.windows = [WindowHit(window=windows[wid], score=s) for wid, s in ranking if wid in windows]
            else:
                kind = _STORE_KINDS[name]
                memory_rankings[name] = self._rank(
                    query, vector, lambda: self.index_for(namespace, kind), lambda: self.lexical_for(namespace, kind),
                    limits[name],
                )
        rows = self.store.get_memories([mid for ranking in memory_rankings.values() for mid, _ in ranking])
        result.episodes = _hits(memory_rankings.get("episodes", []), rows)
        result.tuples = _hits(memory_rankings.get("tuples", []), rows)
        return result

    def _rank(
        self,
        query: str,
        vector: np.ndarray | None,
        dense: Callable[[], VectorIndex],
        lexical: Callable[[], LexicalIndex],
        limit: int,
    ) -> Ranking:
        """One store's ranking: dense, lexical, or both fused (each ``candidate_depth`` deep)."""
        config = self.config
        if config.mode == "dense":
            return dense().search(vector, limit)
        if config.mode == "lexical":
            return lexical().search(query, limit)
        depth = max(limit, config.candidate_depth)
        return fuse(dense().search(vector, depth), lexical().search(query, depth), config)[:limit]


def fuse(dense: Ranking, lexical: Ranking, config: RetrievalConfig) -> Ranking:
    """RRF of a dense and a lexical ranking of the same store, with the configured k and weights."""
    return reciprocal_rank_fusion(
        {"dense": [i for i, _ in dense], "lexical": [i for i, _ in lexical]},
        k=config.rrf_k,
        weights=config.weights.model_dump(),
    )


def _hits(ranked: Sequence[tuple[int, float]], rows: dict[int, Episode | RelationalTuple]) -> list[Hit]:
    # A row can vanish between index lookup and fetch only through another process's forget.
    return [Hit(memory=rows[mid], score=score) for mid, score in ranked if mid in rows]


def format_context(
    result: SearchResult,
    budget: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> RenderedContext:
    """Render a search result: everything it holds, or as much as fits ``budget`` tokens.

    Episodes (with dates), then tuples, then raw-turn windows under one date header per
    session; each block in chronological order. With ``budget``, items are taken in fused
    rank order across stores until no further one fits; ``count_tokens`` (the answer model's
    ``StructuredLLM.count_tokens``) is then required.
    """
    return assemble_context(result, budget=budget, count_tokens=count_tokens)
