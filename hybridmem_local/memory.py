"""HybridMemory: the one entry point that wires store, embedder, indexes and retrieval.

    with HybridMemory.open("memory.db") as memory:
        memory.add_session(session)                 # raw turns (+ curation when an LLM is set)
        memory.add_memories("alice", episodes=[...], tuples=[...])
        result = memory.search("Where did Alice move?", namespace="alice")

The SQLite file is the truth. Indexes live beside it (``memory.db.indexes/``) and are caught
up with SQLite whenever they are first used, and again whenever another process has
committed since (``PRAGMA data_version``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from hybridmem_local.config import Config, load_config
from hybridmem_local.embedding import Embedder, build_embedder
from hybridmem_local.index import SyncReport, VectorIndex
from hybridmem_local.retrieval import Retriever
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    RelationalTuple,
    SearchResult,
    Session,
    TupleDraft,
    check_namespace,
)
from hybridmem_local.store import Event, MemoryStore, NotFoundError, SessionRecord, StoreError, text_hash

log = logging.getLogger(__name__)

KINDS: tuple[MemoryKind, ...] = ("episode", "tuple")


class Stats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespaces: list[str]
    counts: dict[str, int]
    index_sizes: dict[str, int]


class HybridMemory:
    def __init__(self, store: MemoryStore, config: Config, embedder: Embedder | None = None):
        self.store = store
        self.config = config
        self._embedder = embedder
        self._indexes: dict[tuple[str, MemoryKind], VectorIndex] = {}
        self._seen_data_version = store.data_version()
        self.retriever = Retriever(store, self.index_for, self.embed_query)

    @classmethod
    def open(
        cls,
        path: str | Path,
        config: Config | str | Path | None = None,
        embedder: Embedder | None = None,
    ) -> HybridMemory:
        """Open (or create) a store. ``config`` is a Config, a YAML path, or None for defaults."""
        if not isinstance(config, Config):
            config = load_config(config)
        store = MemoryStore(path, busy_timeout_ms=config.store.busy_timeout_ms)
        return cls(store, config, embedder)

    def __enter__(self) -> HybridMemory:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.flush()
        self.store.close()

    def flush(self) -> None:
        """Persist the in-memory indexes (they are a cache: losing them only costs a rebuild)."""
        for index in self._indexes.values():
            index.save()

    # ------------------------------------------------------------------ embeddings and indexes

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = build_embedder(self.config.embedder)
        return self._embedder

    def embed_query(self, text: str) -> np.ndarray:
        return self.embedder.embed([text])[0]

    def _index_dir(self, namespace: str) -> Path:
        if self.store.path is None:
            raise StoreError("an in-memory store has no index directory")
        return Path(str(self.store.path) + ".indexes") / namespace

    def _vectors_for(self, namespace: str, ids: np.ndarray) -> np.ndarray:
        """Vectors of memories by id: from the embedding cache, embedding (and caching) the rest."""
        rows = self.store.get_memories([int(i) for i in ids])
        texts = [rows[int(i)].index_text() for i in ids]
        return self._embed_cached(namespace, texts)

    def _embed_cached(self, namespace: str, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.embedder.dimension), dtype=np.float32)
        model_id = self.embedder.model_id
        cached = self.store.get_embeddings(namespace, model_id, texts)
        missing = sorted({t for t in texts if text_hash(t) not in cached})
        if missing:
            vectors = self.embedder.embed(missing)
            self.store.put_embeddings(namespace, model_id, missing, vectors)
            cached.update({text_hash(t): v for t, v in zip(missing, vectors)})
        return np.stack([cached[text_hash(t)] for t in texts])

    def index_for(self, namespace: str, kind: MemoryKind) -> VectorIndex:
        """The namespace's index for one store, caught up with SQLite."""
        version = self.store.data_version()
        if version != self._seen_data_version:
            # Another process committed: catch every loaded index up (a cheap id-set diff).
            self._seen_data_version = version
            for (ns, k) in list(self._indexes):
                self._sync(ns, k)
        if (namespace, kind) not in self._indexes:
            self._indexes[(namespace, kind)] = VectorIndex(
                self._index_dir(namespace), kind, self.embedder.model_id, self.embedder.dimension, self.config.index
            )
            report = self._sync(namespace, kind)
            if report.rebuilt or report.added or report.removed:
                self._indexes[(namespace, kind)].save()
        return self._indexes[(namespace, kind)]

    def _sync(self, namespace: str, kind: MemoryKind) -> SyncReport:
        index = self._indexes[(namespace, kind)]
        return index.sync(self.store.active_ids(namespace, kind), lambda ids: self._vectors_for(namespace, ids))

    def rebuild_indexes(self, namespace: str) -> dict[str, SyncReport]:
        """Throw the namespace's index files away and build them again from SQLite."""
        reports = {}
        for kind in KINDS:
            self._drop_index(namespace, kind)
            index = VectorIndex(self._index_dir(namespace), kind, self.embedder.model_id, self.embedder.dimension, self.config.index)
            self._indexes[(namespace, kind)] = index
            reports[kind] = self._sync(namespace, kind)
            index.save()
        return reports

    def _drop_index(self, namespace: str, kind: MemoryKind) -> None:
        index = self._indexes.pop((namespace, kind), None) or VectorIndex(
            self._index_dir(namespace), kind, "", 0, self.config.index
        )
        index.delete_files()

    def _apply_to_indexes(self, namespace: str, added: Sequence[Episode | RelationalTuple] = (), removed: Sequence[Episode | RelationalTuple] = ()) -> None:
        """Mirror a committed change in the loaded indexes (unloaded ones catch up on first use)."""
        self._seen_data_version = self.store.data_version()
        for kind in KINDS:
            index = self._indexes.get((namespace, kind))
            if index is None:
                continue
            new = [m for m in added if m.kind == kind]
            if new:
                ids = np.array([m.id for m in new], dtype=np.int64)
                index.add(ids, self._embed_cached(namespace, [m.index_text() for m in new]))
            index.remove([m.id for m in removed if m.kind == kind])

    # ------------------------------------------------------------------ writes

    def add_session(self, session: Session) -> SessionRecord:
        """Store a session's raw turns in one transaction (they stay the source of provenance)."""
        self.store.insert_session(session, curation_status="pending")
        return self.store.get_session(session.namespace, session.session_id)

    def add_memories(
        self,
        namespace: str,
        episodes: Iterable[EpisodeDraft] = (),
        tuples: Iterable[TupleDraft] = (),
        session: Session | None = None,
        curation_status: str = "curated",
        prompt_version: str | None = None,
    ) -> list[int]:
        """Store memories (and, if given, the session they came from) in one transaction.

        Embeddings are computed before the transaction, so a failure there changes nothing.
        Every ``source_turn_ids`` entry must name a turn of this namespace.
        """
        check_namespace(namespace)
        memories = [*episodes, *tuples]
        if session is not None and session.namespace != namespace:
            raise ValueError(f"session {session.session_id!r} belongs to namespace {session.namespace!r}, not {namespace!r}")
        self._check_provenance(namespace, memories, session)
        texts = [_as_stored(m, namespace).index_text() for m in memories]
        model_id = self.embedder.model_id
        cached = self.store.get_embeddings(namespace, model_id, texts)
        missing = sorted({t for t in texts if text_hash(t) not in cached})
        vectors = self.embedder.embed(missing)
        with self.store.transaction():
            if session is not None:
                self.store.insert_session(session, curation_status=curation_status, prompt_version=prompt_version)
            ids = self.store.insert_memories(namespace, memories, source_session_id=session.session_id if session else None)
            self.store.put_embeddings(namespace, model_id, missing, vectors)
        self._apply_to_indexes(namespace, added=list(self.store.get_memories(ids).values()))
        return ids

    def _check_provenance(self, namespace: str, memories: Sequence[EpisodeDraft | TupleDraft], session: Session | None) -> None:
        cited = {t for m in memories for t in m.source_turn_ids}
        if not cited:
            return
        known = {t.turn_id for t in session.turns} if session is not None else set()
        unknown = cited - known - self.store._existing_turn_ids(namespace, sorted(cited - known))
        if unknown:
            raise ValueError(f"source_turn_ids name turns that namespace {namespace!r} does not have: {sorted(unknown)[:5]}")

    def delete(self, memory_id: int, reason: str = "deleted by user") -> None:
        """Mark a memory deleted (kept in history; ``forget`` removes data physically)."""
        memory = self.get(memory_id)
        if memory.status == MemoryStatus.deleted:
            return
        self.store.set_status(memory_id, MemoryStatus.deleted, reason=reason)
        self._apply_to_indexes(memory.namespace, removed=[memory])

    def forget(self, namespace: str) -> dict[str, int]:
        """Remove every trace of a namespace: rows, history, vectors, index files, exports."""
        check_namespace(namespace)
        exports = self.store.exports(namespace)
        counts = self.store.forget_namespace(namespace)
        for kind in KINDS:
            self._drop_index(namespace, kind)
        index_dir = self._index_dir(namespace) if self.store.path is not None else None
        if index_dir is not None and index_dir.exists():
            shutil.rmtree(index_dir)
        for path in exports:
            path.unlink(missing_ok=True)
        counts["exports"] = len(exports)
        self._seen_data_version = self.store.data_version()
        return counts

    # ------------------------------------------------------------------ reads

    def search(self, query: str, namespace: str = "default", k: int | None = None) -> SearchResult:
        """Top-k episodes and top-(2k) tuples for ``query`` (paper §3.3), no LLM call."""
        check_namespace(namespace)
        k = self.config.retrieval.k if k is None else k
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        return self.retriever.search(query, namespace, k, self.config.retrieval.tuple_multiplier * k)

    def get(self, memory_id: int) -> Episode | RelationalTuple:
        return self.store.get_memory(memory_id)

    def list(
        self, namespace: str = "default", kind: MemoryKind | None = None, status: MemoryStatus | None = MemoryStatus.active
    ) -> list[Episode | RelationalTuple]:
        return self.store.list_memories(namespace, kind, status)

    def history(self, memory_id: int) -> list[Event]:
        self.get(memory_id)  # a clear NotFoundError for an unknown id
        return self.store.history(memory_id)

    def stats(self, namespace: str | None = None) -> Stats:
        return Stats(
            namespaces=self.store.namespaces(),
            counts=self.store.counts(namespace),
            index_sizes={f"{ns}/{kind}": len(ix) for (ns, kind), ix in self._indexes.items()},
        )

    # ------------------------------------------------------------------ export / import

    def export(self, namespace: str, path: str | Path) -> int:
        """Write a namespace as JSONL (sessions with turns, then memories with provenance)."""
        check_namespace(namespace)
        if namespace not in self.store.namespaces():
            raise NotFoundError(f"namespace {namespace!r} does not exist")
        path = Path(path)
        lines = 0
        with open(path, "w", encoding="utf-8", opener=_owner_only_opener) as out:
            for record in self.store.iter_sessions(namespace):
                out.write(json.dumps({"type": "session", **json.loads(record.model_dump_json())}) + "\n")
                lines += 1
            for memory in self.store.list_memories(namespace, status=None):
                out.write(json.dumps({"type": "memory", **json.loads(memory.model_dump_json())}) + "\n")
                lines += 1
        self.store.record_export(namespace, path)
        return lines

    def import_(self, path: str | Path, namespace: str | None = None) -> dict[str, int]:
        """Load a JSONL export (optionally into another namespace) in one transaction."""
        from hybridmem_local.ingest import read_export

        sessions, memories = read_export(Path(path), namespace)
        target = {m.namespace for m in memories} | {s.session.namespace for s in sessions}
        old_to_new: dict[int, int] = {}
        with self.store.transaction():
            for record in sessions:
                self.store.insert_session(record.session, curation_status=record.curation_status)
            for memory in memories:
                (new_id,) = self.store.insert_memories(memory.namespace, [memory], action="import")
                old_to_new[memory.id] = new_id
            for memory in memories:
                if memory.status != MemoryStatus.active:
                    self.store.set_status(
                        old_to_new[memory.id], memory.status,
                        reason="imported", superseded_by=old_to_new.get(memory.superseded_by), action="import",
                    )
            for ns in target:
                self._embed_cached(ns, [m.index_text() for m in memories if m.namespace == ns and m.status == MemoryStatus.active])
        for ns in target:
            for kind in KINDS:
                if (ns, kind) in self._indexes:
                    self._sync(ns, kind)
        return {"sessions": len(sessions), "memories": len(memories)}


def _as_stored(memory: EpisodeDraft | TupleDraft, namespace: str) -> Episode | RelationalTuple:
    if isinstance(memory, (Episode, RelationalTuple)):
        return memory
    cls = Episode if isinstance(memory, EpisodeDraft) else RelationalTuple
    return cls(namespace=namespace, **memory.model_dump())


def _owner_only_opener(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)
