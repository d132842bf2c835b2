"""Data model shared by every stage: raw sessions, the two memory stores, LLM output schemas.

The paper's records are kept field for field (§3.1): an episode is
``{title, summary, details, timestamp}`` and a relational tuple is
``{entity, relation, object, timestamp, context}``. Every stored memory also carries its
namespace, provenance (session and turn ids), creation time and a status, so that nothing is
ever lost silently: consolidation marks rows superseded or deleted instead of removing them.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from enum import Enum
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from hybridmem_local.errors import InvalidInputError

#: A turn longer than this is rejected: LoCoMo turns are < 1k characters and LongMemEval's
#: longest assistant replies ~30k; anything far beyond is almost surely a broken input file.
MAX_TURN_CHARS = 100_000

NAMESPACE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

#: ISO 8601 prefixes accepted as memory timestamps: a year, a month, a day or a full datetime.
TIMESTAMP_PATTERN = re.compile(r"^\d{4}(-\d{2}(-\d{2}([T ]\d{2}:\d{2}(:\d{2})?.*)?)?)?$")

MemoryKind = Literal["episode", "tuple"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def check_namespace(namespace: str) -> str:
    """Namespaces name index files on disk, so they are restricted to a safe alphabet."""
    if not isinstance(namespace, str) or not NAMESPACE_PATTERN.match(namespace):
        raise InvalidInputError(
            f"invalid namespace {namespace!r}: use 1-64 characters from A-Z a-z 0-9 _ . - "
            "starting with a letter or digit"
        )
    return namespace


def check_page(limit: int | None, offset: int) -> None:
    """A page of a listing: ``limit`` (None: all) and ``offset`` must not be negative."""
    if (limit is not None and limit < 0) or offset < 0:
        raise InvalidInputError(f"limit and offset must not be negative, got limit={limit} offset={offset}")


#: Turn-id references ("D3:1", "answer_4be1b6b4_2:13", runs such as "D3:1:1:1"; not a time such
#: as "13:56"), which small models copy into memory text in place of content.
TURN_REFERENCE = re.compile(r"\b[^\W\d]\w*(?::\d+)+\b")
#: A list marker ("-", "*", "•", "1.", "2)") at the start of a line, which small models put
#: before an answer or a copied memory.
LIST_MARKER = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+", re.MULTILINE)


def clean_cited_id(raw: str) -> str:
    """An id an LLM cited (a turn id, a short memory id) without the brackets and spaces
    models copy from the prompt: ``" [E1] "`` → ``"E1"``."""
    return raw.strip().strip("[]").strip()


class MemoryStatus(str, Enum):
    active = "active"
    superseded = "superseded"
    deleted = "deleted"


class StrictModel(BaseModel):
    """Unknown fields are errors, at every boundary (LLM replies, API bodies, files)."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- raw sessions


class Turn(StrictModel):
    """One utterance of a session.

    ``turn_id`` is unique within a namespace (LoCoMo's ``D3:7`` already is), so a memory's
    provenance is a plain list of turn ids even after consolidation merges memories of
    several sessions; the store rejects a session that reuses another session's turn id.
    """

    turn_id: str = Field(min_length=1, max_length=64)
    speaker: str = Field(min_length=1, max_length=200)
    text: str = Field(max_length=MAX_TURN_CHARS)
    image_caption: str | None = Field(default=None, max_length=MAX_TURN_CHARS)

    @model_validator(mode="after")
    def _has_content(self) -> Turn:
        if not self.text.strip() and not (self.image_caption or "").strip():
            raise ValueError(f"turn {self.turn_id!r} has neither text nor an image caption")
        return self

    def render(self) -> str:
        """The line an LLM or a lexical index sees for this turn."""
        line = f"[{self.turn_id}] {self.speaker}: {self.text}".rstrip()
        if self.image_caption:
            line += f" [shares an image: {self.image_caption}]"
        return line


