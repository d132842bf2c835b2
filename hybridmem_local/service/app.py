"""The HTTP API of ``hybridmem serve``: a thin FastAPI layer over :class:`ServiceState`.

    app = create_app(state)            # state = ServiceState(db, config); state.open()
    uvicorn.run(app, host="127.0.0.1", port=8420)

Every ``/v1`` request passes :class:`Guard` first, in this order: body size by Content-Length
(413), the bearer key (401), the key's rate limit (429), the body read with the same size limit
(413) and checked to be UTF-8 (400). Routes then check the namespace name (422) and that the
key reaches it with the route's role (403), parse the body into the library's models (422
naming the field) and call ``HybridMemory`` under the state's lock. Curation never runs here:
adding a session stores its raw turns and answers 202; the worker curates it later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import AwareDatetime, Field, model_validator

from hybridmem_local import __version__
from hybridmem_local.answering import Answer
from hybridmem_local.consolidation import ConsolidationReport, UndoReport
from hybridmem_local.errors import (
    BadRequestError,
    ForbiddenError,
    InvalidInputError,
    NotFoundError,
    NotReadyError,
    PayloadTooLargeError,
    RateLimitedError,
    UnauthorizedError,
)
from hybridmem_local.memory import Stats
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    RelationalTuple,
    SearchResult,
    Session,
    StrictModel,
    TupleDraft,
    Turn,
    check_namespace,
)
from hybridmem_local.service.errors import (
    ERROR_RESPONSES,
    ErrorResponse,
    error_response,
    install_error_handlers,
    invalid_input,
)
from hybridmem_local.service.keys import ALL_NAMESPACES, ApiKey, KeyRequest, Role
from hybridmem_local.service.limits import RateLimiter, read_body
from hybridmem_local.service.models import (
    MAX_BATCH,
    MAX_K,
    MAX_PAGE,
    MAX_QUERY_CHARS,
    MemoriesAdded,
    MemoryOut,
    MemoryPage,
)
from hybridmem_local.service.state import ServiceState
from hybridmem_local.service.worker import WorkerStatus
from hybridmem_local.store import Event, SessionRecord

log = logging.getLogger(__name__)
access_log = logging.getLogger("hybridmem_local.service.access")

#: The key every request acts with under ``--no-auth`` (loopback only): an admin of everything.
NO_AUTH_KEY = ApiKey(key_id="no-auth", role=Role.admin, namespaces=[ALL_NAMESPACES], created_at=datetime(2000, 1, 1))


# --------------------------------------------------------------------------- request / response models


class SessionIn(StrictModel):
    """A session to add; its namespace is the one in the path."""

    session_id: str = Field(min_length=1, max_length=200)
    started_at: AwareDatetime
    turns: list[Turn] = Field(min_length=1)

    def to_session(self, namespace: str) -> Session:
        with invalid_input("body"):
            return Session(
                namespace=namespace, session_id=self.session_id, started_at=self.started_at, turns=self.turns
            )


class SessionBatchIn(StrictModel):
    sessions: list[SessionIn] = Field(min_length=1, max_length=MAX_BATCH)


class SessionAccepted(StrictModel):
    namespace: str
    session_id: str
    curation_status: str
    #: Where to poll for the curation outcome.
    status_url: str


class MemoriesIn(StrictModel):
    episodes: list[EpisodeDraft] = Field(default_factory=list)
    tuples: list[TupleDraft] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> MemoriesIn:
        if not self.episodes and not self.tuples:
            raise ValueError("give at least one of episodes or tuples")
        return self


class SearchIn(StrictModel):
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
    status: Literal["active", "superseded", "deleted", "any"] = "active"
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)
    offset: int = Field(default=0, ge=0)


class ConsolidateIn(StrictModel):
    dry_run: bool = False


class ForgetReport(StrictModel):
    namespace: str
    #: Rows, files and cache entries removed, by kind.
    removed: dict[str, int]


class KeyCreated(StrictModel):
    key: ApiKey
    #: The full key for ``Authorization: Bearer``; shown this once, never stored.
    token: str


class Health(StrictModel):
    status: Literal["ok"] = "ok"
    version: str


class Readiness(StrictModel):
    ready: bool
    worker: WorkerStatus


# --------------------------------------------------------------------------- the guard (ASGI middleware)


class Guard:
    """Size limit, authentication and rate limit for ``/v1`` and ``/mcp``; an access log line for all.

    A pure ASGI middleware rather than a FastAPI dependency, so that a request without a valid
    key is refused before its body is read or parsed, and the MCP app mounted at ``/mcp`` gets
    the same checks (it finds the key in ``scope["state"]["api_key"]``).
    """

    PROTECTED = ("/v1", "/mcp")

    def __init__(self, app: Callable, state: ServiceState, require_auth: bool, keys_lock: threading.Lock):
        self.app = app
        self.state = state
        self.keys_lock = keys_lock
        self.require_auth = require_auth
        service = state.config.service
        self.max_body = service.max_body_bytes
        self.log_content = service.log_content
        self.limiter = RateLimiter(service.rate_limit_per_s, service.rate_limit_burst)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = []

        async def send_logged(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            if scope["path"].startswith(self.PROTECTED):
                await self._guarded(scope, receive, send_logged)
            else:
                await self.app(scope, receive, send_logged)
        finally:
            key = scope.get("state", {}).get("api_key")
            route = scope.get("route")
            access_log.info(
                "%s %s %s key=%s %.1fms%s",
                scope["method"],
                getattr(route, "path", None) or _unrouted(scope["path"]),
                status[0] if status else "-",
                key.key_id if key is not None else "-",
                (time.perf_counter() - started) * 1000,
                f" query={scope.get('query_string', b'').decode('latin-1')!r}" if self.log_content else "",
            )

    async def _guarded(self, scope: dict, receive: Callable, send: Callable) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            # Refused unread: a client must not make the server take in what it will not accept.
            await error_response(
                PayloadTooLargeError(
                    f"request body of {int(declared)} bytes is over the limit of {self.max_body} bytes "
                    "(service.max_body_bytes)"
                )
            )(scope, receive, send)
            return
        key = await self._authenticate(headers.get("authorization"))
        if isinstance(key, str):
            await error_response(UnauthorizedError(key))(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = key
        wait = self.limiter.take(key.key_id)
        if wait is not None:
            await error_response(
                RateLimitedError(
                    f"API key {key.key_id} is over its rate limit of {self.limiter.rate:g} requests/s "
                    f"(burst {self.limiter.burst}); retry in {wait:.2f}s",
                    retry_after=wait,
                )
            )(scope, receive, send)
            return
        try:
            body = await read_body(receive, self.max_body)
        except PayloadTooLargeError as exc:
            await error_response(exc)(scope, receive, send)
            return
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            await error_response(BadRequestError(f"request body is not valid UTF-8 (byte {exc.start}: {exc.reason})"))(
                scope, receive, send
            )
            return
        await self.app(scope, _replay(body, receive), send)

    async def _authenticate(self, header: str | None) -> ApiKey | str:
        """The request's key, or a message saying why there is none."""
        if not self.require_auth:
            return NO_AUTH_KEY
        if header is None:
            return "missing Authorization header; send 'Authorization: Bearer <key>'"
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return "Authorization header must be 'Bearer <key>'"
        # The key lookup reads SQLite: off the event loop, so a slow disk stalls no other request.
        key = await anyio.to_thread.run_sync(self._lookup, token)
        return key if key is not None else "invalid or revoked API key"

    def _lookup(self, token: str) -> ApiKey | None:
        with self.keys_lock:
            return self.state.keys.authenticate(token)


