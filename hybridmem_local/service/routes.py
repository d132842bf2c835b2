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

from hybridmem_local import __version__
from hybridmem_local.errors import NotReadyError
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
from hybridmem_local.schema import Episode, RelationalTuple, StrictModel
from hybridmem_local.service.keys import ApiKey, KeyRequest
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
from hybridmem_local.service.schemas import (
    AskIn,
    AuditQuery,
    ConsolidateIn,
    ErrorResponse,
    ForgetReport,
    KeyCreated,
    ListQuery,
    MemoriesAdded,
    MemoriesIn,
    MemoryOut,
    MemoryPage,
    MessagesAccepted,
    MessagesIn,
    NamespaceName,
    Reason,
    RowId,
    SearchIn,
    SessionAccepted,
    SessionBatchIn,
    SessionId,
    SessionIn,
)
from hybridmem_local.service.worker import WorkerStatus
from hybridmem_local.storage.audit import AuditEntry

# --------------------------------------------------------------------------- probe bodies
# Here, not in schemas: HTTP only, and Readiness carries the worker's status (the client never asks).


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


NamespacePath = Annotated[NamespaceName, Path()]


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
MemoryIdPath = Annotated[RowId, Path(description="a memory id")]
RunIdPath = Annotated[RowId, Path(description="a consolidation run's id")]
RedactionIdPath = Annotated[RowId, Path(description="a redaction's id")]

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
def get_session(ops: Reads, session_id: Annotated[SessionId, Path()]) -> SessionRecord:
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
def get_memory(ops: Reads, memory_id: MemoryIdPath) -> Episode | RelationalTuple:
    return ops.memory(memory_id)


@memories.delete("/memories/{memory_id}", response_model=MemoryOut)
def delete_memory(
    ops: Writes,
    memory_id: MemoryIdPath,
    reason: Annotated[Reason, Query()] = "deleted through the HTTP API",
) -> Episode | RelationalTuple:
    """Mark a memory deleted (kept in its history; forgetting the namespace removes it for good)."""
    return ops.delete_memory(memory_id, reason)


@memories.get("/memories/{memory_id}/history", response_model=list[Event])
def memory_history(ops: Reads, memory_id: MemoryIdPath) -> list[Event]:
    """Every change of a memory, oldest first, with before/after."""
    return ops.history(memory_id)


# --------------------------------------------------------------------------- reads

reads = APIRouter(prefix=NAMESPACE, tags=["reads"])


@reads.post("/search", response_model=SearchResult)
def search(ops: Reads, body: SearchIn) -> SearchResult:
    """Top-k episodes and top-2k tuples for a query (no LLM call)."""
    return ops.search(body.query, body.k, body.kinds, body.since, body.until, body.min_score)


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
def undo(ops: Administers, run_id: RunIdPath) -> UndoReport:
    """Restore exactly the state before a consolidation run of this namespace."""
    return ops.undo(run_id)


@admin.get(NAMESPACE + "/redactions", response_model=list[Redaction])
def list_redactions(ops: Administers, status: RedactionStatus | None = None) -> list[Redaction]:
    """What forget requests in the namespace's conversations removed, oldest first (no removed text)."""
    return ops.redactions(status)


@admin.post(NAMESPACE + "/redactions/{redaction_id}/undo", response_model=Redaction)
def undo_redaction(ops: Administers, redaction_id: RedactionIdPath) -> Redaction:
    """Put back exactly what a pending redaction removed."""
    return ops.undo_redaction(redaction_id)


@admin.post(NAMESPACE + "/redactions/{redaction_id}/confirm", response_model=Redaction)
def confirm_redaction(ops: Administers, redaction_id: RedactionIdPath) -> Redaction:
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
