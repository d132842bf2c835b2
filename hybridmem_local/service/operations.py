"""What the HTTP API and the MCP tools do, written once: who may act on which namespace, which
memory is whose, paging and its limits. Both servers call this; neither touches the store.

    operations = Operations(state)
    writer = operations.writer(KeyScope(key), "alice")   # ForbiddenError unless the key may write alice
    writer.add_memories(episodes=[...])                  # NotFoundError, InvalidInputError... as the library raises
    operations.reader(FixedNamespace("alice"), None).search("Where did Alice move?")

A caller's :class:`Scope` resolves the namespace it asks for (or the one it is fixed to) and
checks its role; the class of the handle it gets back says which role each operation needs —
:class:`Reader` < :class:`Writer` < :class:`Admin`, as ``Role`` orders them — so the rule lives
in one place. Errors are the library's (``hybridmem_local.errors``); each server reports them by
their code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, ClassVar, Protocol, TypeVar

from hybridmem_local.errors import ForbiddenError, InvalidInputError, NotFoundError
from hybridmem_local.results import (
    Answer,
    ConsolidationReport,
    Event,
    Redaction,
    RedactionStatus,
    SearchResult,
    SessionRecord,
    Stats,
    UndoReport,
)
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    Message,
    RelationalTuple,
    Session,
    TupleDraft,
    check_namespace,
)
from hybridmem_local.service.keys import ALL_NAMESPACES, ApiKey, KeyRequest, Role
from hybridmem_local.service.schemas import (
    MAX_PAGE,
    ForgetReport,
    KeyCreated,
    MemoriesAdded,
    MemoryPage,
    SessionIn,
    SessionStatus,
    StatusFilter,
    invalid_input,
)
from hybridmem_local.service.state import ServiceState
from hybridmem_local.storage import audit
from hybridmem_local.storage.audit import AuditEntry, Verdict

# --------------------------------------------------------------------------- who may act on which namespace


class Scope(Protocol):
    def namespace(self, requested: str | None, role: Role) -> str:
        """The namespace a call acts on (``requested``, or the caller's only one when None), or
        the error saying why it may not (InvalidInputError, ForbiddenError)."""
        ...


@dataclass(frozen=True)
class KeyScope:
    """The namespaces and role of an API key: the HTTP routes, and the MCP tools over HTTP."""

    key: ApiKey

    def namespace(self, requested: str | None, role: Role) -> str:
        key = self.key
        if requested is None:
            if len(key.namespaces) != 1 or key.namespaces[0] == ALL_NAMESPACES:
                raise InvalidInputError(f"API key {key.key_id} reaches several namespaces; pass namespace")
            requested = key.namespaces[0]
        try:
            check_namespace(requested)
        except InvalidInputError as exc:
            raise InvalidInputError(f"namespace: {exc}") from None
        if not key.covers(requested):
            # Worded the same whether or not the namespace exists: a key learns nothing beyond its own.
            raise ForbiddenError(f"API key {key.key_id} does not reach namespace {requested!r}")
        if not key.allows(requested, role):
            raise ForbiddenError(f"this needs the {role.value} role; API key {key.key_id} has {key.role.value}")
        return requested


@dataclass(frozen=True)
class FixedNamespace:
    """One namespace fixed at start-up (``hybridmem mcp --namespace``): whoever can start the
    process can read the store file anyway, so there is no key and every role."""

    fixed: str

    def namespace(self, requested: str | None, role: Role) -> str:
        if requested is not None and requested != self.fixed:
            raise ForbiddenError(
                f"this MCP server serves namespace {self.fixed!r} only (fixed with --namespace at start-up); "
                "leave namespace out"
            )
        return self.fixed


# --------------------------------------------------------------------------- what each role may do


def _check_page(limit: int, offset: int) -> None:
    """A page of at most MAX_PAGE rows from a non-negative offset, else InvalidInputError."""
    if not 1 <= limit <= MAX_PAGE or offset < 0:
        raise InvalidInputError(f"limit must be 1-{MAX_PAGE} and offset at least 0, got {limit} and {offset}")


class Reader:
    """The operations of a read key on one namespace (checked when the handle was made)."""

    role: ClassVar[Role] = Role.read

    def __init__(self, state: ServiceState, namespace: str):
        self.state = state
        self.namespace = namespace

    def session(self, session_id: str) -> SessionRecord:
        """A stored session with its curation status (``pending``, ``curated``, ``curation_failed``)."""
        with self.state.memory() as memory:
            return memory.get_session(self.namespace, session_id)

    def session_status(self, session_id: str) -> SessionStatus:
        """Where a session's curation stands, without its turns."""
        record = self.session(session_id)
        return SessionStatus(
            namespace=self.namespace,
            session_id=session_id,
            started_at=record.session.started_at,
            turns=len(record.session.turns),
            curation_status=record.curation_status,
            curation_error=record.curation_error,
        )

    def search(
        self,
        query: str,
        k: int | None = None,
        kinds: Sequence[MemoryKind] | None = None,
        since: date | datetime | None = None,
        until: date | datetime | None = None,
        min_score: float | None = None,
    ) -> SearchResult:
        """Top-k episodes and top-2k tuples (no LLM call), kept by the filters given."""
        with self.state.memory() as memory:
            return memory.search(
                query,
                namespace=self.namespace,
                k=k,
                kinds=kinds,
                since=since,
                until=until,
                min_score=min_score,
            )

    def ask(self, question: str, question_date: datetime | None = None, k: int | None = None) -> Answer:
        """One LLM call outside the store's lock; AskTimeoutError past ``service.ask_timeout_s``."""
        answer = self.state.answer(question, self.namespace, question_date, k)
        # The LLM call ran outside the facade: the memories it was shown are noted here.
        audit.note(self.namespace, context=answer.context_memory_ids, cited=answer.cited_memory_ids)
        return answer

    def list_memories(
        self,
        kind: MemoryKind | None = None,
        status: StatusFilter = "active",
        limit: int = 100,
        offset: int = 0,
        since: date | None = None,
        until: date | None = None,
    ) -> MemoryPage:
        """Memories in id order, ``limit`` at a time (at most MAX_PAGE); ``next_offset`` is None on the
        last page. ``since``/``until`` keep those dated within the period (in the database)."""
        _check_page(limit, offset)
        wanted = None if status == "any" else MemoryStatus(status)
        with self.state.memory() as memory:
            rows = memory.list(
                self.namespace, kind=kind, status=wanted, limit=limit + 1, offset=offset, since=since, until=until
            )
        more = len(rows) > limit
        return MemoryPage(
            namespace=self.namespace,
            items=rows[:limit],
            limit=limit,
            offset=offset,
            next_offset=offset + limit if more else None,
        )

    def sessions(self, status: str | None = None, limit: int = 50, offset: int = 0) -> tuple[list[SessionRecord], bool]:
        """A page of the namespace's sessions in date order (of one curation status or any), and
        whether more follow."""
        _check_page(limit, offset)
        with self.state.memory() as memory:
            records = memory.sessions(self.namespace, status)
        return records[offset : offset + limit], len(records) > offset + limit

    def session_memories(self, session_id: str, limit: int = MAX_PAGE) -> list[Episode | RelationalTuple]:
        """The memories (any status) curated from a session of this namespace, in id order."""
        with self.state.memory() as memory:
            memory.get_session(self.namespace, session_id)  # NotFoundError for another namespace's
            found = memory.store.memories.of_session(self.namespace, session_id, limit)
        audit.note(self.namespace, memories=[m.id for m in found if m.id is not None])
        return found

    def memory(self, memory_id: int) -> Episode | RelationalTuple:
        """The memory, or NotFoundError when it is missing or another namespace's (not revealed)."""
        with self.state.memory() as memory:
            return memory.get(memory_id, namespace=self.namespace)

    def history(self, memory_id: int) -> list[Event]:
        with self.state.memory() as memory:
            return memory.history(memory_id, namespace=self.namespace)

    def export(self) -> list[str]:
        """The namespace as JSONL lines: sessions with turns, then memories."""
        with self.state.memory() as memory:
            return memory.export_records(self.namespace)

    def stats(self) -> Stats:
        """Counts and index sizes of this namespace only (not the store's other namespaces)."""
        with self.state.memory() as memory:
            return memory.stats(self.namespace)


class Writer(Reader):
    role: ClassVar[Role] = Role.write

    def add_sessions(self, sessions: Sequence[SessionIn]) -> list[SessionRecord]:
        """Store the sessions' raw turns ``pending`` (all or none) and wake the curation worker."""
        with invalid_input("body"):
            built = [
                Session(namespace=self.namespace, session_id=s.session_id, started_at=s.started_at, turns=s.turns)
                for s in sessions
            ]
        return self.state.enqueue(built)

    def add_messages(self, messages: Sequence[Message], session_id: str | None = None) -> SessionRecord:
        """Chat messages as a session dated now (the speaker from the role), queued like a session."""
        [record] = self.state.enqueue([Session.from_messages(self.namespace, messages, session_id)])
        return record

    def remember(self, text: str) -> SessionRecord:
        """Plain text as a one-message session from the user, dated now, queued like a session."""
        return self.add_messages([Message.from_user(text)])

    def add_memories(self, episodes: Sequence[EpisodeDraft] = (), tuples: Sequence[TupleDraft] = ()) -> MemoriesAdded:
        """Store memories written by the caller (no curation); ``source_turn_ids`` must name stored turns."""
        if not episodes and not tuples:
            raise InvalidInputError("give at least one of episodes or tuples")
        with self.state.memory() as memory:
            ids = memory.add_memories(self.namespace, episodes=episodes, tuples=tuples)
        return MemoriesAdded(namespace=self.namespace, ids=ids)

    def delete_memory(self, memory_id: int, reason: str) -> Episode | RelationalTuple:
        """Mark the memory deleted (kept in its history); returns it as it is now."""
        with self.state.memory() as memory:
            memory.delete(memory_id, reason=reason, namespace=self.namespace)
            return memory.get(memory_id)

    def retry_curation(self, session_id: str) -> SessionRecord:
        """Put a session whose curation failed back in the queue (``pending``) and wake the
        curation worker, which curates it like a new one (``hybridmem curate --retry-failed`` for
        the whole namespace); InvalidInputError for a session that did not fail."""
        with self.state.memory() as memory:
            memory.store.sessions.requeue_failed(self.namespace, session_id)  # NotFoundError for another namespace's
            record = memory.get_session(self.namespace, session_id)
        self.state.worker.wake()
        return record

    def update_memory(self, memory_id: int, reason: str, fields: dict[str, Any]) -> Episode | RelationalTuple:
        """Store the changed memory as a new one that supersedes it (``HybridMemory.update``); returns the new one."""
        with self.state.memory() as memory:
            memory.get(memory_id, namespace=self.namespace)  # NotFoundError for another namespace's
            return memory.update(memory_id, reason, **fields)


class Admin(Writer):
    role: ClassVar[Role] = Role.admin

    def forget(self) -> ForgetReport:
        """Remove every trace of the namespace: rows, history, vectors, index files, exports, LLM cache."""
        with self.state.memory() as memory:
            return ForgetReport(namespace=self.namespace, removed=memory.forget(self.namespace))

    def consolidate(self, dry_run: bool = False) -> ConsolidationReport:
        with self.state.memory() as memory:
            return memory.consolidate(self.namespace, dry_run=dry_run)

    def undo(self, run_id: int) -> UndoReport:
        with self.state.memory() as memory:
            return memory.undo(run_id, namespace=self.namespace)

    def runs(self, limit: int = 50, offset: int = 0) -> tuple[list[RunSummary], bool]:
        """A page of the namespace's consolidation runs, newest first, and whether more follow."""
        _check_page(limit, offset)
        with self.state.memory() as memory:
            rows = memory.store.runs.select(self.namespace, limit + 1, offset)
        return [RunSummary.of(row) for row in rows[:limit]], len(rows) > limit

    def run(self, run_id: int) -> RunSummary:
        """One consolidation run of this namespace with its stored report (NotFoundError for another's)."""
        with self.state.memory() as memory:
            try:
                row = memory.store.runs.get(run_id)
            except NotFoundError:
                row = None
        if row is None or row.namespace != self.namespace:
            raise NotFoundError(f"no consolidation run with id {run_id} in namespace {self.namespace!r}")
        return RunSummary.of(row)

    def redactions(self, status: RedactionStatus | None = None) -> list[Redaction]:
        """What forget requests in this namespace's conversations removed (without the removed text)."""
        with self.state.memory() as memory:
            return memory.redactions(self.namespace, status)

    def redaction_texts(self, redaction_id: int) -> dict[str, tuple[str, str]]:
        """turn id → (original, redacted) text of a pending redaction: the removed spans, for review
        by an admin only (nothing once it is confirmed or undone)."""
        with self.state.memory() as memory:
            redaction = memory.store.redactions.get(redaction_id)
            if redaction.namespace != self.namespace:
                raise NotFoundError(f"no redaction with id {redaction_id}")
            if redaction.status != "pending":
                return {}
            originals = memory.store.redactions.originals(redaction_id)
        audit.note(self.namespace, redactions=[redaction_id])
        return {t: (text, originals["redacted"].get(t, "")) for t, text in originals["turns"].items()}

    def undo_redaction(self, redaction_id: int) -> Redaction:
        with self.state.memory() as memory:
            return memory.undo_redaction(redaction_id, namespace=self.namespace)

    def confirm_redaction(self, redaction_id: int) -> Redaction:
        with self.state.memory() as memory:
            return memory.confirm_redaction(redaction_id, namespace=self.namespace)


@dataclass(frozen=True)
class RunSummary:
    """A consolidation run as its ``consolidation_runs`` row keeps it: the report without the plan's
    text; ``kept`` is the memories the run neither merged nor deleted."""

    run_id: int
    started_at: datetime
    finished_at: datetime | None
    status: str
    report: ConsolidationReport

    @property
    def merged(self) -> int:
        return len(self.report.merged)

    @property
    def deleted(self) -> int:
        return len(self.report.deleted)

    @property
    def kept(self) -> int:
        return sum(max(0, s.memories_before - s.merged_sources - s.deletions) for s in self.report.stores.values())

    @classmethod
    def of(cls, row: Any) -> RunSummary:
        stored = row.report if row.report and row.report != "{}" else None
        report = (
            ConsolidationReport.model_validate_json(stored)
            if stored
            else ConsolidationReport(namespace=row.namespace, run_id=row.id)
        )
        return cls(
            run_id=row.id,
            started_at=datetime.fromisoformat(row.started_at),
            finished_at=datetime.fromisoformat(row.finished_at) if row.finished_at else None,
            status=row.status,
            report=report,
        )


class KeyAdmin:
    """The API keys an admin key manages: those whose every namespace it reaches itself."""

    def __init__(self, state: ServiceState, admin: ApiKey):
        self.state = state
        self.admin = admin

    def _manages(self, key: ApiKey) -> bool:
        return all(self.admin.covers(ns) for ns in key.namespaces)  # covers("*") only for an all-namespace key

    def list(self) -> list[ApiKey]:
        keys = [k for k in self.state.keys.list() if self._manages(k)]
        audit.note(None, keys=[k.key_id for k in keys])
        return keys

    def create(self, request: KeyRequest) -> KeyCreated:
        """A new key for namespaces this admin key reaches; its token is in this answer only."""
        outside = [ns for ns in request.namespaces if not self.admin.covers(ns)]
        if outside:
            raise ForbiddenError(
                f"API key {self.admin.key_id} cannot create keys for namespaces it does not reach: {outside}"
            )
        key, token = self.state.keys.create(request.namespaces, request.role, request.label)
        return KeyCreated(key=key, token=token)

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key at once; revoking twice is harmless. Another admin's key is reported missing."""
        try:
            key = self.state.keys.get(key_id)
        except NotFoundError:
            key = None
        if key is None or not self._manages(key):
            raise NotFoundError(f"no API key {key_id} among the keys this admin key manages")
        return self.state.keys.revoke(key_id)


class AuditReader:
    """The audit trail, for an admin key of every namespace (``*``): it names every key and
    namespace, so a key of some namespaces only may not read it."""

    def __init__(self, state: ServiceState):
        self.state = state

    def entries(self, actor: str | None, namespace: str | None, since: datetime | None, limit: int) -> list[AuditEntry]:
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInputError(f"limit must be 1-{MAX_PAGE}, got {limit}")
        return self.state.audit_entries(actor, namespace, since, limit)

    def verify(self) -> Verdict:
        """Walk the trail's hash chain (``hybridmem audit verify``)."""
        with self.state.memory() as memory:
            return memory.store.audit.verify()


# --------------------------------------------------------------------------- the entry point

Handle = TypeVar("Handle", bound=Reader)


class Operations:
    """Hands out the operations a caller may use (see the module docstring)."""

    def __init__(self, state: ServiceState):
        self.state = state

    def on(self, handle: type[Handle], scope: Scope, namespace: str | None) -> Handle:
        """``handle``'s operations on the namespace ``scope`` resolves, if its role suffices."""
        resolved = scope.namespace(namespace, handle.role)
        audit.note(resolved)  # the request's audit entry names it even when nothing is found there
        return handle(self.state, resolved)

    def reader(self, scope: Scope, namespace: str | None) -> Reader:
        return self.on(Reader, scope, namespace)

    def writer(self, scope: Scope, namespace: str | None) -> Writer:
        return self.on(Writer, scope, namespace)

    def admin(self, scope: Scope, namespace: str | None) -> Admin:
        return self.on(Admin, scope, namespace)

    def namespaces(self, key: ApiKey) -> list[str]:
        """The namespaces a key reaches: its own, or every one in the store for an all-namespace key."""
        if ALL_NAMESPACES not in key.namespaces:
            return list(key.namespaces)
        with self.state.memory() as memory:
            return sorted(memory.store.namespaces.names())

    def last_activity(self, key: ApiKey, namespaces: Sequence[str]) -> dict[str, datetime]:
        """namespace → time of its latest change (event), for those of ``namespaces`` the key
        reaches, in one query (not one per namespace)."""
        reached = [ns for ns in namespaces if key.covers(ns)]
        if not reached:
            return {}
        with self.state.memory() as memory:
            return memory.store.events.latest(reached)

    def audit(self, key: ApiKey) -> AuditReader:
        if key.role != Role.admin or key.revoked_at is not None or key.namespaces != [ALL_NAMESPACES]:
            raise ForbiddenError(
                f"reading the audit trail needs an admin key of every namespace ('*'); API key {key.key_id} is not one"
            )
        return AuditReader(self.state)

    def keys(self, key: ApiKey) -> KeyAdmin:
        if key.role != Role.admin or key.revoked_at is not None:
            raise ForbiddenError(f"this needs the admin role; API key {key.key_id} has {key.role.value}")
        return KeyAdmin(self.state, key)
