"""The ``events`` table: the append-only history. Every change to a memory, session or API key
is a row with the JSON of the row before and after it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hybridmem_local.results import Event
from hybridmem_local.schema import utcnow
from hybridmem_local.storage import audit
from hybridmem_local.storage.connection import Database, chunks


class EventLog:
    def __init__(self, db: Database):
        self.db = db

    def record(
        self,
        namespace: str,
        action: str,
        memory_id: int | None,
        run_id: int | None,
        before: dict | None,
        after: dict | None,
        reason: str | None,
    ) -> None:
        """Append one event (inside the caller's transaction: the change and its event go together),
        and name what it changed to the audit trail's operation in progress (ids only)."""
        with self.db.transaction() as c:
            c.execute(
                "INSERT INTO events (namespace, at, action, memory_id, run_id, before, after, reason) "
                "VALUES (:namespace, :at, :action, :memory_id, :run_id, :before, :after, :reason)",
                {
                    "namespace": namespace,
                    "at": utcnow().isoformat(),
                    "action": action,
                    "memory_id": memory_id,
                    "run_id": run_id,
                    "before": json.dumps(before) if before is not None else None,
                    "after": json.dumps(after) if after is not None else None,
                    "reason": reason,
                },
            )
        after = after or {}
        changed = [memory_id] if memory_id is not None else after.get("memory_ids", [])  # a purge lists them
        audit.note(
            namespace,
            changed=changed,
            sessions=[after["session_id"]] if "session_id" in after else [],
            keys=[after["key_id"]] if "key_id" in after else [],
        )

    def history(self, memory_id: int) -> list[Event]:
        return [
            _row_to_event(r)
            for r in self.db.execute(
                "SELECT * FROM events WHERE memory_id = :memory_id ORDER BY id", {"memory_id": memory_id}
            )
        ]

    def latest(self, namespaces: Sequence[str]) -> dict[str, datetime]:
        """namespace → the time of its latest event (its last change), in one query per
        ``chunks`` of names; a namespace without events is left out."""
        out: dict[str, datetime] = {}
        for chunk in chunks(list(namespaces)):
            # One statement; each name's newest event is one lookup in events_ns_at.
            for row in self.db.execute(
                "SELECT name, (SELECT max(at) FROM events WHERE namespace = name) AS at FROM namespaces "
                "WHERE name IN :namespaces",
                {"namespaces": chunk},
            ):
                if row.at is not None:
                    out[row.name] = datetime.fromisoformat(row.at)
        return out

    def of_run(self, run_id: int) -> list[Event]:
        return [
            _row_to_event(r)
            for r in self.db.execute("SELECT * FROM events WHERE run_id = :run_id ORDER BY id", {"run_id": run_id})
        ]

    def after(self, memory_ids: Sequence[int], event_id: int) -> list[Event]:
        """Events of ``memory_ids`` recorded after event ``event_id``, oldest first."""
        events: list[Event] = []
        for chunk in chunks(memory_ids):
            events += [
                _row_to_event(r)
                for r in self.db.execute(
                    "SELECT * FROM events WHERE memory_id IN :memory_ids AND id > :event_id ORDER BY id",
                    {"memory_ids": chunk, "event_id": event_id},
                )
            ]
        return sorted(events, key=lambda e: e.id)


def _row_to_event(row: sa.Row[Any]) -> Event:
    return Event(
        id=row.id,
        namespace=row.namespace,
        at=datetime.fromisoformat(row.at),
        action=row.action,
        memory_id=row.memory_id,
        run_id=row.run_id,
        before=json.loads(row.before) if row.before else None,
        after=json.loads(row.after) if row.after else None,
        reason=row.reason,
    )
