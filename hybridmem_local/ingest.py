"""Reading sessions from files: the JSONL session format and namespace exports.

Session JSONL: one session per line::

    {"session_id": "s1", "namespace": "alice", "started_at": "2023-05-08T13:56:00+00:00",
     "turns": [{"turn_id": "s1:0", "speaker": "Alice", "text": "Hi!", "image_caption": null}]}

``namespace`` is optional (the command's ``--namespace`` applies). ``started_at`` must carry a
UTC offset. LoCoMo files are read by ``hybridmem_local.eval.locomo``. Every error names the
file, the line and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from pydantic import ValidationError

from hybridmem_local.schema import Episode, RelationalTuple, Session
from hybridmem_local.store import SessionRecord


class InputFileError(ValueError):
    """A file given to ingest/import is malformed; the message names file, record and field."""


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "(record)"
        parts.append(f"field {where}: {err['msg']}")
    return "; ".join(parts)


def _json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputFileError(f"{path}: line {line}: not valid UTF-8 (byte {exc.start})") from exc
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputFileError(f"{path}: line {number}: invalid JSON ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise InputFileError(f"{path}: line {number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def read_sessions_jsonl(path: Path, namespace: str | None = None) -> list[Session]:
    """Parse and validate every line before returning, so a bad file stores nothing."""
    sessions: list[Session] = []
    seen: set[tuple[str, str]] = set()
    for number, record in _json_lines(path):
        if namespace is not None:
            record = {**record, "namespace": record.get("namespace", namespace)}
        try:
            session = Session.model_validate(record)
        except ValidationError as exc:
            sid = record.get("session_id", "?")
            raise InputFileError(f"{path}: line {number} (session {sid!r}): {_describe(exc)}") from exc
        key = (session.namespace, session.session_id)
        if key in seen:
            raise InputFileError(f"{path}: line {number}: session {session.session_id!r} appears twice")
        seen.add(key)
        sessions.append(session)
    if not sessions:
        raise InputFileError(f"{path}: no sessions found")
    return sessions


def read_export(path: Path, namespace: str | None = None) -> tuple[list[SessionRecord], list[Episode | RelationalTuple]]:
    """Parse a ``HybridMemory.export`` file; ``namespace`` renames its namespace on import."""
    sessions: list[SessionRecord] = []
    memories: list[Episode | RelationalTuple] = []
    for number, record in _json_lines(path):
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
                memories.append(cls.model_validate(record))
            else:
                raise InputFileError(f"{path}: line {number}: unknown record type {kind!r} (expected session or memory)")
        except (ValidationError, KeyError, TypeError) as exc:
            detail = _describe(exc) if isinstance(exc, ValidationError) else f"missing or wrong field {exc}"
            raise InputFileError(f"{path}: line {number}: {detail}") from exc
    return sessions, memories