def _unrouted(path: str) -> str:
    """The path logged for a request no route matched: only its first segment (it may hold text)."""
    return "/" + path.lstrip("/").split("/", 1)[0] + ("/…" if path.count("/") > 1 else "")


def _replay(body: bytes, receive: Callable) -> Callable:
    """A ``receive`` that hands the app the body already read, then defers to the client's."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# --------------------------------------------------------------------------- access checks


def _key(request: Request) -> ApiKey:
    return request.scope["state"]["api_key"]


def _namespace_access(role: Role) -> Callable[..., str]:
    """A dependency: the path's namespace, checked for its name and for the key's reach and role."""

    def check(
        request: Request,
        namespace: Annotated[
            str, Path(description="1-64 characters of A-Z a-z 0-9 _ . -, starting with a letter or digit")
        ],
    ) -> str:
        try:
            check_namespace(namespace)
        except InvalidInputError as exc:
            raise InvalidInputError(f"path.namespace: {exc}") from None
        key = _key(request)
        if not key.covers(namespace):
            # The same answer whether or not the namespace exists: a key learns nothing beyond its own.
            raise ForbiddenError(f"API key {key.key_id} does not reach namespace {namespace!r}")
        if not key.allows(namespace, role):
            raise ForbiddenError(f"this route needs the {role.value} role; API key {key.key_id} has {key.role.value}")
        return namespace

    return check


ReadNamespace = Annotated[str, Depends(_namespace_access(Role.read))]
WriteNamespace = Annotated[str, Depends(_namespace_access(Role.write))]
AdminNamespace = Annotated[str, Depends(_namespace_access(Role.admin))]
MemoryId = Annotated[int, Path(ge=1, le=2**63 - 1, description="a memory id")]


def _admin_key(request: Request) -> ApiKey:
    key = _key(request)
    if key.role != Role.admin:
        raise ForbiddenError(f"this route needs the admin role; API key {key.key_id} has {key.role.value}")
    return key


AdminKey = Annotated[ApiKey, Depends(_admin_key)]


def _manages(admin: ApiKey, key: ApiKey) -> bool:
    """An admin sees and revokes only keys whose every namespace it reaches itself."""
    return all(admin.covers(ns) for ns in key.namespaces)  # covers("*") only for an all-namespace key


# --------------------------------------------------------------------------- the app


def create_app(state: ServiceState, *, require_auth: bool = True) -> FastAPI:
    """The FastAPI app over an opened ``state``; ``require_auth=False`` is ``--no-auth`` (loopback only)."""
    app = FastAPI(
        title="hybridmem-local",
        version=__version__,
        description="Offline long-term memory for dialogue agents: sessions in, curated memories, "
        "search and answers out. Every /v1 route needs `Authorization: Bearer <key>` (see `hybridmem keys create`).",
        responses=ERROR_RESPONSES,
        # The interactive docs pages load their scripts from a CDN; an offline service serves the schema only.
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    memory = state.memory
    # The key store is one SQLite connection shared by the Guard and the key routes: one user at a time.
    keys_lock = threading.Lock()

    @app.get("/healthz", response_model=Health, tags=["health"])
    def healthz() -> Health:
        """The process is up (no auth)."""
        return Health(version=__version__)

    @app.get("/readyz", response_model=Readiness, tags=["health"], responses={503: {"model": ErrorResponse}})
    def readyz() -> Readiness:
        """Store open, embedder loaded, curation worker alive (no auth); 503 not_ready otherwise."""
        if not state.ready:
            raise NotReadyError("the service is not ready: store, embedder or curation worker not up")
        return Readiness(ready=True, worker=state.worker.status())

    # ------------------------------------------------------------------ sessions

    def _enqueue(namespace: str, sessions: list[SessionIn], request: Request) -> list[SessionAccepted]:
        built = [s.to_session(namespace) for s in sessions]
        records = state.enqueue(built)
        return [
            SessionAccepted(
                namespace=namespace,
                session_id=r.session.session_id,
                curation_status=r.curation_status,
                status_url=str(
                    request.url_for("get_session", namespace=namespace, session_id=r.session.session_id).path
                ),
            )
            for r in records
        ]

    @app.post("/v1/namespaces/{namespace}/sessions", status_code=202, response_model=SessionAccepted, tags=["sessions"])
    def add_session(namespace: WriteNamespace, body: SessionIn, request: Request) -> SessionAccepted:
        """Store a session's raw turns (one transaction) and queue it for curation; poll ``status_url``."""
        return _enqueue(namespace, [body], request)[0]

    @app.post(
        "/v1/namespaces/{namespace}/sessions/batch",
        status_code=202,
        response_model=list[SessionAccepted],
        tags=["sessions"],
    )
    def add_sessions(namespace: WriteNamespace, body: SessionBatchIn, request: Request) -> list[SessionAccepted]:
        """Store several sessions, all or none, and queue them for curation."""
        return _enqueue(namespace, body.sessions, request)

    @app.get("/v1/namespaces/{namespace}/sessions/{session_id}", response_model=SessionRecord, tags=["sessions"])
    def get_session(
        namespace: ReadNamespace, session_id: Annotated[str, Path(min_length=1, max_length=200)]
    ) -> SessionRecord:
        """A stored session with its turns and curation status (pending, curated, curation_failed)."""
        with memory() as m:
            return m.store.get_session(namespace, session_id)

    # ------------------------------------------------------------------ memories

    @app.post("/v1/namespaces/{namespace}/memories", status_code=201, response_model=MemoriesAdded, tags=["memories"])
    def add_memories(namespace: WriteNamespace, body: MemoriesIn) -> MemoriesAdded:
        """Store memories written by the caller (no curation); ``source_turn_ids`` must name stored turns."""
        with memory() as m:
            try:
                ids = m.add_memories(namespace, episodes=body.episodes, tuples=body.tuples)
            except InvalidInputError as exc:
                raise InvalidInputError(f"body: {exc}") from None
        return MemoriesAdded(namespace=namespace, ids=ids)

    @app.get("/v1/namespaces/{namespace}/memories", response_model=MemoryPage, tags=["memories"])
    def list_memories(namespace: ReadNamespace, query: Annotated[ListQuery, Query()]) -> MemoryPage:
        """Memories in id order, a page at a time (``status=any`` for every status)."""
        status = None if query.status == "any" else MemoryStatus(query.status)
        with memory() as m:
            rows = m.list(namespace, kind=query.kind, status=status, limit=query.limit + 1, offset=query.offset)
        more = len(rows) > query.limit
        return MemoryPage(
            namespace=namespace,
            items=rows[: query.limit],
            limit=query.limit,
            offset=query.offset,
            next_offset=query.offset + query.limit if more else None,
        )

    def _own_memory(m: Any, namespace: str, memory_id: int) -> Episode | RelationalTuple:
        """The memory, or 404 if it is missing or another namespace's (its existence is not revealed)."""
        try:
            found = m.get(memory_id)
        except NotFoundError:
            found = None
        if found is None or found.namespace != namespace:
            raise NotFoundError(f"no memory with id {memory_id} in namespace {namespace!r}")
        return found

    @app.get("/v1/namespaces/{namespace}/memories/{memory_id}", response_model=MemoryOut, tags=["memories"])
    def get_memory(namespace: ReadNamespace, memory_id: MemoryId) -> Episode | RelationalTuple:
        with memory() as m:
            return _own_memory(m, namespace, memory_id)

    @app.delete("/v1/namespaces/{namespace}/memories/{memory_id}", response_model=MemoryOut, tags=["memories"])
    def delete_memory(namespace: WriteNamespace, memory_id: MemoryId) -> Episode | RelationalTuple:
        """Mark a memory deleted (kept in its history; forgetting the namespace removes it for good)."""
        with memory() as m:
            _own_memory(m, namespace, memory_id)
            m.delete(memory_id, reason="deleted through the HTTP API")
            return m.get(memory_id)

    @app.get("/v1/namespaces/{namespace}/memories/{memory_id}/history", response_model=list[Event], tags=["memories"])
    def memory_history(namespace: ReadNamespace, memory_id: MemoryId) -> list[Event]:
        """Every change of a memory, oldest first, with before/after."""
        with memory() as m:
            _own_memory(m, namespace, memory_id)
            return m.history(memory_id)

    # ------------------------------------------------------------------ reads

    @app.post("/v1/namespaces/{namespace}/search", response_model=SearchResult, tags=["reads"])
    def search(namespace: ReadNamespace, body: SearchIn) -> SearchResult:
        """Top-k episodes and top-2k tuples for a query (no LLM call)."""
        with memory() as m:
            return m.search(body.query, namespace=namespace, k=body.k)

    @app.post(
        "/v1/namespaces/{namespace}/ask",
        response_model=Answer,
        tags=["reads"],
        responses={504: {"model": ErrorResponse}},
    )
    def ask(namespace: ReadNamespace, body: AskIn) -> Answer:
        """Answer a question from the namespace's memories with one LLM call; 504 after ``service.ask_timeout_s``."""
        return state.answer(body.question, namespace, body.question_date, body.k)

    @app.get(
        "/v1/namespaces/{namespace}/export",
        tags=["reads"],
        response_class=StreamingResponse,
        responses={200: {"content": {"application/x-ndjson": {}}, "description": "JSONL: sessions, then memories"}},
    )
    def export(namespace: ReadNamespace) -> StreamingResponse:
        """The namespace as JSONL (``hybridmem import`` reads it): sessions with turns, then memories."""
        with memory() as m:
            records = m.export_records(namespace)
        return StreamingResponse(iter(records), media_type="application/x-ndjson")

    @app.get("/v1/namespaces/{namespace}/stats", response_model=Stats, tags=["reads"])
    def stats(namespace: ReadNamespace) -> Stats:
        """Counts of sessions, turns and memories by status in this namespace."""
        with memory() as m:
            full = m.stats(namespace)
        # Stats lists every namespace of the store; a key sees only the one it asked about.
        return Stats(
            namespaces=[ns for ns in full.namespaces if ns == namespace],
            counts=full.counts,
            index_sizes={name: n for name, n in full.index_sizes.items() if name.split("/", 1)[0] == namespace},
        )

    # ------------------------------------------------------------------ admin

    @app.delete("/v1/namespaces/{namespace}", response_model=ForgetReport, tags=["admin"])
    def forget(namespace: AdminNamespace) -> ForgetReport:
        """Remove every trace of the namespace: rows, history, vectors, index files, exports, LLM cache."""
        with memory() as m:
            return ForgetReport(namespace=namespace, removed=m.forget(namespace))

    @app.post("/v1/namespaces/{namespace}/consolidate", response_model=ConsolidationReport, tags=["admin"])
    def consolidate(namespace: AdminNamespace, body: ConsolidateIn) -> ConsolidationReport:
        """Cluster the namespace's memories and merge/retire them with the LLM, as one undoable run."""
        with memory() as m:
            return m.consolidate(namespace, dry_run=body.dry_run)

    @app.post("/v1/namespaces/{namespace}/consolidation-runs/{run_id}/undo", response_model=UndoReport, tags=["admin"])
    def undo(namespace: AdminNamespace, run_id: Annotated[int, Path(ge=1, le=2**63 - 1)]) -> UndoReport:
        """Restore exactly the state before a consolidation run of this namespace."""
        with memory() as m:
            try:
                run_namespace = m.store.consolidation_run(run_id)["namespace"]
            except NotFoundError:
                run_namespace = None
            if run_namespace != namespace:
                raise NotFoundError(f"no consolidation run {run_id} in namespace {namespace!r}")
            return m.undo(run_id)

    @app.get("/v1/keys", response_model=list[ApiKey], tags=["keys"])
    def list_keys(admin: AdminKey) -> list[ApiKey]:
        """The keys this admin key manages: those reaching only namespaces it reaches too."""
        with keys_lock:
            return [k for k in state.keys.list() if _manages(admin, k)]

    @app.post("/v1/keys", status_code=201, response_model=KeyCreated, tags=["keys"])
    def create_key(admin: AdminKey, body: KeyRequest) -> KeyCreated:
        """A new key for namespaces this admin key reaches; its token is in this answer only."""
        outside = [ns for ns in body.namespaces if not admin.covers(ns)]
        if outside:
            raise ForbiddenError(
                f"API key {admin.key_id} cannot create keys for namespaces it does not reach: {outside}"
            )
        with keys_lock:
            key, token = state.keys.create(body.namespaces, body.role, body.label)
        return KeyCreated(key=key, token=token)

    @app.delete("/v1/keys/{key_id}", response_model=ApiKey, tags=["keys"])
    def revoke_key(admin: AdminKey, key_id: Annotated[str, Path(pattern=r"^[0-9a-f]{8}$")]) -> ApiKey:
        """Revoke a key at once (its next request answers 401); revoking twice is harmless."""
        with keys_lock:
            try:
                key = state.keys.get(key_id)
            except NotFoundError:
                key = None
            if key is None or not _manages(admin, key):
                raise NotFoundError(f"no API key {key_id} among the keys this admin key manages")
            return state.keys.revoke(key_id)

    from hybridmem_local.service.mcp_server import mount_mcp

    mount_mcp(app, state, require_auth=require_auth)
    app.add_middleware(Guard, state=state, require_auth=require_auth, keys_lock=keys_lock)
    return app
