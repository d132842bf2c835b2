"""HybridMemory: the one entry point that wires store, embedder, indexes, curation and consolidation.

    with HybridMemory.open("memory.db") as memory:
        memory.add_session(session)                 # raw turns (+ curation when an LLM is set)
        memory.add_memories("alice", episodes=[...], tuples=[...])
        result = memory.search("Where did Alice move?", namespace="alice")

The SQLite file is the truth; every write goes to it first. The indexes (``indexes/``) live
beside it (``memory.db.indexes/``) and catch up with it whenever they are used after a commit,
of this process or another. Consolidation (``consolidation/planner.py``) only plans; the changes a plan
makes — merges through the same ``supersede`` step as ``update``, deletions, undo, purge — are
applied here, on the store.
"""

from __future__ import annotations

import builtins  # annotations after the method `list` below name the builtin as builtins.list
import functools
import inspect
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Concatenate, Final, ParamSpec, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridmem_local.config import Config, load_config
from hybridmem_local.curation.dedup import fold_repeats, plan_duplicates
from hybridmem_local.embedding import Embedder, build_embedder
from hybridmem_local.errors import (
    AlreadyCuratedError,
    ConflictError,
    DuplicateSessionError,
    InvalidInputError,
    NotFoundError,
    QueueFullError,
)
from hybridmem_local.files.paths import owner_only_opener
from hybridmem_local.indexes.store_indexes import StoreIndexes
from hybridmem_local.indexes.vectors import SyncReport
from hybridmem_local.indexes.windows import load_windows, with_source_turns
from hybridmem_local.llm.base import StructuredLLM
from hybridmem_local.retrieval.retriever import Retriever, SearchFilters
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
    check_page,
    utcnow,
)
from hybridmem_local.storage import audit
from hybridmem_local.storage.embedding_cache import text_hash
from hybridmem_local.storage.events import Event
from hybridmem_local.storage.redactions import Redaction, RedactionStatus
from hybridmem_local.storage.rekey import llm_cache_path
from hybridmem_local.storage.scrub import is_pending
from hybridmem_local.storage.store import MemoryStore
from hybridmem_local.usage import LLMUsage

if TYPE_CHECKING:
    from hybridmem_local.answering.answerer import Answer, AnswerOptions, PreparedAnswer
    from hybridmem_local.consolidation.clustering import Clusterer
    from hybridmem_local.consolidation.planner import ConsolidationReport, PurgeReport, UndoReport
    from hybridmem_local.curation.curator import CurationOutcome
    from hybridmem_local.curation.forget import ForgetRequest, RedactionPlan

log = logging.getLogger(__name__)

#: Told after each curated batch: (sessions done, sessions in all). The CLI draws a bar with it.
ProgressCallback = Callable[[int, int], None]


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
    #: Memories the LLM wrote that curation left out (no content, a decoding loop, not from the window).
    memories_left_out: int = 0
    #: Memories without a valid cited turn id, aligned to their window's turns (text/alignment.py).
    memories_aligned: int = 0
    #: Curated memories that repeated an active one (curation/dedup.py): not stored, their turns went to it.
    duplicates_skipped: int = 0
    #: Curation's LLM requests, tokens and model time.
    usage: LLMUsage = Field(default_factory=LLMUsage)
    #: Consolidation runs triggered by ``consolidation.every_n_sessions``.
    consolidation_runs: list[int] = []


class AddSessionResult(BaseModel):
    """What ``add_session`` stored: the session (with its curation status) and the memories
    curated from it (none when curation is queued or failed), with the ingest's figures."""

    model_config = ConfigDict(extra="forbid")

    session: SessionRecord
    memories: list[Episode | RelationalTuple]
    report: IngestReport


_P = ParamSpec("_P")
_R = TypeVar("_R")
_C = TypeVar("_C", bound=type)

#: Public members of ``HybridMemory`` that leave no audit entry, each with its reason. Every other
#: public method is recorded (``_audit_public_methods``). None of these changes the store
#: (tests/test_audit.py calls each and finds every row as it was).
UNAUDITED: Final[Mapping[str, str]] = MappingProxyType(
    {
        "open": "builds the facade; what is then called on it is recorded",
        "close": "lifecycle: saves the index cache and closes the store",
        "flush": "saves the index cache, which is rebuilt from the store when lost",
        "embedder": "a property: the embedding backend",
        "llm": "a property: the LLM backend",
        "scrub_pending": "a property: whether a scrub marker file exists (the worker asks on every idle poll)",
        "answer_options": "this config's answering settings; reads nothing stored",
        "sessions_to_curate": (
            "the curation worker's poll of the queue, every service.worker_poll_s: an entry per poll would bury "
            "the trail; the curate_stored that takes the sessions records what their curation changed"
        ),
    }
)
#: The attribute by which a wrapped method names its audit action (``audited_action``).
_AUDITED_AS = "hybridmem_audit_action"


def audited_action(member: object) -> str | None:
    """The audit action a member of ``HybridMemory`` records (``HybridMemory.<name>``), None if unaudited."""
    action = getattr(member, _AUDITED_AS, None)
    return action if isinstance(action, str) else None


def _audit_public_methods(cls: _C) -> _C:
    """Wrap every public method of ``cls`` in ``_audited`` as the class is created, so a method
    added later is recorded without anyone remembering to. A public member that is not a plain
    method (a property, a classmethod) must be listed in ``UNAUDITED``, as must every exemption."""
    members = vars(cls)
    unknown = sorted(UNAUDITED.keys() - members.keys())
    if unknown:
        raise TypeError(f"UNAUDITED names members {cls.__name__} does not have: {unknown}")
    for name, member in list(members.items()):
        if name.startswith("_") or name in UNAUDITED:
            continue
        if not inspect.isfunction(member):
            raise TypeError(f"{cls.__name__}.{name} is public but no method to audit: list it in UNAUDITED, with why")
        setattr(cls, name, _audited(member))
    return cls


