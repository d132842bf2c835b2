"""Systems under test: how each one builds the context an answer is written from.

Every system answers with the same prompt and the same LLM (``answering/``); they differ
only in what the answer model is shown:

==========================  ==================================================================
``hybrid``                  top-k episodes + top-2k relational tuples (paper §3.3)
``hybrid+consolidation``    the same, over a copy of the store consolidated after ingest (§3.2)
``episodic-only``           top-k episodes (appendix D)
``relational-only``         top-2k tuples (appendix D)
``full-context``            the whole history as raw turns under session dates, cut to the
                            answer model's context keeping the most recent turns
``fused``                   the library default: memories and raw-turn windows fused (dense +
                            BM25) into 2,048 tokens, whatever the run's ``retrieval`` section
``rag``                     raw-turn evidence windows (``indexes/windows.py``) filling a token budget
                            (paper: RAG-4096)
==========================  ==================================================================

A system is one class in :data:`SYSTEMS` with a small protocol: ``prepare(conversation,
memory)`` once per conversation, then ``context(question)`` per question, giving a
:class:`SystemContext` (the rendered text, the turn ids it covers, the retrieved items in
rank order with their provenance, its size in answer-model tokens). Which store a system
reads is its ``needs``: the raw turns, the shared curated store, or a consolidated copy;
the runner hands it the right :class:`~hybridmem_local.memory.HybridMemory`.

Retrieval mode (dense, lexical, hybrid RRF) is ``config.retrieval.mode`` for every
retrieving system, so the systems differ in what they store, not in how they search; set
``retrieval.mode: dense`` for the paper's exact setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import AwareDatetime, Field

from hybridmem_local.answering.context import format_context
from hybridmem_local.config import AnsweringConfig, Config, RetrievalConfig, SearchSource
from hybridmem_local.errors import InvalidInputError
from hybridmem_local.indexes.windows import with_source_turns
from hybridmem_local.retrieval.retriever import Retriever
from hybridmem_local.schema import Hit, Provenance, SearchResult, Session, StrictModel, turn_line
from hybridmem_local.storage.store import MemoryStore

if TYPE_CHECKING:
    from hybridmem_local.memory import HybridMemory

#: The RAG baseline's context budget in answer-model tokens (the paper's RAG-4096).
DEFAULT_RAG_BUDGET = 4096

StoreNeed = Literal["raw", "curated", "consolidated"]


# --------------------------------------------------------------------------- benchmark-neutral records


class EvalQuestion(StrictModel):
    """One question as every system and metric sees it, whichever benchmark it came from."""

    question_id: str
    question: str
    #: None only for LoCoMo adversarial questions (they have no answer).
    gold: str | None
    #: LoCoMo category name ("multi-hop", ...) or LongMemEval question type.
    category: str
    #: LoCoMo's category number (1-5), which the official F1 needs; None for LongMemEval.
    category_number: int | None = None
    adversarial_answer: str | None = None
    #: LongMemEval ``_abs`` questions (the history does not hold the answer).
    abstention: bool = False
    #: Turn ids holding the answer (evidence recall); may be empty (then not scorable).
    evidence: list[str] = Field(default_factory=list)
    #: Sessions holding the answer (LongMemEval session recall).
    answer_session_ids: list[str] = Field(default_factory=list)
    question_date: AwareDatetime | None = None
    #: The answer and evidence after an audit of the gold (``eval/audited_gold.py``); None
    #: without one. Equal to ``gold`` / ``evidence`` where the audit keeps them.
    gold_audited: str | None = None
    evidence_audited: list[str] | None = None


class EvalConversation(StrictModel):
    """One history and the questions asked over it: a LoCoMo sample or a LongMemEval instance."""

    conversation_id: str
    namespace: str
    sessions: list[Session]
    questions: list[EvalQuestion]

    def turn_sessions(self) -> dict[str, str]:
        """Turn id → session id (lifts turn-level rankings to sessions)."""
        return {t.turn_id: s.session_id for s in self.sessions for t in s.turns}


# --------------------------------------------------------------------------- what a system returns


class RankedItem(StrictModel):
    """One retrieved item: a memory (episode, tuple) or an evidence window of raw turns."""

    store: SearchSource
    #: Memory id, or the window id (the turns-table key of its first turn).
    id: int
    turn_ids: list[str]
    #: How a memory's turns were obtained (schema.Provenance); None for a window or a memory without turns.
    provenance: Provenance | None = None
    #: Whether the item made it into the context (a token budget can leave it out).
    shown: bool


class SystemContext(StrictModel):
    text: str
    #: Provenance of what the answer model is shown: every turn id the context covers.
    turn_ids: list[str]
    #: Retrieved items, best first within each store, stores interleaved one retrieval step
    #: at a time (one episode, two tuples, ...); empty for systems that do not retrieve.
    ranked: list[RankedItem] = Field(default_factory=list)
    #: Tokens of ``text`` in the answer model's tokenizer.
    tokens: int
    #: Something the system meant to show (its k items, its token budget, the whole history)
    #: did not fit the answer model's context window and was left out.
    truncated: bool = False
    #: Short ids of the rendered block ("E1", "T3") → memory ids, for resolving citations.
    short_ids: dict[str, int] = Field(default_factory=dict)
    #: Short id → the memory as shown, which text-mode answers are aligned to (answering.TextCiter).
    memory_texts: dict[str, str] = Field(default_factory=dict)


@dataclass
class SystemSettings:
    """What every system is built with."""

    config: Config
    #: ``count_tokens`` of the answer model.
    count_tokens: Callable[[str], int]
    #: Tokens the answer prompt leaves for the context of this question (its window less the
    #: prompt, the question and the reply).
    context_limit: Callable[[EvalQuestion], int]
    #: Retrieval budget: k episodes, ``tuple_multiplier * k`` tuples, k windows.
    k: int
    #: Items retrieved per store beyond what is shown, for recall@k with k up to this depth.
    recall_depth: int = 0
    rag_budget: int = DEFAULT_RAG_BUDGET


# --------------------------------------------------------------------------- retrieving systems


class RetrievalSystem:
    """Searches the namespace's stores and renders the result (``answering.context.format_context``).

    Subclasses name the stores they search; ``sources = None`` keeps the configured ones.
    """

    name: ClassVar[str]
    needs: ClassVar[StoreNeed] = "curated"
    sources: ClassVar[list[str] | None] = None
    #: Whether ``context`` ranks items, so that recall@k is defined.
    ranked: ClassVar[bool] = True

    def __init__(self, settings: SystemSettings):
        self.settings = settings
        retrieval = settings.config.retrieval
        update: dict = {} if self.sources is None else {"sources": list(self.sources)}
        self.retrieval: RetrievalConfig = retrieval.model_copy(update=update)
        self.budget: int | None = self.retrieval.context_budget
        #: Each memory shown with its source turns (``answering.evidence_turns``).
        self.evidence_turns = settings.config.answering.evidence_turns
        self._retriever: Retriever | None = None
        self._store: MemoryStore | None = None
        self._namespace = ""

    def prepare(self, conversation: EvalConversation, memory: HybridMemory) -> None:
        self._namespace = conversation.namespace
        self._store = memory.store
        self._retriever = Retriever(memory.store, memory.indexes, self.retrieval)

    def _limits(self) -> dict[str, int]:
        k = self.settings.k
        return {"episodes": k, "tuples": self.retrieval.tuple_multiplier * k, "windows": k}

    def context(self, question: EvalQuestion) -> SystemContext:
        if self._retriever is None or self._store is None:
            raise RuntimeError(f"{self.name}: prepare() was not called")
        shown_limits = self._limits()
        depth = max(self.settings.k, self.settings.recall_depth)
        result = self._retriever.search(
            question.question,
            self._namespace,
            depth,
            self.retrieval.tuple_multiplier * depth,
            depth,
            candidates=self.budget is not None,
        )
        if self.evidence_turns:
            result = with_source_turns(self._store, result)
        budget_set = self.budget
        selected = _cut(result, shown_limits) if budget_set is None else result
        limit = self.settings.context_limit(question)
        budget = limit if budget_set is None else min(budget_set, limit)
        rendered = format_context(selected, budget=budget, count_tokens=self.settings.count_tokens)
        shown_turns = {t for turns in rendered.window_turns.values() for t in turns}
        shown_memories = set(rendered.short_ids.values())
        ranked = _interleave(result, self.retrieval.tuple_multiplier, shown_memories, shown_turns)
        # Keep what recall@k can read and what was shown (budget mode ranks ~candidate_depth deep).
        within = {(i.store, i.id) for i in retrieved_at(ranked, depth, self.retrieval.tuple_multiplier)}
        ranked = [i for i in ranked if i.shown or (i.store, i.id) in within]
        if budget_set is None:
            truncated = len(shown_memories) + _windows_shown(selected, shown_turns) < _count(selected)
        elif budget_set > limit:  # the answer model's window, not the budget, decided what fits
            nominal = format_context(selected, budget=budget_set, count_tokens=self.settings.count_tokens)
            truncated = set(nominal.turn_ids) != set(rendered.turn_ids)
        else:
            truncated = False
        return SystemContext(
            text=rendered.text,
            turn_ids=rendered.turn_ids,
            ranked=ranked,
            tokens=rendered.tokens or 0,
            truncated=truncated,
            short_ids=rendered.short_ids,
            memory_texts=rendered.memory_texts,
        )


class HybridSystem(RetrievalSystem):
    """Top-k episodes and top-2k tuples (the stores ``retrieval.sources`` names)."""

    name = "hybrid"


class ConsolidatedHybridSystem(HybridSystem):
    """The hybrid system over a consolidated copy of the curated store."""

    name = "hybrid+consolidation"
    needs = "consolidated"


class EpisodicOnlySystem(RetrievalSystem):
    name = "episodic-only"
    sources = ["episodes"]


class RelationalOnlySystem(RetrievalSystem):
    name = "relational-only"
    sources = ["tuples"]


class FusedSystem(RetrievalSystem):
    """The library's default selection, whatever the run's ``retrieval`` and
    ``answering.evidence_turns`` say: curated memories and raw-turn windows fused (dense + BM25)
    into a 2,048-token context, each memory with its source turns (the defaults of
    :class:`RetrievalConfig` and :class:`AnsweringConfig`), so one run compares it with the
    paper's systems."""

    name = "fused"

    def __init__(self, settings: SystemSettings):
        super().__init__(settings)
        self.retrieval = RetrievalConfig()
        self.budget = self.retrieval.context_budget
        self.evidence_turns = AnsweringConfig().evidence_turns


