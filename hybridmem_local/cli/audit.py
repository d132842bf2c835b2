"""``hybridmem audit``: read, verify and trim the store's audit trail (``storage/audit.py``).

Reading the audit trail is the store owner's business (whoever can read the file): the CLI
opens the store file itself, as ``hybridmem keys`` does, and none of these commands is an
operation of the memory API.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import typer
from rich.table import Table

from hybridmem_local.cli.common import (
    CONFIG_OPTION,
    DB_OPTION,
    JSON_OPTION,
    SET_OPTION,
    USER_ERRORS,
    config_from,
    console,
    print_json,
)
from hybridmem_local.cli.errors import fail, reported
from hybridmem_local.config import Config
from hybridmem_local.schema import utcnow
from hybridmem_local.storage.store import MemoryStore

app = typer.Typer(
    help="The audit trail: who read or changed what (ids only), as a hash chain.",
    no_args_is_help=True,
    add_completion=False,
)


@contextmanager
def _store(db: Path, config: Config) -> Iterator[MemoryStore]:
    if not db.exists():  # opening would create an empty store
        raise fail(f"no store at {db}")
    with reported(*USER_ERRORS):
        store = MemoryStore.open(db, config.store)
    try:
        yield store
    finally:
        store.close()


@app.command("verify")
def verify(
    db: Path = DB_OPTION,
    as_json: bool = JSON_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Walk the hash chain; exit 1 naming the first entry edited, deleted or out of place."""
    with _store(db, config_from(config, overrides)) as store, reported(*USER_ERRORS):
        verdict = store.audit.verify()
    if as_json:
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
def list_(
    key: str | None = typer.Option(None, "--key", help="Only this actor: an API key id, 'worker' or 'local:USER'."),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help="Only this namespace."),
    since: str | None = typer.Option(None, "--since", help="From this ISO date or time on (UTC unless given)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="At most this many entries (oldest first)."),
    db: Path = DB_OPTION,
    as_json: bool = JSON_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Entries in chain order: time, actor, action, namespace, ids, outcome."""
    when = _since(since)
    with _store(db, config_from(config, overrides)) as store, reported(*USER_ERRORS):
        entries = store.audit.entries(actor=key, namespace=namespace, since=when, limit=limit)
    if as_json:
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
def trim(
    older_than_days: int | None = typer.Option(
        None, "--older-than-days", min=1, help="Remove entries older than this (default: audit.retention_days)."
    ),
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Remove old entries, keeping the chain verifiable from an anchor (the hash of the last one
    removed); the trim is an entry itself. Refused when the chain does not verify."""
    settings = config_from(config, overrides)
    days = older_than_days if older_than_days is not None else settings.audit.retention_days
    if days is None:
        raise fail("give --older-than-days, or set audit.retention_days in the config")
    with _store(db, settings) as store, reported(*USER_ERRORS):
        trimmed = store.audit.trim(utcnow() - timedelta(days=days))
    console.print(f"trimmed {trimmed} entries older than {days} days")
