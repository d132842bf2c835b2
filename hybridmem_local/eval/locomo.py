"""LoCoMo loader: the official ``locomo10.json`` format into :class:`~hybridmem_local.schema.Session` s.

The file is a JSON list of samples ``{sample_id, conversation, qa, ...}``. A conversation holds
``speaker_a``, ``speaker_b`` and numbered sessions: ``session_N`` (a list of turns
``{speaker, dia_id, text, blip_caption?, ...}``) with its date ``session_N_date_time``, e.g.
``"1:56 pm on 8 May, 2023"``. Sessions are read in numeric order; a date without turns (the
official file lists dates for sessions that were never written) is skipped and counted.

Session dates carry no timezone in the benchmark; they are read as **UTC** so every
``started_at`` is timezone-aware and the order and day arithmetic of the original are kept.

Evidence ids in the official file are not all clean (``"D8:6; D9:17"``, ``"D:11:26"``,
``"D30:05"``, ``"D"``, ids of turns that do not exist). They are normalised where the intended
id is unambiguous; every deviation is recorded in :attr:`LocomoDataset.evidence_issues`.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hybridmem_local.eval import DatasetError, describe_validation_error, read_json_list
from hybridmem_local.schema import Session, Turn, check_namespace

CATEGORY_NAMES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
ADVERSARIAL = 5

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_SESSION_DATE_KEY = re.compile(r"^session_(\d+)_date_time$")
# "1:56 pm on 8 May, 2023"; parsed by hand so the result does not depend on the C locale.
_SESSION_DATE = re.compile(
    r"^\s*(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$",
    re.IGNORECASE,
)
_MONTHS = {
    name: number
    for number, names in enumerate(
        [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"),
         ("may",), ("june", "jun"), ("july", "jul"), ("august", "aug"),
         ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
         ("december", "dec")],
        start=1,
    )
    for name in names
}
# One evidence id, tolerating the stray colon of "D:11:26" and zero padding of "D30:05".
_EVIDENCE_ID = re.compile(r"^D:?(\d+):(\d+)$")
_EVIDENCE_SEPARATORS = re.compile(r"[\s;,]+")


def parse_session_date(value: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` → ``2023-05-08 13:56 UTC`` (the benchmark has no zones)."""
    match = _SESSION_DATE.match(value)
    if not match:
        raise ValueError(f"date {value!r} is not like '1:56 pm on 8 May, 2023'")
    hour, minute, meridiem, day, month_name, year = match.groups()
    month = _MONTHS.get(month_name.lower())
    if month is None:
        raise ValueError(f"date {value!r}: unknown month {month_name!r}")
    hour_12 = int(hour)
    if not 1 <= hour_12 <= 12:
        raise ValueError(f"date {value!r}: hour {hour_12} is not on a 12-hour clock")
    hour_24 = hour_12 % 12 + (12 if meridiem.lower() == "p" else 0)
    return datetime(int(year), month, int(day), hour_24, int(minute), tzinfo=timezone.utc)


# --------------------------------------------------------------------------- raw records


class _RawTurn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    speaker: str
    dia_id: str
    text: str
    blip_caption: str | None = None


