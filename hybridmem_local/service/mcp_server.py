"""The MCP tools of ``hybridmem``: add_session, add_memory, search, ask, list_memories, delete_memory.

Two ways in, one set of tools (the official ``mcp`` SDK's ``MCPServer``):

* **stdio** — ``hybridmem mcp --namespace NS --db PATH``: a local agent spawns the process and
  every tool acts on the one namespace fixed at start-up (whoever can spawn the process can read
  the store file anyway, so there is no key).
* **streamable HTTP** at ``/mcp`` of ``hybridmem serve`` (:func:`mount_mcp`): the app's Guard
  authenticates ``Authorization: Bearer <key>`` (401 without a valid key, the rate limit and
  body limit of ``/v1`` too) and leaves the key in ``scope["state"]["api_key"]``; every tool call
  then checks that the key reaches the namespace with the tool's role, the same rule as the
  HTTP routes. Stateless: each POST stands alone, so a revoked key fails on its next call.

Tools work through :class:`ServiceState` exactly like the HTTP routes: ``add_session`` stores the
raw turns ``pending`` and the curation worker curates them later; reads take the request-side
memory's lock. A refusal or a library error reaches the agent as a tool error whose text starts
with the HTTP API's stable code (``forbidden: ...``, ``not_found: ...``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Annotated, Literal, Protocol

import anyio
from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import AwareDatetime, Field
from starlette.routing import Route

from hybridmem_local import __version__
from hybridmem_local.answering import Answer
from hybridmem_local.schema import (
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    SearchResult,
    Session,
    StrictModel,
    TupleDraft,
    Turn,
    check_namespace,
)
from hybridmem_local.service.keys import ALL_NAMESPACES, ApiKey, Role
from hybridmem_local.service.models import MAX_K, MAX_QUERY_CHARS, MemoriesAdded, MemoryOut, MemoryPage
from hybridmem_local.service.state import AskTimeoutError, QueueFullError, ServiceState
from hybridmem_local.store import NotFoundError, StoreError

#: Where ``hybridmem serve`` answers MCP.
MCP_PATH = "/mcp"
#: Largest page ``list_memories`` returns: smaller than the HTTP API's, since it lands in an agent's context.
MAX_TOOL_PAGE = 200

INSTRUCTIONS = (
    "Long-term memory of past conversations with this user (or agent). Call `search` before answering "
    "anything that may depend on earlier conversations; call `add_session` with the raw turns at the end of "
    "each conversation so they are remembered; call `add_memory` when the user explicitly asks you to "
    "remember something now. Memories carry the ids of the turns they came from."
)

NamespaceArg = Annotated[
    str | None,
    Field(
        description="Namespace (one user or agent). Leave it out when the connection is scoped to one namespace "
        "(stdio, or an API key for a single namespace)."
    ),
]


# --------------------------------------------------------------------------- tool outputs


class SessionQueued(StrictModel):
    namespace: str
    session_id: str
    #: ``pending`` until the curation worker has turned the turns into memories.
    curation_status: str


class DeletedMemory(StrictModel):
    #: The memory as it is now (status ``deleted``).
    memory: MemoryOut


# --------------------------------------------------------------------------- who may act on which namespace


class ToolScope(Protocol):
    def namespace(self, ctx: Context, requested: str | None, role: Role) -> str:
        """The namespace a tool call acts on, or a ToolError saying why it may not."""


@dataclass(frozen=True)
class FixedNamespace:
    """stdio: the one namespace given at start-up."""

    fixed: str

    def namespace(self, ctx: Context, requested: str | None, role: Role) -> str:
        if requested is not None and requested != self.fixed:
            raise ToolError(
                f"forbidden: this MCP server serves namespace {self.fixed!r} only (fixed with --namespace at "
                "start-up); leave namespace out"
            )
        return self.fixed


class BearerKeyScope:
    """Streamable HTTP: the namespaces and role of the key the app's Guard authenticated."""

    def namespace(self, ctx: Context, requested: str | None, role: Role) -> str:
        key = _request_key(ctx)
        if requested is None:
            if len(key.namespaces) != 1 or key.namespaces[0] == ALL_NAMESPACES:
                raise ToolError(f"validation_error: API key {key.key_id} reaches several namespaces; pass namespace")
            requested = key.namespaces[0]
        try:
            check_namespace(requested)
        except ValueError as exc:
            raise ToolError(f"validation_error: namespace: {exc}") from None
        if not key.covers(requested):
            # Worded the same whether or not the namespace exists: a key learns nothing beyond its own.
            raise ToolError(f"forbidden: API key {key.key_id} does not reach namespace {requested!r}")
        if not key.allows(requested, role):
            raise ToolError(
                f"forbidden: this tool needs the {role.value} role; API key {key.key_id} has {key.role.value}"
            )
        return requested


def _request_key(ctx: Context) -> ApiKey:
    request = ctx.request_context.request
    key = request.scope.get("state", {}).get("api_key") if request is not None else None
    if not isinstance(key, ApiKey):
        # Only reachable if the MCP app were served without the Guard in front of it.
        raise ToolError("unauthorized: no authenticated API key on this request")
    return key


