"""scripts/measure_curation_parity.py: evidence recall of the levers-off curation, paired with the study's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridmem_local.eval.locomo import CATEGORY_NAMES, LocomoQuestion
from tests.factories import load_script

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT = REPO / "docs/results/locomo-study/shards/conv-42/memories/conv-42.jsonl"


@pytest.fixture(scope="module")
def parity_script():
    return load_script("measure_curation_parity")


def question(index: int, evidence: list[str], category: int = 1) -> LocomoQuestion:
    return LocomoQuestion(
        question_id=f"c:qa{index}",
        question="?",
        answer="a",
        evidence=evidence,
        category=category,
        category_name=CATEGORY_NAMES[category],
    )


def test_only_questions_of_categories_1_to_4_with_all_evidence_in_the_sessions_count(parity_script):
    questions = [
        question(0, ["D1:1"]),
        question(1, ["D1:2", "D2:1"]),  # half its evidence in a later session
        question(2, []),  # no evidence: nothing to cover
        question(3, ["D1:3"], category=5),  # adversarial
        question(4, ["D1:1", "D1:4"], category=4),
    ]
    chosen = parity_script.covered_questions(questions, {"D1:1", "D1:2", "D1:3", "D1:4"})
    assert [q.question_id for q in chosen] == ["c:qa0", "c:qa4"]


def test_parity_pairs_the_two_curations_question_by_question(parity_script):
    questions = [question(0, ["D1:1"]), question(1, ["D1:2", "D1:3"]), question(2, ["D1:4"])]
    # levers on cover q0 and q1 (both turns); today covers q0 and only half of q1's evidence
    result = parity_script.parity(questions, today={"D1:1", "D1:2"}, levers_on={"D1:1", "D1:2", "D1:3"})
    assert [(r["today"], r["levers_on"]) for r in result["rows"]] == [(True, True), (False, True), (False, False)]
    assert (result["today"]["covered"], result["levers_on"]["covered"]) == (1, 2)
    assert result["difference"]["value"] == pytest.approx(1 / 3)
    low, high = result["difference"]["ci95"]
    assert low <= 1 / 3 <= high


def test_the_levers_on_side_reads_only_the_chosen_sessions_of_the_study_checkpoint(parity_script, tmp_path):
    if not CHECKPOINT.exists():
        pytest.skip(f"the study's conv-42 checkpoint is not in this checkout ({CHECKPOINT})")
    first, first_memories = parity_script.checkpoint_turns(CHECKPOINT, {"conv-42:session_1"})
    both, both_memories = parity_script.checkpoint_turns(CHECKPOINT, {"conv-42:session_1", "conv-42:session_2"})
    assert first and all(turn_id.startswith("D1:") for turn_id in first)
    assert first < both and first_memories < both_memories
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"type": "checkpoint", "key": "k", "namespace": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="holds no memory of the sessions"):
        parity_script.checkpoint_turns(other, {"conv-42:session_1"})
