"""HybridMemory: the one entry point that wires store, embedder, indexes, curation and consolidation.

    with HybridMemory.open("memory.db") as memory:
        memory.add_session(session)                 # raw turns (+ curation when an LLM is set)
        memory.add_memories("alice", episodes=[...], tuples=[...])
        result = memory.search("Where did Alice move?", namespace="alice")

The SQLite file is the truth; every write goes to it first. The indexes (``indexes/``) live
beside it (``memory.db.indexes/``) and catch up with it whenever they are used after a commit,
of this process or another.

``HybridMemory`` is a thin class: each method hands its call to the module that owns its job,
with the parts of the open store (``components.py``):

* ``ingestion.py``: sessions stored and curated, the curation queue;
* ``writes.py``: memories added, updated (a new row superseding the old), deleted;
* ``reads.py``: rows, history and figures; ``queries.py``: search and answers;
* ``runs.py``: consolidation runs, planned and applied by ``consolidation/``;
* ``erasure.py``: a namespace forgotten, the scrubs that finish it;
* ``transfer.py``: export and import;
* redactions are planned and applied in ``curation/`` (``redaction.py``, ``redaction_apply.py``);
* ``audit.py``: every public method recorded in the audit trail as the class is created.

Every memory write goes through one write unit (``indexes/writer.py``): embedded before its
transaction, the new vectors cached inside it.
"""

from __future__ import annotations

import builtins  # annotations after the method `list` below name the builtin as builtins.list
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from hybridmem_local.answering.answerer import AnswerOptions, PreparedAnswer
from hybridmem_local.config import Config, load_config
from hybridmem_local.consolidation import apply as consolidation_runs
from hybridmem_local.consolidation.clustering import Clusterer
from hybridmem_local.curation import redaction_apply
from hybridmem_local.embedding import Embedder
from hybridmem_local.indexes.vectors import SyncReport
from hybridmem_local.llm.base import StructuredLLM
from hybridmem_local.memory import erasure, ingestion, queries, reads, runs, transfer, writes
from hybridmem_local.memory.audit import UNAUDITED, audit_public_methods, audited_action
from hybridmem_local.memory.components import Components
from hybridmem_local.memory.ingestion import ProgressCallback
from hybridmem_local.results import (
    AddSessionResult,
    Answer,
    ConsolidationReport,
    Event,
    IngestReport,
    PurgeReport,
    Redaction,
    RedactionStatus,
    Stats,
    UndoReport,
)
from hybridmem_local.retrieval.retriever import SearchFilters
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    Message,
    RelationalTuple,
    SearchResult,
    Session,
    SessionRecord,
    TupleDraft,
    check_namespace,
)
from hybridmem_local.storage.store import MemoryStore

__all__ = [
    "UNAUDITED",
    "AddSessionResult",
    "HybridMemory",
    "IngestReport",
    "ProgressCallback",
    "Stats",
    "audited_action",
]


