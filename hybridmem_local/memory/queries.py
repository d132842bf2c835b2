"""Search and answers: retrieval (no LLM call), and answers written from it (one call each)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from hybridmem_local.answering.answerer import AnswerOptions, PreparedAnswer, answer_many, citer_for
from hybridmem_local.errors import InvalidInputError
from hybridmem_local.indexes.windows import with_source_turns
from hybridmem_local.memory.components import Components
from hybridmem_local.results import Answer
from hybridmem_local.retrieval.retriever import SearchFilters
from hybridmem_local.schema import SearchResult, check_namespace


def search(
    parts: Components,
    query: str,
    namespace: str,
    k: int | None,
    filters: SearchFilters | None = None,
    candidates: bool = False,
) -> SearchResult:
    """Top-k episodes and top-(``retrieval.tuple_multiplier`` × k) tuples, and windows; with
    ``candidates``, every store's candidates (``Retriever.search``)."""
    check_namespace(namespace)
    k = parts.config.retrieval.k if k is None else k
    if k < 1:
        raise InvalidInputError(f"k must be at least 1, got {k}")
    return parts.retriever.search(
        query, namespace, k, parts.config.retrieval.tuple_multiplier * k, filters=filters, candidates=candidates
    )


def answer_search(parts: Components, question: str, namespace: str, k: int | None) -> SearchResult:
    """The search an answer is written from: every store's candidates when a context budget is
    set (the budget, not k, decides what is shown), with the memories' source turns attached
    when ``answering.evidence_turns`` is on."""
    result = search(parts, question, namespace, k, candidates=parts.config.retrieval.context_budget is not None)
    return with_source_turns(parts.store, result) if parts.config.answering.evidence_turns else result


def answer_options(parts: Components) -> AnswerOptions:
    """How this config answers: thinking, context budget, JSON or text, the text answers' citer."""
    return AnswerOptions(
        enable_thinking=parts.config.llm.enable_thinking,
        context_budget=parts.config.retrieval.context_budget,
        mode=parts.config.answering.mode,
        citer=citer_for(parts.config.answering, parts.embedder.embed),
    )


def prepare_answer(
    parts: Components, question: str, namespace: str, question_date: datetime | None, k: int | None
) -> PreparedAnswer:
    """Everything of an answer but its LLM call: the retrieval and the settings."""
    return PreparedAnswer(
        question=question,
        question_date=question_date,
        search_result=answer_search(parts, question, namespace, k),
        options=answer_options(parts),
    )


def answers(
    parts: Components,
    questions: Sequence[str],
    namespace: str,
    question_dates: Sequence[datetime | None] | None,
    k: int | None,
) -> list[Answer]:
    """Several questions answered in one batched LLM call, each retrieving as one answer does."""
    results = [answer_search(parts, question, namespace, k) for question in questions]
    options = answer_options(parts)
    return answer_many(
        parts.llm,
        questions,
        results,
        question_dates,
        tag=namespace,
        enable_thinking=options.enable_thinking,
        context_budget=options.context_budget,
        mode=options.mode,
        citer=options.citer,
    )
