"""What the public API returns: the one module the client, the service and the CLI import their
result types from.

The types are defined here, below every stage, so each stage that fills one (the consolidation
planner, the answerer, the store's history and redactions) imports it from here. The search
result, its hits and the stored session are the data every stage passes, so they stay in
``schema.py`` and are listed here with the rest.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    Hit,
    MemoryKind,
    RelationalTuple,
    SearchResult,
    SessionRecord,
    TupleDraft,
    WindowHit,
)
from hybridmem_local.usage import LLMUsage

__all__ = [
    "AddSessionResult",
    "Answer",
    "AnswerMode",
    "ConsolidationPlan",
    "ConsolidationReport",
    "ConsolidationUsage",
    "Deletion",
    "DeletionReason",
    "Event",
    "Group",
    "GroupPlan",
    "Hit",
    "IngestReport",
    "Merge",
    "PurgeReport",
    "Redaction",
    "RedactionStatus",
    "SearchResult",
    "SessionRecord",
    "SkippedGroup",
    "Stats",
    "StoreReport",
    "Timings",
    "UndoReport",
    "WindowHit",
]


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- store and ingest


class Stats(_Result):
    namespaces: list[str]
    counts: dict[str, int]
    index_sizes: dict[str, int]


class IngestReport(_Result):
    stored: int = 0
    #: Sessions already in the store (ingest is idempotent per session id).
    skipped: int = 0
    curated: int = 0
    failed: int = 0
    memories: int = 0
    #: Memories the LLM wrote that curation's checks left out (no content, a decoding loop, not from the
    #: window, the other speaker's news).
    memories_left_out: int = 0
    #: Memories without a valid cited turn id, aligned to their window's turns (text/alignment.py).
    memories_aligned: int = 0
    #: Curated memories that repeated an active one (curation/dedup.py): not stored, their turns went to it.
    duplicates_skipped: int = 0
    #: Curation's LLM requests, tokens and model time.
    usage: LLMUsage = Field(default_factory=LLMUsage)
    #: Consolidation runs triggered by ``consolidation.every_n_sessions``.
    consolidation_runs: list[int] = []


class AddSessionResult(_Result):
    """What ``add_session`` stored: the session (with its curation status) and the memories
    curated from it (none when curation is queued or failed), with the ingest's figures."""

    session: SessionRecord
    memories: list[Episode | RelationalTuple]
    report: IngestReport


class Event(_Result):
    """One change in the append-only history (``storage/events.py``): the row before and after it."""

    id: int
    namespace: str
    at: datetime
    action: str
    memory_id: int | None
    run_id: int | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    reason: str | None


# --------------------------------------------------------------------------- answers

AnswerMode = Literal["json", "text"]


class Answer(_Result):
    """An answer with the memories it cites and what it cost."""

    question: str
    answer: str
    #: The cited memories, each with its ``source_turn_ids`` (the provenance of the answer).
    cited: list[Episode | RelationalTuple] = Field(default_factory=list)
    #: How the answer was asked for (``answering.mode``).
    mode: AnswerMode = "json"
    #: The short ids cited: as the model wrote them (json mode), or derived by alignment (text mode).
    citations: list[str] = Field(default_factory=list)
    #: The memory ids behind the valid citations, in citation order, without repeats.
    cited_memory_ids: list[int] = Field(default_factory=list)
    #: The memory ids the context showed the model, in context order (what the audit trail records).
    context_memory_ids: list[int] = Field(default_factory=list)
    #: Cited short ids that named no memory in the context (dropped).
    invalid_citations: list[str] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Seconds of the LLM call (near zero when the call cache answered): wall-clock for
    #: ``answer_from_context``, the backend's per-request figure for ``answer_many``.
    latency_s: float = 0.0
    #: The memory block the model was shown.
    context_text: str
    prompt_version: str
    #: Set when no usable reply came back; ``answer`` is then empty.
    error: str | None = None

    @property
    def cited_turn_ids(self) -> list[str]:
        """Source turns of every cited memory, in citation order, without repeats."""
        return list(dict.fromkeys(t for memory in self.cited for t in memory.source_turn_ids))


# --------------------------------------------------------------------------- redactions

RedactionStatus = Literal["pending", "confirmed", "undone"]


class Redaction(_Result):
    """One redaction as an admin reviews it (without the removed text)."""

    id: int
    namespace: str
    #: The session whose request(s) it answers (found as the session was stored, or at its curation).
    session_id: str
    created_at: datetime
    status: RedactionStatus
    decided_at: datetime | None
    #: What was asked ({what, turn_id, detected_by}), values masked.
    requests: list[dict[str, Any]]
    #: Turn ids rewritten; memory ids rewritten (old → new), removed, and retired ones to delete on confirm.
    turn_ids: list[str]
    rewritten: dict[int, int]
    deleted: list[int]
    retired: list[int]
    #: How many spans were removed from turns.
    spans: int
    #: Whether the removed text is still kept (pending only): what undo restores.
    undoable: bool


