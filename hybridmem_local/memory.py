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
from contextlib import nullcontext as _nullcontext
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from hybridmem_local.config import Config, load_config
from hybridmem_local.llm.base import StructuredLLM
from hybridmem_local.embedding import Embedder, build_embedder
from hybridmem_local.index import SyncReport, VectorIndex
from hybridmem_local.lexical import MemoryLexicalIndexes
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
from hybridmem_local.store import (
    DuplicateSessionError,
    Event,
    MemoryStore,
    NotFoundError,
    SessionRecord,
    StoreError,
    text_hash,
)
from hybridmem_local.windows import WindowSources

if TYPE_CHECKING:
    from rich.progress import Progress

    from hybridmem_local.answering import Answer
    from hybridmem_local.consolidation import ConsolidationReport, PurgeReport, UndoReport
    from hybridmem_local.curation import CurationOutcome

log = logging.getLogger(__name__)

KINDS: tuple[MemoryKind, ...] = ("episode", "tuple")


class Stats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespaces: list[str]
    counts: dict[str, int]
    index_sizes: dict[str, int]


class IngestReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stored: int = 0
    #: Sessions already in the store (ingest is idempotent per session id).
    skipped: int = 0
    curated: int = 0
    failed: int = 0
    memories: int = 0
    #: Memories the LLM wrote without content (only turn ids, a decoding loop), left out.
    memories_left_out: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_seconds: float = 0.0
    #: Consolidation runs triggered by ``consolidation.every_n_sessions``.
    consolidation_runs: list[int] = []


