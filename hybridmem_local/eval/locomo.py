"""LoCoMo loader: the official ``locomo10.json`` format into conversations with their questions.

The conversations are read by :class:`hybridmem_local.files.session_files.LocomoReader` (the format, the
session dates read as UTC, the skipped empty sessions); this module adds each sample's ``qa``.

Evidence ids in the official file are not all clean (``"D8:6; D9:17"``, ``"D:11:26"``,
``"D30:05"``, ``"D"``, ids of turns that do not exist). They are normalised where the intended
id is unambiguous; every deviation is recorded in :attr:`LocomoDataset.evidence_issues`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hybridmem_local.errors import DatasetError
from hybridmem_local.files.readers import describe_validation_error
from hybridmem_local.files.session_files import LocomoReader, LocomoSample, parse_session_date
from hybridmem_local.schema import Session, StrictModel, check_namespace

__all__ = ["ADVERSARIAL", "CATEGORY_NAMES", "LocomoConversation", "LocomoDataset", "load_locomo", "parse_session_date"]

CategoryName = Literal["multi-hop", "temporal", "open-domain", "single-hop", "adversarial"]
CATEGORY_NAMES: dict[int, CategoryName] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
ADVERSARIAL = 5

# One evidence id, tolerating the stray colon of "D:11:26" and zero padding of "D30:05".
_EVIDENCE_ID = re.compile(r"^D:?(\d+):(\d+)$")
_EVIDENCE_SEPARATORS = re.compile(r"[\s;,]+")


# --------------------------------------------------------------------------- raw records


class _RawQuestion(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    question: str
    answer: str | int | None = None
    adversarial_answer: str | None = None
    evidence: list[str]
    category: int = Field(ge=1, le=5)


# --------------------------------------------------------------------------- loaded records


class LocomoQuestion(StrictModel):
    #: ``"{sample_id}:qa{index}"``, the index in the file's ``qa`` list (stable under filtering).
    question_id: str
    question: str
    #: None only for adversarial questions, which have an ``adversarial_answer`` instead.
    answer: str | None
    adversarial_answer: str | None = None
    #: Normalised dia_ids (= turn ids) of the turns that hold the answer; may be empty.
    evidence: list[str]
    category: int = Field(ge=1, le=5)
    category_name: CategoryName


class EvidenceIssue(StrictModel):
    """One evidence string of the file that was not a clean id of an existing turn."""

    question_id: str
    raw: str
    #: split: several ids in one string; repaired: reformatted ("D:11:26", "D30:05");
    #: unresolvable: no id could be read ("D"); dangling: well formed but no such turn.
    kind: Literal["split", "repaired", "unresolvable", "dangling"]
    #: The ids kept from ``raw`` (empty for unresolvable and dangling).
    kept: list[str]


class LocomoConversation(StrictModel):
    sample_id: str
    namespace: str
    speaker_a: str
    speaker_b: str
    sessions: list[Session]
    questions: list[LocomoQuestion]

    _check_namespace = field_validator("namespace")(classmethod(lambda cls, v: check_namespace(v)))


class LocomoDataset(StrictModel):
    path: Path
    conversations: list[LocomoConversation]
    evidence_issues: list[EvidenceIssue] = Field(default_factory=list)
    #: Session numbers without turns: none listed, an empty list, or only blank turns.
    empty_sessions_skipped: int = 0
    #: Turns with neither text nor an image caption.
    empty_turns_skipped: int = 0

    def questions(self) -> list[LocomoQuestion]:
        return [q for c in self.conversations for q in c.questions]


# --------------------------------------------------------------------------- loading


def load_locomo(
    path: str | Path,
    *,
    include_adversarial: bool = False,
    namespace_prefix: str = "",
) -> LocomoDataset:
    """Load a LoCoMo file (``locomo10.json`` or a subset in the same format).

    Each conversation goes to namespace ``namespace_prefix + sample_id`` (LoCoMo's turn ids
    repeat across conversations, so conversations must not share a namespace). Adversarial
    questions (category 5) are left out unless ``include_adversarial`` is set, as in the
    standard protocol. Raises :class:`DatasetError` naming file, sample, session/turn/QA index
    and field when the file does not have the official shape.
    """
    path = Path(path)
    loader = _Loader(path, DatasetError)
    conversations = [
        loader.conversation(raw, sample, include_adversarial) for raw, sample in loader.samples(namespace_prefix)
    ]
    return LocomoDataset(
        path=path,
        conversations=conversations,
        evidence_issues=loader.evidence_issues,
        empty_sessions_skipped=loader.empty_sessions_skipped,
        empty_turns_skipped=loader.empty_turns_skipped,
    )


class _Loader(LocomoReader):
    """The conversations as ``ingest`` reads them, with their questions and evidence checked."""

    def __init__(self, path: Path, error: type[DatasetError]):
        super().__init__(path, error)
        self.evidence_issues: list[EvidenceIssue] = []

    def conversation(self, raw: dict, sample: LocomoSample, include_adversarial: bool) -> LocomoConversation:
        where = sample.where
        qa = raw.get("qa")
        if not isinstance(qa, list):
            raise self.error(where, "field 'qa': missing or not a list")
        turn_ids = {turn.turn_id for session in sample.sessions for turn in session.turns}
        questions = []
        for qa_index, record in enumerate(qa):
            question, issues = self.question(
                f"{where} qa {qa_index}", f"{sample.sample_id}:qa{qa_index}", record, turn_ids
            )
            # Issues are reported for the questions that are loaded, so counts match the data.
            if question.category != ADVERSARIAL or include_adversarial:
                questions.append(question)
                self.evidence_issues.extend(issues)
        return LocomoConversation(
            sample_id=sample.sample_id,
            namespace=sample.namespace,
            speaker_a=sample.speaker_a,
            speaker_b=sample.speaker_b,
            sessions=sample.sessions,
            questions=questions,
        )

    def question(
        self, where: str, question_id: str, record: object, turn_ids: set[str]
    ) -> tuple[LocomoQuestion, list[EvidenceIssue]]:
        try:
            raw = _RawQuestion.model_validate(record)
        except ValidationError as exc:
            raise self.error(where, describe_validation_error(exc)) from exc
        if raw.category != ADVERSARIAL and raw.answer is None:
            raise self.error(where, f"field 'answer': missing for a category-{raw.category} question")
        if raw.category == ADVERSARIAL and raw.answer is None and raw.adversarial_answer is None:
            raise self.error(where, "field 'adversarial_answer': missing for an adversarial question")
        evidence, issues = normalise_evidence(question_id, raw.evidence, turn_ids)
        question = LocomoQuestion(
            question_id=question_id,
            question=raw.question,
            answer=None if raw.answer is None else str(raw.answer),
            adversarial_answer=raw.adversarial_answer,
            evidence=evidence,
            category=raw.category,
            category_name=CATEGORY_NAMES[raw.category],
        )
        return question, issues


def normalise_evidence(
    question_id: str, raw_evidence: list[str], turn_ids: set[str]
) -> tuple[list[str], list[EvidenceIssue]]:
    """Clean evidence ids (in order, without duplicates) and the issues met on the way."""
    kept: list[str] = []
    issues: list[EvidenceIssue] = []
    for raw in raw_evidence:
        tokens = [t for t in _EVIDENCE_SEPARATORS.split(raw) if t]
        ids: list[str] = []
        dangling: list[str] = []
        unreadable: list[str] = []
        for token in tokens:
            match = _EVIDENCE_ID.match(token)
            if match is None:
                unreadable.append(token)
                continue
            dia_id = f"D{int(match.group(1))}:{int(match.group(2))}"
            (ids if dia_id in turn_ids else dangling).append(dia_id)
        if unreadable or not tokens:
            issues.append(EvidenceIssue(question_id=question_id, raw=raw, kind="unresolvable", kept=ids))
        elif dangling:
            issues.append(EvidenceIssue(question_id=question_id, raw=raw, kind="dangling", kept=ids))
        elif len(tokens) > 1:
            issues.append(EvidenceIssue(question_id=question_id, raw=raw, kind="split", kept=ids))
        elif ids != [raw]:
            issues.append(EvidenceIssue(question_id=question_id, raw=raw, kind="repaired", kept=ids))
        kept.extend(i for i in ids if i not in kept)
    return kept, issues