class Session(StrictModel):
    session_id: str = Field(min_length=1, max_length=200)
    namespace: str = "default"
    started_at: AwareDatetime
    turns: list[Turn] = Field(min_length=1)

    _check_namespace = field_validator("namespace")(classmethod(lambda cls, v: check_namespace(v)))

    @model_validator(mode="after")
    def _unique_turn_ids(self) -> Session:
        seen: set[str] = set()
        for turn in self.turns:
            if turn.turn_id in seen:
                raise ValueError(f"session {self.session_id!r}: duplicate turn_id {turn.turn_id!r}")
            seen.add(turn.turn_id)
        return self

    @classmethod
    def from_messages(
        cls,
        namespace: str,
        messages: Sequence[Message],
        session_id: str | None = None,
        started_at: datetime | None = None,
    ) -> Session:
        """Chat messages as a session dated ``started_at`` (default now): turn ``{session_id}:{i}``
        for message i, spoken by the message's ``name``, else its role. Without ``session_id``,
        one is made up from the date and 6 random hex digits."""
        at = started_at or utcnow()
        if session_id is None:
            session_id = f"chat-{at:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
        elif not 1 <= len(session_id) <= MAX_MESSAGES_SESSION_ID:
            raise InvalidInputError(
                f"session_id must be 1-{MAX_MESSAGES_SESSION_ID} characters (its turn ids are session_id:index), "
                f"got {len(session_id)}"
            )
        if not messages:
            raise InvalidInputError("messages is empty: give at least one message")
        turns = [
            Turn(turn_id=f"{session_id}:{i}", speaker=m.name or m.role, text=m.content) for i, m in enumerate(messages)
        ]
        return cls(namespace=check_namespace(namespace), session_id=session_id, started_at=at, turns=turns)


#: Longest session id ``Session.from_messages`` takes: its turn ids add ``:<index>`` within Turn's 64.
MAX_MESSAGES_SESSION_ID = 50


class Message(StrictModel):
    """One chat message as agents keep them: ``{"role": "user", "content": "..."}``."""

    role: str = Field(min_length=1, max_length=50, description="user, assistant, ...: the speaker unless name is set")
    content: str = Field(min_length=1, max_length=MAX_TURN_CHARS)
    #: Who spoke, when the role alone does not say (OpenAI's optional ``name``).
    name: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("content")
    @classmethod
    def _not_blank(cls, content: str) -> str:
        if not content.strip():
            raise ValueError("content is blank")
        return content

    @classmethod
    def from_user(cls, text: str) -> Message:
        """Plain text as the user's message; InvalidInputError when it is blank or too long."""
        try:
            return cls(role="user", content=text)
        except ValidationError as exc:
            raise InvalidInputError(f"text: {exc.errors()[0]['msg']}") from None


class SessionRecord(BaseModel):
    """A stored session and how its curation went (``pending``, ``curated``, ``curation_failed``)."""

    model_config = ConfigDict(extra="forbid")

    session: Session
    curation_status: str
    curation_error: str | None = None


# --------------------------------------------------------------------------- LLM output schemas


def _check_timestamp(value: str) -> str:
    value = value.strip()
    if not TIMESTAMP_PATTERN.match(value):
        raise ValueError(f"timestamp {value!r} is not an ISO 8601 date (YYYY, YYYY-MM, YYYY-MM-DD...)")
    return value


#: How a memory's source turns were obtained: ``cited`` by whoever wrote it (the curation model,
#: an API caller), or ``aligned`` to the turns of its curation window by similarity
#: (text/alignment.py) because none it cited was a turn of that window. None: no source turns.
Provenance = Literal["cited", "aligned"]


def combine_provenance(provenances: Iterable[Provenance | None]) -> Provenance | None:
    """The provenance of a memory whose turns are the union of these: ``aligned`` if any part
    was (not all of it was cited), None when none has turns."""
    known = {p for p in provenances if p is not None}
    if not known:
        return None
    return "aligned" if "aligned" in known else "cited"


def provenance_of(turn_ids: Sequence[str], provenance: Provenance | None) -> Provenance | None:
    """Turns given without a provenance were cited by the caller; no turns, no provenance."""
    if not turn_ids:
        return None
    return provenance or "cited"


def _provenance_follows_turns(memory: EpisodeDraft | TupleDraft) -> EpisodeDraft | TupleDraft:
    memory.provenance = provenance_of(memory.source_turn_ids, memory.provenance)
    return memory


class EpisodeDraft(StrictModel):
    """An episodic record as the curation LLM writes it (no ids yet)."""

    title: str = Field(min_length=1)
    summary: str = Field(min_length=1)
    details: str = Field(min_length=1)
    timestamp: str = Field(description="ISO 8601 date of the event, e.g. 2023-05-07")
    source_turn_ids: list[str] = Field(default_factory=list)
    #: See :data:`Provenance`; left out of JSON schemas, so LLM reply schemas do not ask for it.
    provenance: SkipJsonSchema[Provenance | None] = None

    _ts = field_validator("timestamp")(classmethod(lambda cls, v: _check_timestamp(v)))
    _provenance = model_validator(mode="after")(lambda self: _provenance_follows_turns(self))


