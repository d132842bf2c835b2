"""The routes of the HTTP API, one router per tag; each parses its request and calls the operations.

A route under ``/v1/namespaces/{namespace}`` gets its handle from a dependency: the namespace
checked for its name and for the key's reach and role (``operations.KeyScope``) before the body
is parsed, so a key that may not act there learns nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import AwareDatetime, Field

from hybridmem_local import __version__
from hybridmem_local.answering.answerer import Answer
from hybridmem_local.consolidation.planner import ConsolidationReport, UndoReport
from hybridmem_local.errors import NotReadyError
from hybridmem_local.memory import Stats
from hybridmem_local.retrieval.retriever import SearchFilters
from hybridmem_local.schema import (
    MAX_MESSAGES_SESSION_ID,
    Episode,
    EpisodeDraft,
    MemoryKind,
    Message,
    RelationalTuple,
    SearchResult,
    SessionRecord,
    StrictModel,
    TupleDraft,
)
from hybridmem_local.service.errors import ErrorResponse
from hybridmem_local.service.keys import ApiKey, KeyRequest
from hybridmem_local.service.models import (
    MAX_BATCH,
    MAX_K,
    MAX_MESSAGES,
    MAX_PAGE,
    MAX_QUERY_CHARS,
    ForgetReport,
    KeyCreated,
    MemoriesAdded,
    MemoryOut,
    MemoryPage,
    SessionIn,
    StatusFilter,
)
from hybridmem_local.service.operations import (
    Admin,
    AuditReader,
    Handle,
    KeyAdmin,
    KeyScope,
    Operations,
    Reader,
    Writer,
)
from hybridmem_local.service.worker import WorkerStatus
from hybridmem_local.storage.audit import AuditEntry
from hybridmem_local.storage.events import Event
from hybridmem_local.storage.redactions import Redaction, RedactionStatus

# --------------------------------------------------------------------------- request / response models


class SessionBatchIn(StrictModel):
    sessions: list[SessionIn] = Field(min_length=1, max_length=MAX_BATCH)


class SessionAccepted(StrictModel):
    namespace: str
    session_id: str
    curation_status: str
    #: Where to poll for the curation outcome.
    status_url: str


class MessagesAccepted(SessionAccepted):
    #: The session's date (when the server stored it): with session_id, it names every turn.
    started_at: AwareDatetime


class MessagesIn(StrictModel):
    """Chat messages, stored as one session dated now (the speaker from the role)."""

    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    session_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MESSAGES_SESSION_ID,
        description="the session's id (default: made up from the date); its turns are session_id:index",
    )


class MemoriesIn(StrictModel):
    """At least one of the two (the operation says so when both are empty)."""

    episodes: list[EpisodeDraft] = Field(default_factory=list)
    tuples: list[TupleDraft] = Field(default_factory=list)


class SearchIn(SearchFilters):
    """A query, and optionally which stores, which period and which scores to keep."""

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    k: int | None = Field(
        default=None, ge=1, le=MAX_K, description="episodes to return (tuples: 2k); default from config"
    )


class AskIn(StrictModel):
    question: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    question_date: AwareDatetime | None = Field(
        default=None, description="when the question is asked (for relative dates)"
    )
    k: int | None = Field(default=None, ge=1, le=MAX_K)


class ListQuery(StrictModel):
    kind: MemoryKind | None = None
    status: StatusFilter = "active"
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)
    offset: int = Field(default=0, ge=0)


class ConsolidateIn(StrictModel):
    dry_run: bool = False


class Health(StrictModel):
    status: Literal["ok"] = "ok"
    version: str


class Readiness(StrictModel):
    ready: bool
    worker: WorkerStatus


# --------------------------------------------------------------------------- dependencies


def _operations(request: Request) -> Operations:
    return request.app.state.operations


def _key(request: Request) -> ApiKey:
    """The key the Guard authenticated (``scope["state"]``), or ``--no-auth``'s."""
    return request.scope["state"]["api_key"]


NamespacePath = Annotated[
    str, Path(description="1-64 characters of A-Z a-z 0-9 _ . -, starting with a letter or digit")
]


def _on(handle: type[Handle]) -> Callable[..., Handle]:
    """A dependency: ``handle``'s operations on the path's namespace, for the request's key."""

    def dependency(request: Request, namespace: NamespacePath) -> Handle:
        return _operations(request).on(handle, KeyScope(_key(request)), namespace)

    return dependency


def _keys(request: Request) -> KeyAdmin:
    return _operations(request).keys(_key(request))


Reads = Annotated[Reader, Depends(_on(Reader))]
Writes = Annotated[Writer, Depends(_on(Writer))]
Administers = Annotated[Admin, Depends(_on(Admin))]
ManagesKeys = Annotated[KeyAdmin, Depends(_keys)]
MemoryId = Annotated[int, Path(ge=1, le=2**63 - 1, description="a memory id")]

