"""The run's judge: a verdict per answer (against LoCoMo's gold and, where an audit changes it,
the audited gold) and the audit of the judge itself (planted wrong answers it should reject,
reworded gold answers it should accept; ``judge_audit.py``)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from hybridmem_local.answering.answerer import Answer
from hybridmem_local.config import Config
from hybridmem_local.eval.accounting import MeteredLLM, PhaseUsage
from hybridmem_local.eval.judge import build_judge_request, verdict_of
from hybridmem_local.eval.judge_audit import (
    JUDGE_AUDIT,
    PLANTED,
    REWORDED,
    plant_answers,
    reword_answers,
    summarise_audit,
)
from hybridmem_local.eval.llms import Models
from hybridmem_local.eval.locomo import ADVERSARIAL
from hybridmem_local.eval.options import RunOptions
from hybridmem_local.eval.records import Verdict, append_jsonl, read_records
from hybridmem_local.eval.systems import EvalConversation, EvalQuestion
from hybridmem_local.llm.base import StructuredLLM
from hybridmem_local.prompts import load_prompt, prompt_names

#: How a phase's LLM use is recorded: (phase, usage, conversation id).
UsageRecorder = Callable[[str, PhaseUsage, str], None]


class Judging:
    def __init__(
        self,
        options: RunOptions,
        config: Config,
        config_hash: str,
        models: Models,
        console: Console,
        record_usage: UsageRecorder,
    ):
        self.options = options
        self.config = config
        self.config_hash = config_hash
        self.models = models
        self.console = console
        self.record_usage = record_usage

    def verdicts(
        self, llm: StructuredLLM, namespace: str, batch: list[EvalQuestion], predictions: list[str]
    ) -> list[tuple[Verdict | None, str | None, float | None]]:
        """(verdict, judge error, judge seconds) per question; adversarial ones are not judged."""
        out: list[tuple[Verdict | None, str | None, float | None]] = [(None, None, None)] * len(batch)
        requests, positions = [], []
        for i, (question, prediction) in enumerate(zip(batch, predictions, strict=True)):
            if question.category_number == ADVERSARIAL:
                continue  # mem0's protocol: adversarial questions get the official F1 rule only
            if not prediction:
                out[i] = (Verdict(label="WRONG", reasoning="no answer was produced", judged_by_llm=False), None, None)
                continue
            requests.append(
                build_judge_request(
                    question.question,
                    question.gold or "",
                    prediction,
                    self.options.benchmark,
                    question.category,
                    abstention=question.abstention,
                    locomo_judge=self.options.judge_prompt,
                ).model_copy(update={"tag": namespace})
            )
            positions.append(i)
        for i, result in zip(positions, llm.generate(requests) if requests else [], strict=True):
            verdict = verdict_of(result)
            if verdict is None:
                out[i] = (None, result.error or "reply is not a JudgeVerdict", result.latency_s)
            else:
                out[i] = (Verdict(label=verdict.label, reasoning=verdict.reasoning), None, result.latency_s)
        return out

    def audited_verdicts(
        self,
        llm: StructuredLLM,
        namespace: str,
        batch: list[EvalQuestion],
        answers: list[Answer | None],
        verdicts: list[tuple[Verdict | None, str | None, float | None]],
    ) -> list[Verdict | None]:
        """The verdict against the audited gold: the original one where the audit keeps the
        answer, one more judge call where it changes it; None without an audit."""
        out: list[Verdict | None] = []
        changed = []
        for i, (question, (verdict, _, _)) in enumerate(zip(batch, verdicts, strict=True)):
            if question.evidence_audited is None or question.category_number == ADVERSARIAL:
                out.append(None)
            elif question.gold_audited == question.gold:
                out.append(verdict)
            else:
                out.append(None)
                changed.append(i)
        texts = ["" if answer is None else answer.answer for answer in answers]
        regraded = self.verdicts(
            llm,
            namespace,
            [batch[i].model_copy(update={"gold": batch[i].gold_audited}) for i in changed],
            [texts[i] for i in changed],
        )
        for i, (verdict, _, _) in zip(changed, regraded, strict=True):
            out[i] = verdict
        return out

    def audit(self, conversations: list[EvalConversation]) -> dict[str, Any]:
        """Grade planted wrong answers and reworded gold answers (``judge_audit.py``); rows already
        in ``judge_audit.jsonl`` under this config and these prompts are reused, so a rerun asks
        the judge nothing."""
        path = self.options.out / JUDGE_AUDIT
        key = hashlib.sha256(
            json.dumps(
                {
                    "config": self.config_hash,
                    "prompts": [load_prompt(n).version for n in prompt_names()],
                    "judge_prompt": self.options.judge_prompt,
                },
                sort_keys=True,
            ).encode("utf-8")
        ).hexdigest()[:16]
        seed = self.config.llm.seed
        graded = [
            (PLANTED, p.question_id, p.question, p.gold, p.category, p.planted, p.model_dump())
            for p in plant_answers(conversations, self.options.judge_audit, seed=seed)
        ] + [
            (REWORDED, r.question_id, r.question, r.gold, r.category, r.reworded, r.model_dump())
            for r in reword_answers(conversations, self.options.judge_rewordings, seed=seed)
        ]
        known = {
            (r.get("kind", PLANTED), r["question_id"], r.get("reworded", r.get("planted"))): r
            for r in read_records(path)
            if r.get("audit_key") == key
        }
        todo = [g for g in graded if (g[0], g[1], g[5]) not in known]
        # In batches, each on disk (rows and cost) as it ends, as the questions' are: a run
        # stopped during the audit resumes it where it stopped.
        for start in range(0, len(todo), self.options.batch_size):
            batch = todo[start : start + self.options.batch_size]
            usage = PhaseUsage()
            judge = MeteredLLM(self.models.judge, usage)
            started = time.perf_counter()
            requests = [
                build_judge_request(
                    question, gold, answer, self.options.benchmark, category, locomo_judge=self.options.judge_prompt
                ).model_copy(update={"tag": "judge-audit"})
                for _, _, question, gold, category, answer, _ in batch
            ]
            rows = []
            for (kind, _, _, _, _, _, fields), result in zip(batch, judge.generate(requests), strict=True):
                verdict = verdict_of(result)
                rows.append(
                    {
                        "audit_key": key,
                        "kind": kind,
                        **fields,
                        "label": None if verdict is None else verdict.label,
                        "reasoning": None if verdict is None else verdict.reasoning,
                        "judge_error": None if verdict is not None else result.error or "reply is not a JudgeVerdict",
                    }
                )
            append_jsonl(path, rows)
            known.update({(r["kind"], r["question_id"], r.get("reworded", r.get("planted"))): r for r in rows})
            usage.wall_s, usage.units = time.perf_counter() - started, len(batch)
            self.record_usage("judge_audit", usage, conversations[0].conversation_id)
        audit = {
            "audit_key": key,
            **summarise_audit([known[(g[0], g[1], g[5])] for g in graded], self.models.judge_model_id()),
        }
        if audit["judged"]:
            self.console.print(
                f"judge audit: {audit['accepted']} of {audit['judged']} planted wrong answers accepted "
                f"({100 * audit['false_accept_rate']:.1f}% false accepts)"
            )
        if audit[REWORDED]["judged"]:
            self.console.print(
                f"judge audit: {audit[REWORDED]['rejected']} of {audit[REWORDED]['judged']} reworded gold answers "
                f"rejected ({100 * audit[REWORDED]['false_reject_rate']:.1f}% false rejects)"
            )
        return audit