@contextmanager
def _as_tool_errors() -> Iterator[None]:
    """Library errors as tool errors the agent can act on, prefixed with the HTTP API's codes.

    Anything else propagates: the SDK reports it as a generic failure and logs the traceback.
    """
    try:
        yield
    except NotFoundError as exc:
        raise ToolError(f"not_found: {exc.args[0] if exc.args else exc}") from None
    except QueueFullError as exc:
        raise ToolError(f"queue_full: {exc}; retry later") from None
    except AskTimeoutError as exc:
        raise ToolError(f"timeout: {exc}") from None
    except StoreError as exc:  # a duplicate session id, or turn ids another session already uses
        raise ToolError(f"conflict: {exc}") from None
    except ValueError as exc:  # pydantic's ValidationError included
        raise ToolError(f"validation_error: {exc}") from None


# --------------------------------------------------------------------------- the tools


def build_mcp_server(state: ServiceState, scope: ToolScope, *, owns_state: bool = False) -> MCPServer:
    """The MCP server over ``state``; with ``owns_state`` it opens the state on start and closes it on exit
    (stdio: the models then load while the SDK has stdout diverted, so nothing stray reaches the wire)."""

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[None]:
        if owns_state:
            await anyio.to_thread.run_sync(state.open)
        try:
            yield
        finally:
            if owns_state:
                await anyio.to_thread.run_sync(state.close)

    server = MCPServer("hybridmem", instructions=INSTRUCTIONS, version=__version__, lifespan=lifespan)
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False))
    def add_session(
        session_id: Annotated[
            str, Field(min_length=1, max_length=200, description="Unique id of this session in the namespace.")
        ],
        started_at: Annotated[
            AwareDatetime, Field(description="When the conversation started, ISO 8601 with a time zone.")
        ],
        turns: Annotated[
            list[Turn],
            Field(
                min_length=1,
                description=(
                    "The raw turns in order; turn ids must be unique in the namespace "
                    "(prefix them with the session id)."
                ),
            ),
        ],
        ctx: Context,
        namespace: NamespaceArg = None,
    ) -> SessionQueued:
        """Hand over a finished conversation (or a long chunk of one) so it is remembered.

        Call this once at the end of every conversation, or every few dozen turns in a long one, with
        the raw turns. It returns at once with curation_status "pending": a background worker turns the
        turns into episodic memories and facts shortly after, and only then does `search` find them.
        Needs a write key."""
        ns = scope.namespace(ctx, namespace, Role.write)
        with _as_tool_errors():
            session = Session(namespace=ns, session_id=session_id, started_at=started_at, turns=turns)
            [record] = state.enqueue([session])
        return SessionQueued(namespace=ns, session_id=session_id, curation_status=record.curation_status)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False))
    def add_memory(
        ctx: Context,
        episodes: Annotated[
            list[EpisodeDraft], Field(description="Events: title, summary, details, timestamp (ISO date).")
        ] = [],  # noqa: B006 - FastMCP validates calls through a pydantic model, which copies the default
        tuples: Annotated[
            list[TupleDraft], Field(description="Facts: entity, relation, object, timestamp (ISO date), context.")
        ] = [],  # noqa: B006 - as above
        namespace: NamespaceArg = None,
    ) -> MemoriesAdded:
        """Store memories you wrote yourself, right away, without waiting for curation.

        Call it when the user explicitly asks you to remember something, or states a lasting fact (a
        preference, a name, a date) that must be findable in the very next turn. An episode is an event
        {title, summary, details, timestamp}; a tuple is a fact {entity, relation, object, timestamp,
        context}. source_turn_ids, if given, must name stored turns. Needs a write key."""
        ns = scope.namespace(ctx, namespace, Role.write)
        if not episodes and not tuples:
            raise ToolError("validation_error: give at least one of episodes or tuples")
        with _as_tool_errors(), state.memory() as memory:
            ids = memory.add_memories(ns, episodes=episodes, tuples=tuples)
        return MemoriesAdded(namespace=ns, ids=ids)

    @server.tool(annotations=reads)
    def search(
        query: Annotated[
            str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description="What to look up, in natural language.")
        ],
        ctx: Context,
        k: Annotated[
            int | None,
            Field(ge=1, le=MAX_K, description="Episodes to return (facts: 2k); default from the service config."),
        ] = None,
        namespace: NamespaceArg = None,
    ) -> SearchResult:
        """Look up what the user said in earlier conversations.

        Call it before answering anything that may depend on the past (preferences, people, plans,
        dates, "as I told you") and use what comes back as context. Returns the top-k episodes and
        top-2k facts with scores and their source turn ids. No LLM call, so it is fast; prefer it over
        `ask` when you will reason over the memories yourself."""
        ns = scope.namespace(ctx, namespace, Role.read)
        with _as_tool_errors(), state.memory() as memory:
            return memory.search(query, namespace=ns, k=k)

    @server.tool(annotations=reads)
    def ask(
        question: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS)],
        ctx: Context,
        question_date: Annotated[
            AwareDatetime | None, Field(description="When the question is asked, for relative dates ('last week').")
        ] = None,
        k: Annotated[int | None, Field(ge=1, le=MAX_K)] = None,
        namespace: NamespaceArg = None,
    ) -> Answer:
        """Have the memory service answer a question from its memories, with citations.

        Call it when you want a short answer rather than the memories themselves, e.g. a factual
        question about the user's past. It retrieves like `search` and then makes one LLM call on the
        service: slower, and it fails with "timeout" when the service's LLM stays busy. The answer
        cites the memories it used (with their source turn ids); an empty answer with `error` set
        means the model gave no usable reply."""
        ns = scope.namespace(ctx, namespace, Role.read)
        with _as_tool_errors():
            return state.answer(question, ns, question_date, k)

    @server.tool(annotations=reads)
    def list_memories(
        ctx: Context,
        kind: Annotated[MemoryKind | None, Field(description="'episode' or 'tuple'; both when left out.")] = None,
        status: Annotated[
            Literal["active", "superseded", "deleted", "any"], Field(description="Which memories; 'any' for all.")
        ] = "active",
        limit: Annotated[int, Field(ge=1, le=MAX_TOOL_PAGE)] = 50,
        offset: Annotated[int, Field(ge=0, description="Where the page starts: next_offset of the previous page.")] = 0,
        namespace: NamespaceArg = None,
    ) -> MemoryPage:
        """Page through the stored memories in the order they were written.

        Call it to review what is remembered (e.g. the user asks "what do you know about me?") or to
        find the id of a memory to delete. To find memories relevant to a question, use `search`."""
        ns = scope.namespace(ctx, namespace, Role.read)
        wanted = None if status == "any" else MemoryStatus(status)
        with _as_tool_errors(), state.memory() as memory:
            rows = memory.list(ns, kind=kind, status=wanted, limit=limit + 1, offset=offset)
        more = len(rows) > limit
        return MemoryPage(
            namespace=ns, items=rows[:limit], limit=limit, offset=offset, next_offset=offset + limit if more else None
        )

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
        )
    )
    def delete_memory(
        memory_id: Annotated[int, Field(ge=1, description="The memory's id, from search or list_memories.")],
        ctx: Context,
        reason: Annotated[
            str, Field(min_length=1, max_length=500, description="Why, kept in the memory's history.")
        ] = "deleted by an agent over MCP",
        namespace: NamespaceArg = None,
    ) -> DeletedMemory:
        """Delete one memory by id; the change is kept in its history.

        Call it when the user asks you to forget something specific or says a remembered fact is
        wrong (then store the correct one with `add_memory`). Find the id with `search` or
        `list_memories` first. Needs a write key."""
        ns = scope.namespace(ctx, namespace, Role.write)
        with _as_tool_errors(), state.memory() as memory:
            try:
                found = memory.get(memory_id)
            except NotFoundError:
                found = None
            if found is None or found.namespace != ns:
                # Another namespace's memory is reported missing: its existence is not revealed.
                raise NotFoundError(f"no memory with id {memory_id} in namespace {ns!r}")
            memory.delete(memory_id, reason=reason)
            return DeletedMemory(memory=memory.get(memory_id))

    return server


