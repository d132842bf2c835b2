"""The service's schemas, declared once: the limits, the argument types and the bodies that the
HTTP routes, the MCP tools and the client share, and how a refusal of a request is described
(pydantic only: cheap to import, and the client needs neither FastAPI nor the MCP SDK).

An argument type carries its limits (``QueryText`` is 1 to MAX_QUERY_CHARS characters): a
route, a tool and a request body each use the type, so a limit changes here for all of them
(tests/test_api_parity.py holds each MCP tool's arguments to its HTTP route's).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field, ValidationError

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.schema import (
    MAX_MESSAGES_SESSION_ID,
    Episode,
    EpisodeDraft,
    MemoryKind,
    Message,
    RelationalTuple,
    StrictModel,
    TupleDraft,
    Turn,
)
from hybridmem_local.service.keys import ApiKey

# --------------------------------------------------------------------------- limits

#: Largest ``k`` a search or ask may ask for (2k tuples come with it); beyond it answers 422.
MAX_K = 100
#: Largest page of ``GET .../memories`` and of the audit trail.
MAX_PAGE = 1000
#: Largest page of the MCP ``list_memories`` tool: smaller, since it lands in an agent's context.
MAX_TOOL_PAGE = 200
#: Sessions one batch request may carry (the pending-queue bound applies on top).
MAX_BATCH = 100
#: Messages one add_messages request may carry (a session's turns).
MAX_MESSAGES = 1000
#: Longest query or question accepted.
MAX_QUERY_CHARS = 10_000
#: Longest reason kept in a memory's history.
MAX_REASON_CHARS = 500
#: Longest session id (``Session``'s own bound).
MAX_SESSION_ID_CHARS = 200
#: Largest row id (memories, consolidation runs, redactions): SQLite's integers are 64-bit.
MAX_ROW_ID = 2**63 - 1

# --------------------------------------------------------------------------- argument types
# The optional ones include None (the default: the config's, or no filter), so that their
# description stays on the argument rather than on one branch of its JSON schema.

NamespaceName = Annotated[
    str, Field(description="1-64 characters of A-Z a-z 0-9 _ . -, starting with a letter or digit")
]
RowId = Annotated[int, Field(ge=1, le=MAX_ROW_ID)]
SessionId = Annotated[str, Field(min_length=1, max_length=MAX_SESSION_ID_CHARS)]
#: The id of a session made of chat messages: its turn ids add ``:<index>`` within Turn's 64 characters.
MessagesSessionId = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=MAX_MESSAGES_SESSION_ID,
        description="An id for this conversation, unique in the namespace (made up when left out); its turns "
        "are session_id:index.",
    ),
]
QueryText = Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS)]
TopK = Annotated[
    int | None, Field(ge=1, le=MAX_K, description="Episodes to return (tuples: 2k); default from the config.")
]
QuestionDate = Annotated[
    AwareDatetime | None, Field(description="When the question is asked, for relative dates ('last week').")
]
Reason = Annotated[
    str, Field(min_length=1, max_length=MAX_REASON_CHARS, description="Why, kept in the memory's history.")
]
PageOffset = Annotated[int, Field(ge=0, description="Where the page starts: next_offset of the previous page.")]
Turns = Annotated[
    list[Turn],
    Field(
        min_length=1,
        description="The raw turns in order; turn ids must be unique in the namespace (prefix them with the "
        "session id).",
    ),
]
Messages = Annotated[
    list[Message],
    Field(
        min_length=1,
        max_length=MAX_MESSAGES,
        description="The conversation, oldest first, as chat messages {role, content} (optional name): the "
        "name, else the role, is the speaker.",
    ),
]
Episodes = Annotated[list[EpisodeDraft], Field(description="Events: title, summary, details, timestamp (ISO date).")]
Tuples = Annotated[
    list[TupleDraft], Field(description="Facts: entity, relation, object, timestamp (ISO date), context.")
]

# The search filters, one argument each as ``HybridMemory.search`` takes them (the HTTP body and
# the MCP tool alike; tests/test_api_parity.py holds them to ``retrieval.SearchFilters``).
Kinds = Annotated[
    list[MemoryKind] | None,
    Field(min_length=1, description="Memory stores to search: 'episode', 'tuple' (default: the config's)."),
]
Since = Annotated[
    date | datetime | None,
    Field(description="Only memories dated on or after this (a window by its session's date)."),
]
Until = Annotated[
    date | datetime | None,
    Field(description="Only memories dated on or before this (a window by its session's date)."),
]
MinScore = Annotated[
    float | None, Field(description="Only hits scoring at least this, in the retrieval mode's own scale.")
]

MemoryOut = Annotated[Episode | RelationalTuple, Field(discriminator="kind")]
#: Which memories a listing shows; ``any`` for every status.
StatusFilter = Literal["active", "superseded", "deleted", "any"]

# --------------------------------------------------------------------------- request bodies


class SessionIn(StrictModel):
    """A session to add; its namespace is the one the request acts on."""

    session_id: SessionId
    started_at: AwareDatetime
    turns: Turns


class SessionBatchIn(StrictModel):
    sessions: list[SessionIn] = Field(min_length=1, max_length=MAX_BATCH)


class MessagesIn(StrictModel):
    """Chat messages, stored as one session dated now (the speaker from the role)."""

    messages: Messages
    session_id: MessagesSessionId = None


class MemoriesIn(StrictModel):
    """At least one of the two (the operation says so when both are empty)."""

    # Pydantic copies a mutable default for each instance.
    episodes: Episodes = []
    tuples: Tuples = []


class SearchIn(StrictModel):
    """A query, and optionally which stores, which period and which scores to keep."""

    query: QueryText
    k: TopK = None
    kinds: Kinds = None
    since: Since = None
    until: Until = None
    min_score: MinScore = None


class AskIn(StrictModel):
    question: QueryText
    question_date: QuestionDate = None
    k: TopK = None


class ListQuery(StrictModel):
    kind: MemoryKind | None = None
    status: StatusFilter = "active"
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)
    offset: PageOffset = 0


class ConsolidateIn(StrictModel):
    dry_run: bool = False


class AuditQuery(StrictModel):
    key: str | None = Field(default=None, max_length=64, description="only this actor (an API key id, 'worker')")
    namespace: str | None = Field(default=None, max_length=64)
    since: AwareDatetime | None = None
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)


# --------------------------------------------------------------------------- response bodies


class SessionAccepted(StrictModel):
    namespace: str
    session_id: str
    curation_status: str
    #: Where to poll for the curation outcome.
    status_url: str


class MessagesAccepted(SessionAccepted):
    #: The session's date (when the server stored it): with session_id, it names every turn.
    started_at: AwareDatetime


class SessionStatus(StrictModel):
    """Where a session's curation stands (its turns left out)."""

    namespace: str
    session_id: str
    started_at: AwareDatetime
    turns: int
    #: ``pending`` until the curation worker is done, then ``curated`` or ``curation_failed``.
    curation_status: str
    curation_error: str | None = None