class TupleDraft(StrictModel):
    """A relational tuple as the curation LLM writes it (no ids yet)."""

    entity: str = Field(min_length=1)
    relation: str = Field(min_length=1)
    object: str = Field(min_length=1)
    timestamp: str = Field(description="ISO 8601 date the fact holds from, e.g. 2023-05-07")
    context: str = ""
    source_turn_ids: list[str] = Field(default_factory=list)
    provenance: SkipJsonSchema[Provenance | None] = None

    _ts = field_validator("timestamp")(classmethod(lambda cls, v: _check_timestamp(v)))
    _provenance = model_validator(mode="after")(lambda self: _provenance_follows_turns(self))


class CurationResult(StrictModel):
    episodes: list[EpisodeDraft] = Field(default_factory=list)
    tuples: list[TupleDraft] = Field(default_factory=list)


# --------------------------------------------------------------------------- stored memories


class _StoredMemory(StrictModel):
    id: int | None = None
    namespace: str = "default"
    source_session_id: str | None = None
    source_turn_ids: list[str] = Field(default_factory=list)
    created_at: AwareDatetime = Field(default_factory=utcnow)
    status: MemoryStatus = MemoryStatus.active
    superseded_by: int | None = None
    #: Shown in stored memories' JSON schemas (service and MCP responses), unlike the drafts'.
    provenance: Provenance | None = None

    _check_namespace = field_validator("namespace")(classmethod(lambda cls, v: check_namespace(v)))

    @property
    def stored_id(self) -> int:
        """The id of a memory read from the store (``id`` is None only before it is inserted)."""
        if self.id is None:
            raise InvalidInputError("this memory is not stored yet (it has no id)")
        return self.id


class Episode(_StoredMemory, EpisodeDraft):
    kind: Literal["episode"] = "episode"

    def index_text(self) -> str:
        """Episodes are searched by their ``details`` field (paper §3.3)."""
        return self.details

    def render(self) -> str:
        return f"({self.timestamp}) {self.title}: {self.details}"


class RelationalTuple(_StoredMemory, TupleDraft):
    kind: Literal["tuple"] = "tuple"

    def render(self) -> str:
        """The natural-language string that is embedded and shown to the LLM."""
        tail = self.timestamp if not self.context else f"{self.timestamp}; {self.context}"
        return f"{self.entity} — {self.relation} — {self.object} ({tail})"

    def index_text(self) -> str:
        return self.render()


Memory = Episode | RelationalTuple


# --------------------------------------------------------------------------- evidence windows


class EvidenceWindow(StrictModel):
    """Consecutive raw turns of one session, searched as one text (see ``indexes/windows.py``)."""

    #: The turns-table key of the window's first turn (its hnswlib and BM25 label).
    id: int
    namespace: str
    session_id: str
    session_date: AwareDatetime
    #: Position of the first turn within its session (windows of a session can then be merged).
    start: int = Field(ge=0)
    turns: list[Turn] = Field(min_length=1)

    @property
    def turn_ids(self) -> list[str]:
        return [t.turn_id for t in self.turns]

    def index_text(self) -> str:
        """What is embedded and BM25-indexed: speaker-prefixed lines, without turn ids or dates."""
        return "\n".join(turn_line(t) for t in self.turns)


def turn_line(turn: Turn) -> str:
    """A turn as the answer model sees it inside a window (``Turn.render`` without the id)."""
    line = f"{turn.speaker}: {turn.text}".rstrip()
    if turn.image_caption:
        line += f" [shares an image: {turn.image_caption}]"
    return line


# --------------------------------------------------------------------------- search results


class Hit(StrictModel):
    memory: Episode | RelationalTuple = Field(discriminator="kind")
    score: float


class WindowHit(StrictModel):
    window: EvidenceWindow
    score: float


class SearchResult(StrictModel):
    query: str
    namespace: str
    episodes: list[Hit] = Field(default_factory=list)
    tuples: list[Hit] = Field(default_factory=list)
    #: Raw-turn evidence windows, when ``retrieval.sources`` includes them.
    windows: list[WindowHit] = Field(default_factory=list)
    #: The memories' source turns, one single-turn window each, attached at answer time when
    #: ``answering.evidence_turns`` is on (``windows.with_source_turns``); a context shows them.
    source_turns: list[EvidenceWindow] = Field(default_factory=list)

    def memories(self) -> list[Episode | RelationalTuple]:
        return [h.memory for h in self.episodes] + [h.memory for h in self.tuples]

    def provenance(self) -> set[str]:
        """Every source turn id the retrieved memories cite, and every turn of the windows."""
        return {t for m in self.memories() for t in m.source_turn_ids} | {
            t for h in self.windows for t in h.window.turn_ids
        }
