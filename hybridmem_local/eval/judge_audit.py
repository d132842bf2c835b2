"""How often the judge accepts a wrong answer: planted answers and the false-accept rate.

A lenient judge inflates every score it gives: mem0's LoCoMo prompt asks to be "generous", and
a published audit found it accepts 62.8% of wrong answers that stay on topic. So every run
measures its own judge. For a sample of the run's questions a *planted* answer is graded with
the same prompt as the real ones: the gold answer of another question about the same
conversation (on topic, about the same people, and wrong: it shares no normalised, stemmed
token with this question's gold answer). The share labelled CORRECT is the judge's
false-accept rate; judge accuracy overstates a system by up to that share of its wrong answers.

Which question lends its answer: one naming the same person and of the same category first,
then one naming the same person, then any of the conversation; for one-question histories
(LongMemEval) a question of the same type from another history. The choice is seeded, so a
rerun plants the same answers and the LLM cache answers it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.eval.locomo import ADVERSARIAL
from hybridmem_local.eval.metrics import bootstrap_interval, token_f1
from hybridmem_local.eval.systems import EvalConversation, EvalQuestion
from hybridmem_local.schema import StrictModel

#: Planted answers per run unless ``--judge-audit`` says otherwise (the CLI's default).
DEFAULT_AUDIT_SIZE = 100
JUDGE_AUDIT = "judge_audit.jsonl"


class PlantedAnswer(StrictModel):
    """One wrong answer planted for the judge: ``planted`` is the gold answer of ``planted_from``."""

    conversation_id: str
    question_id: str
    category: str
    question: str
    gold: str
    planted: str
    planted_from: str


def _gradable(question: EvalQuestion) -> bool:
    return bool(question.gold) and not question.abstention and question.category_number != ADVERSARIAL


def _people(conversation: EvalConversation) -> set[str]:
    return {turn.speaker for session in conversation.sessions for turn in session.turns}


def _named(question: EvalQuestion, people: set[str]) -> set[str]:
    text = question.question.lower()
    return {person for person in people if person.lower() in text}


def plant_answers(conversations: Sequence[EvalConversation], size: int, seed: int = 0) -> list[PlantedAnswer]:
    """Up to ``size`` planted answers for questions of ``conversations``, in question order.

    A question with no possible lender (every other gold answer shares a token with its own)
    gets none; ``size`` larger than the gradable questions plants one for each of them.
    """
    if size < 0:
        raise InvalidInputError(f"the judge audit size must be 0 or more, got {size}")
    by_category: dict[str, list[tuple[EvalConversation, EvalQuestion]]] = {}
    for conversation in conversations:
        for question in conversation.questions:
            if _gradable(question):
                by_category.setdefault(question.category, []).append((conversation, question))
    planted = []
    for conversation in conversations:
        people = _people(conversation)
        gradable = [q for q in conversation.questions if _gradable(q)]
        for question in gradable:
            lender = _lender(question, conversation, gradable, people, by_category.get(question.category, []), seed)
            if lender is not None:
                planted.append(
                    PlantedAnswer(
                        conversation_id=conversation.conversation_id,
                        question_id=question.question_id,
                        category=question.category,
                        question=question.question,
                        gold=question.gold or "",
                        planted=lender.gold or "",
                        planted_from=lender.question_id,
                    )
                )
    if size < len(planted):
        chosen = set(random.Random(seed).sample(range(len(planted)), size))
        planted = [p for i, p in enumerate(planted) if i in chosen]
    return planted


def _lender(
    question: EvalQuestion,
    conversation: EvalConversation,
    gradable: list[EvalQuestion],
    people: set[str],
    same_category: list[tuple[EvalConversation, EvalQuestion]],
    seed: int,
) -> EvalQuestion | None:
    def wrong(other: EvalQuestion) -> bool:
        return other.question_id != question.question_id and token_f1(other.gold or "", question.gold or "") == 0.0

    named = _named(question, people)
    around = [q for q in gradable if wrong(q)]
    about_them = [q for q in around if _named(q, people) & named]
    tiers = (
        [q for q in about_them if q.category == question.category],
        about_them,
        around,
        [q for c, q in same_category if c.conversation_id != conversation.conversation_id and wrong(q)],
    )
    best = next((tier for tier in tiers if tier), None)
    return None if best is None else random.Random(f"{seed}:{question.question_id}").choice(best)


def summarise_audit(records: Sequence[dict[str, Any]], judge_model_id: str) -> dict[str, Any]:
    """The ``judge_audit`` block of the summary from ``judge_audit.jsonl`` records.

    ``false_accept_rate`` is over the planted answers the judge labelled (a failed judge reply
    counts in ``judge_failures``, not as a rejection), with its bootstrap 95% interval.
    """

    def block(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        accepted = [r["label"] == "CORRECT" for r in rows if r.get("label") is not None]
        interval = bootstrap_interval(accepted)
        return {
            "planted": len(rows),
            "judged": len(accepted),
            "accepted": sum(accepted),
            "judge_failures": len(rows) - len(accepted),
            "false_accept_rate": sum(accepted) / len(accepted) if accepted else None,
            "ci95": None if interval is None else list(interval),
        }

    categories = sorted({r["category"] for r in records})
    return {
        "judge_model": judge_model_id,
        **block(records),
        "by_category": {c: block([r for r in records if r["category"] == c]) for c in categories},
    }