class _RawQuestion(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    question: str
    answer: str | int | None = None
    adversarial_answer: str | None = None
    evidence: list[str]
    category: int = Field(ge=1, le=5)


# --------------------------------------------------------------------------- loaded records


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocomoQuestion(_Strict):
    #: ``"{sample_id}:qa{index}"``, the index in the file's ``qa`` list (stable under filtering).
    question_id: str
    question: str
    #: None only for adversarial questions, which have an ``adversarial_answer`` instead.
    answer: str | None
    adversarial_answer: str | None = None
    #: Normalised dia_ids (= turn ids) of the turns that hold the answer; may be empty.
    evidence: list[str]
    category: int = Field(ge=1, le=5)
    category_name: Literal["multi-hop", "temporal", "open-domain", "single-hop", "adversarial"]


class EvidenceIssue(_Strict):
    """One evidence string of the file that was not a clean id of an existing turn."""

    question_id: str
    raw: str
    #: split: several ids in one string; repaired: reformatted ("D:11:26", "D30:05");
    #: unresolvable: no id could be read ("D"); dangling: well formed but no such turn.
    kind: Literal["split", "repaired", "unresolvable", "dangling"]
    #: The ids kept from ``raw`` (empty for unresolvable and dangling).
    kept: list[str]


class LocomoConversation(_Strict):
    sample_id: str
    namespace: str
    speaker_a: str
    speaker_b: str
    sessions: list[Session]
    questions: list[LocomoQuestion]

    _check_namespace = field_validator("namespace")(classmethod(lambda cls, v: check_namespace(v)))

    def in_namespace(self, namespace: str) -> LocomoConversation:
        """The same conversation with every session moved to ``namespace``."""
        check_namespace(namespace)
        sessions = [s.model_copy(update={"namespace": namespace}) for s in self.sessions]
        return self.model_copy(update={"namespace": namespace, "sessions": sessions})


class LocomoDataset(_Strict):
    path: Path
    conversations: list[LocomoConversation]
    evidence_issues: list[EvidenceIssue] = Field(default_factory=list)
    #: Session numbers without turns: none listed, an empty list, or only blank turns.
    empty_sessions_skipped: int = 0
    #: Turns with neither text nor an image caption.
    empty_turns_skipped: int = 0

    def questions(self) -> list[LocomoQuestion]:
        return [q for c in self.conversations for q in c.questions]

    def evidence_issue_counts(self) -> dict[str, int]:
        return dict(Counter(issue.kind for issue in self.evidence_issues))


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
    loader = _Loader(path)
    conversations = [
        loader.conversation(index, sample, include_adversarial, namespace_prefix)
        for index, sample in enumerate(read_json_list(path))
    ]
    seen: set[str] = set()
    for conversation in conversations:
        if conversation.sample_id in seen:
            raise DatasetError(f"{path}: sample_id {conversation.sample_id!r} appears twice")
        seen.add(conversation.sample_id)
    return LocomoDataset(
        path=path,
        conversations=conversations,
        evidence_issues=loader.evidence_issues,
        empty_sessions_skipped=loader.empty_sessions_skipped,
        empty_turns_skipped=loader.empty_turns_skipped,
    )


class _Loader:
    """Walks the file by hand so that every error can say exactly where it is."""

    def __init__(self, path: Path):
        self.path = path
        self.evidence_issues: list[EvidenceIssue] = []
        self.empty_sessions_skipped = 0
        self.empty_turns_skipped = 0

    def error(self, where: str, message: str) -> DatasetError:
        return DatasetError(f"{self.path}: {where}: {message}")

    def conversation(
        self, index: int, sample: object, include_adversarial: bool, namespace_prefix: str
    ) -> LocomoConversation:
        where = f"sample {index}"
        if not isinstance(sample, dict):
            raise self.error(where, f"expected an object, got {type(sample).__name__}")
        sample_id = sample.get("sample_id")
        if not isinstance(sample_id, str) or not sample_id:
            raise self.error(where, "field 'sample_id': missing or not a non-empty string")
        where = f"sample {index} ({sample_id})"
        namespace = namespace_prefix + sample_id
        try:
            check_namespace(namespace)
        except ValueError as exc:
            raise self.error(where, str(exc)) from exc

        conversation = sample.get("conversation")
        if not isinstance(conversation, dict):
            raise self.error(where, "field 'conversation': missing or not an object")
        speakers = [conversation.get(key) for key in ("speaker_a", "speaker_b")]
        for key, speaker in zip(("speaker_a", "speaker_b"), speakers):
            if not isinstance(speaker, str) or not speaker:
                raise self.error(where, f"field 'conversation.{key}': missing or not a non-empty string")
        sessions = self.sessions(where, sample_id, namespace, conversation)

        qa = sample.get("qa")
        if not isinstance(qa, list):
            raise self.error(where, "field 'qa': missing or not a list")
        turn_ids = {turn.turn_id for session in sessions for turn in session.turns}
        questions = []
        for qa_index, record in enumerate(qa):
            question, issues = self.question(f"{where} qa {qa_index}", f"{sample_id}:qa{qa_index}", record, turn_ids)
            # Issues are reported for the questions that are loaded, so counts match the data.
            if question.category != ADVERSARIAL or include_adversarial:
                questions.append(question)
                self.evidence_issues.extend(issues)
        return LocomoConversation(
            sample_id=sample_id,
            namespace=namespace,
            speaker_a=speakers[0],
            speaker_b=speakers[1],
            sessions=sessions,
            questions=questions,
        )

    def sessions(self, where: str, sample_id: str, namespace: str, conversation: dict) -> list[Session]:
        turns_by_number: dict[int, object] = {}
        dates_by_number: dict[int, object] = {}
        for key, value in conversation.items():
            if match := _SESSION_KEY.match(key):
                turns_by_number[int(match.group(1))] = value
            elif match := _SESSION_DATE_KEY.match(key):
                dates_by_number[int(match.group(1))] = value

        sessions: list[Session] = []
        seen_turn_ids: dict[str, int] = {}
        for number in sorted(turns_by_number.keys() | dates_by_number.keys()):
            raw_turns = turns_by_number.get(number)
            session_where = f"{where} session_{number}"
            if raw_turns is None or raw_turns == []:
                self.empty_sessions_skipped += 1
                continue
            if not isinstance(raw_turns, list):
                raise self.error(session_where, f"field 'conversation.session_{number}': expected a list of turns")
            raw_date = dates_by_number.get(number)
            if not isinstance(raw_date, str):
                raise self.error(
                    session_where, f"field 'conversation.session_{number}_date_time': missing or not a string"
                )
            try:
                started_at = parse_session_date(raw_date)
            except ValueError as exc:
                raise self.error(session_where, f"field 'conversation.session_{number}_date_time': {exc}") from exc

            turns = []
            for turn_index, raw_turn in enumerate(raw_turns):
                turn_where = f"{session_where} turn {turn_index}"
                turn = self.turn(turn_where, raw_turn)
                if turn is None:
                    continue
                if turn.turn_id in seen_turn_ids:
                    raise self.error(
                        turn_where,
                        f"field 'dia_id': {turn.turn_id!r} already used in session_{seen_turn_ids[turn.turn_id]}",
                    )
                seen_turn_ids[turn.turn_id] = number
                turns.append(turn)
            if not turns:
                self.empty_sessions_skipped += 1
                continue
            sessions.append(
                Session(
                    session_id=f"{sample_id}:session_{number}",
                    namespace=namespace,
                    started_at=started_at,
                    turns=turns,
                )
            )
        if not sessions:
            raise self.error(where, "conversation has no session with turns")
        return sessions

    def turn(self, where: str, raw_turn: object) -> Turn | None:
        try:
            raw = _RawTurn.model_validate(raw_turn)
        except ValidationError as exc:
            raise self.error(where, describe_validation_error(exc)) from exc
        caption = raw.blip_caption if raw.blip_caption and raw.blip_caption.strip() else None
        if not raw.text.strip() and caption is None:
            self.empty_turns_skipped += 1
            return None
        try:
            return Turn(turn_id=raw.dia_id, speaker=raw.speaker, text=raw.text, image_caption=caption)
        except ValidationError as exc:
            raise self.error(where, describe_validation_error(exc)) from exc

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
        ids, dangling, unreadable = [], [], []
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
