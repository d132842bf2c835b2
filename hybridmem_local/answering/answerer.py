"""Answering (paper §3.3): retrieved memories and a question in, a short cited answer out.

    result = memory.search(question, namespace="alice")
    answer = answer_from_context(llm, question, result, question_date=when_asked)
    answer.answer, [m.source_turn_ids for m in answer.cited]

Exactly one LLM request per question (fixed top-k retrieval needs no query-time LLM step);
:func:`answer_many` sends the requests of many questions as one batched call (the facade's
``HybridMemory.answer_many``, the evaluation runner). The memories are shown with short ids
(``E1``, ``T3``; ``context.format_context``). Two modes (``answering.mode``):

* ``json``: constrained JSON ``{answer, cited_memory_ids}``; the model cites the ids, and ids
  that were not shown are dropped and counted, never trusted;
* ``text``: a short plain-text answer (small models answer better without a schema); the cited
  memories are derived by aligning question + answer to the memories shown, with the scoring
  that aligns curated memories to their turns (``text/alignment.py``; :class:`TextCiter`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hybridmem_local.answering.context import RenderedContext, format_context
from hybridmem_local.config import AnsweringConfig
from hybridmem_local.errors import InvalidInputError, LLMError
from hybridmem_local.llm.base import LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.prompts import load_prompt
from hybridmem_local.results import Answer, AnswerMode
from hybridmem_local.schema import LIST_MARKER, SearchResult, clean_cited_id
from hybridmem_local.text.alignment import AlignmentSettings, Embed, alignment_scores, select

#: Room for a few-word answer and its citations; a thinking model gets the backend default
#: (``LLMConfig.max_new_tokens``) because its reasoning comes first.
ANSWER_MAX_NEW_TOKENS = 256
#: A text answer is a few words; the cap stops a small model that goes on into a paragraph.
ANSWER_TEXT_MAX_NEW_TOKENS = 48

_PROMPTS: dict[str, str] = {"json": "answer", "text": "answer_text"}
_ABSTAINS = re.compile(r"^\W*i (don'?t|do not) know\b", re.IGNORECASE)
#: A label a small model writes before its answer: "Answer:", "The answer is:", or a speaker
#: name copied from the transcript ("Jon:"); token F1 counts each of its words as wrong.
_ANSWER_LABEL = re.compile(
    r"^\W*(?:(?i:(?:the )?answer(?: is)?)|(?!(?:Yes|No)\b)[A-Z][\w'-]*(?: [A-Z][\w'-]*){0,2})\s*:(?:\s+|$)"
)


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


def _question_date_line(question_date: datetime | None) -> str:
    if question_date is None:
        return ""
    return f"Question date: {question_date:%Y-%m-%d (%A)}"


class TextCiter:
    """The memories a plain-text answer rests on: those shown that question + answer align to.

    Scored as curation aligns a memory to its turns (``alignment.alignment_scores``: stem
    overlap and cosine), and chosen as there (``alignment.select``): the best memory, then more
    while they reach ``settings.min_score``, ``settings.max_turns`` in all. The question is part
    of the aligned text because the answer alone is often a date or a name the memory words
    differently ("7 May 2023" for "(2023-05-07) ... support group"), while the question names the
    event. An "I don't know" cites nothing.
    """

    def __init__(self, embed: Embed, settings: AlignmentSettings):
        self.embed = embed
        self.settings = settings

    @classmethod
    def from_config(cls, config: AnsweringConfig, embed: Embed) -> TextCiter:
        return cls(
            embed,
            AlignmentSettings(
                max_turns=config.cite_max_memories,
                min_score=config.cite_min_score,
                lexical_weight=config.cite_lexical_weight,
            ),
        )

    def cite(
        self, questions: Sequence[str], answers: Sequence[str], contexts: Sequence[RenderedContext]
    ) -> list[list[str]]:
        """Short ids cited by each answer, in context order (one embedding call for the batch)."""
        queries = [
            f"{q.strip()}\n{a}" if a and not _ABSTAINS.match(a) else None
            for q, a in zip(questions, answers, strict=True)
        ]
        texts = list(
            dict.fromkeys(
                t
                for query, context in zip(queries, contexts, strict=True)
                if query is not None and context.memory_texts
                for t in [query, *context.memory_texts.values()]
            )
        )
        if not texts:
            return [[] for _ in questions]
        vectors = dict(zip(texts, self.embed(texts), strict=True))
        cited: list[list[str]] = []
        for query, context in zip(queries, contexts, strict=True):
            if query is None or not context.memory_texts:
                cited.append([])
                continue
            shorts, shown = list(context.memory_texts), list(context.memory_texts.values())
            scores = alignment_scores(
                [query],
                vectors[query][None, :],
                shown,
                np.stack([vectors[t] for t in shown]),
                self.settings.lexical_weight,
            )[0]
            cited.append([shorts[i] for i in select(scores, self.settings)])
        return cited


def citer_for(config: AnsweringConfig, embed: Embed) -> TextCiter | None:
    """The citer ``answering.mode`` needs: a :class:`TextCiter` for text answers, None for JSON."""
    return TextCiter.from_config(config, embed) if config.mode == "text" else None


def build_answer_request(
    question: str,
    context: RenderedContext,
    question_date: datetime | None,
    enable_thinking: bool,
    mode: AnswerMode = "json",
) -> LLMRequest:
    """The one request that answers ``question`` from ``context``: constrained JSON or plain text."""
    if not question.strip():
        raise InvalidInputError("question is empty")
    prompt = load_prompt(_PROMPTS[mode])
    cap = ANSWER_MAX_NEW_TOKENS if mode == "json" else ANSWER_TEXT_MAX_NEW_TOKENS
    return LLMRequest(
        messages=prompt.messages(
            memories=context.text, question=question.strip(), question_date_line=_question_date_line(question_date)
        ),
        output_schema=AnswerDraft if mode == "json" else None,
        max_new_tokens=None if enable_thinking else cap,
        enable_thinking=enable_thinking,
        prompt_version=prompt.version,
    )


def answer_from_context(
    llm: StructuredLLM,
    question: str,
    search_result: SearchResult,
    question_date: datetime | None = None,
    enable_thinking: bool = False,
    context_budget: int | None = None,
    mode: AnswerMode = "json",
    citer: TextCiter | None = None,
) -> Answer:
    """Answer ``question`` from the memories of ``search_result`` with one LLM call.

    ``context_budget`` (tokens of this LLM's tokenizer) switches from the fixed k / 2k
    selection to filling the context in fused rank order. ``mode`` "text" asks for plain text
    and needs ``citer``. A backend that cannot be reached gives an :class:`Answer` with
    ``error`` set rather than an exception.
    """
    start = time.perf_counter()
    try:
        [answer] = answer_many(
            llm,
            [question],
            [search_result],
            [question_date],
            enable_thinking=enable_thinking,
            context_budget=context_budget,
            mode=mode,
            citer=citer,
        )
    except LLMError as exc:
        context = _render(search_result, llm, context_budget)
        answer = _answer(
            question,
            context,
            search_result,
            LLMResult(error=f"LLM backend failed: {exc}"),
            load_prompt(_PROMPTS[mode]).version,
            mode,
            [],
        )
    return answer.model_copy(update={"latency_s": time.perf_counter() - start})


@dataclass(frozen=True)
class AnswerOptions:
    """How a config answers (``HybridMemory.answer_options``): the settings of every answer call."""

    enable_thinking: bool = False
    #: Tokens of the answer model's tokenizer for the context; None: the fixed k / 2k selection.
    context_budget: int | None = None
    mode: AnswerMode = "json"
    #: Derives a text answer's citations (``mode`` "text" needs one).
    citer: TextCiter | None = None


@dataclass(frozen=True)
class PreparedAnswer:
    """An answer retrieved and ready for its one LLM call (``HybridMemory.prepare_answer``)."""

    question: str
    question_date: datetime | None
    search_result: SearchResult
    options: AnswerOptions

    def run(self, llm: StructuredLLM) -> Answer:
        """The LLM call (``answer_from_context``)."""
        return answer_from_context(
            llm,
            self.question,
            self.search_result,
            self.question_date,
            enable_thinking=self.options.enable_thinking,
            context_budget=self.options.context_budget,
            mode=self.options.mode,
            citer=self.options.citer,
        )


def answer_many(
    llm: StructuredLLM,
    questions: Sequence[str],
    contexts: Sequence[SearchResult | RenderedContext],
    question_dates: Sequence[datetime | None] | None = None,
    *,
    enable_thinking: bool = False,
    context_budget: int | None = None,
    tag: str | None = None,
    mode: AnswerMode = "json",
    citer: TextCiter | None = None,
) -> list[Answer]:
    """Answer each question from its context, all in one batched LLM call (one request each).

    A context is a :class:`SearchResult` (rendered here, ``context_budget`` as in
    :func:`answer_from_context`; the answer's ``cited`` then holds the memories) or a block
    already rendered (an evaluation system's; ``cited_memory_ids`` resolves its citations).
    Requests are filed under ``tag`` for the call cache (default: the search result's
    namespace). An :class:`~hybridmem_local.llm.base.LLMError` of the backend as a whole
    propagates: nothing was answered, and a caller that keeps answers must not keep these.
    In ``mode`` "text", ``citer`` derives each answer's citations from the rendered memories.
    """
    if mode == "text" and citer is None:
        raise InvalidInputError("text answers need a TextCiter to derive their cited memories")
    dates = list(question_dates) if question_dates is not None else [None] * len(questions)
    if not len(questions) == len(contexts) == len(dates):
        raise InvalidInputError(f"{len(questions)} questions, {len(contexts)} contexts and {len(dates)} question dates")
    rendered = [c if isinstance(c, RenderedContext) else _render(c, llm, context_budget) for c in contexts]
    requests = [
        build_answer_request(question, context, date, enable_thinking, mode).model_copy(
            update={"tag": tag if tag is not None else getattr(source, "namespace", None)}
        )
        for question, context, date, source in zip(questions, rendered, dates, contexts, strict=True)
    ]
    results = llm.generate(requests) if requests else []
    if mode == "text" and citer is not None:  # always has a citer (checked above)
        texts = [_text_answer(r.text) if r.ok else "" for r in results]
        derived = citer.cite(questions, texts, rendered)
    else:
        derived = [[] for _ in results]
    return [
        _answer(
            question,
            context,
            source if isinstance(source, SearchResult) else None,
            result,
            request.prompt_version,
            mode,
            cites,
        )
        for question, context, source, result, request, cites in zip(
            questions, rendered, contexts, results, requests, derived, strict=True
        )
    ]


def _render(search_result: SearchResult, llm: StructuredLLM, context_budget: int | None) -> RenderedContext:
    return format_context(
        search_result, budget=context_budget, count_tokens=llm.count_tokens if context_budget else None
    )


def _text_answer(text: str) -> str:
    """The answer of a plain-text reply: its first non-empty line without the labels small
    models put before it (repeated "Jon: Jon:" included) or a list marker; a line that only
    announces a list ("The activities are:") is replaced by the list items, comma-joined."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1:
        return ", ".join(_unlabelled(line) for line in lines[1:])
    return _unlabelled(lines[0])


def _unlabelled(line: str) -> str:
    while (stripped := LIST_MARKER.sub("", _ANSWER_LABEL.sub("", line, count=1)).strip()) != line:
        line = stripped
    return line


def _answer(
    question: str,
    context: RenderedContext,
    search_result: SearchResult | None,
    result: LLMResult,
    prompt_version: str,
    mode: AnswerMode,
    derived: list[str],
) -> Answer:
    if mode == "json":
        draft = result.parsed if result.ok and isinstance(result.parsed, AnswerDraft) else None
        text, citations = (draft.answer.strip(), draft.cited_memory_ids) if draft else ("", [])
        problem = None if draft else (result.error or "reply is not an AnswerDraft")
    else:
        text = _text_answer(result.text) if result.ok else ""
        citations = derived
        problem = None if text else (result.error or "the reply holds no answer")
    cited_ids, invalid = _resolve_citations(citations, context)
    memories = {m.id: m for m in search_result.memories()} if search_result is not None else {}
    return Answer(
        question=question,
        answer=text,
        mode=mode,
        cited=[memories[i] for i in cited_ids if i in memories],
        citations=citations,
        cited_memory_ids=cited_ids,
        context_memory_ids=list(dict.fromkeys(context.short_ids.values())),
        invalid_citations=invalid,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        latency_s=result.latency_s,
        context_text=context.text,
        prompt_version=prompt_version,
        error=problem,
    )


def _resolve_citations(citations: list[str], context: RenderedContext) -> tuple[list[int], list[str]]:
    """The memory ids behind the cited short ids (citation order, no repeats) and the ids that name none."""
    cited: list[int] = []
    invalid: list[str] = []
    for raw in citations:
        memory_id = context.short_ids.get(clean_cited_id(raw).upper())
        if memory_id is None:
            invalid.append(raw)
        elif memory_id not in cited:
            cited.append(memory_id)
    return cited, invalid