# --------------------------------------------------------------------------- health (no key)

health = APIRouter(tags=["health"])


@health.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process is up (no auth)."""
    return Health(version=__version__)


@health.get("/readyz", response_model=Readiness, responses={503: {"model": ErrorResponse}})
def readyz(request: Request) -> Readiness:
    """Store open, embedder loaded, curation worker alive (no auth); 503 not_ready otherwise."""
    state = _operations(request).state
    if not state.ready:
        raise NotReadyError("the service is not ready: store, embedder or curation worker not up")
    return Readiness(ready=True, worker=state.worker.status())


# --------------------------------------------------------------------------- sessions

NAMESPACE = "/v1/namespaces/{namespace}"
sessions = APIRouter(prefix=NAMESPACE, tags=["sessions"])


def _accepted(request: Request, namespace: str, records: list[SessionRecord]) -> list[SessionAccepted]:
    return [
        SessionAccepted(
            namespace=namespace,
            session_id=r.session.session_id,
            curation_status=r.curation_status,
            status_url=str(request.url_for("get_session", namespace=namespace, session_id=r.session.session_id).path),
        )
        for r in records
    ]


@sessions.post("/sessions", status_code=202, response_model=SessionAccepted)
def add_session(ops: Writes, body: SessionIn, request: Request) -> SessionAccepted:
    """Store a session's raw turns (one transaction) and queue it for curation; poll ``status_url``."""
    return _accepted(request, ops.namespace, ops.add_sessions([body]))[0]


@sessions.post("/sessions/batch", status_code=202, response_model=list[SessionAccepted])
def add_sessions(ops: Writes, body: SessionBatchIn, request: Request) -> list[SessionAccepted]:
    """Store several sessions, all or none, and queue them for curation."""
    return _accepted(request, ops.namespace, ops.add_sessions(body.sessions))


@sessions.post("/messages", status_code=202, response_model=MessagesAccepted)
def add_messages(ops: Writes, body: MessagesIn, request: Request) -> MessagesAccepted:
    """Store chat messages (``{role, content}``; plain text is one user message) as a session dated
    now, the speaker from the role, and queue it for curation; poll ``status_url``."""
    record = ops.add_messages(body.messages, body.session_id)
    [accepted] = _accepted(request, ops.namespace, [record])
    return MessagesAccepted(**accepted.model_dump(), started_at=record.session.started_at)


@sessions.get("/sessions/{session_id}", response_model=SessionRecord)
def get_session(ops: Reads, session_id: Annotated[str, Path(min_length=1, max_length=200)]) -> SessionRecord:
    """A stored session with its turns and curation status (pending, curated, curation_failed)."""
    return ops.session(session_id)


# --------------------------------------------------------------------------- memories

memories = APIRouter(prefix=NAMESPACE, tags=["memories"])


@memories.post("/memories", status_code=201, response_model=MemoriesAdded)
def add_memories(ops: Writes, body: MemoriesIn) -> MemoriesAdded:
    """Store memories written by the caller (no curation); ``source_turn_ids`` must name stored turns."""
    return ops.add_memories(body.episodes, body.tuples)


@memories.get("/memories", response_model=MemoryPage)
def list_memories(ops: Reads, query: Annotated[ListQuery, Query()]) -> MemoryPage:
    """Memories in id order, a page at a time (``status=any`` for every status)."""
    return ops.list_memories(query.kind, query.status, query.limit, query.offset)


@memories.get("/memories/{memory_id}", response_model=MemoryOut)
def get_memory(ops: Reads, memory_id: MemoryId) -> Episode | RelationalTuple:
    return ops.memory(memory_id)


@memories.delete("/memories/{memory_id}", response_model=MemoryOut)
def delete_memory(
    ops: Writes,
    memory_id: MemoryId,
    reason: Annotated[str, Query(min_length=1, max_length=500, description="kept in the memory's history")] = (
        "deleted through the HTTP API"
    ),
) -> Episode | RelationalTuple:
    """Mark a memory deleted (kept in its history; forgetting the namespace removes it for good)."""
    return ops.delete_memory(memory_id, reason)


@memories.get("/memories/{memory_id}/history", response_model=list[Event])
def memory_history(ops: Reads, memory_id: MemoryId) -> list[Event]:
    """Every change of a memory, oldest first, with before/after."""
    return ops.history(memory_id)


# --------------------------------------------------------------------------- reads

reads = APIRouter(prefix=NAMESPACE, tags=["reads"])


@reads.post("/search", response_model=SearchResult)
def search(ops: Reads, body: SearchIn) -> SearchResult:
    """Top-k episodes and top-2k tuples for a query (no LLM call)."""
    return ops.search(body.query, body.k, body)  # the body is the filters, too


