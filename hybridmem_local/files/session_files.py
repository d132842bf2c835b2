"""The files sessions come in: LoCoMo JSON, the JSONL session format, and namespace exports (read
and written).

Session JSONL: one session per line::

    {"session_id": "s1", "namespace": "alice", "started_at": "2023-05-08T13:56:00+00:00",
     "turns": [{"turn_id": "s1:0", "speaker": "Alice", "text": "Hi!", "image_caption": null}]}

``namespace`` is optional (the command's ``--namespace`` applies). ``started_at`` must carry a
UTC offset. LoCoMo files (the benchmark's official format) are read by :class:`LocomoReader`,
which the evaluation's loader extends with the questions. Every error names the file, the
line or record, and the field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from hybridmem_local.errors import EncryptionKeyError, InputFileError, InvalidInputError, SealError
from hybridmem_local.files.readers import (
    describe_validation_error,
    is_stdin,
    read_input,
    read_json_lines,
    read_json_list,
)
from hybridmem_local.files.sealing import is_sealed, seal, unseal
from hybridmem_local.schema import Episode, RelationalTuple, Session, SessionRecord, Turn, check_namespace

__all__ = [
    "LocomoReader",
    "read_export",
    "read_locomo_sessions",
    "read_sessions_file",
    "read_sessions_jsonl",
]


def read_sessions_file(path: Path, namespace: str | None, conversations: Sequence[str] | None = None) -> list[Session]:
    """A LoCoMo JSON file (``conversations``: sample ids to keep) or a JSONL of sessions, told
    apart by content; ``path`` ``-`` reads standard input."""
    if not is_stdin(path) and not path.exists():
        raise InputFileError(f"{path}: no such file")
    raw = read_input(path)
    if raw[:64].lstrip()[:1] != b"[":
        return read_sessions_jsonl(path, namespace, raw=raw)
    return read_locomo_sessions(path, namespace, conversations, raw=raw)


def read_sessions_jsonl(path: Path, namespace: str | None = None, raw: bytes | None = None) -> list[Session]:
    """Parse and validate every line (of ``raw``, when already read) before returning, so a bad file stores nothing."""
    sessions: list[Session] = []
    seen: set[tuple[str, str]] = set()
    for number, record in read_json_lines(path, raw):
        if namespace is not None:
            record = {**record, "namespace": record.get("namespace", namespace)}
        try:
            session = Session.model_validate(record)
        except ValidationError as exc:
            sid = record.get("session_id", "?")
            raise InputFileError(
                f"{path}: line {number} (session {sid!r}): "
                f"{describe_validation_error(exc, quote_fields=False, limit=5)}"
            ) from exc
        key = (session.namespace, session.session_id)
        if key in seen:
            raise InputFileError(f"{path}: line {number}: session {session.session_id!r} appears twice")
        seen.add(key)
        sessions.append(session)
    if not sessions:
        raise InputFileError(f"{path}: no sessions found")
    return sessions


#: What a sealed export is bound to (``files/sealing.py``): an export file, format v1.
EXPORT_CONTEXT = "export/v1"


def export_bytes(records: Sequence[str], key: bytes | None) -> bytes:
    """An export file's bytes: the JSONL ``records``, sealed with ``key`` (an encrypted store's
    ``keys.files``) so that the file is encrypted at rest like the store it came from."""
    data = "".join(records).encode("utf-8")
    return data if key is None else seal(key, EXPORT_CONTEXT, data)


def read_export(
    path: Path, namespace: str | None = None, key: bytes | None = None
) -> tuple[list[SessionRecord], list[Episode | RelationalTuple]]:
    """Parse a ``HybridMemory.export`` file, plaintext or sealed (``key``: the importing store's
    ``keys.files``, None when it is not encrypted); ``namespace`` renames its namespace on import."""
    raw = read_input(path)
    if is_sealed(raw):
        if key is None:
            raise EncryptionKeyError(
                f"{path} is a sealed (encrypted) export: import it into a store with store.encryption: "
                "sqlcipher and the master key it was exported with"
            )
        try:
            raw = unseal(key, EXPORT_CONTEXT, raw)
        except SealError as exc:
            raise EncryptionKeyError(
                f"cannot import {path}: {exc} (the store's master key is not the one it was exported with?)"
            ) from None
    sessions: list[SessionRecord] = []
    memories: list[Episode | RelationalTuple] = []
    for number, record in read_json_lines(path, raw):
        kind = record.pop("type", None)
        try:
            if kind == "session":
                if namespace is not None:
                    record["session"]["namespace"] = namespace
                sessions.append(SessionRecord.model_validate(record))
            elif kind == "memory":
                if namespace is not None:
                    record["namespace"] = namespace
                cls = Episode if record.get("kind") == "episode" else RelationalTuple
                memory = cls.model_validate(record)
                if memory.id is None:  # superseded_by and the events refer to memories by id
                    raise InputFileError(f"{path}: line {number}: a memory record needs its 'id'")
                memories.append(memory)
            else:
                raise InputFileError(
                    f"{path}: line {number}: unknown record type {kind!r} (expected session or memory)"
                )
        except (ValidationError, KeyError, TypeError) as exc:
            detail = (
                describe_validation_error(exc, quote_fields=False, limit=5)
                if isinstance(exc, ValidationError)
                else f"missing or wrong field {exc}"
            )
            raise InputFileError(f"{path}: line {number}: {detail}") from exc
    return sessions, memories


# --------------------------------------------------------------------------- LoCoMo


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
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}


def parse_session_date(value: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` → ``2023-05-08 13:56 UTC`` (the benchmark has no zones)."""
    match = _SESSION_DATE.match(value)
    if not match:
        raise InvalidInputError(f"date {value!r} is not like '1:56 pm on 8 May, 2023'")
    hour, minute, meridiem, day, month_name, year = match.groups()
    month = _MONTHS.get(month_name.lower())
    if month is None:
        raise InvalidInputError(f"date {value!r}: unknown month {month_name!r}")
    hour_12 = int(hour)
    if not 1 <= hour_12 <= 12:
        raise InvalidInputError(f"date {value!r}: hour {hour_12} is not on a 12-hour clock")
    hour_24 = hour_12 % 12 + (12 if meridiem.lower() == "p" else 0)
    return datetime(int(year), month, int(day), hour_24, int(minute), tzinfo=timezone.utc)


