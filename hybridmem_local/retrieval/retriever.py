"""Retrieval (paper §3.3, extended): per store, dense and/or BM25 rankings, fused by RRF.

No LLM call happens here. For each store named in ``retrieval.sources`` (episodes, tuples,
raw-turn evidence windows) the retriever ranks by

* ``dense``: one query embedding, one hnswlib lookup — the paper's setting;
* ``lexical``: BM25 over stemmed words (``indexes/bm25.py``);
* ``hybrid``: both, each ``candidate_depth`` deep, fused by reciprocal rank fusion (``fusion.py``);

each from the namespace's indexes (``indexes/store_indexes.py``), caught up with the store on use. The
stores' rankings run on a small thread pool: BM25 while the query is embedded, then the
hnswlib lookups side by side (search p95 / query-embedding p95 with the default sources at
100k memories + 90k windows: 1.45–1.48× → 1.34–1.41×, docs/benchmarks.md §1). Results are the same as
ranked one by one.

A search returns the top-k episodes, top-2k tuples and top-k windows (the paper's fixed
selection over the stores searched); asked for ``candidates`` (an answer with
``retrieval.context_budget`` set) it returns every candidate, and
answering's ``format_context(result, budget=..., count_tokens=...)`` fills the budget in fused
rank order across stores (``answering/context.py``): it renders the block an answer prompt
shows, with short ids (E1, T3, W2) the answer can cite.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hybridmem_local.config import RetrievalConfig
from hybridmem_local.errors import InvalidInputError
from hybridmem_local.retrieval.fusion import reciprocal_rank_fusion
from hybridmem_local.schema import Episode, Hit, MemoryKind, RelationalTuple, SearchResult, WindowHit
from hybridmem_local.storage.store import MemoryStore

if TYPE_CHECKING:
    from hybridmem_local.indexes.store_indexes import SourceKind, StoreIndexes

Ranking = list[tuple[int, float]]

_STORE_KINDS: dict[str, MemoryKind] = {"episodes": "episode", "tuples": "tuple"}
_SOURCE_KINDS = ("episode", "tuple", "window")


class SearchFilters(BaseModel):
    """What a search keeps of the ranked candidates (all optional; none given keeps everything).

    ``since``/``until`` compare dates: a memory's timestamp (an ISO prefix: a year, month, day
    or datetime) is kept when the period it names overlaps ``[since, until]``; a window is kept
    by its session's date. ``min_score`` drops hits scoring lower, in the mode's own scale
    (cosine for dense, BM25 for lexical, reciprocal-rank-fusion for hybrid).
    """

    model_config = ConfigDict(extra="forbid")

    #: Memory stores to search (default: those ``retrieval.sources`` names); windows follow the config.
    kinds: list[MemoryKind] | None = Field(default=None, min_length=1)
    since: date | datetime | None = None
    until: date | datetime | None = None
    min_score: float | None = None

    def dated(self) -> bool:
        return self.since is not None or self.until is not None

    def keeps_timestamp(self, timestamp: str) -> bool:
        # An ISO prefix compares with a bound cut to the same precision: "2023" overlaps 2023-05-01.
        if self.since is not None and timestamp < _iso(self.since)[: len(timestamp)]:
            return False
        return self.until is None or timestamp <= _iso(self.until)[: len(timestamp)]


def _iso(moment: date | datetime) -> str:
    return moment.isoformat()


class Retriever:
    """Dense, lexical or hybrid search over the stores of one namespace."""

    def __init__(self, store: MemoryStore, indexes: StoreIndexes, config: RetrievalConfig | None = None):
        self.store = store
        self.indexes = indexes
        # Dense over episodes and tuples, as the paper, when no config is given.
        self.config = config if config is not None else RetrievalConfig(mode="dense")
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def close(self) -> None:
        """Stop the ranking threads (a later search starts them again)."""
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown()
        self._pool = None

    def search(
        self,
        query: str,
        namespace: str,
        k: int,
        tuple_k: int,
        window_k: int | None = None,
        filters: SearchFilters | None = None,
        candidates: bool = False,
    ) -> SearchResult:
        """Top-``k`` episodes, top-``tuple_k`` tuples and top-``window_k`` (default k) windows.

        With ``candidates`` every store returns its whole candidate list (``candidate_depth``,
        at least the k asked for), ranked, for a budgeted ``format_context`` to cut. With date
        ``filters`` a store is searched deeper until it has its count of hits that pass them,
        or has no more candidates.

        The stores' rankings run on a small thread pool (hnswlib, numpy and torch release the
        GIL): BM25 needs no query vector, so it ranks while the query is embedded, and then the
        stores' hnswlib lookups run side by side. Fusion, and every SQLite read, stay on the
        calling thread, which owns the connection.
        """
        if not query.strip():
            raise InvalidInputError("search query is empty")
        config = self.config
        filters = filters or SearchFilters()
        limits = {"episodes": k, "tuples": tuple_k, "windows": k if window_k is None else window_k}
        if candidates:
            limits = {name: max(limit, config.candidate_depth) for name, limit in limits.items()}
        searched: dict[str, SourceKind] = {
            name: "window" if name == "windows" else _STORE_KINDS[name]
            for name in config.sources
            if name == "windows" or filters.kinds is None or _STORE_KINDS[name] in filters.kinds
        }
        depths = {kind: self._depth(limits[name], filters) for name, kind in searched.items()}
        started: dict[SourceKind, dict[str, Future[Ranking]]] = {kind: {} for kind in depths}
        try:
            if config.mode != "dense":
                self._start(started, "lexical", namespace, depths, lambda index, depth: index.search(query, depth))
            vector = self.indexes.embed_query(query) if config.mode != "lexical" else None
            if vector is not None:
                self._start(started, "dense", namespace, depths, lambda index, depth: index.search(vector, depth))
            result = SearchResult(query=query, namespace=namespace)
            for name, kind in searched.items():
                if kind == "window":
                    result.windows = self._filtered(
                        query,
                        vector,
                        namespace,
                        kind,
                        limits[name],
                        filters,
                        started[kind],
                        lambda ranking: [
                            WindowHit(window=w, score=s)
                            for w, s in _found(ranking, self.indexes.windows(namespace, [i for i, _ in ranking]))
                        ],
                        lambda hit: filters.keeps_timestamp(hit.window.session_date.date().isoformat()),
                    )
                else:
                    hits = self._filtered(
                        query,
                        vector,
                        namespace,
                        kind,
                        limits[name],
                        filters,
                        started[kind],
                        lambda ranking: _hits(ranking, self.store.memories.get_many([i for i, _ in ranking])),
                        lambda hit: filters.keeps_timestamp(hit.memory.timestamp),
                    )
                    setattr(result, name, hits)
        finally:
            # An index is never caught up (changed) while a ranking thread still reads it.
            wait([future for futures in started.values() for future in futures.values()])
        return result

    def _depth(self, limit: int, filters: SearchFilters) -> int:
        """How deep a store's first ranking goes: its limit, 4× that when date filters may drop hits."""
        return limit * 4 if filters.dated() else limit

    def _ranking_depth(self, limit: int) -> int:
        """Hybrid search fuses two rankings ``candidate_depth`` deep (at least ``limit``)."""
        return max(limit, self.config.candidate_depth) if self.config.mode == "hybrid" else limit

    def _start(
        self,
        started: dict[SourceKind, dict[str, Future[Ranking]]],
        method: str,
        namespace: str,
        depths: dict[SourceKind, int],
        rank: Callable[[Any, int], Ranking],
    ) -> None:
        """Start the ``method`` ("dense" or "lexical") ranking of every store on the pool, each
        index caught up first here, on the calling thread."""
        indexes = {kind: getattr(self.indexes, method)(namespace, kind) for kind in depths}
        # Threads do not survive a fork: a forked child starts a pool of its own.
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(max_workers=len(_SOURCE_KINDS), thread_name_prefix="ranking")
            self._pool_pid = os.getpid()
        for kind, index in indexes.items():
            started[kind][method] = self._pool.submit(rank, index, self._ranking_depth(depths[kind]))

    def _filtered(
        self,
        query: str,
        vector: np.ndarray | None,
        namespace: str,
        kind: SourceKind,
        limit: int,
        filters: SearchFilters,
        started: dict[str, Future[Ranking]],
        to_hits: Callable[[Ranking], list[Any]],
        keeps: Callable[[Any], bool],
    ) -> list[Any]:
        """A store's top ``limit`` hits that pass ``filters``, searching deeper while date filters
        leave fewer than ``limit`` and the index has more. ``started``: the store's rankings of
        the first depth, by method, already running on the pool."""
        depth = self._depth(limit, filters)
        first = {method: future.result() for method, future in started.items()}
        while True:
            ranking = self._rank(query, vector, namespace, kind, depth, first)
            first = {}
            if filters.min_score is not None:
                ranking = [(i, s) for i, s in ranking if s >= filters.min_score]
            hits = [h for h in to_hits(ranking) if not filters.dated() or keeps(h)]
            if len(hits) >= limit or len(ranking) < depth or not filters.dated():
                return hits[:limit]
            depth *= 4

    def _rank(
        self,
        query: str,
        vector: np.ndarray | None,
        namespace: str,
        kind: SourceKind,
        limit: int,
        ranked: Mapping[str, Ranking],
    ) -> Ranking:
        """One store's ranking: dense, lexical, or both fused (each ``candidate_depth`` deep);
        ``ranked``: the rankings by method already made at this depth."""
        config, depth = self.config, self._ranking_depth(limit)
        dense = lexical = []
        if vector is not None:  # None in lexical mode
            dense = ranked["dense"] if "dense" in ranked else self.indexes.dense(namespace, kind).search(vector, depth)
        if config.mode != "dense":
            lexical = (
                ranked["lexical"] if "lexical" in ranked else self.indexes.lexical(namespace, kind).search(query, depth)
            )
        if config.mode == "dense":
            return dense
        if config.mode == "lexical":
            return lexical
        return fuse(dense, lexical, config)[:limit]


def _found(ranking: Ranking, rows: dict[int, Any]) -> list[tuple[Any, float]]:
    return [(rows[i], s) for i, s in ranking if i in rows]


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
