"""Answering (paper §3.3): retrieved memories and a question in, a short cited answer out.

    result = memory.search(question, namespace="alice")
    answer = answer_from_context(llm, question, result, question_date=when_asked)
    answer.answer, [m.source_turn_ids for m in answer.cited]

Exactly one LLM call per question (fixed top-k retrieval needs no query-time LLM step). The
memories are shown with short ids (``E1``, ``T3``; ``retrieval.format_context``); the model
cites them, and citations of ids that were not shown are dropped and counted, never trusted.
"""

from __future__ import annotations

import time
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from hybridmem_local.llm.base import LLMError, LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.prompts import load_prompt
from hybridmem_local.retrieval import RenderedContext, format_context
from hybridmem_local.schema import Episode, RelationalTuple, SearchResult

#: Room for a few-word answer and its citations; a thinking model gets the backend default
#: (``LLMConfig.max_new_tokens``) because its reasoning comes first.
ANSWER_MAX_NEW_TOKENS = 256


class AnswerDraft(BaseModel):
    """What the answering LLM writes."""

    model_config = ConfigDict(extra="forbid")

    # Schema-only limits (constrained decoding obeys them, validation stays lenient): a small
    # model cannot loop inside the answer, and cites only ids shaped like format_context's.
    answer: str = Field(description="a few words", json_schema_extra={"maxLength": 200})
    cited_memory_ids: list[str] = Field(
        description='short ids of the memories used, e.g. ["E1", "T3"]',
        json_schema_extra={"items": {"type": "string", "pattern": r"^[ET][0-9]{1,4}$"}},
    )


class Answer(BaseModel):
    """An answer with the memories it cites and what it cost."""

    model_config = ConfigDict(extra="forbid")

    question: str
    answer: str
    #: The cited memories, each with its ``source_turn_ids`` (the provenance of the answer).
    cited: list[Episode | RelationalTuple] = Field(default_factory=list)
    #: Cited short ids that named no memory in the context (dropped).
    invalid_citations: list[str] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Wall-clock seconds of the LLM call (near zero when the call cache answered).
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


def _question_date_line(question_date: datetime | None) -> str:
    if question_date is None:
        return ""
    return f"Question date: {question_date:%Y-%m-%d (%A)}"


def build_answer_request(
    question: str,
    context: RenderedContext,
    question_date: datetime | None,
    enable_thinking: bool,
) -> LLMRequest:
    """The one request that answers ``question`` from ``context``."""
    if not question.strip():
        raise ValueError("question is empty")
    prompt = load_prompt("answer")
    return LLMRequest(
        messages=prompt.messages(
            memories=context.text, question=question.strip(), question_date_line=_question_date_line(question_date)
        ),
        output_schema=AnswerDraft,
        max_new_tokens=None if enable_thinking else ANSWER_MAX_NEW_TOKENS,
        enable_thinking=enable_thinking,
        prompt_version=prompt.version,
    )


def _short_id(raw: str) -> str:
    return raw.strip().strip("[]").strip().upper()


def answer_from_context(
    llm: StructuredLLM,
    question: str,
    search_result: SearchResult,
    question_date: datetime | None = None,
    enable_thinking: bool = False,
    context_budget: int | None = None,
) -> Answer:
    """Answer ``question`` from the memories of ``search_result`` with one LLM call.

    ``context_budget`` (tokens of this LLM's tokenizer) switches from the fixed k / 2k
    selection to filling the context in fused rank order.
    """
    context = format_context(search_result, budget=context_budget, count_tokens=llm.count_tokens if context_budget else None)
    request = build_answer_request(question, context, question_date, enable_thinking)
    request = request.model_copy(update={"tag": search_result.namespace})
    start = time.perf_counter()
    try:
        [result] = llm.generate([request])
    except LLMError as exc:
        result = LLMResult(error=f"LLM backend failed: {exc}")
    latency = time.perf_counter() - start
    draft = result.parsed if result.ok and isinstance(result.parsed, AnswerDraft) else None
    cited, invalid = _resolve_citations(draft.cited_memory_ids if draft else [], context, search_result)
    return Answer(
        question=question,
        answer=draft.answer.strip() if draft else "",
        cited=cited,
        invalid_citations=invalid,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        latency_s=latency,
        context_text=context.text,
        prompt_version=request.prompt_version,
        error=None if draft else (result.error or "reply is not an AnswerDraft"),
    )


def _resolve_citations(
    short_ids: list[str], context: RenderedContext, search_result: SearchResult
) -> tuple[list[Episode | RelationalTuple], list[str]]:
    """The memories behind the cited short ids (in citation order) and the ids that name none."""
    memories = {m.id: m for m in search_result.memories()}
    cited: dict[int, Episode | RelationalTuple] = {}
    invalid: list[str] = []
    for raw in short_ids:
        memory_id = context.short_ids.get(_short_id(raw))
        if memory_id in memories:
            cited.setdefault(memory_id, memories[memory_id])
        else:
            invalid.append(raw)
    return list(cited.values()), invalid
