"""The MCP tools of ``hybridmem``: what an agent remembers and recalls.

* writes: ``remember`` (plain text), ``add_messages`` (chat messages ``{role, content}``),
  ``add_session`` (turns with ids), ``add_memory`` (memories written by the agent),
  ``delete_memory``; ``session_status`` says when handed-over text is curated;
* reads: ``search``, ``ask``, ``list_memories``;
* admin: ``reset_namespace`` (everything of the namespace, for an admin key); ``list_redactions``,
  ``undo_redaction``, ``confirm_redaction`` (what forget requests in conversations removed).

Two ways in, one set of tools (the official ``mcp`` SDK's ``MCPServer``):

* **stdio** — ``hybridmem mcp --namespace NS --db PATH``: a local agent spawns the process and
  every tool acts on the one namespace fixed at start-up (whoever can spawn the process can read
  the store file anyway, so there is no key).
* **streamable HTTP** at ``/mcp`` of ``hybridmem serve`` (:func:`mount_mcp`): the app's Guard
  authenticates ``Authorization: Bearer <key>`` (401 without a valid key, the rate limit and
  body limit of ``/v1`` too) and leaves the key in ``scope["state"]["api_key"]``; every tool call
  then checks that the key reaches the namespace with the tool's role, the same rule as the
  HTTP routes. Stateless: each POST stands alone, so a revoked key fails on its next call.

Each tool is a few lines over the operations the HTTP routes call (``operations.py``): the same
scope and ownership checks and paging, and arguments of the same types and limits as the routes'
(``schemas.py``; tests/test_api_parity.py lists where a tool differs on purpose). ``add_session``
stores the raw turns ``pending`` and the curation worker curates them later. A failed call is
a tool error (``isError``) whose text is ``code: message`` with the HTTP API's stable codes
(:class:`CodedMCPServer`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, cast

import anyio
from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, InputRequiredResult, ToolAnnotations
from pydantic import AwareDatetime, Field, ValidationError
from starlette.routing import Route

from hybridmem_local import __version__
from hybridmem_local.errors import HybridMemError, InvalidInputError, NotFoundError, UnauthorizedError, error_text
from hybridmem_local.results import Answer, Redaction, RedactionStatus, SearchResult, SessionRecord
from hybridmem_local.schema import MAX_TURN_CHARS, MemoryKind, StrictModel, check_namespace
from hybridmem_local.service.errors import internal_error
from hybridmem_local.service.keys import ApiKey
from hybridmem_local.service.operations import (
    Admin,
    FixedNamespace,
    Handle,
    KeyScope,
    Operations,
    Reader,
    Scope,
    Writer,
)
from hybridmem_local.service.schemas import (
    MAX_TOOL_PAGE,
    Episodes,
    ForgetReport,
    Kinds,
    MemoriesAdded,
    MemoryOut,
    MemoryPage,
    Messages,
    MessagesSessionId,
    MinScore,
    NamespaceName,
    PageOffset,
    QueryText,
    QuestionDate,
    Reason,
    RowId,
    SessionId,
    SessionIn,
    SessionStatus,
    Since,
    StatusFilter,
    TopK,
    Tuples,
    Turns,
    Until,
    describe_validation_errors,
)
from hybridmem_local.service.state import ServiceState
from hybridmem_local.storage import audit

#: Where ``hybridmem serve`` answers MCP.
MCP_PATH = "/mcp"

INSTRUCTIONS = (
    "Long-term memory of past conversations with this user (or agent). Call `search` before answering "
    "anything that may depend on earlier conversations. At the end of each conversation hand it over with "
    "`add_messages` (the chat messages as they are) so it is remembered; `remember` takes a note in plain "
    "text. Both are turned into memories by a background worker shortly after (`session_status` tells when). "
    "Call `add_memory` when the user explicitly asks you to remember something that must be findable at once. "
    "Memories carry the ids of the turns they came from."
)

NamespaceArg = Annotated[
    NamespaceName | None,
    Field(
        description="Namespace (one user or agent). Leave it out when the connection is scoped to one namespace "
        "(stdio, or an API key for a single namespace)."
    ),
]
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
DELETES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)


# --------------------------------------------------------------------------- tool outputs


class SessionQueued(StrictModel):
    namespace: str
    session_id: str
    #: ``pending`` until the curation worker has turned the turns into memories.
    curation_status: str


class DeletedMemory(StrictModel):
    #: The memory as it is now (status ``deleted``).
    memory: MemoryOut


class RedactionList(StrictModel):
    namespace: str
    redactions: list[Redaction]


# --------------------------------------------------------------------------- errors by code


class CodedMCPServer(MCPServer):
    """An MCPServer whose failed tool calls say what went wrong by the library's stable code.

    The SDK wraps whatever a tool raises; here the error under the wrapper decides the text of
    the ``isError`` result: a library error becomes ``code: message`` (``not_found: no memory with
    id 7 ...``), arguments that fail the tool's schema ``validation_error: ...`` naming each field,
    and anything else ``internal: ...`` without its text (logged here with its traceback).
    """

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context | None = None
    ) -> CallToolResult | InputRequiredResult:
        entry = audit.SCOPE.get()
        if entry is not None:  # the request's audit entry (app.Guard) names the tool, not just /mcp
            entry.action = f"MCP {name}"
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            raise ToolError(error_text(_coded(exc, name))) from exc.__cause__


def _coded(exc: ToolError, tool: str) -> HybridMemError:
    """The library error a failed tool call stands for."""
    cause = exc.__cause__
    if isinstance(cause, HybridMemError) and cause.code != "internal":
        return cause
    if isinstance(cause, ValidationError):  # the arguments do not fit the tool's input schema
        return InvalidInputError(describe_validation_errors(cause.errors()))
    if cause is None:  # the SDK's own refusal, e.g. an unknown tool name
        return NotFoundError(str(exc))
    return internal_error(cause, f"MCP tool {tool}")


# --------------------------------------------------------------------------- who is calling


@dataclass(frozen=True)
class ToolContext:
    """What every tool call finds in the server's lifespan context."""

    operations: Operations
    #: The caller's scope: the fixed namespace (stdio) or the request's key (HTTP).
    scope_of: Callable[[Context], Scope]


