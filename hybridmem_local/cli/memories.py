"""Memories: the record verbs ``get``, ``list``, ``add-memories``, ``update``, ``delete``,
``history``, and the reads ``search`` and ``ask`` (the ``HybridMemory`` methods of the same
names; ``ask`` is ``answer``/``answer_many``)."""

from __future__ import annotations

import json
from datetime import date
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from hybridmem_local.cli.common import (
    USER_ERRORS,
    MemoryId,
    Namespace,
    Output,
    StoreOptions,
    print_json,
    with_options,
)
from hybridmem_local.cli.errors import fail, reported
from hybridmem_local.cli.render import print_answer, print_memories, print_search
from hybridmem_local.errors import InputFileError
from hybridmem_local.files.readers import describe_validation_error, read_input, read_json_lines
from hybridmem_local.schema import EpisodeDraft, MemoryStatus, TupleDraft


class Kind(str, Enum):
    episode = "episode"
    tuple = "tuple"


class Status(str, Enum):
    """``MemoryStatus`` as a choice of ``list --status``, with ``any``."""

    active = "active"
    superseded = "superseded"
    deleted = "deleted"
    any = "any"


@with_options
def get(memory_id: MemoryId, *, store: StoreOptions, output: Output) -> None:
    """One memory with every field (any status)."""
    with store.open_memory() as memory:
        found = memory.get(memory_id)
    output.show(found)