class HybridMemory:
    def __init__(
        self, store: MemoryStore, config: Config, embedder: Embedder | None = None, llm: StructuredLLM | None = None
    ):
        self.store = store
        self.config = config
        self._embedder = embedder
        self._llm = llm
        self._indexes: dict[tuple[str, MemoryKind], VectorIndex] = {}
        self._seen_data_version = store.data_version()
        # --- hybrid retrieval (lexical.py, windows.py): BM25 indexes and raw-turn evidence windows,
        # each a rebuildable cache of SQLite that catches up on use.
        self.lexical = MemoryLexicalIndexes(store, self._index_dir)
        self.windows = WindowSources(
            store, self._index_dir, config.index,
            shape=lambda: (self.config.retrieval.window_size, self.config.retrieval.window_stride),
            embedder_id=lambda: (self.embedder.model_id, self.embedder.dimension),
            embed=self._embed_cached,
        )
        self.retriever = Retriever(
            store, self.index_for, self.embed_query, config.retrieval, self.lexical.get, self.windows.get
        )
        # --- end hybrid retrieval

    @classmethod
    def open(
        cls,
        path: str | Path,
        config: Config | str | Path | None = None,
        embedder: Embedder | None = None,
        llm: StructuredLLM | None = None,
    ) -> HybridMemory:
        """Open (or create) a store. ``config`` is a Config, a YAML path, or None for defaults.

        ``embedder`` and ``llm`` override the configured backends (both are otherwise built
        lazily, on first use, from the config).
        """
        if not isinstance(config, Config):
            config = load_config(config)
        store = MemoryStore(path, busy_timeout_ms=config.store.busy_timeout_ms)
        return cls(store, config, embedder, llm)

    def __enter__(self) -> HybridMemory:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.flush()
        if self._llm is not None and hasattr(self._llm, "close"):
            self._llm.close()
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

    @property
    def llm(self) -> StructuredLLM:
        """The configured LLM, wrapped in the on-disk call cache beside the store."""
        if self._llm is None:
            from hybridmem_local.llm import build_llm

            cache = self._llm_cache_path() if self.store.path is not None else None
            self._llm = build_llm(self.config.llm, cache_path=cache)
        return self._llm

    def _llm_cache_path(self) -> Path:
        return Path(str(self.store.path) + ".llm_cache.sqlite")

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
        self.lexical.drop(namespace)  # hybrid retrieval: BM25 and window indexes rebuild on next use
        self.windows.drop(namespace)
        return reports

    def _drop_index(self, namespace: str, kind: MemoryKind) -> None:
        index = self._indexes.pop((namespace, kind), None) or VectorIndex(
            self._index_dir(namespace), kind, "", 0, self.config.index
        )
        index.delete_files()

    def _apply_to_indexes(self, namespace: str, added: Sequence[Episode | RelationalTuple] = (), removed: Sequence[Episode | RelationalTuple] = ()) -> None:
        """Mirror a committed change in the loaded indexes (unloaded ones catch up on first use).

        ``PRAGMA data_version`` ignores this connection's own commits, so the staleness check
        in ``index_for`` still sees any other process's commit that landed meanwhile.
        """
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
        """Store one session and curate it (or queue it: ``curation.mode``); see ``ingest``."""
        self.ingest([session])
        return self.store.get_session(session.namespace, session.session_id)

    def ingest(self, sessions: Sequence[Session], curate: bool = True, progress: Progress | None = None) -> IngestReport:
        """Store sessions and curate them in batches (one batched LLM call per batch).

        Each session is written in one transaction together with its memories. A session
        whose curation fails is stored with status ``curation_failed`` (raw turns kept) and
        can be retried with ``curate_pending(retry_failed=True)``. Sessions already present
        are skipped, so an interrupted ingest can simply be run again.
        """
        report = IngestReport()
        new = [s for s in sessions if not self.store.has_session(s.namespace, s.session_id)]
        report.skipped = len(sessions) - len(new)
        curate = curate and self.config.curation.mode == "sync"
        if not curate:
            for session in new:
                try:
                    self.store.insert_session(session, curation_status="pending")
                    report.stored += 1
                except DuplicateSessionError:  # another process stored it since the check above
                    report.skipped += 1
            return report
        self._curate_and_store(new, already_stored=False, report=report, progress=progress)
        report.consolidation_runs = self._scheduled_consolidation({s.namespace for s in new})
        return report

    def curate_pending(
        self,
        namespace: str | None = None,
        retry_failed: bool = False,
        progress: Progress | None = None,
        limit: int | None = None,
    ) -> IngestReport:
        """Curate sessions stored raw (``pending``), and failed ones too with ``retry_failed``,
        oldest first; at most ``limit`` of them when given."""
        statuses = ["pending"] + (["curation_failed"] if retry_failed else [])
        records = self.store.sessions_to_curate(statuses, namespace=namespace, limit=limit)
        return self.curate_stored([r.session for r in records], progress=progress)

    def curate_stored(self, sessions: Sequence[Session], progress: Progress | None = None) -> IngestReport:
        """Curate sessions already stored (pending or failed) in batches, then run the
        consolidation their namespaces are due. A session curated meanwhile by another process
        is skipped, never stored twice."""
        report = IngestReport()
        self._curate_and_store(sessions, already_stored=True, report=report, progress=progress)
        report.consolidation_runs = self._scheduled_consolidation({s.namespace for s in sessions})
        return report

    def _curate_and_store(self, sessions: Sequence[Session], already_stored: bool, report: IngestReport, progress: Progress | None) -> None:
        from hybridmem_local.curation import Curator

        curator = Curator(self.llm, self.config.llm, self.config.curation)
        batch = self.config.curation.batch_sessions
        task = progress.add_task("curating sessions", total=len(sessions)) if progress else None
        with progress or _nullcontext():
            for start in range(0, len(sessions), batch):
                chunk = sessions[start : start + batch]
                for session, outcome in zip(chunk, curator.curate(chunk)):
                    report.llm_calls += outcome.llm_calls
                    report.prompt_tokens += outcome.prompt_tokens
                    report.completion_tokens += outcome.completion_tokens
                    report.llm_seconds += outcome.seconds
                    report.memories_left_out += len(outcome.dropped_memories)
                    try:
                        self._store_outcome(session, outcome, already_stored, report)
                    except DuplicateSessionError:  # another process stored it meanwhile
                        report.skipped += 1
                if task is not None:
                    progress.advance(task, len(chunk))

    def _store_outcome(self, session: Session, outcome: CurationOutcome, already_stored: bool, report: IngestReport) -> None:
        """Write one session's curation: its memories, or the failure status (never losing the turns)."""
        if outcome.ok and outcome.result is not None:
            ids = self.add_memories(
                session.namespace,
                episodes=outcome.result.episodes,
                tuples=outcome.result.tuples,
                session=None if already_stored else session,
                source_session_id=session.session_id,
                prompt_version=outcome.prompt_version,
                require_uncurated=already_stored,
            )
            report.memories += len(ids)
            report.curated += 1
        else:
            log.warning("curation of session %s failed: %s", session.session_id, outcome.error)
            if already_stored:
                self.store.set_curation_status(
                    session.namespace, session.session_id, "curation_failed", outcome.error, require_uncurated=True
                )
            else:
                self.store.insert_session(session, curation_status="curation_failed", curation_error=outcome.error)
            report.failed += 1
        report.stored += 0 if already_stored else 1

    def _scheduled_consolidation(self, namespaces: set[str]) -> list[int]:
        if self.config.consolidation.every_n_sessions == 0:
            return []
        from hybridmem_local.consolidation import maybe_consolidate

        runs = []
        for namespace in sorted(namespaces):
            report = maybe_consolidate(self, namespace, self.llm)
            if report is not None and report.run_id is not None:
                runs.append(report.run_id)
        return runs

    def add_memories(
        self,
        namespace: str,
        episodes: Iterable[EpisodeDraft] = (),
        tuples: Iterable[TupleDraft] = (),
        session: Session | None = None,
        source_session_id: str | None = None,
        prompt_version: str | None = None,
        require_uncurated: bool = False,
    ) -> list[int]:
        """Store memories (and, if given, the new session they came from) in one transaction.

        Embeddings are computed before the transaction, so a failure there changes nothing.
        Every ``source_turn_ids`` entry must name a turn of this namespace. With
        ``source_session_id`` naming a stored session, that session is marked curated in the
        same transaction; with ``require_uncurated`` too, nothing is written (AlreadyCuratedError)
        when that session is curated already, so two curators never store its memories twice.
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
        source_session_id = session.session_id if session is not None else source_session_id
        with self.store.transaction():
            if session is not None:
                self.store.insert_session(session, curation_status="curated", prompt_version=prompt_version)
            elif source_session_id is not None:
                self.store.set_curation_status(
                    namespace, source_session_id, "curated", prompt_version=prompt_version,
                    require_uncurated=require_uncurated,
                )
            ids = self.store.insert_memories(namespace, memories, source_session_id=source_session_id)
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
        self.lexical.drop(namespace)  # hybrid retrieval: BM25 and window indexes
        self.windows.drop(namespace)
        index_dir = self._index_dir(namespace) if self.store.path is not None else None
        if index_dir is not None and index_dir.exists():
            shutil.rmtree(index_dir)
        for path in exports:
            path.unlink(missing_ok=True)
        counts["exports"] = len(exports)
        if self.store.path is not None:
            from hybridmem_local.llm.cache import forget_tag

            counts["llm_cache"] = forget_tag(self._llm_cache_path(), namespace)
        return counts

    # ------------------------------------------------------------------ consolidation

    def consolidate(self, namespace: str, dry_run: bool = False) -> ConsolidationReport:
        """Cluster the namespace's active memories and let the LLM merge/retire them (paper §3.2)."""
        from hybridmem_local.clustering import make_clusterer
        from hybridmem_local.consolidation import consolidate

        return consolidate(self, namespace, self.llm, make_clusterer(self.config.consolidation), dry_run=dry_run)

    def undo(self, run_id: int) -> UndoReport:
        """Restore exactly the state before consolidation run ``run_id``."""
        from hybridmem_local.consolidation import undo

        return undo(self, run_id)

    def purge(self, namespace: str, older_than: timedelta) -> PurgeReport:
        """Physically delete superseded/deleted memories retired longer ago than ``older_than``."""
        from hybridmem_local.consolidation import purge

        return purge(self, namespace, older_than)

    # ------------------------------------------------------------------ reads

    def search(self, query: str, namespace: str = "default", k: int | None = None) -> SearchResult:
        """Top-k episodes and top-(2k) tuples for ``query`` (paper §3.3), no LLM call."""
        check_namespace(namespace)
        k = self.config.retrieval.k if k is None else k
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        return self.retriever.search(query, namespace, k, self.config.retrieval.tuple_multiplier * k)

    def answer(
        self, question: str, namespace: str = "default", question_date: datetime | None = None, k: int | None = None
    ) -> Answer:
        """Retrieve (top-k episodes + top-2k tuples) and answer with one LLM call."""
        from hybridmem_local.answering import answer_from_context

        result = self.search(question, namespace=namespace, k=k)
        return answer_from_context(
            self.llm, question, result, question_date,
            enable_thinking=self.config.llm.enable_thinking, context_budget=self.config.retrieval.context_budget,
        )

    def get(self, memory_id: int) -> Episode | RelationalTuple:
        return self.store.get_memory(memory_id)

    def list(
        self,
        namespace: str = "default",
        kind: MemoryKind | None = None,
        status: MemoryStatus | None = MemoryStatus.active,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Episode | RelationalTuple]:
        """Memories in id order (``status=None``: any status); ``limit``/``offset`` page through them."""
        if (limit is not None and limit < 0) or offset < 0:
            raise ValueError(f"limit and offset must not be negative, got limit={limit} offset={offset}")
        return self.store.list_memories(namespace, kind, status, limit=limit, offset=offset)

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
        records = self.export_records(namespace)
        path = Path(path)
        with open(path, "w", encoding="utf-8", opener=_owner_only_opener) as out:
            out.writelines(records)
        self.store.record_export(namespace, path)
        return len(records)

    def export_records(self, namespace: str) -> list[str]:
        """The export's JSONL lines, each ending in a newline: sessions, then memories of any status."""
        check_namespace(namespace)
        if namespace not in self.store.namespaces():
            raise NotFoundError(f"namespace {namespace!r} does not exist")
        sessions = [
            json.dumps({"type": "session", **json.loads(record.model_dump_json())}) + "\n"
            for record in self.store.iter_sessions(namespace)
        ]
        memories = [
            json.dumps({"type": "memory", **json.loads(memory.model_dump_json())}) + "\n"
            for memory in self.store.list_memories(namespace, status=None)
        ]
        return sessions + memories

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