# --------------------------------------------------------------------------- consolidation runs

DeletionReason = Literal["outdated", "conflicting", "superseded", "duplicate"]


class Group(_Result):
    """Memories shown to the LLM together: one cluster, or a piece of one sized to the context."""

    kind: MemoryKind
    #: Memory ids in prompt order (oldest first): the LLM sees them as M1..Mn.
    memory_ids: list[int]


class Merge(_Result):
    source_ids: list[int]
    #: The LLM's record with provenance and timestamp already fixed by the code.
    merged: EpisodeDraft | TupleDraft
    #: The members' common session, None when they come from several.
    source_session_id: str | None = None
    #: The new row's id, once applied.
    merged_id: int | None = None


class Deletion(_Result):
    memory_id: int
    reason: DeletionReason


class GroupPlan(_Result):
    group: Group
    merges: list[Merge]
    deletions: list[Deletion]
    #: 1 when the first reply was valid, 2 when the retry was.
    attempts: int = 1

    def touched_ids(self) -> list[int]:
        return [i for m in self.merges for i in m.source_ids] + [d.memory_id for d in self.deletions]


class SkippedGroup(_Result):
    group: Group
    error: str


class ConsolidationPlan(_Result):
    namespace: str
    groups: list[GroupPlan] = Field(default_factory=list)
    skipped: list[SkippedGroup] = Field(default_factory=list)


class StoreReport(_Result):
    """One store's figures for a run (or, for a dry run, what the run would do)."""

    memories_before: int = 0
    memories_after: int = 0
    clusters: int = 0
    noise: int = 0
    #: Why clustering did not run (too few memories), None when it ran.
    clustering_skipped: str | None = None
    #: Requests sent for this store, retries included (one per group on the first pass).
    llm_calls: int = 0
    invalid_plans_retried: int = 0
    invalid_plans_skipped: int = 0
    merges: int = 0
    merged_sources: int = 0
    deletions: int = 0

    @property
    def compression_pct(self) -> float:
        if not self.memories_before:
            return 0.0
        return 100.0 * (self.memories_before - self.memories_after) / self.memories_before


class Timings(_Result):
    embed_load_s: float = 0.0
    umap_s: float = 0.0
    hdbscan_s: float = 0.0
    llm_s: float = 0.0
    apply_s: float = 0.0


class ConsolidationUsage(LLMUsage):
    """The run's LLM use (``usage.LLMUsage``), with the model and prompt that planned it."""

    model_id: str = ""
    prompt_version: str = ""
    #: ``generate`` calls: one for the first pass, one more when any plan needed a retry.
    batches: int = 0


class ConsolidationReport(_Result):
    """What a run did; stored (without ``plan``, so no memory text) in its ``consolidation_runs`` row."""

    run_id: int | None = None
    namespace: str
    dry_run: bool = False
    #: The clustering backend that ran ("cpu", "cuml"), or "given" for clusters passed in.
    backend: str = ""
    stores: dict[MemoryKind, StoreReport] = Field(default_factory=dict)
    timings: Timings = Field(default_factory=Timings)
    llm: ConsolidationUsage = Field(default_factory=ConsolidationUsage)
    #: Applied merges: merged row id → source ids (empty for a dry run).
    merged: dict[int, list[int]] = Field(default_factory=dict)
    #: Applied deletions: memory id → reason.
    deleted: dict[int, DeletionReason] = Field(default_factory=dict)
    skipped: list[SkippedGroup] = Field(default_factory=list)
    #: The groups and validated plans (with the merged records' text); not stored in the run row.
    plan: ConsolidationPlan | None = Field(default=None, exclude=True)

    @property
    def memories_before(self) -> int:
        return sum(s.memories_before for s in self.stores.values())

    @property
    def memories_after(self) -> int:
        return sum(s.memories_after for s in self.stores.values())

    @property
    def compression_pct(self) -> float:
        before = self.memories_before
        return 100.0 * (before - self.memories_after) / before if before else 0.0


class UndoReport(_Result):
    run_id: int
    namespace: str
    #: Sources and deleted memories made active again.
    restored: int
    #: The run's merged rows, now marked deleted.
    removed: int


class PurgeReport(_Result):
    namespace: str
    cutoff: datetime
    memories: int
    embeddings: int
    events: int
    #: Old non-active rows kept because a newer row still points at them (superseded_by).
    kept_referenced: int
    #: Another connection's read kept the purged rows in the WAL for now: the scrub
    #: (``MemoryStore.scrub``) is retried when the service is idle and at the next open.
    scrub_pending: bool = False