def _on(ctx: Context, handle: type[Handle], namespace: str | None) -> Handle:
    # What build_mcp_server's lifespan yields (the SDK types it as its default, a dict).
    tools = cast(ToolContext, ctx.request_context.lifespan_context)
    return tools.operations.on(handle, tools.scope_of(ctx), namespace)


def _request_key(ctx: Context) -> KeyScope:
    request = ctx.request_context.request
    key = request.scope.get("state", {}).get("api_key") if request is not None else None
    if not isinstance(key, ApiKey):
        # Only reachable if the MCP app were served without the Guard in front of it.
        raise UnauthorizedError("no authenticated API key on this request")
    return KeyScope(key)


# --------------------------------------------------------------------------- the tools


def add_session(
    session_id: Annotated[SessionId, Field(description="Unique id of this session in the namespace.")],
    started_at: Annotated[
        AwareDatetime, Field(description="When the conversation started, ISO 8601 with a time zone.")
    ],
    turns: Turns,
    ctx: Context,
    namespace: NamespaceArg = None,
) -> SessionQueued:
    """Hand over a finished conversation (or a long chunk of one) so it is remembered.

    Call this once at the end of every conversation, or every few dozen turns in a long one, with
    the raw turns. It returns at once with curation_status "pending": a background worker turns the
    turns into episodic memories and facts shortly after, and only then does `search` find them.
    Needs a write key."""
    writer = _on(ctx, Writer, namespace)
    [record] = writer.add_sessions([SessionIn(session_id=session_id, started_at=started_at, turns=turns)])
    return _queued(writer.namespace, record)


def remember(
    text: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_TURN_CHARS,
            description="What to remember, in plain words: a note, a fact the user stated, an account of an exchange.",
        ),
    ],
    ctx: Context,
    namespace: NamespaceArg = None,
) -> SessionQueued:
    """Remember plain text: a note, something the user told you, or an account of a conversation.

    Call it when the user tells you something worth keeping ("my sister is called Ana", "we moved
    to Lyon in May") and you have no chat messages to hand over. The text is stored at once as a
    message from the user, dated now; a background worker turns it into memories shortly after
    (`session_status` with the returned session_id tells when), and then `search` finds them.
    Needs a write key."""
    writer = _on(ctx, Writer, namespace)
    return _queued(writer.namespace, writer.remember(text))


def add_messages(
    messages: Messages,
    ctx: Context,
    session_id: MessagesSessionId = None,
    namespace: NamespaceArg = None,
) -> SessionQueued:
    """Hand over a conversation as chat messages so it is remembered.

    Call it at the end of every conversation (or every few dozen messages in a long one) with the
    messages as you have them. They are stored at once as one session dated now; a background
    worker turns them into episodic memories and facts shortly after (`session_status` tells when),
    and only then does `search` find them. Needs a write key."""
    writer = _on(ctx, Writer, namespace)
    return _queued(writer.namespace, writer.add_messages(messages, session_id))


