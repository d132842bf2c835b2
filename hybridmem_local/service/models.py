"""Bounds and models the HTTP API and the MCP tools share, and how a model's refusal of a
request is described (pydantic only: cheap to import)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field, ValidationError

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.schema import Episode, RelationalTuple, StrictModel, Turn
from hybridmem_local.service.keys import ApiKey

#: Largest ``k`` a search or ask may ask for (2k tuples come with it); beyond it answers 422.
MAX_K = 100
#: Largest page of ``GET .../memories``.
MAX_PAGE = 1000
#: Largest page of the MCP ``list_memories`` tool: smaller, since it lands in an agent's context.
MAX_TOOL_PAGE = 200
#: Sessions one batch request may carry (the pending-queue bound applies on top).
MAX_BATCH = 100
#: Messages one add_messages request may carry (a session's turns).
MAX_MESSAGES = 1000
#: Longest query or question accepted.
MAX_QUERY_CHARS = 10_000

MemoryOut = Annotated[Episode | RelationalTuple, Field(discriminator="kind")]
#: Which memories a listing shows; ``any`` for every status.
StatusFilter = Literal["active", "superseded", "deleted", "any"]


class SessionIn(StrictModel):
    """A session to add; its namespace is the one the request acts on."""

    session_id: str = Field(min_length=1, max_length=200)
    started_at: AwareDatetime
    turns: list[Turn] = Field(min_length=1)


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
