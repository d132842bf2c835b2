"""How often the judge accepts a wrong answer, and rejects a right one: the judge's two error rates.

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

A strict judge errs the other way: it rejects a right answer worded unlike the gold. For a
sample of questions the gold answer is *reworded* without changing what it says
(:func:`reword_answers`: a date written another way, a list in another order, or the answer put
in a sentence) and graded too; the share labelled WRONG is the false-reject rate.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.eval.locomo import ADVERSARIAL
from hybridmem_local.eval.metrics import score_interval, token_f1
from hybridmem_local.eval.systems import EvalConversation, EvalQuestion
from hybridmem_local.schema import StrictModel

#: Planted answers per run unless ``--judge-audit`` says otherwise (the CLI's default).
DEFAULT_AUDIT_SIZE = 100
JUDGE_AUDIT = "judge_audit.jsonl"


#: ``kind`` of a judge-audit row: a wrong answer the judge should reject, or the gold reworded,
#: which it should accept.
PLANTED, REWORDED = "planted", "reworded"


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


class RewordedAnswer(StrictModel):
    """The gold answer of a question said another way (``rewording`` names how), to be accepted."""

    conversation_id: str
    question_id: str
    category: str
    question: str
    gold: str
    reworded: str
    rewording: str


_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_DAY_MONTH_YEAR = re.compile(rf"^(\d{{1,2}}) ({'|'.join(_MONTHS)}),? (\d{{4}})$", re.IGNORECASE)
_MONTH_YEAR = re.compile(rf"^({'|'.join(_MONTHS)}),? (\d{{4}})$", re.IGNORECASE)
_YEAR = re.compile(r"^(19|20)\d\d$")
_LIST_SEPARATOR = re.compile(r",\s*(?:and\s+)?|\s+and\s+")
_SENTENCES = ("The answer is {}.", "I believe it was {}.", "From what they said: {}.", "{}, as far as I can tell.")


def _reword_date(gold: str, rng: random.Random) -> str | None:
    text = gold.strip()
    if match := _DAY_MONTH_YEAR.match(text):
        day = datetime.strptime(f"{match[1]} {match[2]} {match[3]}", "%d %B %Y")
        return rng.choice(
            (f"{day:%B} {day.day}, {day:%Y}", f"{day:%Y-%m-%d}", f"on {day:%A}, {day.day} {day:%B} {day:%Y}")
        )
    if match := _MONTH_YEAR.match(text):
        return f"in {match[1].capitalize()} of {match[2]}"
    if _YEAR.match(text):
        return f"in the year {text}"
    return None


def _reword_list(gold: str, rng: random.Random) -> str | None:
    items = [item.strip() for item in _LIST_SEPARATOR.split(gold.strip().rstrip(".")) if item.strip()]
    if len(items) < 2:
        return None
    items.reverse()
    return ", ".join(items[:-1]) + " and " + items[-1]


def _reword_sentence(gold: str, rng: random.Random) -> str | None:
    return rng.choice(_SENTENCES).format(gold.strip().rstrip("."))


#: Tried in order; the first that applies rewords the answer (a sentence always applies).
_REWORDINGS: tuple[tuple[str, Callable[[str, random.Random], str | None]], ...] = (
    ("date", _reword_date),
    ("list", _reword_list),
    ("sentence", _reword_sentence),
)


def reword_answers(conversations: Sequence[EvalConversation], size: int, seed: int = 0) -> list[RewordedAnswer]:
    """Up to ``size`` gold answers of ``conversations`` reworded, in question order; seeded."""
    if size < 0:
        raise InvalidInputError(f"the number of reworded answers must be 0 or more, got {size}")
    reworded = []
    for conversation in conversations:
        for question in conversation.questions:
            if not _gradable(question):
                continue
            gold = question.gold or ""
            rng = random.Random(f"{seed}:{question.question_id}")
            name, text = next((n, t) for n, reword in _REWORDINGS if (t := reword(gold, rng)) is not None)
            reworded.append(
                RewordedAnswer(
                    conversation_id=conversation.conversation_id,
                    question_id=question.question_id,
                    category=question.category,
                    question=question.question,
                    gold=gold,
                    reworded=text,
                    rewording=name,
                )
            )
    if size < len(reworded):
        chosen = set(random.Random(seed).sample(range(len(reworded)), size))
        reworded = [r for i, r in enumerate(reworded) if i in chosen]
    return reworded


def summarise_audit(records: Sequence[dict[str, Any]], judge_model_id: str) -> dict[str, Any]:
    """The ``judge_audit`` block of the summary from ``judge_audit.jsonl`` records.

    ``false_accept_rate`` is over the planted answers the judge labelled, ``false_reject_rate``
    (under ``reworded``) over the reworded gold answers it labelled (a failed judge reply counts
    in ``judge_failures``, not as a verdict), each with its Wilson 95% interval.
    """

    def block(rows: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
        wrong_label, error_name, rate = _AUDIT_ERRORS[kind]
        errors = [r["label"] == wrong_label for r in rows if r.get("label") is not None]
        interval = score_interval(errors)
        return {
            kind: len(rows),
            "judged": len(errors),
            error_name: sum(errors),
            "judge_failures": len(rows) - len(errors),
            rate: sum(errors) / len(errors) if errors else None,
            "ci95": None if interval is None else list(interval),
        }

    def per_category(kind: str) -> dict[str, Any]:
        rows = [r for r in records if r.get("kind", PLANTED) == kind]
        categories = sorted({r["category"] for r in rows})
        return {
            **block(rows, kind),
            "by_category": {c: block([r for r in rows if r["category"] == c], kind) for c in categories},
        }

    return {"judge_model": judge_model_id, **per_category(PLANTED), REWORDED: per_category(REWORDED)}


#: Per audit kind: the label that is the judge's error, what the errors are called, and their rate.
_AUDIT_ERRORS = {
    PLANTED: ("CORRECT", "accepted", "false_accept_rate"),
    REWORDED: ("WRONG", "rejected", "false_reject_rate"),
}