def session_status(
    session_id: Annotated[SessionId, Field(description="The id a write tool returned.")],
    ctx: Context,
    namespace: NamespaceArg = None,
) -> SessionStatus:
    """Check whether a conversation you handed over has been turned into memories yet.

    Call it after `remember`, `add_messages` or `add_session` when you need the new memories (e.g.
    before searching for what was just said). curation_status is "pending" while the background
    worker has not got to it, "curated" once its memories are searchable, and "curation_failed"
    (with curation_error) when the LLM could not curate it: the raw text is kept and an operator
    can retry."""
    return _on(ctx, Reader, namespace).session_status(session_id)


def add_memory(
    ctx: Context,
    episodes: Episodes = [],  # noqa: B006 - the SDK validates calls through a pydantic model, which copies the default
    tuples: Tuples = [],  # noqa: B006 - as above
    namespace: NamespaceArg = None,
) -> MemoriesAdded:
    """Store memories you wrote yourself, right away, without waiting for curation.

    Call it when the user explicitly asks you to remember something, or states a lasting fact (a
    preference, a name, a date) that must be findable in the very next turn. An episode is an event
    {title, summary, details, timestamp}; a tuple is a fact {entity, relation, object, timestamp,
    context}. source_turn_ids, if given, must name stored turns. Needs a write key."""
    return _on(ctx, Writer, namespace).add_memories(episodes, tuples)


def search(
    query: Annotated[QueryText, Field(description="What to look up, in natural language.")],
    ctx: Context,
    k: TopK = None,
    kinds: Kinds = None,
    since: Since = None,
    until: Until = None,
    min_score: MinScore = None,
    namespace: NamespaceArg = None,
) -> SearchResult:
    """Look up what the user said in earlier conversations.

    Call it before answering anything that may depend on the past (preferences, people, plans,
    dates, "as I told you") and use what comes back as context. Returns the top-k episodes and
    top-2k facts with scores and their source turn ids; kinds, since/until (e.g. "what did we plan
    last May") and min_score narrow it down. No LLM call, so it is fast; prefer it over `ask` when
    you will reason over the memories yourself."""
    return _on(ctx, Reader, namespace).search(query, k, kinds, since, until, min_score)


def ask(
    question: QueryText,
    ctx: Context,
    question_date: QuestionDate = None,
    k: TopK = None,
    namespace: NamespaceArg = None,
) -> Answer:
    """Have the memory service answer a question from its memories, with citations.

    Call it when you want a short answer rather than the memories themselves, e.g. a factual
    question about the user's past. It retrieves like `search` and then makes one LLM call on the
    service: slower, and it fails with "timeout" when the service's LLM stays busy. The answer
    cites the memories it used (with their source turn ids); an empty answer with `error` set
    means the model gave no usable reply."""
    return _on(ctx, Reader, namespace).ask(question, question_date, k)


def list_memories(
    ctx: Context,
    kind: Annotated[MemoryKind | None, Field(description="'episode' or 'tuple'; both when left out.")] = None,
    status: Annotated[StatusFilter, Field(description="Which memories; 'any' for all.")] = "active",
    limit: Annotated[int, Field(ge=1, le=MAX_TOOL_PAGE)] = 50,
    offset: PageOffset = 0,
    namespace: NamespaceArg = None,
) -> MemoryPage:
    """Page through the stored memories in the order they were written.

    Call it to review what is remembered (e.g. the user asks "what do you know about me?") or to
    find the id of a memory to delete. To find memories relevant to a question, use `search`."""
    return _on(ctx, Reader, namespace).list_memories(kind, status, limit, offset)


def delete_memory(
    memory_id: Annotated[RowId, Field(description="The memory's id, from search or list_memories.")],
    ctx: Context,
    reason: Reason = "deleted by an agent over MCP",
    namespace: NamespaceArg = None,
) -> DeletedMemory:
    """Delete one memory by id; the change is kept in its history.

    Call it when the user asks you to forget something specific or says a remembered fact is
    wrong (then store the correct one with `add_memory`). Find the id with `search` or
    `list_memories` first. Needs a write key."""
    return DeletedMemory(memory=_on(ctx, Writer, namespace).delete_memory(memory_id, reason))


