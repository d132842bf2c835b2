"""Evaluation harness: benchmark loaders, metrics, the LLM judge, runners and reports.

Modules: ``locomo`` and ``longmemeval`` (loaders), ``metrics`` (F1, BLEU-1, retrieval recall),
``judge`` (judge prompts and verdict schema). Nothing heavy is imported here; this module only
holds what both loaders share: their error type and strict JSON reading.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError


class DatasetError(ValueError):
    """A benchmark file is unreadable or malformed; the message names file, record and field."""


def read_json_list(path: str | Path) -> list:
    """Read a UTF-8 JSON file whose top level must be a list, with errors that name the file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read file: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{path}: not UTF-8 text: byte {raw[exc.start]:#04x} at offset {exc.start}"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    if not isinstance(data, list):
        raise DatasetError(f"{path}: top level must be a JSON list of records, got {type(data).__name__}")
    return data


def describe_validation_error(exc: ValidationError) -> str:
    """Pydantic's errors as ``field 'a.b': message`` items, one per problem."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "(record)"
        parts.append(f"field {field!r}: {error['msg']}")
    return "; ".join(parts)