@audit_public_methods
class HybridMemory:
    def __init__(
        self, store: MemoryStore, config: Config, embedder: Embedder | None = None, llm: StructuredLLM | None = None
    ):
        self._parts = Components(store, config, embedder, llm)
        self.store = store
        self.config = config
        self.indexes = self._parts.indexes
        self.retriever = self._parts.retriever
        # What another process forgot leaves this host too: at open, and whenever an index use
        # finds the store changed (another replica's forget moves the change marker).
        self.indexes.on_store_change.append(lambda: erasure.sweep_forgotten(self._parts))
        erasure.sweep_forgotten(self._parts)

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
        lazily, on first use, from the config). A given LLM stays the caller's to close;
        ``close`` closes only one built here.
        """
        if not isinstance(config, Config):
            config = load_config(config)
        store = MemoryStore.open(path, config.store)
        return cls(store, config, embedder, llm)

    def __enter__(self) -> HybridMemory:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._parts.close()

    def flush(self) -> None:
        """Persist the changed indexes (they are a cache: losing them only costs a rebuild)."""
        self.indexes.flush()

    # ------------------------------------------------------------------ backends

    @property
    def embedder(self) -> Embedder:
        return self._parts.embedder

    @property
    def llm(self) -> StructuredLLM:
        """The configured LLM, wrapped in the on-disk call cache beside the store (``llm/factory.py``)."""
        return self._parts.llm

    @property
    def scrub_pending(self) -> bool:
        """Whether a forget, purge or confirmed redaction left the scrub of the store or its LLM
        call cache pending (a reader held it up): ``retry_pending_scrubs`` finishes it."""
        return erasure.scrub_pending(self._parts)

    def rebuild_indexes(self, namespace: str) -> dict[str, SyncReport]:
        """Throw the namespace's index files away and build them again from SQLite."""
        return self.indexes.rebuild(namespace)

    # ------------------------------------------------------------------ ingest and curation

    def add_session(self, session: Session) -> AddSessionResult:
        """Store one session and curate it (or queue it: ``curation.mode``); see ``ingest``."""
        return ingestion.add_session(self._parts, session)

    def ingest(
        self, sessions: Sequence[Session], curate: bool = True, on_progress: ProgressCallback | None = None
    ) -> IngestReport:
        """Store sessions and curate them in batches (one batched LLM call per batch).

        Each session is written in one transaction together with its memories. When a session
        asks to forget something (the rules of ``curation/redaction.py``), the call's sessions are
        instead stored first, each redacted as ``enqueue`` does, then curated from what was
        stored (``curate_pending`` finishes them if the call is interrupted in between). A session
        whose curation fails is stored with status ``curation_failed`` (raw turns kept) and
        can be retried with ``curate_pending(retry_failed=True)``. Sessions already present
        are skipped, so an interrupted ingest can simply be run again.
        """
        report = IngestReport()
        ingestion.store_sessions(self._parts, sessions, curate, report, on_progress)
        return report

    def enqueue(self, sessions: Sequence[Session], max_pending: int | None = None) -> list[SessionRecord]:
        """Store sessions raw as ``pending`` for a curator to take later (``curate_pending``, or the
        service's worker), in one transaction: all or none.

        What a forget request in them names (the rules of ``curation/redaction.py``) is redacted in
        the same transaction, so search never returns it while they wait; the records returned
        are the sessions as stored.

        Raises DuplicateSessionError (or DuplicateTurnError) when a session id (or a turn id) is
        already stored in its namespace, and QueueFullError when the pending sessions of all
        namespaces would then be more than ``max_pending``; nothing is stored either way.
        """
        return ingestion.enqueue(self._parts, sessions, max_pending)

    def add_messages(self, namespace: str, messages: Sequence[Message], session_id: str | None = None) -> SessionRecord:
        """Chat messages (``{role, content}``) stored as a session dated now, ``pending`` like
        ``enqueue`` (``Session.from_messages``: the speaker is the role; a session id is made up
        when none is given). ``get_session`` tells when it is curated."""
        [record] = ingestion.enqueue(self._parts, [Session.from_messages(namespace, messages, session_id)], None)
        return record

    def remember(self, namespace: str, text: str) -> SessionRecord:
        """Plain text (a note, something the user said) stored as a one-message session from the
        user, dated now, for curation (``add_messages``)."""
        [record] = ingestion.enqueue(self._parts, [Session.from_messages(namespace, [Message.from_user(text)])], None)
        return record

    def get_session(self, namespace: str, session_id: str) -> SessionRecord:
        """A stored session with its turns and curation status (``pending``, ``curated``, ``curation_failed``)."""
        check_namespace(namespace)
        return self.store.sessions.get(namespace, session_id)

    def sessions(self, namespace: str, status: str | None = None) -> builtins.list[SessionRecord]:
        """The namespace's stored sessions in date order, of one curation status (``pending``,
        ``curated``, ``curation_failed``) or any."""
        check_namespace(namespace)
        return builtins.list(self.store.sessions.select(namespace, status))

    def curate_pending(
        self,
        namespace: str | None = None,
        retry_failed: bool = False,
        on_progress: ProgressCallback | None = None,
        limit: int | None = None,
    ) -> IngestReport:
        """Curate sessions stored raw (``pending``), and failed ones too with ``retry_failed``,
        oldest first; at most ``limit`` of them when given."""
        sessions = ingestion.sessions_to_curate(self._parts, namespace, retry_failed, limit)
        return ingestion.curate_stored(self._parts, sessions, on_progress)

    def sessions_to_curate(
        self, namespace: str | None = None, retry_failed: bool = False, limit: int | None = None
    ) -> list[Session]:
        """Sessions stored raw (``pending``; ``curation_failed`` too with ``retry_failed``), oldest
        first, of one namespace or all; at most ``limit``."""
        return ingestion.sessions_to_curate(self._parts, namespace, retry_failed, limit)

    def claim_sessions(self, worker: str, limit: int, lease_s: float) -> list[Session]:
        """Claim up to ``limit`` pending sessions, oldest first, for ``worker`` until ``lease_s``
        from now: sessions another worker holds an unexpired claim on are skipped (on
        PostgreSQL, rows another worker is claiming right now too: ``FOR UPDATE SKIP LOCKED``).
        Storing a session's curation (or its failure) ends its claim."""
        return [r.session for r in self.store.sessions.claim(worker, limit, lease_s)]

    def mark_curation_failed(self, sessions: Sequence[Session], error: str) -> int:
        """Mark those of ``sessions`` still pending ``curation_failed`` with ``error`` (their raw
        turns stay, for ``curate_pending(retry_failed=True)``); a session curated meanwhile, or whose
        namespace was forgotten, is left alone. Returns how many were marked."""
        return ingestion.mark_curation_failed(self._parts, sessions, error)

    def curate_stored(self, sessions: Sequence[Session], on_progress: ProgressCallback | None = None) -> IngestReport:
        """Curate sessions already stored (pending or failed) in batches, then run the
        consolidation their namespaces are due. A session curated meanwhile by another process
        is skipped, never stored twice."""
        return ingestion.curate_stored(self._parts, sessions, on_progress)

    # ------------------------------------------------------------------ writes

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
        A forget request in ``session`` redacts what it names (these memories included) in the
        same transaction, as ``enqueue`` does; the ids returned are those stored, a rewritten
        memory's among them (``get`` shows its successor).
        Every ``source_turn_ids`` entry must name a turn of this namespace. With
        ``source_session_id`` naming a stored session, that session is marked curated in the
        same transaction; with ``require_uncurated`` too, nothing is written (AlreadyCuratedError)
        when that session is curated already, so two curators never store its memories twice.
        """
        ids, _ = writes.write_memories(
            self._parts,
            namespace,
            [*episodes, *tuples],
            session,
            source_session_id,
            prompt_version,
            require_uncurated,
        )
        return ids

    def update(self, memory_id: int, reason: str = "updated by user", **fields: Any) -> Episode | RelationalTuple:
        """Change an active memory's content: the changed record is stored as a new memory that
        supersedes the old one (content is never edited in place, so history and indexes stay
        exact), with an ``update`` event carrying the old row as ``before``. Returns the new
        memory; ``get(old_id).superseded_by`` points at it.

        ``fields`` are the record's own (an episode's ``title``, ``summary``, ``details``,
        ``timestamp``, ``source_turn_ids``; a tuple's ``entity``, ``relation``, ``object``,
        ``context``, ``timestamp``, ``source_turn_ids``). Nothing changes (and nothing is
        written) when they equal the current values.
        """
        return writes.update(self._parts, memory_id, reason, fields)

    def delete(self, memory_id: int, reason: str = "deleted by user", *, namespace: str | None = None) -> None:
        """Mark a memory deleted (kept in history; ``forget`` removes data physically); with
        ``namespace``, only if it is that namespace's (NotFoundError otherwise)."""
        writes.delete(self._parts, memory_id, reason, namespace)

    # ------------------------------------------------------------------ erasure

    def forget(self, namespace: str) -> dict[str, int]:
        """Remove every trace of a namespace: rows, history, vectors, index files, exports and
        LLM cache entries, then scrub the store and the cache file so no file under the store's
        folder keeps a byte of it (docs/deployment.md, "Forget").

        ``scrub_pending`` counts the files (store, LLM cache) whose scrub another connection's
        open read transaction held up: their WAL keeps the forgotten text until
        :meth:`retry_pending_scrubs` succeeds (the service worker calls it when idle, and every
        open of the store retries). 0 means the guarantee holds now."""
        return erasure.forget(self._parts, namespace)

    def retry_pending_scrubs(self) -> int:
        """Finish the scrubs a forget or purge left pending (store and LLM cache), without
        waiting for readers; returns how many files are still pending (0: none)."""
        return erasure.retry_pending_scrubs(self._parts)

    # ------------------------------------------------------------------ redactions (forget requests)

    def redactions(self, namespace: str, status: RedactionStatus | None = None) -> builtins.list[Redaction]:
        """The namespace's redactions (content removed because a user asked in a conversation),
        oldest first; ``status`` keeps one of pending / confirmed / undone."""
        check_namespace(namespace)
        return self.store.redactions.select(namespace, status)

    def undo_redaction(self, redaction_id: int, *, namespace: str | None = None) -> Redaction:
        """Put back exactly what a pending redaction removed: the turns' texts, the rewritten
        memories (their redacted copies are marked deleted) and the removed ones, in one
        transaction. Refused (ConflictError, nothing changed) once it is confirmed or undone, or
        when a turn or memory it changed was changed since (a later redaction: undo that first)."""
        return redaction_apply.undo(self.indexes, redaction_id, namespace)

    def confirm_redaction(self, redaction_id: int, *, namespace: str | None = None) -> Redaction:
        """Make a pending redaction final: the removed text kept for undo, the memories it
        retired (with their history and cached vectors) and the namespace's LLM call cache are
        deleted, and the store is scrubbed (``MemoryStore.scrub``); it cannot be undone after."""
        return redaction_apply.confirm(self.indexes, redaction_id, namespace)

    # ------------------------------------------------------------------ consolidation

    def consolidate(
        self,
        namespace: str,
        dry_run: bool = False,
        llm: StructuredLLM | None = None,
        clusterer: Clusterer | None = None,
        clusters: Mapping[MemoryKind, Sequence[Sequence[int]]] | None = None,
    ) -> ConsolidationReport:
        """Cluster the namespace's active memories, let the LLM plan merges and deletions
        (``planner.plan_consolidation``), and apply the plan as one undoable run (paper §3.2).

        ``llm`` and ``clusterer`` default to the configured ones; ``clusters`` skips embedding and
        clustering (memory ids grouped per store: replays, tests). A dry run returns the plan and
        changes no memory, event, run or counter.
        """
        return runs.consolidate(self._parts, namespace, dry_run, llm, clusterer, clusters)

    def consolidate_if_due(
        self, namespace: str, llm: StructuredLLM | None = None, clusterer: Clusterer | None = None
    ) -> ConsolidationReport | None:
        """Consolidate when ``consolidation.every_n_sessions`` sessions were stored since the last
        run (0 = never); the run resets the count."""
        return runs.consolidate_if_due(self._parts, namespace, llm, clusterer)

    def apply_consolidation(self, report: ConsolidationReport) -> ConsolidationReport:
        """Apply a planned run (``consolidate(dry_run=True)`` or ``plan_consolidation`` made the
        report) in one transaction: a ``consolidation_runs`` row, each merge through the store's
        ``supersede`` (action ``merge``), each deletion a status change, all events carrying the
        run id, the namespace's session count reset. A group whose memories were changed since
        planning is skipped, not the run. Returns the report, now of the applied run."""
        return consolidation_runs.apply_run(self._parts.writer, self.config, report)

    def undo(self, run_id: int, *, namespace: str | None = None) -> UndoReport:
        """Restore exactly the state before consolidation run ``run_id``, in one transaction.

        Sources and deleted memories get back their previous status, reason and pointer; the run's
        merged rows are marked deleted ("undo of run N"); the run becomes 'undone'. Refused
        (ConsolidationError, nothing changed) when a memory the run touched was changed since (by
        a later run: undo that one first) or purged. With ``namespace``, only a run of that
        namespace is undone (NotFoundError otherwise).
        """
        return consolidation_runs.undo_run(self.store, run_id, namespace)

    def purge(self, namespace: str, older_than: timedelta) -> PurgeReport:
        """Physically delete non-active memories whose last status change is older than ``older_than``.

        Their history events go too (events hold the full row, so keeping them would keep the text
        purge promises to remove), as do their cached embeddings (unless a remaining memory has the
        same text); one ``purge`` event records which ids went. A consolidation run that touched a
        purged memory can no longer be undone. Freed pages are vacuumed and the namespace's index
        files rebuilt, so no copy of the purged text or vectors stays on disk.
        """
        return consolidation_runs.purge(self.indexes, namespace, older_than)

    # ------------------------------------------------------------------ reads

    def search(
        self,
        query: str,
        namespace: str = "default",
        k: int | None = None,
        kinds: Sequence[MemoryKind] | None = None,
        since: date | datetime | None = None,
        until: date | datetime | None = None,
        min_score: float | None = None,
    ) -> SearchResult:
        """Top-k episodes and top-(2k) tuples for ``query`` (paper §3.3), no LLM call.

        ``kinds`` limits the memory stores searched; ``since``/``until`` keep memories whose
        timestamp falls in that period (windows: their session's date); ``min_score`` drops
        weaker hits (``retriever.SearchFilters``).
        """
        filters = SearchFilters(
            kinds=list(kinds) if kinds is not None else None, since=since, until=until, min_score=min_score
        )
        return queries.search(self._parts, query, namespace, k, filters=filters)

    def answer(
        self, question: str, namespace: str = "default", question_date: datetime | None = None, k: int | None = None
    ) -> Answer:
        """Retrieve (``answer_search``) and answer with one LLM call, as ``answering`` configures."""
        return queries.prepare_answer(self._parts, question, namespace, question_date, k).run(self.llm)

    def prepare_answer(
        self, question: str, namespace: str = "default", question_date: datetime | None = None, k: int | None = None
    ) -> PreparedAnswer:
        """Everything of ``answer`` but the LLM call: its retrieval and its settings. ``answer`` is
        ``prepare_answer(...).run(self.llm)``; the service retrieves under its store lock and makes
        the call outside it, so a slow model holds up no other request."""
        return queries.prepare_answer(self._parts, question, namespace, question_date, k)

    def answer_many(
        self,
        questions: Sequence[str],
        namespace: str = "default",
        question_dates: Sequence[datetime | None] | None = None,
        k: int | None = None,
    ) -> list[Answer]:
        """Answer several questions in one batched LLM call: each retrieves as ``answer`` does."""
        return queries.answers(self._parts, questions, namespace, question_dates, k)

    def answer_search(self, question: str, namespace: str = "default", k: int | None = None) -> SearchResult:
        """The search an answer is written from: ``search``, but every store's candidates when a
        context budget is set (the budget, not k, decides what is shown), with the memories'
        source turns attached when ``answering.evidence_turns`` is on (the context then shows them)."""
        return queries.answer_search(self._parts, question, namespace, k)

    def answer_options(self) -> AnswerOptions:
        """How this config answers: thinking, context budget, JSON or text, the text answers' citer."""
        return queries.answer_options(self._parts)

    def get(self, memory_id: int, *, namespace: str | None = None) -> Episode | RelationalTuple:
        """The memory with this id; with ``namespace``, only if it is that namespace's. Either way a
        missing one is a NotFoundError, and another namespace's is reported just as missing."""
        return reads.get(self._parts, memory_id, namespace)

    def list(
        self,
        namespace: str = "default",
        kind: MemoryKind | None = None,
        status: MemoryStatus | None = MemoryStatus.active,
        limit: int | None = None,
        offset: int = 0,
        *,
        since: date | datetime | None = None,
        until: date | datetime | None = None,
    ) -> list[Episode | RelationalTuple]:
        """Memories in id order (``status=None``: any status); ``limit``/``offset`` page through them.
        ``since``/``until`` keep those whose timestamp (an ISO prefix) names a period overlapping
        ``[since, until]``, filtered in the database."""
        return reads.page(self._parts, namespace, kind, status, limit, offset, since, until)

    def history(self, memory_id: int, *, namespace: str | None = None) -> builtins.list[Event]:
        """Every change of a memory, oldest first (``namespace`` as in ``get``)."""
        return reads.history(self._parts, memory_id, namespace)

    def stats(self, namespace: str | None = None) -> Stats:
        """Counts of sessions, turns and memories by status, and the loaded indexes' sizes: of the
        whole store, or of one namespace."""
        return reads.stats(self._parts, namespace)

    # ------------------------------------------------------------------ export / import

    def export(self, namespace: str, path: str | Path) -> int:
        """Write a namespace as JSONL (sessions with turns, then memories with provenance); when
        the store is encrypted, the file is sealed with its key (``files.session_files.export_bytes``)
        and only ``import_`` into a store with that key reads it. Returns the records written."""
        return transfer.export(self._parts, namespace, Path(path))

    def backup(self, path: str | Path) -> None:
        """A consistent copy of the whole store at ``path`` (owner-only), made while others may
        write; encrypted with the store's key when it is. Indexes are not copied: they rebuild
        from the copy, vectors from its embedding cache."""
        self.store.backup_to(Path(path))

    def export_records(self, namespace: str) -> builtins.list[str]:
        """The export's JSONL lines, each ending in a newline: sessions, then memories of any status."""
        return transfer.export_records(self._parts, namespace)

    def import_(self, path: str | Path, namespace: str | None = None) -> dict[str, int]:
        """Load an export (optionally into another namespace) in one transaction; a sealed one
        needs this store's key (a clear error and nothing imported otherwise)."""
        return transfer.import_(self._parts, Path(path), namespace)