def _audited(method: Callable[Concatenate[HybridMemory, _P], _R]) -> Callable[Concatenate[HybridMemory, _P], _R]:
    """Record each call in the audit trail (``storage/audit.py``, ``audit.enabled``): one entry
    ``HybridMemory.<name>`` per namespace, naming the ids the call returned (memories read,
    windows, sessions, redactions, an answer's context) and changed (its events). A call made
    inside another operation (a nested facade call, or a service request naming its key and
    route) adds to that operation's entry instead of writing its own; only the outermost facade
    call reports ids of its result, so an answer records the context it showed, not every
    candidate retrieved."""
    action = f"HybridMemory.{method.__name__}"
    parameters = list(inspect.signature(method).parameters.values())
    position = next((i for i, p in enumerate(parameters) if p.name == "namespace"), None)
    default = parameters[position].default if position is not None else None

    def namespace_of(args: tuple, kwargs: dict) -> str | None:
        if position is None:
            return None
        value = (
            kwargs["namespace"] if "namespace" in kwargs else args[position - 1] if len(args) >= position else default
        )
        return value if isinstance(value, str) else None

    @functools.wraps(method)
    def recorded(self: HybridMemory, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not self.config.audit.enabled:
            return method(self, *args, **kwargs)
        with audit.operation(action, self.store.audit.record) as scope:
            scope.depth += 1
            try:
                outermost = scope.depth == 1
                namespace = namespace_of(args, kwargs)
                if outermost and namespace is not None:
                    scope.note(namespace)
                result = method(self, *args, **kwargs)
                if outermost:
                    _note_result(scope, namespace, result)
                return result
            finally:
                scope.depth -= 1

    setattr(recorded, _AUDITED_AS, action)
    return recorded


def _note_result(scope: audit.AuditScope, namespace: str | None, result: Any) -> None:
    """The ids a call hands back (never its text): memories, windows, sessions, redactions, an answer's context."""
    from hybridmem_local.answering.answerer import Answer

    for item in result if isinstance(result, builtins.list) else [result]:
        if isinstance(item, SearchResult):
            scope.note(
                item.namespace,
                read=[h.memory.stored_id for h in [*item.episodes, *item.tuples]],
                windows=[h.window.id for h in item.windows],
            )
        elif isinstance(item, (Episode, RelationalTuple)):
            scope.note(item.namespace, read=[item.stored_id])
        elif isinstance(item, Event) and item.memory_id is not None:
            scope.note(item.namespace, read=[item.memory_id])
        elif isinstance(item, SessionRecord):
            scope.note(item.session.namespace, sessions=[item.session.session_id])
        elif isinstance(item, AddSessionResult):
            scope.note(item.session.session.namespace, sessions=[item.session.session.session_id])
        elif isinstance(item, Answer):
            scope.note(namespace, context=item.context_memory_ids, cited=item.cited_memory_ids)
        elif isinstance(item, Redaction):
            scope.note(item.namespace, redactions=[item.id])


@_audit_public_methods
class HybridMemory:
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
        self.flush()
        self.retriever.close()
        if self._owns_llm and self._llm is not None:
            self._llm.close()
        self.store.close()

    def flush(self) -> None:
        """Persist the changed indexes (they are a cache: losing them only costs a rebuild)."""
        self.indexes.flush()

    # ------------------------------------------------------------------ backends

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
            self._llm = build_llm(self.config.llm, cache_path=cache, cache_keys=self.store.keys)
        return self._llm

    def _llm_cache_path(self) -> Path:
        return llm_cache_path(Path(str(self.store.path)))

    @property
    def scrub_pending(self) -> bool:
        """Whether a forget, purge or confirmed redaction left the scrub of the store or its LLM
        call cache pending (a reader held it up): ``retry_pending_scrubs`` finishes it."""
        return self.store.path is not None and (self.store.scrub_pending or is_pending(self._llm_cache_path()))

    def rebuild_indexes(self, namespace: str) -> dict[str, SyncReport]:
        """Throw the namespace's index files away and build them again from SQLite."""
        return self.indexes.rebuild(namespace)

    # ------------------------------------------------------------------ writes

    def add_session(self, session: Session) -> AddSessionResult:
        """Store one session and curate it (or queue it: ``curation.mode``); see ``ingest``."""
        report = IngestReport()
        stored = self._ingest([session], curate=True, report=report, on_progress=None)
        ids = stored.get((session.namespace, session.session_id), [])
        return AddSessionResult(
            session=self.store.sessions.get(session.namespace, session.session_id),
            memories=list(self.store.memories.get_many(ids).values()),
            report=report,
        )

    def ingest(
        self, sessions: Sequence[Session], curate: bool = True, on_progress: ProgressCallback | None = None
    ) -> IngestReport:
        """Store sessions and curate them in batches (one batched LLM call per batch).

        Each session is written in one transaction together with its memories. When a session
        asks to forget something (the rules of ``curation/forget.py``), the call's sessions are
        instead stored first, each redacted as ``enqueue`` does, then curated from what was
        stored (``curate_pending`` finishes them if the call is interrupted in between). A session
        whose curation fails is stored with status ``curation_failed`` (raw turns kept) and
        can be retried with ``curate_pending(retry_failed=True)``. Sessions already present
        are skipped, so an interrupted ingest can simply be run again.
        """
        report = IngestReport()
        self._ingest(sessions, curate, report, on_progress)
        return report

    def enqueue(self, sessions: Sequence[Session], max_pending: int | None = None) -> list[SessionRecord]:
        """Store sessions raw as ``pending`` for a curator to take later (``curate_pending``, or the
        service's worker), in one transaction: all or none.

        What a forget request in them names (the rules of ``curation/forget.py``) is redacted in
        the same transaction, so search never returns it while they wait; the records returned
        are the sessions as stored.

        Raises DuplicateSessionError (or DuplicateTurnError) when a session id (or a turn id) is
        already stored in its namespace, and QueueFullError when the pending sessions of all
        namespaces would then be more than ``max_pending``; nothing is stored either way.
        """
        redacted: set[str] = set()
        with self.store.transaction():
            # Counted inside the write transaction: no other writer can add pending rows meanwhile.
            pending = self.store.sessions.count("pending")
            if max_pending is not None and pending + len(sessions) > max_pending:
                raise QueueFullError(
                    f"the curation queue holds {pending} sessions; adding {len(sessions)} would pass "
                    f"service.max_pending_sessions={max_pending}"
                )
            for session in sessions:
                if self._store_pending(session) is not None:
                    redacted.add(session.namespace)
            records = [self.store.sessions.get(s.namespace, s.session_id) for s in sessions]
        for namespace in sorted(redacted):
            self._drop_indexes(namespace)
        return records

    def add_messages(self, namespace: str, messages: Sequence[Message], session_id: str | None = None) -> SessionRecord:
        """Chat messages (``{role, content}``) stored as a session dated now, ``pending`` like
        ``enqueue`` (``Session.from_messages``: the speaker is the role; a session id is made up
        when none is given). ``get_session`` tells when it is curated."""
        [record] = self.enqueue([Session.from_messages(namespace, messages, session_id)])
        return record

    def remember(self, namespace: str, text: str) -> SessionRecord:
        """Plain text (a note, something the user said) stored as a one-message session from the
        user, dated now, for curation (``add_messages``)."""
        return self.add_messages(namespace, [Message.from_user(text)])

    def get_session(self, namespace: str, session_id: str) -> SessionRecord:
        """A stored session with its turns and curation status (``pending``, ``curated``, ``curation_failed``)."""
        check_namespace(namespace)
        return self.store.sessions.get(namespace, session_id)

    def _ingest(
        self, sessions: Sequence[Session], curate: bool, report: IngestReport, on_progress: ProgressCallback | None
    ) -> dict[tuple[str, str], list[int]]:
        """Store the sessions not stored yet (curated, or queued); returns the memory ids stored
        per (namespace, session id)."""
        new = [s for s in sessions if not self.store.sessions.exists(s.namespace, s.session_id)]
        report.skipped += len(sessions) - len(new)
        curate_now = curate and self.config.curation.mode == "sync"
        if curate_now and not any(self._forget_requests_in(s) for s in new):
            stored = self._curate_and_store(new, already_stored=False, report=report, on_progress=on_progress)
        else:
            # A forget request may name any earlier turn, this call's included: the sessions are
            # stored first, in order, each redacted as it is stored, and curated as stored, so
            # neither the windows nor the LLM see what was asked to be forgotten.
            raw = self._store_raw(new, report)
            if not curate_now:
                return {}
            as_stored = [self.store.sessions.get(s.namespace, s.session_id).session for s in raw]
            stored = self._curate_and_store(as_stored, already_stored=True, report=report, on_progress=on_progress)
        report.consolidation_runs = self._scheduled_consolidation({s.namespace for s in new})
        return stored

    def _store_raw(self, sessions: Sequence[Session], report: IngestReport) -> builtins.list[Session]:
        """Store sessions raw as ``pending``, each in its own transaction with the redaction its
        forget requests make (``_store_pending``); returns those stored here (another process
        may have stored one since they were checked)."""
        stored: list[Session] = []
        redacted: set[str] = set()
        for session in sessions:
            try:
                if self._store_pending(session) is not None:
                    redacted.add(session.namespace)
            except DuplicateSessionError:  # another process stored it since the check in _ingest
                report.skipped += 1
                continue
            report.stored += 1
            stored.append(session)
        for namespace in sorted(redacted):
            self._drop_indexes(namespace)
        return stored

    def curate_pending(
        self,
        namespace: str | None = None,
        retry_failed: bool = False,
        on_progress: ProgressCallback | None = None,
        limit: int | None = None,
    ) -> IngestReport:
        """Curate sessions stored raw (``pending``), and failed ones too with ``retry_failed``,
        oldest first; at most ``limit`` of them when given."""
        sessions = self.sessions_to_curate(namespace, retry_failed=retry_failed, limit=limit)
        return self.curate_stored(sessions, on_progress=on_progress)

    def sessions_to_curate(
        self, namespace: str | None = None, retry_failed: bool = False, limit: int | None = None
    ) -> list[Session]:
        """Sessions stored raw (``pending``; ``curation_failed`` too with ``retry_failed``), oldest
        first, of one namespace or all; at most ``limit``."""
        statuses = ["pending"] + (["curation_failed"] if retry_failed else [])
        return [r.session for r in self.store.sessions.to_curate(statuses, namespace=namespace, limit=limit)]

    def mark_curation_failed(self, sessions: Sequence[Session], error: str) -> int:
        """Mark those of ``sessions`` still pending ``curation_failed`` with ``error`` (their raw
        turns stay, for ``curate_pending(retry_failed=True)``); a session curated meanwhile, or whose
        namespace was forgotten, is left alone. Returns how many were marked."""
        marked = 0
        for session in sessions:
            try:
                if self.store.sessions.get(session.namespace, session.session_id).curation_status != "pending":
                    continue  # stored before the error, or curated by another process
                self.store.sessions.set_curation_status(
                    session.namespace, session.session_id, "curation_failed", error, require_uncurated=True
                )
                marked += 1
            except (AlreadyCuratedError, NotFoundError):  # curated meanwhile, or its namespace forgotten
                continue
        return marked

    def curate_stored(self, sessions: Sequence[Session], on_progress: ProgressCallback | None = None) -> IngestReport:
        """Curate sessions already stored (pending or failed) in batches, then run the
        consolidation their namespaces are due. A session curated meanwhile by another process
        is skipped, never stored twice."""
        report = IngestReport()
        self._curate_and_store(sessions, already_stored=True, report=report, on_progress=on_progress)
        report.consolidation_runs = self._scheduled_consolidation({s.namespace for s in sessions})
        return report

    def _curate_and_store(
        self,
        sessions: Sequence[Session],
        already_stored: bool,
        report: IngestReport,
        on_progress: ProgressCallback | None,
    ) -> dict[tuple[str, str], list[int]]:
        from hybridmem_local.curation.curator import Curator

        curator = Curator(self.llm, self.config.llm, self.config.curation, embed=self.embedder.embed)
        batch = self.config.curation.batch_sessions
        stored: dict[tuple[str, str], list[int]] = {}
        for start in range(0, len(sessions), batch):
            chunk = sessions[start : start + batch]
            for session, outcome in zip(chunk, curator.curate(chunk), strict=True):
                report.usage.add(outcome.usage)
                report.memories_left_out += len(outcome.dropped_memories)
                report.memories_aligned += outcome.aligned_memories
                try:
                    stored[(session.namespace, session.session_id)] = self._store_outcome(
                        session, outcome, already_stored, report
                    )
                except DuplicateSessionError:  # another process stored it meanwhile
                    report.skipped += 1
                    continue
                self._act_on_forget_requests(session, outcome)
            if on_progress is not None:
                on_progress(min(start + batch, len(sessions)), len(sessions))
        self._confirm_expired_redactions()
        return stored

    def _store_outcome(
        self, session: Session, outcome: CurationOutcome, already_stored: bool, report: IngestReport
    ) -> list[int]:
        """Write one session's curation: its memories (their ids are returned), or the failure
        status (never losing the turns)."""
        ids: list[int] = []
        if outcome.ok and outcome.result is not None:
            held, duplicates = self._write_memories(
                session.namespace,
                [*outcome.result.episodes, *outcome.result.tuples],
                session=None if already_stored else session,
                source_session_id=session.session_id,
                prompt_version=outcome.prompt_version,
                require_uncurated=already_stored,
                deduplicate=True,
            )
            ids = list(dict.fromkeys(held))
            report.memories += len(held) - duplicates
            report.duplicates_skipped += duplicates
            report.curated += 1
        else:
            log.warning("curation of session %s failed: %s", session.session_id, outcome.error)
            if already_stored:
                self.store.sessions.set_curation_status(
                    session.namespace, session.session_id, "curation_failed", outcome.error, require_uncurated=True
                )
            else:
                self.store.sessions.insert(session, curation_status="curation_failed", curation_error=outcome.error)
            report.failed += 1
        report.stored += 0 if already_stored else 1
        return ids

    def _scheduled_consolidation(self, namespaces: set[str]) -> list[int]:
        if self.config.consolidation.every_n_sessions == 0:
            return []
        runs = []
        for namespace in sorted(namespaces):
            report = self.consolidate_if_due(namespace)
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
        A forget request in ``session`` redacts what it names (these memories included) in the
        same transaction, as ``enqueue`` does; the ids returned are those stored, a rewritten
        memory's among them (``get`` shows its successor).
        Every ``source_turn_ids`` entry must name a turn of this namespace. With
        ``source_session_id`` naming a stored session, that session is marked curated in the
        same transaction; with ``require_uncurated`` too, nothing is written (AlreadyCuratedError)
        when that session is curated already, so two curators never store its memories twice.
        """
        ids, _ = self._write_memories(
            namespace, [*episodes, *tuples], session, source_session_id, prompt_version, require_uncurated
        )
        return ids

    def _write_memories(
        self,
        namespace: str,
        memories: Sequence[EpisodeDraft | TupleDraft],
        session: Session | None = None,
        source_session_id: str | None = None,
        prompt_version: str | None = None,
        require_uncurated: bool = False,
        deduplicate: bool = False,
    ) -> tuple[list[int], int]:
        """``add_memories``; with ``deduplicate`` (curated writes), a memory repeating an active one
        is not stored and its turns go to that row (curation/dedup.py). Returns, per memory, the id of the
        row holding it, and how many were repeats."""
        check_namespace(namespace)
        if session is not None and session.namespace != namespace:
            raise InvalidInputError(
                f"session {session.session_id!r} belongs to namespace {session.namespace!r}, not {namespace!r}"
            )
        self._check_provenance(namespace, memories, session)
        texts = [_as_stored(m, namespace).index_text() for m in memories]
        missing, vectors, every_vector = self.indexes.for_write(namespace, texts)
        source_session_id = session.session_id if session is not None else source_session_id
        plan = None
        if deduplicate:
            plan = plan_duplicates(
                memories,
                list(every_vector),
                candidates=lambda kind, timestamp: self.store.memories.duplicate_candidates(
                    namespace, kind, timestamp, source_session_id
                ),
                vectors_of=lambda stored_texts: self.indexes.embed(namespace, stored_texts),
                threshold=self.config.curation.duplicate_cosine,
                same_session=source_session_id is not None,
            )
        with self.store.transaction():
            if session is not None:
                self.store.sessions.insert(session, curation_status="curated", prompt_version=prompt_version)
            elif source_session_id is not None:
                self.store.sessions.set_curation_status(
                    namespace,
                    source_session_id,
                    "curated",
                    prompt_version=prompt_version,
                    require_uncurated=require_uncurated,
                )
            ids = self.store.memories.insert(
                namespace, plan.new if plan else memories, source_session_id=source_session_id
            )
            self.store.embedding_cache.put(namespace, self.embedder.model_id, missing, vectors)
            if plan is not None:
                ids = fold_repeats(self.store, plan, ids)
            # After the memories: a forget request in the session names what they hold too.
            redaction = self._redact_as_stored(session) if session is not None else None
        if redaction is not None:
            self._drop_indexes(namespace)
        return ids, len(plan.repeats) if plan else 0

    def _check_provenance(
        self, namespace: str, memories: Sequence[EpisodeDraft | TupleDraft], session: Session | None
    ) -> None:
        cited = {t for m in memories for t in m.source_turn_ids}
        if not cited:
            return
        known = {t.turn_id for t in session.turns} if session is not None else set()
        unknown = cited - known - self.store.sessions.existing_turn_ids(namespace, sorted(cited - known))
        if unknown:
            raise InvalidInputError(
                f"source_turn_ids name turns that namespace {namespace!r} does not have: {sorted(unknown)[:5]}"
            )

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
        old = self.get(memory_id)
        if old.status != MemoryStatus.active:
            hint = f"; update its successor {old.superseded_by}" if old.superseded_by is not None else ""
            raise InvalidInputError(
                f"memory {memory_id} is {old.status.value}, only an active memory can be updated{hint}"
            )
        draft_type = EpisodeDraft if old.kind == "episode" else TupleDraft
        current = draft_type.model_validate(old.model_dump(include=set(draft_type.model_fields)))
        try:
            # Turns a caller gives are cited by that caller: provenance follows them, not the old row.
            kept = current.model_dump(exclude={"provenance"} if "source_turn_ids" in fields else set())
            draft = draft_type.model_validate({**kept, **fields})
        except ValidationError as exc:
            raise InvalidInputError(f"update of memory {memory_id}: {exc}") from exc
        if draft == current:
            return old
        self._check_provenance(old.namespace, [draft], None)
        new = _as_stored(draft, old.namespace).model_copy(update={"source_session_id": old.source_session_id})
        (new_id,) = self._supersede(old.namespace, [([memory_id], new)], reason=reason, action="update")
        return self.get(new_id)

    def _supersede(
        self,
        namespace: str,
        replacements: Sequence[tuple[Sequence[int], Episode | RelationalTuple]],
        reason: str,
        action: str,
        run_id: int | None = None,
    ) -> list[int]:
        """The one step behind ``update`` and a consolidation merge: each new record stored as the
        active successor of its sources (``store.memories.supersede``), embedded before the
        transaction (a failure there changes nothing). Joins the caller's transaction."""
        missing, vectors, _ = self.indexes.for_write(namespace, [new.index_text() for _, new in replacements])
        with self.store.transaction():
            self.store.embedding_cache.put(namespace, self.embedder.model_id, missing, vectors)
            return [
                self.store.memories.supersede(
                    namespace, list(sources), new, reason=reason, action=action, run_id=run_id
                )
                for sources, new in replacements
            ]

    def delete(self, memory_id: int, reason: str = "deleted by user", *, namespace: str | None = None) -> None:
        """Mark a memory deleted (kept in history; ``forget`` removes data physically); with
        ``namespace``, only if it is that namespace's (NotFoundError otherwise)."""
        memory = self.get(memory_id, namespace=namespace)
        if memory.status == MemoryStatus.deleted:
            return
        self.store.memories.set_status(memory_id, MemoryStatus.deleted, reason=reason)

    def forget(self, namespace: str) -> dict[str, int]:
        """Remove every trace of a namespace: rows, history, vectors, index files, exports and
        LLM cache entries, then scrub the store and the cache file so no file under the store's
        folder keeps a byte of it (docs/deployment.md, "Forget").

        ``scrub_pending`` counts the files (store, LLM cache) whose scrub another connection's
        open read transaction held up: their WAL keeps the forgotten text until
        :meth:`retry_pending_scrubs` succeeds (the service worker calls it when idle, and every
        open of the store retries). 0 means the guarantee holds now."""
        check_namespace(namespace)
        exports = self.store.namespaces.exports(namespace)
        counts = self.store.forget_namespace(namespace)
        self.indexes.forget(namespace)
        for path in exports:
            path.unlink(missing_ok=True)
        counts["exports"] = len(exports)
        if self.store.path is not None:
            from hybridmem_local.llm.cache import forget_tag

            forgotten = forget_tag(
                self._llm_cache_path(), namespace, self.store.keys, self.config.store.busy_timeout_ms / 1000
            )
            counts["llm_cache"] = forgotten.deleted
            counts["scrub_pending"] += int(not forgotten.scrubbed)
        if counts["scrub_pending"]:
            log.warning(
                "forget %r: the rows are deleted, but %d file(s) keep them in their WAL until another connection's "
                "read ends; the scrub is retried when the service is idle and at the next open",
                namespace,
                counts["scrub_pending"],
            )
        return counts

    def retry_pending_scrubs(self) -> int:
        """Finish the scrubs a forget or purge left pending (store and LLM cache), without
        waiting for readers; returns how many files are still pending (0: none)."""
        from hybridmem_local.llm.cache import retry_pending_scrub

        result = self.store.retry_pending_scrub()
        pending = int(result is not None and not result.done)
        if self.store.path is not None:
            pending += int(retry_pending_scrub(self._llm_cache_path(), self.store.keys) is False)
        return pending

    # ------------------------------------------------------------------ forget requests

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
        redaction = self._redaction_of(redaction_id, namespace)
        originals = self._pending_originals(redaction)
        ns = redaction.namespace
        current = self.store.redactions.turn_texts(ns, list(originals["redacted"]))
        moved = [t for t, text in originals["redacted"].items() if current.get(t) != text]
        rows = self.store.memories.status_rows(
            [*redaction.rewritten, *redaction.rewritten.values(), *redaction.deleted]
        )

        def status(memory_id: int) -> tuple[str | None, int | None]:
            row = rows.get(memory_id, {})
            return row.get("status"), row.get("superseded_by")

        moved += [f"memory {old}" for old, new in redaction.rewritten.items() if status(old) != ("superseded", new)]
        moved += [f"memory {new}" for new in redaction.rewritten.values() if status(new)[0] != "active"]
        moved += [f"memory {m}" for m in redaction.deleted if status(m)[0] != "deleted"]
        if moved:
            raise ConflictError(f"redaction {redaction.id}: changed since: {moved[:5]}; undo the later change first")
        reason = f"undo of redaction {redaction.id}"
        with self.store.transaction():
            self.store.redactions.rewrite_turns(ns, originals["turns"])
            for old, new in redaction.rewritten.items():
                self.store.memories.set_status(new, MemoryStatus.deleted, reason=reason, action="undo_redaction")
                self.store.memories.set_status(old, MemoryStatus.active, reason=None, action="undo_redaction")
            for memory_id in redaction.deleted:
                self.store.memories.set_status(memory_id, MemoryStatus.active, reason=None, action="undo_redaction")
            self.store.redactions.decide(redaction.id, "undone")
            self.store.events.record(ns, "undo_redaction", None, None, None, {"redaction_id": redaction.id}, None)
        self._drop_indexes(ns)
        return self.store.redactions.get(redaction.id)

    def confirm_redaction(self, redaction_id: int, *, namespace: str | None = None) -> Redaction:
        """Make a pending redaction final: the removed text kept for undo, the memories it
        retired (with their history and cached vectors) and the namespace's LLM call cache are
        deleted, and the store is scrubbed (``MemoryStore.scrub``); it cannot be undone after."""
        redaction = self._redaction_of(redaction_id, namespace)
        self._pending_originals(redaction)
        ns = redaction.namespace
        summary = self.store.redactions.summary(redaction.id)
        candidates = sorted({*redaction.rewritten, *redaction.deleted, *redaction.retired})
        # A memory made active again since (by hand) is the admin's: it stays.
        rows = self.store.memories.status_rows(candidates)
        doomed = [m for m in candidates if m in rows and rows[m]["status"] != MemoryStatus.active.value]
        with self.store.transaction():
            counts = self.store.redactions.delete_memories(ns, doomed, summary.get("embedding_hashes", []))
            self.store.redactions.decide(redaction.id, "confirmed")
            self.store.events.record(
                ns, "confirm_redaction", None, None, None, {"redaction_id": redaction.id, **counts}, None
            )
        if self.store.path is not None:
            from hybridmem_local.llm.cache import forget_tag

            # The cached curation prompts hold the turns as they were.
            forget_tag(self._llm_cache_path(), ns, self.store.keys)
        # Freed pages and the WAL would otherwise still hold the removed text; a scrub a reader
        # holds up stays pending and is finished by the worker or the next open (storage/scrub.py).
        self.store.scrub()
        self._drop_indexes(ns)
        return self.store.redactions.get(redaction.id)

    def _redaction_of(self, redaction_id: int, namespace: str | None) -> Redaction:
        try:
            redaction = self.store.redactions.get(redaction_id)
        except NotFoundError:
            redaction = None
        if redaction is None or (namespace is not None and redaction.namespace != namespace):
            where = "" if namespace is None else f" in namespace {namespace!r}"
            raise NotFoundError(f"no redaction {redaction_id}{where}")
        return redaction

    def _pending_originals(self, redaction: Redaction) -> dict[str, Any]:
        if redaction.status != "pending":
            raise ConflictError(f"redaction {redaction.id} is {redaction.status} already")
        return self.store.redactions.originals(redaction.id)

    def _confirm_expired_redactions(self) -> None:
        """Confirm redactions pending longer than ``curation.redaction_review_days``."""
        days = self.config.curation.redaction_review_days
        if days is None:
            return
        for redaction_id in self.store.redactions.pending_before(utcnow() - timedelta(days=days)):
            self.confirm_redaction(redaction_id)

    def _act_on_forget_requests(self, session: Session, outcome: CurationOutcome) -> int | None:
        """Redact what the session's forget requests name that no redaction of it answered when it
        was stored (``_redact_as_stored``): the LLM's (``curation.forget_requests: rules+llm``), and
        the rules' where storing found nothing to remove (or the session was stored without
        them). Returns the redaction's id, if one was made."""
        mode = self.config.curation.forget_requests
        if mode == "off":
            return None
        from hybridmem_local.curation.forget import detect_requests, merge_requests

        marked = outcome.forget_requests if mode == "rules+llm" else []
        # The request sentences stay in the redacted turns, so the rules find them again: a turn
        # already answered is not redacted twice (nor again after an admin undid its redaction).
        answered = self.store.redactions.asked_turn_ids(session.namespace, session.session_id)
        requests = [r for r in merge_requests(detect_requests(session), marked) if r.turn_id not in answered]
        return self._redact(session.namespace, session.session_id, requests) if requests else None

    def _forget_requests_in(self, session: Session) -> builtins.list[ForgetRequest]:
        """The forget requests the rules find in a session (none with ``curation.forget_requests: off``)."""
        if self.config.curation.forget_requests == "off":
            return []
        from hybridmem_local.curation.forget import detect_requests

        return detect_requests(session)

    def _store_pending(self, session: Session) -> int | None:
        """Store a session raw as ``pending`` and redact what its forget requests name, in one
        transaction (the caller's, when inside one); returns the redaction's id, if one was made.
        The caller rebuilds the namespace's indexes after its transaction (``_drop_indexes``)."""
        with self.store.transaction():
            self.store.sessions.insert(session, curation_status="pending")
            return self._redact_as_stored(session)

    def _redact_as_stored(self, session: Session) -> int | None:
        """Redact what the rules' forget requests in ``session`` name, inside the transaction that
        stores it, so neither its windows nor any other ever serve it, whatever the curation
        backlog. A request naming nothing stored leaves no trace: curation plans it again once the
        session's memories exist. Returns the redaction's id, if one was made."""
        requests = self._forget_requests_in(session)
        if not requests:
            return None
        plan = self._plan_redaction(session.namespace, requests)
        return None if plan.empty else self._write_redaction(session.namespace, session.session_id, plan)

    def _redact(self, namespace: str, session_id: str, requests: Sequence[ForgetRequest]) -> int | None:
        """Remove what ``requests`` name from the namespace as one pending redaction
        (``_write_redaction``) and rebuild its indexes; an empty plan only logs a
        ``forget_request`` event."""
        plan = self._plan_redaction(namespace, requests)
        if plan.empty:
            log.info("session %s: forget request(s) named nothing stored", session_id)
            with self.store.transaction():
                self.store.events.record(
                    namespace,
                    "forget_request",
                    None,
                    None,
                    None,
                    {"session_id": session_id, "requests": [r.model_dump() for r in plan.requests]},
                    "nothing stored matched",
                )
            return None
        redaction_id = self._write_redaction(namespace, session_id, plan)
        self._drop_indexes(namespace)
        return redaction_id

    def _plan_redaction(self, namespace: str, requests: Sequence[ForgetRequest]) -> RedactionPlan:
        """What ``requests`` name in the namespace's turns and memories (curation/forget.py); changes nothing."""
        from hybridmem_local.curation.forget import TurnText, plan_redaction

        turns = [
            TurnText(r["turn_id"], r["session_id"], r["speaker"], r["text"])
            for r in self.store.sessions.turn_rows(namespace)
        ]
        return plan_redaction(requests, turns, self.store.memories.select(namespace, status=None))

    def _write_redaction(self, namespace: str, session_id: str, plan: RedactionPlan) -> int:
        """Apply a non-empty plan as one pending redaction with a ``redact`` event, in one
        transaction (the caller's, when inside one). The removed text stays in the redaction's
        originals until it is confirmed; the caller rebuilds the namespace's indexes after commit."""
        olds = self.store.memories.get_many([*plan.rewritten, *plan.deleted, *plan.retired])
        copies: dict[int, Episode | RelationalTuple] = {}
        for old_id, fields in plan.rewritten.items():
            old = olds[old_id]
            draft_type = EpisodeDraft if old.kind == "episode" else TupleDraft
            draft = draft_type.model_validate({**old.model_dump(include=set(draft_type.model_fields)), **fields})
            copies[old_id] = _as_stored(draft, namespace).model_copy(
                update={"source_session_id": old.source_session_id}
            )
        missing, vectors, _ = self.indexes.for_write(namespace, [c.index_text() for c in copies.values()])
        changed_turns = set(plan.turns)
        # Cached vectors of text that is going: removed with the originals on confirm.
        hashes = {text_hash(m.index_text()) for m in olds.values()} | self._window_hashes(namespace, changed_turns)
        reason_of = "removed at the user's request (redaction {})"
        with self.store.transaction():
            before = self.store.redactions.turn_texts(namespace, sorted(changed_turns))
            redaction_id = self.store.redactions.create(
                namespace,
                session_id,
                [r.model_dump() for r in plan.requests],
                {},
                {"turns": before, "redacted": plan.turns},
            )
            reason = reason_of.format(redaction_id)
            self.store.redactions.rewrite_turns(namespace, plan.turns)
            self.store.embedding_cache.put(namespace, self.embedder.model_id, missing, vectors)
            rewritten: dict[int, int] = {}
            for old_id, copy in copies.items():
                (new_id,) = self.store.memories.insert(namespace, [copy], action="redact")
                self.store.memories.set_status(
                    old_id, MemoryStatus.superseded, reason=reason, superseded_by=new_id, action="redact"
                )
                rewritten[old_id] = new_id
            for memory_id in plan.deleted:
                self.store.memories.set_status(memory_id, MemoryStatus.deleted, reason=reason, action="redact")
            summary = {
                "turn_ids": sorted(changed_turns),
                "rewritten": rewritten,
                "deleted": plan.deleted,
                "retired": plan.retired,
                "spans": sum(len(spans) for spans in plan.spans.values()),
                "embedding_hashes": sorted(hashes),
            }
            self.store.redactions.set_summary(redaction_id, summary)
            self.store.events.record(
                namespace,
                "redact",
                None,
                None,
                None,
                {
                    "redaction_id": redaction_id,
                    "session_id": session_id,
                    **{k: summary[k] for k in ("turn_ids", "spans")},
                },
                "forget request",
            )
        log.info("redaction %d in %s: %d turns, %d memories", redaction_id, namespace, len(changed_turns), len(olds))
        return redaction_id

    def _window_hashes(self, namespace: str, turn_ids: set[str]) -> set[str]:
        """Text hashes of the windows that hold any of ``turn_ids``. Read from the store, not the
        indexes' cache of windows: inside a transaction that may still roll back, that cache
        would keep turns that were never stored."""
        if self.store.path is None:
            return set()
        size, stride = self.config.retrieval.window_size, self.config.retrieval.window_stride
        return {
            text_hash(window.index_text())
            for window in load_windows(self.store, namespace, size, stride).values()
            if turn_ids & {t.turn_id for t in window.turns}
        }

    def _drop_indexes(self, namespace: str) -> None:
        """Index files keep vectors and texts of removed entries (hnswlib marks them deleted): rebuild."""
        if self.store.path is not None:
            self.indexes.rebuild(namespace)

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
        from hybridmem_local.consolidation.planner import plan_consolidation

        report = plan_consolidation(
            self.indexes,
            namespace,
            self.llm if llm is None else llm,
            self.config,
            clusterer=clusterer,
            clusters=clusters,
        )
        return report if dry_run else self.apply_consolidation(report)

    def consolidate_if_due(
        self, namespace: str, llm: StructuredLLM | None = None, clusterer: Clusterer | None = None
    ) -> ConsolidationReport | None:
        """Consolidate when ``consolidation.every_n_sessions`` sessions were stored since the last
        run (0 = never); the run resets the count."""
        every = self.config.consolidation.every_n_sessions
        if every == 0 or self.store.runs.sessions_since_last(namespace) < every:
            return None
        return self.consolidate(namespace, llm=llm, clusterer=clusterer)

    def apply_consolidation(self, report: ConsolidationReport) -> ConsolidationReport:
        """Apply a planned run (``consolidate(dry_run=True)`` or ``plan_consolidation`` made the
        report) in one transaction: a ``consolidation_runs`` row, each merge through ``_supersede``
        (action ``merge``), each deletion a status change, all events carrying the run id, the
        namespace's session count reset. A group whose memories were changed since planning is
        skipped, not the run. Returns the report, now of the applied run."""
        from hybridmem_local.consolidation.planner import SkippedGroup, count_outcome, run_params, stored_merge

        plan = report.plan
        if plan is None or report.run_id is not None:
            raise InvalidInputError("apply_consolidation takes a planned report (with a plan, not applied yet)")
        namespace, started = plan.namespace, time.perf_counter()
        # Embedded before the transaction (a failure there changes nothing, and no lock is held meanwhile).
        self.indexes.embed(namespace, [stored_merge(m, namespace).index_text() for g in plan.groups for m in g.merges])
        report.dry_run, report.merged, report.deleted = False, {}, {}
        applied = []
        with self.store.transaction():
            run_id = report.run_id = self.store.runs.start(namespace, report.backend, run_params(self.config, report))
            for group_plan in plan.groups:
                stale = self.store.memories.not_active(group_plan.touched_ids())
                if stale:
                    report.skipped.append(
                        SkippedGroup(group=group_plan.group, error=f"memories {stale} changed since planning")
                    )
                    report.stores[group_plan.group.kind].invalid_plans_skipped += 1
                    continue
                merged_ids = self._supersede(
                    namespace,
                    [(m.source_ids, stored_merge(m, namespace)) for m in group_plan.merges],
                    reason=f"merged by consolidation run {run_id}",
                    action="merge",
                    run_id=run_id,
                )
                for merge, merged_id in zip(group_plan.merges, merged_ids, strict=True):
                    merge.merged_id = merged_id
                    report.merged[merged_id] = merge.source_ids
                for deletion in group_plan.deletions:
                    self.store.memories.set_status(
                        deletion.memory_id, MemoryStatus.deleted, reason=deletion.reason, run_id=run_id
                    )
                    report.deleted[deletion.memory_id] = deletion.reason
                applied.append(group_plan)
            count_outcome(report, applied)
            report.timings.apply_s = time.perf_counter() - started
            self.store.runs.finish(run_id, namespace, report.model_dump_json())
        log.info(
            "consolidation run %d on %s: %d → %d memories",
            run_id,
            namespace,
            report.memories_before,
            report.memories_after,
        )
        return report

    def undo(self, run_id: int, *, namespace: str | None = None) -> UndoReport:
        """Restore exactly the state before consolidation run ``run_id``, in one transaction.

        Sources and deleted memories get back their previous status, reason and pointer; the run's
        merged rows are marked deleted ("undo of run N"); the run becomes 'undone'. Refused
        (ConsolidationError, nothing changed) when a memory the run touched was changed since (by
        a later run: undo that one first) or purged. With ``namespace``, only a run of that
        namespace is undone (NotFoundError otherwise).
        """
        from hybridmem_local.consolidation.planner import UndoReport, plan_undo

        if namespace is not None:
            try:
                run_namespace = self.store.runs.get(run_id)["namespace"]
            except NotFoundError:
                run_namespace = None
            if run_namespace != namespace:
                raise NotFoundError(f"no consolidation run {run_id} in namespace {namespace!r}")
        with self.store.transaction():
            plan = plan_undo(self.store, run_id)
            for memory_id, before in plan.restore.items():
                self.store.memories.set_status(
                    memory_id,
                    MemoryStatus(before["status"]),
                    reason=before["status_reason"],
                    superseded_by=before["superseded_by"],
                    run_id=run_id,
                    action="undo",
                )
            for memory_id in plan.merged_ids:
                self.store.memories.set_status(
                    memory_id, MemoryStatus.deleted, reason=f"undo of run {run_id}", run_id=run_id, action="undo"
                )
            self.store.runs.mark_undone(run_id)
        return UndoReport(
            run_id=run_id, namespace=plan.namespace, restored=len(plan.restore), removed=len(plan.merged_ids)
        )

    def purge(self, namespace: str, older_than: timedelta) -> PurgeReport:
        """Physically delete non-active memories whose last status change is older than ``older_than``.

        Their history events go too (events hold the full row, so keeping them would keep the text
        purge promises to remove), as do their cached embeddings (unless a remaining memory has the
        same text); one ``purge`` event records which ids went. A consolidation run that touched a
        purged memory can no longer be undone. Freed pages are vacuumed and the namespace's index
        files rebuilt, so no copy of the purged text or vectors stays on disk.
        """
        from hybridmem_local.consolidation.planner import PurgeReport

        check_namespace(namespace)
        if older_than < timedelta(0):
            raise InvalidInputError(f"older_than must not be negative, got {older_than}")
        cutoff = utcnow() - older_than
        with self.store.transaction():
            candidates = self.store.memories.retired_before(namespace, cutoff)
            doomed = _unreferenced(candidates, self.store.memories.superseded_pointers(namespace))
            ids = sorted(doomed)
            remaining_texts = {
                text_hash(m.index_text())
                for m in self.store.memories.select(namespace, status=None)
                if m.id not in doomed
            }
            purged_texts = {
                text_hash(m.index_text()) for m in self.store.memories.get_many(ids).values()
            } - remaining_texts
            events, embeddings = self.store.delete_memories(
                namespace,
                ids,
                sorted(purged_texts),
                {"memory_ids": ids, "cutoff": cutoff.isoformat()},
                f"older than {older_than}",
            )
        scrub_pending = False
        if ids:
            scrub_pending = not self.store.scrub().done
            if self.store.path is not None:
                self.indexes.rebuild(namespace)  # hnswlib keeps vectors of deleted labels
        return PurgeReport(
            namespace=namespace,
            cutoff=cutoff,
            memories=len(ids),
            embeddings=embeddings,
            events=events,
            kept_referenced=len(candidates) - len(ids),
            scrub_pending=scrub_pending,
        )

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
        return self._search(query, namespace, k, filters=filters)

    def _search(
        self, query: str, namespace: str, k: int | None, filters: SearchFilters | None = None, candidates: bool = False
    ) -> SearchResult:
        check_namespace(namespace)
        k = self.config.retrieval.k if k is None else k
        if k < 1:
            raise InvalidInputError(f"k must be at least 1, got {k}")
        return self.retriever.search(
            query, namespace, k, self.config.retrieval.tuple_multiplier * k, filters=filters, candidates=candidates
        )

    def answer(
        self, question: str, namespace: str = "default", question_date: datetime | None = None, k: int | None = None
    ) -> Answer:
        """Retrieve (``answer_search``) and answer with one LLM call, as ``answering`` configures."""
        return self.prepare_answer(question, namespace, question_date, k).run(self.llm)

    def prepare_answer(
        self, question: str, namespace: str = "default", question_date: datetime | None = None, k: int | None = None
    ) -> PreparedAnswer:
        """Everything of ``answer`` but the LLM call: its retrieval and its settings. ``answer`` is
        ``prepare_answer(...).run(self.llm)``; the service retrieves under its store lock and makes
        the call outside it, so a slow model holds up no other request."""
        from hybridmem_local.answering.answerer import PreparedAnswer

        return PreparedAnswer(
            question=question,
            question_date=question_date,
            search_result=self.answer_search(question, namespace=namespace, k=k),
            options=self.answer_options(),
        )

    def answer_many(
        self,
        questions: Sequence[str],
        namespace: str = "default",
        question_dates: Sequence[datetime | None] | None = None,
        k: int | None = None,
    ) -> list[Answer]:
        """Answer several questions in one batched LLM call: each retrieves as ``answer`` does."""
        from hybridmem_local.answering.answerer import answer_many

        results = [self.answer_search(question, namespace=namespace, k=k) for question in questions]
        options = self.answer_options()
        return answer_many(
            self.llm,
            questions,
            results,
            question_dates,
            tag=namespace,
            enable_thinking=options.enable_thinking,
            context_budget=options.context_budget,
            mode=options.mode,
            citer=options.citer,
        )

    def answer_search(self, question: str, namespace: str = "default", k: int | None = None) -> SearchResult:
        """The search an answer is written from: ``search``, but every store's candidates when a
        context budget is set (the budget, not k, decides what is shown), with the memories'
        source turns attached when ``answering.evidence_turns`` is on (the context then shows them)."""
        result = self._search(question, namespace, k, candidates=self.config.retrieval.context_budget is not None)
        return with_source_turns(self.store, result) if self.config.answering.evidence_turns else result

    def answer_options(self) -> AnswerOptions:
        """How this config answers: thinking, context budget, JSON or text, the text answers' citer."""
        from hybridmem_local.answering.answerer import AnswerOptions, citer_for

        return AnswerOptions(
            enable_thinking=self.config.llm.enable_thinking,
            context_budget=self.config.retrieval.context_budget,
            mode=self.config.answering.mode,
            citer=citer_for(self.config.answering, self.embedder.embed),
        )

    def get(self, memory_id: int, *, namespace: str | None = None) -> Episode | RelationalTuple:
        """The memory with this id; with ``namespace``, only if it is that namespace's. Either way a
        missing one is a NotFoundError, and another namespace's is reported just as missing."""
        if namespace is None:
            return self.store.memories.get(memory_id)
        try:
            found = self.store.memories.get(memory_id)
        except NotFoundError:
            found = None
        if found is None or found.namespace != namespace:
            raise NotFoundError(f"no memory with id {memory_id} in namespace {namespace!r}")
        return found

    def list(
        self,
        namespace: str = "default",
        kind: MemoryKind | None = None,
        status: MemoryStatus | None = MemoryStatus.active,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Episode | RelationalTuple]:
        """Memories in id order (``status=None``: any status); ``limit``/``offset`` page through them."""
        check_page(limit, offset)
        return self.store.memories.select(namespace, kind, status, limit=limit, offset=offset)

    def history(self, memory_id: int, *, namespace: str | None = None) -> builtins.list[Event]:
        """Every change of a memory, oldest first (``namespace`` as in ``get``)."""
        self.get(memory_id, namespace=namespace)  # a clear NotFoundError for an unknown id
        return self.store.events.history(memory_id)

    def stats(self, namespace: str | None = None) -> Stats:
        """Counts of sessions, turns and memories by status, and the loaded indexes' sizes: of the
        whole store, or of one namespace."""
        namespaces = self.store.namespaces.names()
        sizes = self.indexes.sizes()
        if namespace is not None:
            namespaces = [ns for ns in namespaces if ns == namespace]
            sizes = {name: n for name, n in sizes.items() if name.split("/", 1)[0] == namespace}
        return Stats(namespaces=namespaces, counts=self.store.counts(namespace), index_sizes=sizes)

    # ------------------------------------------------------------------ export / import

    def export(self, namespace: str, path: str | Path) -> int:
        """Write a namespace as JSONL (sessions with turns, then memories with provenance); when
        the store is encrypted, the file is sealed with its key (``files.sessions.export_bytes``)
        and only ``import_`` into a store with that key reads it. Returns the records written."""
        from hybridmem_local.files.sessions import export_bytes

        records = self.export_records(namespace)
        path = Path(path)
        data = export_bytes(records, None if self.store.keys is None else self.store.keys.files)
        with open(path, "wb", opener=owner_only_opener) as out:
            out.write(data)
        self.store.namespaces.record_export(namespace, path)
        return len(records)

    def export_records(self, namespace: str) -> builtins.list[str]:
        """The export's JSONL lines, each ending in a newline: sessions, then memories of any status."""
        check_namespace(namespace)
        if namespace not in self.store.namespaces.names():
            raise NotFoundError(f"namespace {namespace!r} does not exist")
        sessions = [
            json.dumps({"type": "session", **json.loads(record.model_dump_json())}) + "\n"
            for record in self.store.sessions.select(namespace)
        ]
        memories = [
            json.dumps({"type": "memory", **json.loads(memory.model_dump_json())}) + "\n"
            for memory in self.store.memories.select(namespace, status=None)
        ]
        return sessions + memories

    def import_(self, path: str | Path, namespace: str | None = None) -> dict[str, int]:
        """Load an export (optionally into another namespace) in one transaction; a sealed one
        needs this store's key (a clear error and nothing imported otherwise)."""
        from hybridmem_local.files.sessions import read_export

        key = None if self.store.keys is None else self.store.keys.files
        sessions, memories = read_export(Path(path), namespace, key)
        target = {m.namespace for m in memories} | {s.session.namespace for s in sessions}
        old_to_new: dict[int, int] = {}
        with self.store.transaction():
            for record in sessions:
                self.store.sessions.insert(record.session, curation_status=record.curation_status)
            for memory in memories:
                (new_id,) = self.store.memories.insert(memory.namespace, [memory], action="import")
                old_to_new[memory.stored_id] = new_id
            for memory in memories:
                if memory.status != MemoryStatus.active:
                    self.store.memories.set_status(
                        old_to_new[memory.stored_id],
                        memory.status,
                        reason="imported",
                        superseded_by=None if memory.superseded_by is None else old_to_new.get(memory.superseded_by),
                        action="import",
                    )
            for ns in target:
                self.indexes.embed(
                    ns, [m.index_text() for m in memories if m.namespace == ns and m.status == MemoryStatus.active]
                )
        return {"sessions": len(sessions), "memories": len(memories)}


def _as_stored(memory: EpisodeDraft | TupleDraft, namespace: str) -> Episode | RelationalTuple:
    if isinstance(memory, (Episode, RelationalTuple)):
        return memory
    cls = Episode if isinstance(memory, EpisodeDraft) else RelationalTuple
    return cls(namespace=namespace, **memory.model_dump())


def _unreferenced(candidates: set[int], pointers: dict[int, int]) -> set[int]:
    """The candidates no kept row points at (its pointer must resolve); repeated until stable,
    since keeping one row can keep the row it points at."""
    doomed = set(candidates)
    while True:
        referenced = {target for source, target in pointers.items() if source not in doomed and target in doomed}
        if not referenced:
            return doomed
        doomed -= referenced