@reads.post("/ask", response_model=Answer, responses={504: {"model": ErrorResponse}})
def ask(ops: Reads, body: AskIn) -> Answer:
    """Answer a question from the namespace's memories with one LLM call; 504 after ``service.ask_timeout_s``."""
    return ops.ask(body.question, body.question_date, body.k)


@reads.get(
    "/export",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "JSONL: sessions, then memories"}},
)
def export(ops: Reads) -> StreamingResponse:
    """The namespace as JSONL (``hybridmem import`` reads it): sessions with turns, then memories."""
    return StreamingResponse(iter(ops.export()), media_type="application/x-ndjson")


@reads.get("/stats", response_model=Stats)
def stats(ops: Reads) -> Stats:
    """Counts of sessions, turns and memories by status in this namespace."""
    return ops.stats()


# --------------------------------------------------------------------------- admin

admin = APIRouter(tags=["admin"])


@admin.delete(NAMESPACE, response_model=ForgetReport)
def forget(ops: Administers) -> ForgetReport:
    """Remove every trace of the namespace: rows, history, vectors, index files, exports, LLM cache."""
    return ops.forget()


@admin.post(NAMESPACE + "/consolidate", response_model=ConsolidationReport)
def consolidate(ops: Administers, body: ConsolidateIn) -> ConsolidationReport:
    """Cluster the namespace's memories and merge/retire them with the LLM, as one undoable run."""
    return ops.consolidate(body.dry_run)


@admin.post(NAMESPACE + "/consolidation-runs/{run_id}/undo", response_model=UndoReport)
def undo(ops: Administers, run_id: Annotated[int, Path(ge=1, le=2**63 - 1)]) -> UndoReport:
    """Restore exactly the state before a consolidation run of this namespace."""
    return ops.undo(run_id)


@admin.get(NAMESPACE + "/redactions", response_model=list[Redaction])
def list_redactions(ops: Administers, status: RedactionStatus | None = None) -> list[Redaction]:
    """What forget requests in the namespace's conversations removed, oldest first (no removed text)."""
    return ops.redactions(status)


@admin.post(NAMESPACE + "/redactions/{redaction_id}/undo", response_model=Redaction)
def undo_redaction(ops: Administers, redaction_id: Annotated[int, Path(ge=1, le=2**63 - 1)]) -> Redaction:
    """Put back exactly what a pending redaction removed."""
    return ops.undo_redaction(redaction_id)


@admin.post(NAMESPACE + "/redactions/{redaction_id}/confirm", response_model=Redaction)
def confirm_redaction(ops: Administers, redaction_id: Annotated[int, Path(ge=1, le=2**63 - 1)]) -> Redaction:
    """Delete a pending redaction's originals for good (no undo after)."""
    return ops.confirm_redaction(redaction_id)


# --------------------------------------------------------------------------- keys

keys = APIRouter(prefix="/v1/keys", tags=["keys"])


@keys.get("", response_model=list[ApiKey])
def list_keys(keyring: ManagesKeys) -> list[ApiKey]:
    """The keys this admin key manages: those reaching only namespaces it reaches too."""
    return keyring.list()


@keys.post("", status_code=201, response_model=KeyCreated)
def create_key(keyring: ManagesKeys, body: KeyRequest) -> KeyCreated:
    """A new key for namespaces this admin key reaches; its token is in this answer only."""
    return keyring.create(body)


@keys.delete("/{key_id}", response_model=ApiKey)
def revoke_key(keyring: ManagesKeys, key_id: Annotated[str, Path(pattern=r"^[0-9a-f]{8}$")]) -> ApiKey:
    """Revoke a key at once (its next request answers 401); revoking twice is harmless."""
    return keyring.revoke(key_id)


# --------------------------------------------------------------------------- audit


class AuditQuery(StrictModel):
    key: str | None = Field(default=None, max_length=64, description="only this actor (an API key id, 'worker')")
    namespace: str | None = Field(default=None, max_length=64)
    since: AwareDatetime | None = None
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)


audit = APIRouter(prefix="/v1/audit", tags=["audit"])


def _audit(request: Request) -> AuditReader:
    return _operations(request).audit(_key(request))


@audit.get("", response_model=list[AuditEntry])
def audit_entries(
    reader: Annotated[AuditReader, Depends(_audit)], query: Annotated[AuditQuery, Query()]
) -> list[AuditEntry]:
    """The audit trail, oldest first: who read or changed which ids (never text). Only for an admin
    key of every namespace ('*'); ``hybridmem audit verify`` checks its hash chain."""
    return reader.entries(query.key, query.namespace, query.since, query.limit)


ROUTERS = [health, sessions, memories, reads, admin, keys, audit]
