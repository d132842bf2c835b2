"""Reading the files a user hands over (JSON, YAML, standard input) with errors that name the
file and the place: one loader for configs, manifests, prompts, session files and benchmarks."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hybridmem_local.errors import InputFileError


def describe_validation_error(exc: ValidationError, *, quote_fields: bool = True, limit: int | None = None) -> str:
    """Pydantic's errors as ``field 'a.b': message`` items (``field a.b: ...`` unquoted), one per problem."""
    parts = []
    for error in exc.errors()[:limit]:
        field = ".".join(str(p) for p in error["loc"]) or "(record)"
        parts.append(f"field {field!r}: {error['msg']}" if quote_fields else f"field {field}: {error['msg']}")
    return "; ".join(parts)


def is_stdin(path: Path | str) -> bool:
    """``-`` stands for standard input wherever a command takes a file to read."""
    return str(path) == "-"


def read_input(path: Path, error: type[InputFileError] = InputFileError) -> bytes:
    """The bytes of ``path`` (of standard input for ``-``), with an error that names the file."""
    try:
        return sys.stdin.buffer.read() if is_stdin(path) else path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read file: {exc.strerror or exc}") from exc


def read_json_list(path: str | Path, error: type[InputFileError] = InputFileError, raw: bytes | None = None) -> list:
    """Read a UTF-8 JSON file (its bytes ``raw`` when already read) whose top level must be a
    list, with errors (of type ``error``) that name the file."""
    path = Path(path)
    if raw is None:
        raw = read_input(path, error)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text: byte {raw[exc.start]:#04x} at offset {exc.start}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    if not isinstance(data, list):
        raise error(f"{path}: top level must be a JSON list of records, got {type(data).__name__}")
    return data


def read_json_lines(path: Path, raw: bytes | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a UTF-8 JSONL file (its bytes ``raw``
    when already read); errors name the file and the line."""
    if raw is None:
        raw = read_input(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_line = raw[: exc.start].count(b"\n") + 1
        raise InputFileError(f"{path}: line {bad_line}: not valid UTF-8 (byte {exc.start})") from exc
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


def read_yaml_mapping(path: Path, what: str, error: type[Exception], allow_empty: bool = False) -> dict[str, Any]:
    """A YAML file (``-``: standard input) whose top level is a mapping (``{}`` for an empty file
    when ``allow_empty``); errors of type ``error`` say ``what`` it is: ``cannot read config x.yaml: ...``."""
    try:
        data = yaml.safe_load(sys.stdin.read() if is_stdin(path) else path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from exc
    if data is None and allow_empty:
        return {}
    if not isinstance(data, dict):
        raise error(f"{what} {path}: top level must be a mapping, got {type(data).__name__}")
    return data
