"""The ``memories`` table: episodes and tuples, one table for both stores.

* ``kind`` = episode | tuple, so a memory id is unique across the library: ``get``, ``delete``
  and ``history`` take just an id, and the id doubles as the hnswlib label.
* Memory content is immutable once written; only ``status`` / ``superseded_by`` /
  ``status_reason`` change, and the source turns grow (a union, never a loss) when curation
  meets the same memory again (:meth:`Memories.add_source_turns`). Consolidation inserts new
  rows instead of editing old ones, so an index never holds a stale vector for a live id, and
  undo is a status flip.
* Every change is an event (:class:`~hybridmem_local.storage.events.EventLog`) with the row
  before and after it, written in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any

import numpy as np
import sqlalchemy as sa

from hybridmem_local.errors import NotFoundError
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    Provenance,
    RelationalTuple,
    TupleDraft,
    combine_provenance,
    provenance_of,
    utcnow,
)
from hybridmem_local.storage.connection import Database, chunks, inserted_id
from hybridmem_local.storage.events import EventLog
from hybridmem_local.storage.namespaces import Namespaces

_MEMORY_COLUMNS = (
    "id, namespace, kind, title, summary, details, entity, relation, object, context, timestamp, "
    "source_session_id, source_turn_ids, provenance, created_at, status, superseded_by"
)
#: ``LIMIT`` without a limit (an ``OFFSET`` alone): the largest BIGINT, as SQLite and PostgreSQL both take it.
_NO_LIMIT = 2**63 - 1


class Memories:
    def __init__(self, db: Database, namespaces: Namespaces, events: EventLog):
        self.db = db
        self.namespaces = namespaces
        self.events = events

    def insert(
        self,
        namespace: str,
        memories: Iterable[EpisodeDraft | TupleDraft | Episode | RelationalTuple],
        source_session_id: str | None = None,
        run_id: int | None = None,
        action: str = "add",
        before: dict[str, Any] | None = None,
    ) -> list[int]:
        """Insert new active memories and their ``action`` events (with ``before``, the row a
        memory replaces, when there is one); returns the new ids."""
        ids: list[int] = []
        now = utcnow().isoformat()
        with self.db.transaction() as c:
            self.namespaces.ensure(namespace)
            for memory in memories:
                data = _memory_columns(memory)
                session_id = getattr(memory, "source_session_id", None) or source_session_id
                memory_id = inserted_id(
                    c.execute(
                        "INSERT INTO memories (namespace, kind, title, summary, details, entity, relation, object, "
                        "context, "
                        "timestamp, source_session_id, source_turn_ids, provenance, created_at) "
                        "VALUES (:namespace, :kind, :title, :summary, :details, :entity, :relation, :object, :context, "
                        ":timestamp, :source_session_id, :source_turn_ids, :provenance, :created_at) RETURNING id",
                        {**data, "namespace": namespace, "source_session_id": session_id, "created_at": now},
                    )
                )
                ids.append(memory_id)
                self.events.record(namespace, action, memory_id, run_id, before, self._row_json(memory_id), None)
        return ids

    def set_status(
        self,
        memory_id: int,
        status: MemoryStatus,
        reason: str | None = None,
        superseded_by: int | None = None,
        run_id: int | None = None,
        action: str | None = None,
    ) -> None:
        """Change one memory's status (the only mutation a memory ever sees), with an event."""
        with self.db.transaction() as c:
            before = self._row_json(memory_id)
            c.execute(
                "UPDATE memories SET status = :status, superseded_by = :superseded_by, status_reason = :reason "
                "WHERE id = :id",
                {
                    "status": MemoryStatus(status).value,
                    "superseded_by": superseded_by,
                    "reason": reason,
                    "id": memory_id,
                },
            )
            self.events.record(
                before["namespace"],
                action or MemoryStatus(status).value,
                memory_id,
                run_id,
                before,
                self._row_json(memory_id),
                reason,
            )

    def duplicate_candidates(
        self, namespace: str, kind: MemoryKind, timestamp: str, session_id: str | None
    ) -> list[Episode | RelationalTuple]:
        """Active memories of ``kind`` that a new memory could repeat: those with its timestamp,
        and those of its session (a model restating a memory of the session under another date)."""
        return [
            _row_to_memory(r)
            for r in self.db.execute(
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = :namespace AND kind = :kind "
                "AND status = 'active' AND (timestamp = :timestamp OR source_session_id = :session_id) ORDER BY id",
                {"namespace": namespace, "kind": kind, "timestamp": timestamp, "session_id": session_id},
            )
        ]

    def add_source_turns(
        self, memory_id: int, turn_ids: Sequence[str], provenance: Provenance | None, reason: str
    ) -> None:
        """Give a memory more source turns (a union, in order: old ones first) and the combined
        provenance, with a ``duplicate`` event; nothing else of it changes."""
        with self.db.transaction() as c:
            before = self._row_json(memory_id)
            old = json.loads(before["source_turn_ids"])
            union = list(dict.fromkeys([*old, *turn_ids]))
            combined = combine_provenance([before["provenance"] if old else None, provenance if turn_ids else None])
            c.execute(
                "UPDATE memories SET source_turn_ids = :source_turn_ids, provenance = :provenance WHERE id = :id",
                {"source_turn_ids": json.dumps(union), "provenance": combined, "id": memory_id},
            )
            self.events.record(
                before["namespace"], "duplicate", memory_id, None, before, self._row_json(memory_id), reason
            )

    def supersede(
        self,
        namespace: str,
        source_ids: Sequence[int],
        memory: Episode | RelationalTuple,
        reason: str,
        action: str,
        run_id: int | None = None,
        redacting: bool = False,
    ) -> int:
        """Store ``memory`` as the active successor of ``source_ids`` (an update: one source; a
        consolidation merge: several; a redaction's rewritten copy) and mark each source
        superseded by it, every change an event. The new row's ``action`` event carries, for one
        source, that source's row as ``before``, except when ``redacting``: that row holds the
        text being removed, and confirming the redaction deletes only the sources' own events;
        a redaction's sources' events are named ``action`` too. Returns the new id."""
        with self.db.transaction():
            before = self._row_json(source_ids[0]) if len(source_ids) == 1 and not redacting else None
            (new_id,) = self.insert(namespace, [memory], run_id=run_id, action=action, before=before)
            for source_id in source_ids:
                self.set_status(
                    source_id,
                    MemoryStatus.superseded,
                    reason=reason,
                    superseded_by=new_id,
                    run_id=run_id,
                    action=action if redacting else None,
                )
        return new_id

    def not_active(self, ids: Sequence[int]) -> list[int]:
        """The ids that are no longer active memories (changed or purged)."""
        rows = self.status_rows(ids)
        return [i for i in ids if i not in rows or rows[i]["status"] != MemoryStatus.active.value]

    def _row_json(self, memory_id: int) -> dict[str, Any]:
        row = self.db.execute(
            f"SELECT {_MEMORY_COLUMNS}, status_reason FROM memories WHERE id = :id", {"id": memory_id}
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no memory with id {memory_id}")
        return dict(row._mapping)

    def get(self, memory_id: int) -> Episode | RelationalTuple:
        row = self.db.execute(f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id = :id", {"id": memory_id}).fetchone()
        if row is None:
            raise NotFoundError(f"no memory with id {memory_id}")
        return _row_to_memory(row)

    def get_many(self, ids: Sequence[int]) -> dict[int, Episode | RelationalTuple]:
        out: dict[int, Episode | RelationalTuple] = {}
        for chunk in chunks(ids):
            for row in self.db.execute(f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id IN :ids", {"ids": chunk}):
                out[row.id] = _row_to_memory(row)
        return out

    def of_session(self, namespace: str, session_id: str, limit: int) -> list[Episode | RelationalTuple]:
        """The memories (any status) curated from a session of ``namespace``, in id order, at most ``limit``."""
        rows = self.db.execute(
            f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = :namespace AND source_session_id = :session_id "
            "ORDER BY id LIMIT :limit",
            {"namespace": namespace, "session_id": session_id, "limit": int(limit)},
        )
        return [_row_to_memory(row) for row in rows]

    def select(
        self,
        namespace: str,
        kind: MemoryKind | None = None,
        status: MemoryStatus | None = MemoryStatus.active,
        limit: int | None = None,
        offset: int = 0,
        since: date | datetime | None = None,
        until: date | datetime | None = None,
    ) -> list[Episode | RelationalTuple]:
        """Memories in id order; ``limit``/``offset`` page through them (ids never move, so pages are stable).

        ``since``/``until`` keep a memory whose timestamp (an ISO prefix: a year, month, day or
        datetime) names a period overlapping ``[since, until]``: both sides are compared cut to
        the shorter's length, so "2023" overlaps 2023-05-01 and "2023-05-01T10:00" is within
        until=2023-05-01."""
        sql = f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = :namespace"
        params: dict[str, str | int] = {"namespace": namespace}
        if kind is not None:
            sql, params["kind"] = sql + " AND kind = :kind", kind
        if status is not None:
            sql, params["status"] = sql + " AND status = :status", MemoryStatus(status).value
        if since is not None:
            sql += (
                " AND substr(timestamp, 1, length(CAST(:since AS TEXT)))"
                " >= substr(CAST(:since AS TEXT), 1, length(timestamp))"
            )
            params["since"] = since.isoformat()
        if until is not None:
            sql += (
                " AND substr(timestamp, 1, length(CAST(:until AS TEXT)))"
                " <= substr(CAST(:until AS TEXT), 1, length(timestamp))"
            )
            params["until"] = until.isoformat()
        sql += " ORDER BY id"
        if limit is not None or offset:
            # SQLite needs a LIMIT for an OFFSET, and PostgreSQL refuses SQLite's -1 for "no limit":
            # the largest BIGINT means none on both.
            sql += " LIMIT :limit OFFSET :offset"
            params.update(limit=_NO_LIMIT if limit is None else int(limit), offset=int(offset))
        return [_row_to_memory(r) for r in self.db.execute(sql, params)]

    def active_ids(self, namespace: str, kind: MemoryKind) -> np.ndarray:
        rows = self.db.execute(
            "SELECT id FROM memories WHERE namespace = :namespace AND kind = :kind AND status = 'active' ORDER BY id",
            {"namespace": namespace, "kind": kind},
        ).fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def status_rows(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """id → {status, superseded_by, status_reason} for the ids that exist."""
        rows: dict[int, dict[str, Any]] = {}
        for chunk in chunks(ids):
            for r in self.db.execute(
                "SELECT id, status, superseded_by, status_reason FROM memories WHERE id IN :ids", {"ids": chunk}
            ):
                rows[r.id] = dict(r._mapping)
        return rows

    def retired_before(self, namespace: str, cutoff: datetime) -> set[int]:
        """Non-active memories whose last change (or creation) is older than ``cutoff``."""
        return {
            r[0]
            for r in self.db.execute(
                # PostgreSQL's HAVING cannot name an output column: the expression is repeated.
                "SELECT m.id FROM memories m LEFT JOIN events e ON e.memory_id = m.id "
                "WHERE m.namespace = :namespace AND m.status != 'active' "
                "GROUP BY m.id, m.created_at HAVING coalesce(max(e.at), m.created_at) < :cutoff",
                {"namespace": namespace, "cutoff": cutoff.isoformat()},
            )
        }

    def superseded_pointers(self, namespace: str) -> dict[int, int]:
        """memory id → the id of the memory that superseded it."""
        return {
            r.id: r.superseded_by
            for r in self.db.execute(
                "SELECT id, superseded_by FROM memories WHERE namespace = :namespace AND superseded_by IS NOT NULL",
                {"namespace": namespace},
            )
        }


def _memory_columns(memory: EpisodeDraft | TupleDraft) -> dict[str, Any]:
    kind = "episode" if isinstance(memory, EpisodeDraft) else "tuple"
    fields = ("title", "summary", "details", "entity", "relation", "object", "context")
    data = {f: getattr(memory, f, None) for f in fields}
    data.update(
        kind=kind,
        timestamp=memory.timestamp,
        source_turn_ids=json.dumps(list(memory.source_turn_ids)),
        provenance=memory.provenance,
    )
    return data


def _row_to_memory(result_row: sa.Row[Any]) -> Episode | RelationalTuple:
    # Rows were validated on their way in (insert takes drafts), so they are built without
    # validating again: ~13 µs a row instead of ~30, ~0.5 ms of a 30-hit search.
    row = result_row._mapping
    turn_ids = json.loads(row["source_turn_ids"])
    common = dict(
        id=row["id"],
        namespace=row["namespace"],
        timestamp=row["timestamp"],
        source_session_id=row["source_session_id"],
        source_turn_ids=turn_ids,
        # Rows older than the provenance column hold NULL: their turns were cited.
        provenance=provenance_of(turn_ids, row["provenance"]),
        created_at=datetime.fromisoformat(row["created_at"]),
        status=MemoryStatus(row["status"]),
        superseded_by=row["superseded_by"],
    )
    if row["kind"] == "episode":
        return Episode.model_construct(title=row["title"], summary=row["summary"], details=row["details"], **common)
    return RelationalTuple.model_construct(
        entity=row["entity"], relation=row["relation"], object=row["object"], context=row["context"] or "", **common
    )
