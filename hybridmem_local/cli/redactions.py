"""``hybridmem redactions``: content removed because a user asked, in a conversation, to forget
it (``HybridMemory.redactions``, ``undo_redaction``, ``confirm_redaction``)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from hybridmem_local.cli.common import Namespace, Output, StoreOptions, with_options

app = typer.Typer(
    help="Content removed because a user asked, in a conversation, to forget it: list, undo, confirm.",
    no_args_is_help=True,
    add_completion=False,
)

RedactionId = Annotated[int, typer.Argument(help="A pending redaction's id (see `hybridmem redactions list`).")]


class RedactionStatusChoice(str, Enum):
    pending = "pending"
    confirmed = "confirmed"
    undone = "undone"


@app.command("list")
@with_options
def list_(
    namespace: Namespace = "default",
    status: Annotated[
        RedactionStatusChoice | None, typer.Option("--status", help="Only redactions with this status.")
    ] = None,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """The namespace's redactions, oldest first: what was asked, which turns and memories changed."""
    with store.open_memory() as memory:
        found = memory.redactions(namespace, None if status is None else status.value)
    columns = ("id", "session_id", "created_at", "status", "requests", "turn_ids", "rewritten", "deleted", "undoable")
    output.show(found, columns=columns)


@app.command("undo")
@with_options
def undo(redaction_id: RedactionId, *, store: StoreOptions, output: Output) -> None:
    """Put back exactly what a pending redaction removed."""
    with store.open_memory() as memory:
        output.show(memory.undo_redaction(redaction_id))


@app.command("confirm")
@with_options
def confirm(redaction_id: RedactionId, *, store: StoreOptions, output: Output) -> None:
    """Delete a pending redaction's originals for good (no undo after)."""
    with store.open_memory() as memory:
        output.show(memory.confirm_redaction(redaction_id))