class RagSystem(RetrievalSystem):
    """Raw-turn evidence windows, taken in rank order until ``rag_budget`` tokens are full.

    Needs no curation: windows are built from the stored turns (``indexes/windows.py``).
    """

    name = "rag"
    needs = "raw"
    sources = ["windows"]

    def __init__(self, settings: SystemSettings):
        super().__init__(settings)
        self.budget = settings.rag_budget
        self.retrieval = self.retrieval.model_copy(update={"context_budget": settings.rag_budget})


# --------------------------------------------------------------------------- full context


class FullContextSystem:
    """The whole history as raw turns, one date header per session, oldest first.

    When it does not fit the answer model's context, the oldest turns are left out (a note
    says so) and the context is marked ``truncated``.
    """

    name: ClassVar[str] = "full-context"
    needs: ClassVar[StoreNeed] = "raw"
    ranked: ClassVar[bool] = False
    OMITTED = "(earlier conversation omitted: it does not fit the context window)"

    def __init__(self, settings: SystemSettings):
        self.settings = settings
        self.evidence_turns = settings.config.answering.evidence_turns  # as recorded; it shows no memories
        self._lines: list[tuple[str | None, str]] = []  # (turn id or None for a header, line)
        self._by_limit: dict[int, SystemContext] = {}  # questions differ in length, rarely in limit

    def prepare(self, conversation: EvalConversation, memory: HybridMemory) -> None:
        self._lines = []
        for session in sorted(conversation.sessions, key=lambda s: s.started_at):
            self._lines.append((None, session_header(session.started_at)))
            self._lines.extend((turn.turn_id, turn_line(turn)) for turn in session.turns)
        self._by_limit = {}

    def context(self, question: EvalQuestion) -> SystemContext:
        limit = self.settings.context_limit(question)
        if limit not in self._by_limit:
            self._by_limit[limit] = self._render(limit)
        return self._by_limit[limit]

    def _render(self, limit: int) -> SystemContext:
        count = self.settings.count_tokens
        whole = "\n".join(line for _, line in self._lines)
        tokens = count(whole)
        if tokens <= limit:
            return SystemContext(text=whole, turn_ids=self._turn_ids(self._lines), tokens=tokens)
        # Keep a suffix of whole turns; the kept part's first session gets its header back.
        used = count(self.OMITTED + "\n")
        start = len(self._lines)
        for index in range(len(self._lines) - 1, -1, -1):
            cost = count(self._lines[index][1] + "\n")
            if used + cost > limit:
                break
            used += cost
            start = index
        while True:
            kept = self._with_header(start)
            text = "\n".join([self.OMITTED] + [line for _, line in kept])
            tokens = count(text)
            if tokens <= limit or start >= len(self._lines):
                return SystemContext(text=text, turn_ids=self._turn_ids(kept), tokens=tokens, truncated=True)
            start += 1  # line-by-line counts missed a join token or the re-added header

    def _with_header(self, start: int) -> list[tuple[str | None, str]]:
        kept = self._lines[start:]
        if kept and kept[0][0] is not None:
            header = next(line for turn_id, line in reversed(self._lines[:start]) if turn_id is None)
            kept = [(None, header)] + kept
        return kept

    @staticmethod
    def _turn_ids(lines: list[tuple[str | None, str]]) -> list[str]:
        return [turn_id for turn_id, _ in lines if turn_id is not None]