# --------------------------------------------------------------------------- the two transports


def run_stdio(state: ServiceState, namespace: str) -> None:
    """Serve the tools over stdin/stdout for ``namespace`` until the client closes stdin."""
    check_namespace(namespace)
    build_mcp_server(state, FixedNamespace(namespace), owns_state=True).run("stdio")


def mount_mcp(app: FastAPI, state: ServiceState, *, require_auth: bool = True) -> None:
    """Serve the tools over streamable HTTP at ``/mcp`` of ``app``, behind its Guard.

    The MCP session manager must run for as long as the app does, so it joins the app's lifespan.
    DNS-rebinding protection (Host / Origin checks) guards a keyless loopback server from web pages
    in a local browser; with keys it would add nothing and refuse the Host a reverse proxy sends.
    """
    server = build_mcp_server(state, BearerKeyScope())
    if require_auth:
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    else:
        security = TransportSecuritySettings(
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    # Stateless JSON: no server-side MCP sessions to expire or hijack; every POST is checked on its own.
    server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=security,
        max_request_body_size=state.config.service.max_body_bytes,
    )
    sessions = server.session_manager
    app.router.routes.append(Route(MCP_PATH, endpoint=StreamableHTTPASGIApp(sessions)))

    app_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(running: FastAPI) -> AsyncIterator[object]:
        async with sessions.run(), app_lifespan(running) as app_state:
            yield app_state

    # It yields what the app's own lifespan yields (None or a state mapping), which Starlette's
    # Lifespan type only accepts as two separate callables.
    app.router.lifespan_context = lifespan  # type: ignore[assignment]