class MemoriesAdded(StrictModel):
    namespace: str
    ids: list[int]


class MemoryPage(StrictModel):
    namespace: str
    items: list[MemoryOut]
    limit: int
    offset: int
    #: The offset of the next page, or None on the last one.
    next_offset: int | None


class ForgetReport(StrictModel):
    namespace: str
    #: Rows, files and cache entries removed, by kind.
    removed: dict[str, int]


class KeyCreated(StrictModel):
    key: ApiKey
    #: The full key for ``Authorization: Bearer``; shown this once, never stored.
    token: str


class ErrorBody(StrictModel):
    code: str
    message: str


class ErrorResponse(StrictModel):
    """The body of every non-2xx answer."""

    error: ErrorBody


# --------------------------------------------------------------------------- refusals


def describe_validation_errors(errors: list[Any]) -> str:
    """``body.turns.0.text: Field required; query.limit: ...`` (at most five, each naming its field)."""
    parts = []
    for error in errors[:5]:
        location = ".".join(str(p) for p in error.get("loc", ())) or "body"
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    more = len(errors) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


@contextmanager
def invalid_input(where: str) -> Iterator[None]:
    """Pydantic's refusal of data a caller sent, as an InvalidInputError naming each field under ``where``.

    Only around building models from a request: a ValidationError anywhere else is a bug (internal).
    """
    try:
        yield
    except ValidationError as exc:
        located = [{**e, "loc": (where, *e["loc"])} for e in exc.errors()]
        raise InvalidInputError(describe_validation_errors(located)) from None
