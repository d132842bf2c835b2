"""``MemoryAPI``: what ``HybridMemory`` (in-process) and ``HybridMemoryClient`` (a remote
``hybridmem serve``) both do, with the same names, arguments and return types.

    def remember_and_recall(memory: MemoryAPI, session: Session) -> SearchResult:
        memory.enqueue([session])                 # stored raw, curated later
        return memory.search("Where did Alice move?", namespace=session.namespace)

A program written against it runs on either (tests/test_api_parity.py holds both to it). Each
may take more optional arguments than listed here (``HybridMemory.consolidate``'s ``llm``, say).
Where they must differ, the names differ too: ``HybridMemory.add_session`` curates at once (with
``curation.mode: sync``) and returns the curated memories, ``HybridMemoryClient.add_session``
only queues the session; ``enqueue`` is the same on both. A memory id or a consolidation run
belongs to a namespace: ``namespace=None`` means any in-process, while the service, which scopes
every id by namespace, refuses it (InvalidInputError) rather than guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    Message,
    RelationalTuple,
    SearchResult,
    Session,
    TupleDraft,
)

if TYPE_CHECKING:
    from hybridmem_local.results import (
        Answer,
        ConsolidationReport,
        Event,
        Redaction,
        RedactionStatus,
        Stats,
        UndoReport,
    )
    from hybridmem_local.schema import SessionRecord


class MemoryAPI(Protocol):
    def close(self) -> None: ...

    # ------------------------------------------------------------------ writes

    def enqueue(self, sessions: Sequence[Session]) -> list[SessionRecord]:
        """Store sessions raw as ``pending`` (all or none per namespace) for curation later."""
        ...

    def add_messages(self, namespace: str, messages: Sequence[Message], session_id: str | None = None) -> SessionRecord:
        """Chat messages (``{role, content}``) stored as a session dated now, the speaker from the
        role, for curation later like ``enqueue``."""
        ...

    def remember(self, namespace: str, text: str) -> SessionRecord:
        """Plain text stored as a one-message session from the user, dated now, for curation later."""
        ...

    def get_session(self, namespace: str, session_id: str) -> SessionRecord:
        """A stored session with its curation status (``pending``, ``curated``, ``curation_failed``)."""
        ...

    def add_memories(
        self, namespace: str, episodes: Iterable[EpisodeDraft] = (), tuples: Iterable[TupleDraft] = ()
    ) -> list[int]:
        """Store memories as given (no curation); returns their ids."""
        ...

    def delete(self, memory_id: int, reason: str = "deleted by user", *, namespace: str | None = None) -> None:
        """Mark a memory deleted (kept in its history)."""
        ...

    def forget(self, namespace: str) -> dict[str, int]:
        """Remove every trace of a namespace."""
        ...

    def consolidate(self, namespace: str, dry_run: bool = False) -> ConsolidationReport:
        """Merge and retire the namespace's memories with the LLM, as one undoable run."""
        ...

    def undo(self, run_id: int, *, namespace: str | None = None) -> UndoReport:
        """Restore exactly the state before a consolidation run."""
        ...

    def redactions(self, namespace: str, status: RedactionStatus | None = None) -> list[Redaction]:
        """Content removed because a user asked in a conversation, oldest first (admin)."""
        ...

    def undo_redaction(self, redaction_id: int, *, namespace: str | None = None) -> Redaction:
        """Put back exactly what a pending redaction removed (admin)."""
        ...

    def confirm_redaction(self, redaction_id: int, *, namespace: str | None = None) -> Redaction:
        """Delete a pending redaction's originals for good; no undo after (admin)."""
        ...

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
        """Top-k episodes and top-2k tuples for a query (no LLM call)."""
        ...

    def answer(
        self, question: str, namespace: str = "default", question_date: datetime | None = None, k: int | None = None
    ) -> Answer:
        """Retrieve and answer with one LLM call, citing the memories used."""
        ...

    def get(self, memory_id: int, *, namespace: str | None = None) -> Episode | RelationalTuple: ...

    def history(self, memory_id: int, *, namespace: str | None = None) -> list[Event]: ...

    def stats(self, namespace: str | None = None) -> Stats: ...

    def export(self, namespace: str, path: str | Path) -> int:
        """Write the namespace as JSONL (``import_`` / ``hybridmem import`` read it); returns the line count."""
        ...

    # Last: a method named ``list`` would shadow the builtin in the annotations after it.
    def list(
        self,
        namespace: str = "default",
        kind: MemoryKind | None = None,
        status: MemoryStatus | None = MemoryStatus.active,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Episode | RelationalTuple]:
        """Memories in id order (``status=None``: any status)."""
        ...
