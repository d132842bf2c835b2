"""LLM-as-a-judge: which prompt grades which question, the request, and the verdict schema.

The prompts live in ``hybridmem_local/prompts/judge_*.yaml``: mem0's LoCoMo judge, a strict
LoCoMo judge, and LongMemEval's per-type answer checks, each asking for a :class:`JudgeVerdict` as JSON.
Running the requests is the caller's job (any :class:`~hybridmem_local.llm.base.StructuredLLM`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.eval import Benchmark
from hybridmem_local.eval.locomo import CATEGORY_NAMES
from hybridmem_local.llm.base import LLMRequest, LLMResult
from hybridmem_local.prompts import load_prompt
from hybridmem_local.schema import StrictModel

#: LongMemEval question type → judge prompt (as in LongMemEval's ``get_anscheck_prompt``).
LONGMEMEVAL_JUDGE_PROMPTS: dict[str, str] = {
    "single-session-user": "judge_longmemeval_factual",
    "single-session-assistant": "judge_longmemeval_factual",
    "multi-session": "judge_longmemeval_factual",
    "temporal-reasoning": "judge_longmemeval_temporal",
    "knowledge-update": "judge_longmemeval_knowledge_update",
    "single-session-preference": "judge_longmemeval_preference",
}
LONGMEMEVAL_ABSTENTION_PROMPT = "judge_longmemeval_abstention"
#: LoCoMo judge prompts by name: mem0's (the one papers report, "generous") and a strict one
#: (the same fact, the same time), whose error rates docs/benchmarks.md §15 measures.
LOCOMO_JUDGE_PROMPTS: dict[str, str] = {"mem0": "judge_locomo", "strict": "judge_locomo_strict"}
LocomoJudge = Literal["mem0", "strict"]

#: A one-sentence reason and a label fit comfortably; the cap stops a runaway judge.
JUDGE_MAX_NEW_TOKENS = 256


class JudgeVerdict(StrictModel):
    """The judge's reply. ``reasoning`` comes first so the model reasons before it labels."""

    reasoning: str = Field(description="One sentence explaining the label")
    label: Literal["CORRECT", "WRONG"]

    @property
    def correct(self) -> bool:
        return self.label == "CORRECT"


def judge_prompt_name(
    benchmark: Benchmark, question_type: str | None, abstention: bool = False, locomo_judge: LocomoJudge = "mem0"
) -> str:
    """The prompt file that grades this kind of question (``locomo_judge`` picks LoCoMo's)."""
    if benchmark == "locomo":
        if question_type == CATEGORY_NAMES[5]:
            raise InvalidInputError(
                "adversarial LoCoMo questions are not judged (mem0's protocol skips them); "
                "score them with metrics.f1_official(prediction, gold, 5)"
            )
        if question_type is not None and question_type not in CATEGORY_NAMES.values():
            raise InvalidInputError(
                f"unknown LoCoMo category {question_type!r}; expected one of {list(CATEGORY_NAMES.values())}"
            )
        return LOCOMO_JUDGE_PROMPTS[locomo_judge]
    if benchmark == "longmemeval":
        if question_type not in LONGMEMEVAL_JUDGE_PROMPTS:
            raise InvalidInputError(
                f"unknown LongMemEval question type {question_type!r}; "
                f"expected one of {list(LONGMEMEVAL_JUDGE_PROMPTS)}"
            )
        return LONGMEMEVAL_ABSTENTION_PROMPT if abstention else LONGMEMEVAL_JUDGE_PROMPTS[question_type]
    raise InvalidInputError(f"unknown benchmark {benchmark!r}; expected 'locomo' or 'longmemeval'")


def build_judge_request(
    question: str,
    gold: str,
    prediction: str,
    benchmark: Benchmark,
    question_type: str | None = None,
    *,
    abstention: bool = False,
    locomo_judge: LocomoJudge = "mem0",
) -> LLMRequest:
    """One judge call whose reply must be a :class:`JudgeVerdict`.

    ``question_type`` is the LoCoMo category name (optional: one prompt serves all) or the
    LongMemEval question type (required). ``abstention`` marks LongMemEval ``_abs`` questions,
    whose ``gold`` is the explanation of why the question cannot be answered. ``locomo_judge``
    picks the LoCoMo prompt (:data:`LOCOMO_JUDGE_PROMPTS`).
    """
    prompt = load_prompt(judge_prompt_name(benchmark, question_type, abstention, locomo_judge))
    return LLMRequest(
        messages=prompt.messages(question=question, gold=gold, prediction=prediction),
        output_schema=JudgeVerdict,
        max_new_tokens=JUDGE_MAX_NEW_TOKENS,
        enable_thinking=False,
        prompt_version=prompt.version,
    )


def verdict_of(result: LLMResult) -> JudgeVerdict | None:
    """The judge's verdict in ``result``; None when the call failed or the reply is not one."""
    return result.parsed if result.ok and isinstance(result.parsed, JudgeVerdict) else None