def session_header(moment: datetime) -> str:
    return f"### {moment:%Y-%m-%d (%A) %H:%M}"


# --------------------------------------------------------------------------- registry

SYSTEMS: dict[str, type[RetrievalSystem] | type[FullContextSystem]] = {
    cls.name: cls
    for cls in (
        HybridSystem,
        ConsolidatedHybridSystem,
        EpisodicOnlySystem,
        RelationalOnlySystem,
        FusedSystem,
        FullContextSystem,
        RagSystem,
    )
}


def build_system(name: str, settings: SystemSettings):
    if name not in SYSTEMS:
        raise InvalidInputError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    return SYSTEMS[name](settings)


# --------------------------------------------------------------------------- helpers


def _cut(result: SearchResult, limits: dict[str, int]) -> SearchResult:
    return result.model_copy(
        update={
            "episodes": result.episodes[: limits["episodes"]],
            "tuples": result.tuples[: limits["tuples"]],
            "windows": result.windows[: limits["windows"]],
        }
    )


def _count(result: SearchResult) -> int:
    return len(result.episodes) + len(result.tuples) + len(result.windows)


def _windows_shown(result: SearchResult, shown_turns: set[str]) -> int:
    return sum(1 for hit in result.windows if set(hit.window.turn_ids) <= shown_turns)


