"""The judge audit: which wrong answers are planted, and how the false-accept rate is summed."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from hybridmem_local.eval.judge_audit import plant_answers, summarise_audit
from hybridmem_local.eval.metrics import token_f1, wilson_interval
from hybridmem_local.eval.systems import EvalConversation, EvalQuestion
from hybridmem_local.schema import Session, Turn

WHEN = datetime(2023, 5, 8, tzinfo=timezone.utc)


def _conversation(
    conversation_id: str, people: tuple[str, str], questions: list[tuple[str, str, str]]
) -> EvalConversation:
    turns = [Turn(turn_id=f"{conversation_id}:D1:{i}", speaker=people[i % 2], text=f"turn {i}") for i in range(4)]
    session = Session(session_id=f"{conversation_id}:s1", namespace=conversation_id, started_at=WHEN, turns=turns)
    return EvalConversation(
        conversation_id=conversation_id,
        namespace=conversation_id,
        sessions=[session],
        questions=[
            EvalQuestion(
                question_id=f"{conversation_id}:q{i}",
                question=text,
                gold=gold,
                category=category,
                category_number=5 if category == "adversarial" else 1,
            )
            for i, (text, gold, category) in enumerate(questions)
        ],
    )


CAROLINE_MELANIE = _conversation(
    "c1",
    ("Caroline", "Melanie"),
    [
        ("What did Caroline research?", "adoption agencies", "single-hop"),
        ("When did Caroline go to the support group?", "7 May 2023", "temporal"),
        ("What is Caroline's identity?", "transgender woman", "single-hop"),
        ("What did Melanie paint?", "a lake sunrise", "single-hop"),
        ("When did Melanie run a charity race?", "the Sunday before 25 May 2023", "temporal"),
        ("What would Caroline never do?", "give up", "adversarial"),
    ],
)


def test_planted_answers_are_other_questions_gold_about_the_same_person_and_share_no_token():
    planted = plant_answers([CAROLINE_MELANIE], size=100)
    by_question = {p.question_id: p for p in planted}
    gold = {q.question_id: q for q in CAROLINE_MELANIE.questions}
    assert "c1:q5" not in by_question  # adversarial questions are not judged, so not audited
    assert set(by_question) == {"c1:q0", "c1:q1", "c1:q2", "c1:q3", "c1:q4"}
    for p in planted:
        lender = gold[p.planted_from]
        assert p.planted == lender.gold and p.planted_from != p.question_id
        assert token_f1(p.planted, p.gold) == 0.0  # on topic but wrong
    # Caroline's single-hop question gets the other Caroline single-hop answer.
    assert by_question["c1:q0"].planted_from == "c1:q2" and by_question["c1:q2"].planted_from == "c1:q0"
    # The two dates share "May 2023": the temporal question about Caroline borrows a Caroline answer instead.
    assert by_question["c1:q1"].planted_from in {"c1:q0", "c1:q2"}
    # Melanie's questions have no same-category lender about her: another Melanie question lends.
    assert by_question["c1:q3"].planted_from == "c1:q4"


def test_planting_is_seeded_and_samples_down_to_the_size():
    assert plant_answers([CAROLINE_MELANIE], size=100) == plant_answers([CAROLINE_MELANIE], size=100)
    two = plant_answers([CAROLINE_MELANIE], size=2, seed=3)
    assert len(two) == 2 and two == plant_answers([CAROLINE_MELANIE], size=2, seed=3)
    assert {p.question_id for p in two} < {p.question_id for p in plant_answers([CAROLINE_MELANIE], size=100)}
    assert plant_answers([CAROLINE_MELANIE], size=0) == []
    with pytest.raises(ValueError, match="0 or more"):
        plant_answers([CAROLINE_MELANIE], size=-1)


def test_one_question_histories_borrow_from_another_history_of_the_same_type():
    histories = [
        _conversation("h1", ("user", "assistant"), [("Where did I move?", "Lisbon", "single-hop")]),
        _conversation("h2", ("user", "assistant"), [("What car do I drive?", "a red Volvo", "single-hop")]),
        _conversation("h3", ("user", "assistant"), [("When did I start?", "March", "temporal")]),
    ]
    planted = {p.question_id: p.planted_from for p in plant_answers(histories, size=10)}
    assert planted == {"h1:q0": "h2:q0", "h2:q0": "h1:q0"}  # h3 has no temporal lender


def test_audit_summary_counts_accepts_over_labelled_answers_only():
    rows = [
        {"category": "single-hop", "label": "CORRECT"},
        {"category": "single-hop", "label": "WRONG"},
        {"category": "temporal", "label": "WRONG"},
        {"category": "temporal", "label": None},  # the judge's reply failed: not a rejection
    ]
    audit = summarise_audit(rows, "llamacpp:some-judge")
    assert (audit["planted"], audit["judged"], audit["accepted"], audit["judge_failures"]) == (4, 3, 1, 1)
    assert audit["false_accept_rate"] == pytest.approx(1 / 3)
    low, high = audit["ci95"]
    assert low <= 1 / 3 <= high
    assert audit["by_category"]["temporal"]["false_accept_rate"] == 0.0
    # None accepted of the 1 judged: a rate one answer cannot pin to 0 (Wilson's 0–79%, not the bootstrap's 0–0).
    assert audit["by_category"]["temporal"]["ci95"] == pytest.approx(list(wilson_interval(0, 1)))
    assert audit["by_category"]["temporal"]["ci95"][1] > 0.75
    assert audit["by_category"]["single-hop"]["accepted"] == 1
    assert summarise_audit([], "j")["false_accept_rate"] is None