def reset_namespace(ctx: Context, namespace: NamespaceArg = None) -> ForgetReport:
    """Erase everything remembered in the namespace: memories, conversations, history, indexes.

    Call it only when the user explicitly asks you to forget everything about them (or to start
    over); it cannot be undone. To forget one thing, use `delete_memory`. Needs an admin key for the
    namespace."""
    return _on(ctx, Admin, namespace).forget()


RedactionIdArg = Annotated[RowId, Field(description="The redaction's id, from list_redactions.")]


def list_redactions(
    ctx: Context,
    status: Annotated[
        RedactionStatus | None, Field(description="'pending', 'confirmed' or 'undone'; all when left out.")
    ] = None,
    namespace: NamespaceArg = None,
) -> RedactionList:
    """List what was removed because the user asked, in a conversation, to forget something.

    Call it to review these redactions (which turns and memories changed; never the removed text)
    before undoing or confirming one. A pending one can still be undone. Needs an admin key."""
    handle = _on(ctx, Admin, namespace)
    return RedactionList(namespace=handle.namespace, redactions=handle.redactions(status))


def undo_redaction(redaction_id: RedactionIdArg, ctx: Context, namespace: NamespaceArg = None) -> Redaction:
    """Put back exactly what a pending redaction removed (the turns' text and the memories).

    Call it only when a forget request was misread and the user wants the content kept. Needs an
    admin key for the namespace."""
    return _on(ctx, Admin, namespace).undo_redaction(redaction_id)


def confirm_redaction(redaction_id: RedactionIdArg, ctx: Context, namespace: NamespaceArg = None) -> Redaction:
    """Make a pending redaction final: the removed text kept for undo is deleted for good.

    Call it when the user confirms the content must be gone now (otherwise it is confirmed after
    the review period). It cannot be undone. Needs an admin key for the namespace."""
    return _on(ctx, Admin, namespace).confirm_redaction(redaction_id)


def _queued(namespace: str, record: SessionRecord) -> SessionQueued:
    return SessionQueued(
        namespace=namespace, session_id=record.session.session_id, curation_status=record.curation_status
    )


#: Every tool, with what it does to the store.
TOOLS: list[tuple[Callable[..., Any], ToolAnnotations]] = [
    (remember, WRITES),
    (add_messages, WRITES),
    (session_status, READS),
    (add_session, WRITES),
    (add_memory, WRITES),
    (search, READS),
    (ask, READS),
    (list_memories, READS),
    (delete_memory, DELETES),
    (reset_namespace, DELETES),
    (list_redactions, READS),
    (undo_redaction, WRITES),
    (confirm_redaction, DELETES),
]


def build_mcp_server(
    operations: Operations, scope_of: Callable[[Context], Scope], *, owns_state: bool = False
) -> MCPServer:
    """The MCP server over ``operations``; with ``owns_state`` it opens the state on start and closes
    it on exit (stdio: the models then load while the SDK has stdout diverted, so nothing stray
    reaches the wire)."""
    state = operations.state

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[ToolContext]:
        if owns_state:
            await anyio.to_thread.run_sync(state.open)
        try:
            yield ToolContext(operations, scope_of)
        finally:
            if owns_state:
                await anyio.to_thread.run_sync(state.close)

    server = CodedMCPServer("hybridmem", instructions=INSTRUCTIONS, version=__version__, lifespan=lifespan)
    for tool, hints in TOOLS:
        server.add_tool(tool, annotations=hints)
    return server


# --------------------------------------------------------------------------- the two transports


def run_stdio(state: ServiceState, namespace: str) -> None:
    """Serve the tools over stdin/stdout for ``namespace`` until the client closes stdin."""
    scope = FixedNamespace(check_namespace(namespace))  # a bad name is refused before anything starts
    build_mcp_server(Operations(state), lambda ctx: scope, owns_state=True).run("stdio")


def mount_mcp(app: FastAPI, operations: Operations, *, require_auth: bool = True) -> None:
    """Serve the tools over streamable HTTP at ``/mcp`` of ``app``, behind its Guard.

    The MCP session manager must run for as long as the app does, so it joins the app's lifespan.
    DNS-rebinding protection (Host / Origin checks) guards a keyless loopback server from web pages
    in a local browser; with keys it would add nothing and refuse the Host a reverse proxy sends.
    """
    server = build_mcp_server(operations, _request_key)
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
        max_request_body_size=operations.state.config.service.max_body_bytes,
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
