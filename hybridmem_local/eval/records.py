"""What an evaluation run writes per question: the record (one line of ``predictions.jsonl``),
its per-question metrics, and reading and appending those files."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from hybridmem_local.eval import Benchmark, metrics
from hybridmem_local.eval.judge import JudgeVerdict
from hybridmem_local.eval.locomo import ADVERSARIAL
from hybridmem_local.eval.systems import EvalQuestion, RankedItem, SystemContext, retrieved_at
from hybridmem_local.schema import StrictModel

log = logging.getLogger(__name__)

PREDICTIONS = "predictions.jsonl"
USAGE = "usage.jsonl"


class Verdict(JudgeVerdict):
    """A question's verdict as recorded: the judge's, or the runner's own for an empty answer."""

    #: False when the runner decided without a judge call (no answer to judge).
    judged_by_llm: bool = True


class QuestionRecord(StrictModel):
    """One line of ``predictions.jsonl``: a question answered (or retrieved for) by one system."""

    run_key: str
    system: str
    system_name: str
    conversation_id: str
    question_id: str
    question: str
    category: str
    gold: str | None
    adversarial_answer: str | None = None
    evidence: list[str]
    #: None with ``--retrieval-only``.
    prediction: str | None = None
    #: ``answering.mode`` the answer was asked in (None with ``--retrieval-only``); in text mode
    #: ``cited`` holds the short ids derived by alignment, not ids the model wrote.
    answer_mode: Literal["json", "text"] | None = None
    #: ``answering.evidence_turns``: the context showed the memories' source turns.
    evidence_turns: bool = False
    answer_error: str | None = None
    cited: list[str] = Field(default_factory=list)
    cited_memory_ids: list[int] = Field(default_factory=list)
    retrieved: list[RankedItem] = Field(default_factory=list)
    context_turns: int = 0
    context_tokens: int = 0
    context_truncated: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    retrieval_s: float = 0.0
    answer_s: float | None = None
    judge_s: float | None = None
    verdict: Verdict | None = None
    judge_error: str | None = None
    #: The gold after the audit (``--audited-gold``) and the judge's verdict against it (the same
    #: verdict where the audit keeps the answer); None without an audit.
    gold_audited: str | None = None
    evidence_audited: list[str] | None = None
    verdict_audited: Verdict | None = None
    metrics: dict[str, float | bool | None]


def read_records(path: Path) -> list[dict]:
    """The records of a predictions file; a line cut short by a kill is skipped with a warning."""
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s line %d is not valid JSON (a run killed mid-write?); ignored", path, number)
    return records


def append_jsonl(path: Path, rows: Iterable[BaseModel | dict]) -> None:
    with open(path, "a", encoding="utf-8") as out:
        for row in rows:
            out.write((row.model_dump_json() if isinstance(row, BaseModel) else json.dumps(row)) + "\n")
        out.flush()
        os.fsync(out.fileno())


def question_metrics(
    benchmark: Benchmark,
    question: EvalQuestion,
    context: SystemContext,
    prediction: str | None,
    verdict: Verdict | None,
    ranked: bool,
    recall_ks: Sequence[int],
    tuple_multiplier: int,
    turn_sessions: dict[str, str],
    verdict_audited: Verdict | None = None,
) -> dict[str, float | bool | None]:
    """Every per-question figure: None where it does not apply (aggregation leaves it out).
    The ``*_audited`` figures score against the audited gold (None without an audit)."""
    audited = question.evidence_audited is not None
    values: dict[str, float | bool | None] = {
        "judge_correct": None if verdict is None else verdict.correct,
        "judge_correct_audited": None if verdict_audited is None else verdict_audited.correct,
        "f1_official": None,
        "f1": None,
        "f1_audited": None,
        "bleu1": None,
        "evidence_recall": metrics.evidence_recall(context.turn_ids, question.evidence),
        "evidence_recall_audited": (
            metrics.evidence_recall(context.turn_ids, question.evidence_audited or []) if audited else None
        ),
    }
    if prediction is not None:
        if benchmark == "locomo" and question.category_number is not None:
            values["f1_official"] = metrics.f1_official(prediction, question.gold or "", question.category_number)
        if question.gold is not None and question.category_number != ADVERSARIAL:
            values["f1"] = metrics.f1_mem0(prediction, question.gold)
            values["bleu1"] = metrics.bleu1(prediction, question.gold)
        if audited and question.gold_audited is not None and question.category_number != ADVERSARIAL:
            values["f1_audited"] = metrics.f1_mem0(prediction, question.gold_audited)
    sessions = [turn_sessions[t] for item in context.ranked for t in item.turn_ids if t in turn_sessions]
    for k in recall_ks:
        values[f"evidence_recall@{k}"] = values[f"session_recall@{k}"] = None
        if ranked:
            top = retrieved_at(context.ranked, k, tuple_multiplier)
            values[f"evidence_recall@{k}"] = metrics.evidence_recall(
                {t for i in top for t in i.turn_ids}, question.evidence
            )
            values[f"session_recall@{k}"] = metrics.session_recall_at_k(sessions, question.answer_session_ids, k)
    return values
