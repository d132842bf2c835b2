"""``hybridmem audit``: read, verify and trim the store's audit trail (``storage/audit.py``).

Reading the audit trail is the store owner's business (whoever can read the file): the CLI
opens the store file itself, as ``hybridmem keys`` does, and none of these commands is an
operation of the memory API.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Annotated

import typer
from rich.table import Table

from hybridmem_local.cli.common import NamespaceFilter, Output, StoreOptions, print_json, with_options
from hybridmem_local.cli.console import console
from hybridmem_local.cli.errors import fail
from hybridmem_local.schema import utcnow
from hybridmem_local.storage.store import MemoryStore

app = typer.Typer(
    help="The audit trail: who read or changed what (ids only), as a hash chain.",
    no_args_is_help=True,
    add_completion=False,
)


@contextmanager
def _existing(store: StoreOptions) -> Iterator[MemoryStore]:
    if store.config.store.url is None and not store.db.exists():  # opening would create an empty store
        raise fail(f"no store at {store.db}")
    with store.open_store() as opened:
        yield opened


@app.command("verify")
@with_options
def verify(*, store: StoreOptions, output: Output) -> None:
    """Walk the hash chain; exit 1 naming the first entry edited, deleted or out of place."""
    with _existing(store) as opened:
        verdict = opened.audit.verify()
    if output.as_json:
        print_json(verdict)
    elif verdict.ok:
        console.print(f"ok: {verdict.entries} entries after anchor {verdict.anchor_id}; head hash {verdict.head_hash}")
    if not verdict.ok:
        raise fail(f"audit chain broken at entry {verdict.first_bad_id}: {verdict.problem}")


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"expected an ISO date or time, got {value!r}", param_hint="--since") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)


@app.command("list")
@with_options
def list_(
    key: Annotated[
        str | None, typer.Option("--key", help="Only this actor: an API key id, 'worker' or 'local:USER'.")
    ] = None,
    namespace: NamespaceFilter = None,
    since: Annotated[
        str | None, typer.Option("--since", help="From this ISO date or time on (UTC unless given).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most this many entries (oldest first).")
    ] = None,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Entries in chain order: time, actor, action, namespace, ids, outcome."""
    when = _since(since)
    with _existing(store) as opened:
        entries = opened.audit.entries(actor=key, namespace=namespace, since=when, limit=limit)
    if output.as_json:
        print_json(entries)
        return
    table = Table("id", "at", "actor", "action", "namespace", "refs", "outcome")
    for entry in entries:
        table.add_row(
            str(entry.id),
            entry.at.isoformat(timespec="seconds"),
            entry.actor,
            entry.action,
            entry.namespace or "",
            "; ".join(f"{kind}: {', '.join(map(str, ids))}" for kind, ids in entry.refs.items()),
            entry.outcome,
        )
    console.print(table)


@app.command("trim")
@with_options
def trim(
    older_than_days: Annotated[
        int | None,
        typer.Option(
            "--older-than-days", min=1, help="Remove entries older than this (default: audit.retention_days)."
        ),
    ] = None,
    *,
    store: StoreOptions,
) -> None:
    """Remove old entries, keeping the chain verifiable from an anchor (the hash of the last one
    removed); the trim is an entry itself. Refused when the chain does not verify."""
    days = older_than_days if older_than_days is not None else store.config.audit.retention_days
    if days is None:
        raise fail("give --older-than-days, or set audit.retention_days in the config")
    with _existing(store) as opened:
        trimmed = opened.audit.trim(utcnow() - timedelta(days=days))
    console.print(f"trimmed {trimmed} entries older than {days} days")