class _RawTurn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    speaker: str
    dia_id: str
    text: str
    blip_caption: str | None = None


@dataclass
class LocomoSample:
    """The conversation part of one LoCoMo sample (its questions are the evaluation's)."""

    sample_id: str
    namespace: str
    speaker_a: str
    speaker_b: str
    sessions: list[Session]
    #: Where the sample is in the file, for error messages: ``"sample 3 (conv-30)"``.
    where: str


class LocomoReader:
    """Reads the conversations of a LoCoMo file (official format) into sessions.

    The file is a JSON list of samples ``{sample_id, conversation, qa, ...}``. A conversation
    holds ``speaker_a``, ``speaker_b`` and numbered sessions: ``session_N`` (a list of turns
    ``{speaker, dia_id, text, blip_caption?, ...}``) with its date ``session_N_date_time``, e.g.
    ``"1:56 pm on 8 May, 2023"``. Sessions are read in numeric order; a date without turns (the
    official file lists dates for sessions that were never written) is skipped and counted.
    Session dates carry no timezone in the benchmark; they are read as **UTC**. The file is
    walked by hand so that every error (of type ``error``) says exactly where it is.
    """

    def __init__(self, path: Path, error: type[InputFileError] = InputFileError):
        self.path = path
        self.error_type = error
        #: Session numbers without turns: none listed, an empty list, or only blank turns.
        self.empty_sessions_skipped = 0
        #: Turns with neither text nor an image caption.
        self.empty_turns_skipped = 0

    def error(self, where: str, message: str) -> InputFileError:
        return self.error_type(f"{self.path}: {where}: {message}")

    def samples(self, namespace_prefix: str = "", raw: bytes | None = None) -> list[tuple[dict, LocomoSample]]:
        """Every sample of the file (``raw``: its bytes, when already read), as the record and
        its conversation read; sample ids must be unique."""
        records = read_json_list(self.path, self.error_type, raw)
        samples = [self.sample(index, record, namespace_prefix) for index, record in enumerate(records)]
        seen: set[str] = set()
        for _, sample in samples:
            if sample.sample_id in seen:
                raise self.error_type(f"{self.path}: sample_id {sample.sample_id!r} appears twice")
            seen.add(sample.sample_id)
        return samples

    def sample(self, index: int, raw: object, namespace_prefix: str) -> tuple[dict, LocomoSample]:
        where = f"sample {index}"
        if not isinstance(raw, dict):
            raise self.error(where, f"expected an object, got {type(raw).__name__}")
        sample_id = raw.get("sample_id")
        if not isinstance(sample_id, str) or not sample_id:
            raise self.error(where, "field 'sample_id': missing or not a non-empty string")
        where = f"sample {index} ({sample_id})"
        namespace = namespace_prefix + sample_id
        try:
            check_namespace(namespace)
        except ValueError as exc:
            raise self.error(where, str(exc)) from exc
        conversation = raw.get("conversation")
        if not isinstance(conversation, dict):
            raise self.error(where, "field 'conversation': missing or not an object")
        speakers: list[str] = []
        for key in ("speaker_a", "speaker_b"):
            speaker = conversation.get(key)
            if not isinstance(speaker, str) or not speaker:
                raise self.error(where, f"field 'conversation.{key}': missing or not a non-empty string")
            speakers.append(speaker)
        sessions = self.sessions(where, sample_id, namespace, conversation)
        return raw, LocomoSample(sample_id, namespace, speakers[0], speakers[1], sessions, where)

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
                    session_id=f"{sample_id}:session_{number}", namespace=namespace, started_at=started_at, turns=turns
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


def read_locomo_sessions(
    path: Path, namespace: str | None = None, conversations: Sequence[str] | None = None, raw: bytes | None = None
) -> list[Session]:
    """The sessions of a LoCoMo file's conversations (all, or the sample ids ``conversations``).

    Each conversation goes to a namespace of its own (their turn ids repeat across
    conversations): the sample id, or ``NAMESPACE-sample_id`` when a namespace is given for
    several conversations (``NAMESPACE`` itself for one).
    """
    selected = [sample for _, sample in LocomoReader(path).samples(raw=raw)]
    if conversations:
        unknown = set(conversations) - {s.sample_id for s in selected}
        if unknown:
            raise InputFileError(f"{path}: no conversation {sorted(unknown)} (has {[s.sample_id for s in selected]})")
        selected = [s for s in selected if s.sample_id in conversations]
    sessions: list[Session] = []
    for sample in selected:
        target = (
            sample.namespace
            if namespace is None
            else namespace
            if len(selected) == 1
            else f"{namespace}-{sample.sample_id}"
        )
        check_namespace(target)
        sessions.extend(s.model_copy(update={"namespace": target}) for s in sample.sessions)
    return sessions
