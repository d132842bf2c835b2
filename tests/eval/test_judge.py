"""Judge prompts: which prompt grades which question, the rendered request, the verdict schema."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hybridmem_local.errors import PromptError
from hybridmem_local.eval.judge import (
    LONGMEMEVAL_JUDGE_PROMPTS,
    JudgeVerdict,
    build_judge_request,
)
from hybridmem_local.prompts import PromptTemplate, load_prompt


def test_locomo_request_renders_mem0_judge_with_the_three_values():
    request = build_judge_request(
        "When did Caroline go to the support group?", "7 May 2023", "On May 7th", "locomo", "temporal"
    )
    assert request.output_schema is JudgeVerdict
    assert request.prompt_version == "judge-locomo/v1"
    [message] = request.messages  # the reference judge sends a single user message
    assert message.role == "user"
    assert "Question: When did Caroline go to the support group?" in message.content
    assert "Gold answer: 7 May 2023" in message.content
    assert "Generated answer: On May 7th" in message.content
    assert '"May 7th" vs "7 May"' in message.content  # generous on date formats
    assert "$" not in message.content


@pytest.mark.parametrize(
    ("question_type", "version", "rule"),
    [
        ("single-session-user", "judge-longmemeval-factual/v1", "only contains a subset"),
        ("single-session-assistant", "judge-longmemeval-factual/v1", "only contains a subset"),
        ("multi-session", "judge-longmemeval-factual/v1", "only contains a subset"),
        ("temporal-reasoning", "judge-longmemeval-temporal/v1", "do not penalize off-by-one errors"),
        ("knowledge-update", "judge-longmemeval-knowledge-update/v1", "along with an updated answer"),
        ("single-session-preference", "judge-longmemeval-preference/v1", "Rubric: be concise"),
    ],
)
def test_longmemeval_request_per_question_type(question_type, version, rule):
    request = build_judge_request("Q?", "be concise", "R.", "longmemeval", question_type)
    assert request.prompt_version == version
    assert rule in request.messages[-1].content
    assert request.messages[-1].content.count("Model Response: R.") == 1


def test_longmemeval_abstention_overrides_the_type():
    request = build_judge_request(
        "Q?", "You never mentioned a cello.", "I don't know.", "longmemeval", "temporal-reasoning", abstention=True
    )
    assert request.prompt_version == "judge-longmemeval-abstention/v1"
    assert "Explanation: You never mentioned a cello." in request.messages[-1].content


def test_every_longmemeval_type_has_a_loadable_prompt():
    for name in set(LONGMEMEVAL_JUDGE_PROMPTS.values()):
        assert load_prompt(name).version.endswith("/v1")


@pytest.mark.parametrize(
    ("benchmark", "question_type", "message"),
    [
        ("longmemeval", None, "unknown LongMemEval question type"),
        ("longmemeval", "trivia", "unknown LongMemEval question type"),
        ("locomo", "adversarial", "adversarial LoCoMo questions are not judged"),
        ("locomo", "trivia", "unknown LoCoMo category"),
        ("squad", None, "unknown benchmark"),
    ],
)
def test_unknown_question_kinds_are_errors(benchmark, question_type, message):
    with pytest.raises(ValueError, match=message):
        build_judge_request("Q?", "A", "P", benchmark, question_type)


def test_values_with_dollar_signs_and_braces_are_kept_verbatim():
    request = build_judge_request("Cost of {x}?", "$5", "${gold} $$", "locomo")
    assert "Gold answer: $5" in request.messages[0].content
    assert "Generated answer: ${gold} $$" in request.messages[0].content


def test_judge_verdict_schema():
    verdict = JudgeVerdict.model_validate_json('{"reasoning": "Same date.", "label": "CORRECT"}')
    assert verdict.correct
    assert not JudgeVerdict(reasoning="Different city.", label="WRONG").correct
    assert list(JudgeVerdict.model_json_schema()["properties"]) == ["reasoning", "label"]
    with pytest.raises(ValidationError):
        JudgeVerdict.model_validate_json('{"reasoning": "?", "label": "MAYBE"}')


def test_prompt_template_reports_missing_placeholders():
    template = PromptTemplate(name="t", version="t/v1", system="Be $tone.", user="Say $word.")
    assert [m.content for m in template.messages(tone="brief", word="hi")] == ["Be brief.", "Say hi."]
    with pytest.raises(PromptError, match=r"prompt 't': no value for placeholder \$word"):
        template.messages(tone="brief")


@pytest.mark.parametrize(
    ("name", "message"), [("../config", "invalid prompt name"), ("no_such_prompt", "cannot read prompt")]
)
def test_load_prompt_errors(name, message):
    with pytest.raises(PromptError, match=message):
        load_prompt(name)
