"""Sessions: storing them (``ingest``, ``add``, ``remember``, ``add-messages``), curating them
(``curate``) and reading them back (``sessions``, ``get-session``): ``HybridMemory.ingest``,
``add_session``, ``remember``, ``add_messages``, ``curate_pending``, ``sessions``, ``get_session``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from hybridmem_local.cli.common import (
    USER_ERRORS,
    Namespace,
    NamespaceFilter,
    Output,
    StoreOptions,
    print_data,
    print_json,
    with_options,
)
from hybridmem_local.cli.console import console
from hybridmem_local.cli.errors import reported
from hybridmem_local.cli.render import curation_notes, print_memories, print_session, progress
from hybridmem_local.errors import InputFileError
from hybridmem_local.files.readers import describe_validation_error, read_json_list
from hybridmem_local.files.session_files import read_sessions_file, read_sessions_jsonl
from hybridmem_local.schema import Message, SessionRecord


@with_options
def ingest(
    path: Annotated[Path, typer.Argument(help="LoCoMo JSON (official format) or sessions JSONL; - reads stdin.")],
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", help="Store every session here (LoCoMo default: one namespace per conversation)."
        ),
    ] = None,
    conversation: Annotated[
        list[str] | None, typer.Option("--conversation", help="LoCoMo sample ids to ingest (default: all).")
    ] = None,
    curate: Annotated[
        bool, typer.Option("--curate/--no-curate", help="Curate memories with the configured LLM.")
    ] = True,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Store sessions (raw turns, then curated memories)."""
    with reported(*USER_ERRORS):
        sessions = read_sessions_file(path, namespace, conversation)
    with store.open_memory() as memory:
        started = time.perf_counter()
        report = memory.ingest(sessions, curate=curate, on_progress=progress())
    if output.as_json:
        print_json(report)
        return
    console.print(
        f"ingested {report.stored} sessions ({report.skipped} already present, {report.failed} curation failures) "
        f"with {report.memories} memories in {time.perf_counter() - started:.1f}s" + curation_notes(report)
    )


@with_options
def add(
    path: Annotated[Path, typer.Argument(help="Sessions JSONL (one session a line); - reads stdin.")],
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Namespace of sessions that name none.")
    ] = None,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Add sessions one by one (``HybridMemory.add_session``) and show the memories curated from each."""
    with reported(*USER_ERRORS):
        sessions = read_sessions_jsonl(path, namespace)
    with store.open_memory() as memory:
        results = [memory.add_session(session) for session in sessions]
    if output.as_json:
        print_json(results)
        return
    for result in results:
        record = result.session
        title = f"session {record.session.session_id} ({record.session.namespace}): {record.curation_status}" + (
            ", already stored" if result.report.skipped else ""
        )
        print_memories(result.memories, False, title=title)


@with_options
def remember(
    text: Annotated[str, typer.Argument(help="A note, or something the user said.")],
    namespace: Namespace = "default",
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Store plain text as a one-message session from the user, dated now, queued for curation."""
    with store.open_memory() as memory:
        record = memory.remember(namespace, text)
    _show_session(record, output)


@with_options
def add_messages(
    path: Annotated[Path, typer.Argument(help='JSON list of chat messages {"role", "content"}; - reads stdin.')],
    namespace: Namespace = "default",
    session_id: Annotated[
        str | None, typer.Option("--session-id", help="The new session's id (default: one is made up).")
    ] = None,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Store chat messages as one session dated now, queued for curation (the speaker is the role)."""
    with reported(*USER_ERRORS):
        messages = read_messages(path)
    with store.open_memory() as memory:
        record = memory.add_messages(namespace, messages, session_id)
    _show_session(record, output)


def read_messages(path: Path) -> list[Message]:
    """The messages of a JSON list, each checked; errors name the file and the message."""
    messages = []
    for number, item in enumerate(read_json_list(path), start=1):
        try:
            messages.append(Message.model_validate(item))
        except ValidationError as exc:
            raise InputFileError(f"{path}: message {number}: {describe_validation_error(exc, limit=5)}") from exc
    if not messages:
        raise InputFileError(f"{path}: no messages found")
    return messages


@with_options
def curate(
    namespace: NamespaceFilter = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Also retry sessions whose curation failed.")
    ] = False,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Curate stored sessions that are not curated yet."""
    with store.open_memory() as memory:
        started = time.perf_counter()
        report = memory.curate_pending(namespace, retry_failed=retry_failed, on_progress=progress())
    if output.as_json:
        print_json(report)
        return
    console.print(
        f"curated {report.curated} sessions ({report.failed} failed) into {report.memories} memories "
        f"with {report.usage.requests} LLM calls in {time.perf_counter() - started:.1f}s" + curation_notes(report)
    )


@with_options
def get_session(
    session_id: Annotated[str, typer.Argument(help="A stored session's id.")],
    namespace: Namespace = "default",
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """A stored session with its turns and curation status (pending, curated, curation_failed)."""
    with store.open_memory() as memory:
        record = memory.get_session(namespace, session_id)
    _show_session(record, output)


@with_options
def sessions(
    namespace: Namespace = "default",
    status: Annotated[
        str | None,
        typer.Option("--status", help="Only sessions of this curation status (pending, curated, curation_failed)."),
    ] = None,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """The namespace's stored sessions in date order, with their curation status."""
    with store.open_memory() as memory:
        records = memory.sessions(namespace, status)
    if output.as_json:
        print_json(records)
        return
    rows = [
        {
            "session": r.session.session_id,
            "started_at": r.session.started_at,
            "turns": len(r.session.turns),
            "curation_status": r.curation_status,
            "curation_error": r.curation_error,
        }
        for r in records
    ]
    print_data(rows, False, title=f"{len(rows)} sessions in {namespace}")


def _show_session(record: SessionRecord, output: Output) -> None:
    if output.as_json:
        print_json(record)
    else:
        print_session(record)