@with_options
def list_(
    namespace: Namespace = "default",
    kind: Annotated[Kind | None, typer.Option("--kind", help="Only episodes or only tuples.")] = None,
    status: Annotated[Status, typer.Option("--status", help="Memories of this status (any: all).")] = Status.active,
    limit: Annotated[int | None, typer.Option("--limit", min=0, help="At most this many.")] = None,
    offset: Annotated[int, typer.Option("--offset", min=0, help="Skip this many first.")] = 0,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """A namespace's memories in id order, a page at a time."""
    with store.open_memory() as memory:
        memories = memory.list(
            namespace,
            kind=kind.value if kind else None,
            status=None if status is Status.any else MemoryStatus(status.value),
            limit=limit,
            offset=offset,
        )
    print_memories(memories, output.as_json)


@with_options
def add_memories(
    path: Annotated[
        Path,
        typer.Argument(
            help='JSON {"episodes": [...], "tuples": [...]} or JSONL of one episode or tuple a line; - reads stdin.'
        ),
    ],
    namespace: Namespace = "default",
    source_session: Annotated[
        str | None,
        typer.Option("--source-session", help="The stored session they were written from: it is marked curated."),
    ] = None,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Store memories written by hand or by another tool (no curation); their turn ids must name stored turns."""
    with reported(*USER_ERRORS):
        episodes, tuples = read_drafts(path)
    with store.open_memory() as memory:
        ids = memory.add_memories(namespace, episodes=episodes, tuples=tuples, source_session_id=source_session)
        stored = [memory.get(memory_id) for memory_id in ids]
    print_memories(stored, output.as_json)


def read_drafts(path: Path) -> tuple[list[EpisodeDraft], list[TupleDraft]]:
    """Episodes and tuples from JSON (``{"episodes": [...], "tuples": [...]}``, the body of
    ``POST /memories``, or a list of records) or JSONL (a record a line). A record with an
    ``entity`` is a tuple, any other an episode; every one is checked before any is stored."""
    raw = read_input(path)
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        document = None  # JSONL, or broken: read_json_lines names the line
    if isinstance(document, dict) and document and document.keys() <= {"episodes", "tuples"}:
        records = [
            (f"{kind}[{i}]", item) for kind in ("episodes", "tuples") for i, item in enumerate(document.get(kind, []))
        ]
    elif isinstance(document, list):
        records = [(f"record {number}", item) for number, item in enumerate(document, start=1)]
    else:
        records = [(f"line {number}", item) for number, item in read_json_lines(path, raw)]
    if not records:
        raise InputFileError(f"{path}: no memories found")
    episodes: list[EpisodeDraft] = []
    tuples: list[TupleDraft] = []
    for where, item in records:
        is_tuple = isinstance(item, dict) and "entity" in item
        try:
            if is_tuple:
                tuples.append(TupleDraft.model_validate(item))
            else:
                episodes.append(EpisodeDraft.model_validate(item))
        except ValidationError as exc:
            kind = "tuple" if is_tuple else "episode"
            raise InputFileError(f"{path}: {where} ({kind}): {describe_validation_error(exc, limit=5)}") from exc
    return episodes, tuples


@with_options
def update(
    memory_id: Annotated[int, typer.Argument(help="An active memory's id.")],
    title: Annotated[str | None, typer.Option("--title", help="Episode title.")] = None,
    summary: Annotated[str | None, typer.Option("--summary", help="Episode summary.")] = None,
    details: Annotated[str | None, typer.Option("--details", help="Episode details.")] = None,
    entity: Annotated[str | None, typer.Option("--entity", help="Tuple entity.")] = None,
    relation: Annotated[str | None, typer.Option("--relation", help="Tuple relation.")] = None,
    object_: Annotated[str | None, typer.Option("--object", help="Tuple object.")] = None,
    context: Annotated[str | None, typer.Option("--context", help="Tuple context.")] = None,
    timestamp: Annotated[str | None, typer.Option("--timestamp", help="YYYY-MM-DD.")] = None,
    turns: Annotated[
        list[str] | None, typer.Option("--turn", help="Source turn id (repeatable; replaces the list).")
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Recorded in the memory's history.")] = "updated by user",
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Change a memory: the new version supersedes the old one (see `hybridmem history`)."""
    given = {
        "title": title,
        "summary": summary,
        "details": details,
        "entity": entity,
        "relation": relation,
        "object": object_,
        "context": context,
        "timestamp": timestamp,
        "source_turn_ids": turns,
    }
    fields = {name: value for name, value in given.items() if value is not None}
    if not fields:
        raise fail("nothing to update: give at least one field (--title, --details, --object, ...)")
    with store.open_memory() as memory:
        updated = memory.update(memory_id, reason=reason, **fields)
    output.show(updated)


@with_options
def delete(
    memory_id: MemoryId,
    reason: Annotated[str, typer.Option("--reason", help="Recorded in the memory's history.")] = "deleted by user",
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Mark a memory deleted (its history stays; `hybridmem purge` removes it for good)."""
    with store.open_memory() as memory:
        memory.delete(memory_id, reason=reason)
        deleted = memory.get(memory_id)
    output.show(deleted)


@with_options
def history(memory_id: MemoryId, *, store: StoreOptions, output: Output) -> None:
    """Every event of a memory, oldest first (add, update, merge, delete, ...)."""
    with store.open_memory() as memory:
        events = memory.history(memory_id)
    output.show(events, ("id", "at", "action", "run_id", "reason", "before", "after"))


@with_options
def search(
    query: Annotated[str, typer.Argument()],
    namespace: Namespace = "default",
    k: Annotated[int | None, typer.Option("--k", help="Episodes to return (tuples: 2k). Default from config.")] = None,
    kind: Annotated[list[Kind] | None, typer.Option("--kind", help="Search only these stores (repeatable).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Memories dated on or after YYYY-MM-DD.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Memories dated on or before YYYY-MM-DD.")] = None,
    min_score: Annotated[float | None, typer.Option("--min-score", help="Drop hits scoring below this.")] = None,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Top-k episodes and top-2k tuples for a query, and the top-k windows of raw turns when
    windows are a retrieval source (the default); no LLM call. A table of the memories and one
    of the windows (a row each: its session, date, turn ids and text)."""
    period = {"since": _day(since, "--since"), "until": _day(until, "--until")}
    with store.open_memory() as memory:
        result = memory.search(
            query,
            namespace=namespace,
            k=k,
            kinds=[x.value for x in kind] if kind else None,
            min_score=min_score,
            **period,
        )
    if output.as_json:
        print_json(result)
    else:
        print_search(result)


def _day(value: str | None, option: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"expected YYYY-MM-DD, got {value!r}", param_hint=option) from None


@with_options
def ask(
    questions: Annotated[list[str], typer.Argument(help="One question, or several answered in one batched LLM call.")],
    namespace: Namespace = "default",
    k: Annotated[int | None, typer.Option("--k")] = None,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Answer questions from the namespace's memories (one LLM call for all of them)."""
    with store.open_memory() as memory:
        if len(questions) == 1:
            answers = [memory.answer(questions[0], namespace=namespace, k=k)]
        else:
            answers = memory.answer_many(questions, namespace=namespace, k=k)
    if output.as_json:
        print_json(answers[0] if len(answers) == 1 else answers)
        return
    for answer in answers:
        print_answer(answer)