def _interleave(
    result: SearchResult, tuple_multiplier: int, shown_memories: set[int], shown_turns: set[str]
) -> list[RankedItem]:
    """All hits, one retrieval step at a time: the i-th episode, then the tuples of step i
    (``tuple_multiplier`` of them), then the i-th window. The first k steps are exactly what
    a search with budget k returns, so recall@k reads a prefix of k steps."""
    per_step = {"episodes": 1, "tuples": max(tuple_multiplier, 1), "windows": 1}
    items: list[tuple[int, int, RankedItem]] = []
    memory_stores: tuple[tuple[SearchSource, list[Hit]], ...] = (
        ("episodes", result.episodes),
        ("tuples", result.tuples),
    )
    for order, (store, hits) in enumerate(memory_stores):
        for rank, hit in enumerate(hits):
            memory = hit.memory
            item = RankedItem(
                store=store,
                id=memory.stored_id,
                turn_ids=list(memory.source_turn_ids),
                provenance=memory.provenance,
                shown=memory.id in shown_memories,
            )
            items.append((rank // per_step[store], order, item))
    for rank, window in enumerate(window_hit.window for window_hit in result.windows):
        item = RankedItem(
            store="windows", id=window.id, turn_ids=window.turn_ids, shown=set(window.turn_ids) <= shown_turns
        )
        items.append((rank, 2, item))
    return [item for _, _, item in sorted(items, key=lambda entry: (entry[0], entry[1]))]


def retrieved_at(ranked: list[RankedItem], k: int, tuple_multiplier: int) -> list[RankedItem]:
    """The items a search with budget ``k`` returns: the first k episodes, the first
    ``tuple_multiplier * k`` tuples and the first k windows of ``ranked`` (for recall@k)."""
    per_k = {"episodes": 1, "tuples": tuple_multiplier, "windows": 1}
    taken = {store: 0 for store in per_k}
    out = []
    for item in ranked:
        if taken[item.store] < per_k[item.store] * k:
            taken[item.store] += 1
            out.append(item)
    return out
