"""LongMemEval loader: ``longmemeval_s_cleaned.json``, ``_m_`` and ``_oracle`` into sessions.

Each file is a JSON list of instances; every instance is one question over its own chat
history (``haystack_sessions``, each a list of ``{role, content, has_answer?}`` turns, with
``haystack_session_ids`` and ``haystack_dates`` alongside). An instance therefore becomes its
own namespace, derived from its ``question_id``.

Turn ids are ``"{session_id}:{index}"`` with the index of the turn in the file, so they stay
unique within the namespace and stable when empty turns are skipped. Dates like
``"2023/05/30 (Tue) 23:40"`` carry no timezone; they are read as **UTC**.

The ``_m`` file is ~2.7 GB and is parsed whole with :mod:`json`: expect well over 10 GiB of
memory for it. The ``_s`` and ``_oracle`` files load in seconds.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator

from hybridmem_local.errors import DatasetError, InvalidInputError
from hybridmem_local.files.readers import describe_validation_error, read_json_list
from hybridmem_local.schema import NAMESPACE_PATTERN, Session, StrictModel, Turn, check_namespace

QuestionType = Literal[
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "temporal-reasoning",
    "knowledge-update",
    "multi-session",
]
ABSTENTION_SUFFIX = "_abs"

# "2023/05/30 (Tue) 23:40"; the weekday is redundant and not checked.
_DATE = re.compile(r"^\s*(\d{4})/(\d{2})/(\d{2})\s*\([A-Za-z]{3}\)\s*(\d{2}):(\d{2})\s*$")
_UNSAFE_NAMESPACE_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


def parse_longmemeval_date(value: str) -> datetime:
    """``"2023/05/30 (Tue) 23:40"`` → ``2023-05-30 23:40 UTC`` (the benchmark has no zones)."""
    match = _DATE.match(value)
    if not match:
        raise InvalidInputError(f"date {value!r} is not like '2023/05/30 (Tue) 23:40'")
    year, month, day, hour, minute = (int(g) for g in match.groups())
    try:
        return datetime(year, month, day, hour, minute, tzinfo=timezone.utc)
    except ValueError as exc:
        raise InvalidInputError(f"date {value!r}: {exc}") from exc


def namespace_for_question(question_id: str, prefix: str = "") -> str:
    """A namespace for one instance: ``prefix + question_id`` with unsafe characters replaced.

    An id that had to be changed gets a short hash of the original appended, so two ids that
    differ only in unsafe characters (or beyond the 64-character limit) stay distinct.
    """
    candidate = prefix + question_id
    if NAMESPACE_PATTERN.match(candidate):
        return candidate
    digest = hashlib.sha1(candidate.encode("utf-8")).hexdigest()[:8]
    safe = _UNSAFE_NAMESPACE_CHARS.sub("_", candidate).lstrip("_.-")[: 64 - 9]
    return check_namespace(f"{safe}-{digest}" if safe else digest)


# --------------------------------------------------------------------------- raw records


class _RawTurn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["user", "assistant"]
    content: str
    has_answer: bool = False


class _RawInstance(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    question_id: str = Field(min_length=1)
    question_type: QuestionType
    question: str
    answer: str | int
    question_date: str
    haystack_session_ids: list[str]
    haystack_dates: list[str]
    # Turns are validated one by one later, so their errors can name session and turn.
    haystack_sessions: list[list[object]]
    answer_session_ids: list[str]


# --------------------------------------------------------------------------- loaded records


class LongMemEvalInstance(StrictModel):
    question_id: str
    namespace: str
    question_type: QuestionType
    #: ``question_id`` ends in ``_abs``: the history does not hold the answer.
    is_abstention: bool
    question: str
    answer: str
    question_date: AwareDatetime
    sessions: list[Session]
    #: Turn ids of the turns marked ``has_answer`` (turn-level recall).
    evidence_turn_ids: list[str]
    #: The sessions that hold the evidence (session-level recall), as the file lists them.
    answer_session_ids: list[str]

    _check_namespace = field_validator("namespace")(classmethod(lambda cls, v: check_namespace(v)))


class LongMemEvalDataset(StrictModel):
    path: Path
    instances: list[LongMemEvalInstance]
    #: Turns whose content is empty or whitespace.
    empty_turns_skipped: int = 0
    #: Sessions without any non-empty turn.
    empty_sessions_skipped: int = 0
    #: Repeats of a session id within one instance's haystack (the first one is kept).
    duplicate_sessions_skipped: int = 0


# --------------------------------------------------------------------------- loading


def load_longmemeval(path: str | Path, *, namespace_prefix: str = "", limit: int | None = None) -> LongMemEvalDataset:
    """Load a LongMemEval file; ``limit`` keeps only the first instances (parsing is whole-file).

    Raises :class:`DatasetError` naming file, instance, session/turn index and field when the
    file does not have the official shape.
    """
    path = Path(path)
    loader = _Loader(path)
    records = read_json_list(path, DatasetError)
    if limit is not None:
        records = records[:limit]
    instances = []
    namespaces: dict[str, str] = {}
    for index, record in enumerate(records):
        instance = loader.instance(index, record, namespace_prefix)
        if instance.namespace in namespaces:
            raise DatasetError(
                f"{path}: instance {index} ({instance.question_id}): namespace {instance.namespace!r} "
                f"already used by question {namespaces[instance.namespace]!r}"
            )
        namespaces[instance.namespace] = instance.question_id
        instances.append(instance)
    return LongMemEvalDataset(
        path=path,
        instances=instances,
        empty_turns_skipped=loader.empty_turns_skipped,
        empty_sessions_skipped=loader.empty_sessions_skipped,
        duplicate_sessions_skipped=loader.duplicate_sessions_skipped,
    )


class _Loader:
    def __init__(self, path: Path):
        self.path = path
        self.empty_turns_skipped = 0
        self.empty_sessions_skipped = 0
        self.duplicate_sessions_skipped = 0

    def error(self, where: str, message: str) -> DatasetError:
        return DatasetError(f"{self.path}: {where}: {message}")

    def instance(self, index: int, record: object, namespace_prefix: str) -> LongMemEvalInstance:
        where = f"instance {index}"
        if isinstance(record, dict) and isinstance(record.get("question_id"), str):
            where += f" ({record['question_id']})"
        try:
            raw = _RawInstance.model_validate(record)
        except ValidationError as exc:
            raise self.error(where, describe_validation_error(exc)) from exc
        lengths = {
            "haystack_session_ids": len(raw.haystack_session_ids),
            "haystack_dates": len(raw.haystack_dates),
            "haystack_sessions": len(raw.haystack_sessions),
        }
        if len(set(lengths.values())) != 1:
            raise self.error(where, f"haystack lists differ in length: {lengths}")
        try:
            question_date = parse_longmemeval_date(raw.question_date)
        except ValueError as exc:
            raise self.error(where, f"field 'question_date': {exc}") from exc

        namespace = namespace_for_question(raw.question_id, namespace_prefix)
        sessions: list[Session] = []
        evidence_turn_ids: list[str] = []
        seen_session_ids: set[str] = set()
        for position, (session_id, date, raw_turns) in enumerate(
            zip(raw.haystack_session_ids, raw.haystack_dates, raw.haystack_sessions, strict=True)
        ):
            session_where = f"{where} session {position} ({session_id})"
            if session_id in seen_session_ids:
                self.duplicate_sessions_skipped += 1
                continue
            seen_session_ids.add(session_id)
            try:
                started_at = parse_longmemeval_date(date)
            except ValueError as exc:
                raise self.error(session_where, f"field 'haystack_dates.{position}': {exc}") from exc
            turns = []
            for turn_index, raw_turn in enumerate(raw_turns):
                turn_where = f"{session_where} turn {turn_index}"
                try:
                    turn = _RawTurn.model_validate(raw_turn)
                except ValidationError as exc:
                    raise self.error(turn_where, describe_validation_error(exc)) from exc
                if not turn.content.strip():
                    self.empty_turns_skipped += 1
                    continue
                turn_id = f"{session_id}:{turn_index}"
                try:
                    turns.append(Turn(turn_id=turn_id, speaker=turn.role, text=turn.content))
                except ValidationError as exc:
                    raise self.error(turn_where, describe_validation_error(exc)) from exc
                if turn.has_answer:
                    evidence_turn_ids.append(turn_id)
            if not turns:
                self.empty_sessions_skipped += 1
                continue
            try:
                sessions.append(Session(session_id=session_id, namespace=namespace, started_at=started_at, turns=turns))
            except ValidationError as exc:
                raise self.error(session_where, describe_validation_error(exc)) from exc

        return LongMemEvalInstance(
            question_id=raw.question_id,
            namespace=namespace,
            question_type=raw.question_type,
            is_abstention=raw.question_id.endswith(ABSTENTION_SUFFIX),
            question=raw.question,
            answer=str(raw.answer),
            question_date=question_date,
            sessions=sessions,
            evidence_turn_ids=evidence_turn_ids,
            answer_session_ids=raw.answer_session_ids,
        )
