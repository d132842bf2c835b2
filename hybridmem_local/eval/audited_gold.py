"""Corrected gold answers and evidence from an audit of LoCoMo (``--audited-gold FILE``).

An independent audit (dial481/locomo-audit, ``errors.json``) lists questions whose gold answer
or evidence is wrong. Each entry names its question by ``sample_id`` and ``qa_index`` (its place
in that sample's ``qa`` list) and gives ``error_type``, ``correct_answer`` and
``correct_evidence``. ``WRONG_CITATION`` keeps the answer and corrects the evidence; every other
type (HALLUCINATION, TEMPORAL_ERROR, ATTRIBUTION_ERROR, AMBIGUOUS, INCOMPLETE) changes what a
correct answer is. A run scores every question twice: against the benchmark's gold and against
the audited one (the same where the audit has nothing to say).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from hybridmem_local.errors import DatasetError
from hybridmem_local.eval.systems import EvalConversation
from hybridmem_local.files.readers import describe_validation_error
from hybridmem_local.schema import StrictModel

#: The audit's error type that leaves the answer as it is.
WRONG_CITATION = "WRONG_CITATION"


class AuditEntry(StrictModel, extra="ignore"):
    sample_id: str
    qa_index: int
    question: str
    error_type: str
    correct_answer: str
    correct_evidence: list[str]

    @property
    def question_id(self) -> str:
        return f"{self.sample_id}:qa{self.qa_index}"

    @property
    def changes_answer(self) -> bool:
        return self.error_type != WRONG_CITATION


def load_audit(path: Path) -> dict[str, AuditEntry]:
    """The audit's entries by question id; a malformed file is a :class:`DatasetError` naming the entry."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read the audited gold answers: {exc}") from exc
    if not isinstance(raw, list):
        raise DatasetError(f"{path}: the audited gold answers must be a JSON list of entries")
    entries: dict[str, AuditEntry] = {}
    for position, item in enumerate(raw):
        try:
            entry = AuditEntry.model_validate(item)
        except ValidationError as exc:
            raise DatasetError(f"{path} entry {position}: {describe_validation_error(exc)}") from exc
        entries[entry.question_id] = entry
    return entries


def apply_audit(conversations: list[EvalConversation], entries: dict[str, AuditEntry], path: Path) -> int:
    """Set ``gold_audited`` / ``evidence_audited`` on every question of ``conversations``; the
    number of questions whose answer the audit changes. An entry whose question text differs
    from the benchmark's is an error (the audit was made for another version of the file)."""
    changed = 0
    for conversation in conversations:
        for question in conversation.questions:
            entry = entries.get(question.question_id)
            if entry is None:
                question.gold_audited, question.evidence_audited = question.gold, list(question.evidence)
                continue
            if entry.question.strip() != question.question.strip():
                raise DatasetError(
                    f"{path}: the entry for {question.question_id} asks {entry.question!r} but the benchmark asks "
                    f"{question.question!r}: the audit belongs to another version of the data"
                )
            question.gold_audited = entry.correct_answer if entry.changes_answer else question.gold
            question.evidence_audited = list(entry.correct_evidence)
            changed += entry.changes_answer
    return changed
