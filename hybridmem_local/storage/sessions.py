"""The ``sessions`` and ``turns`` tables: stored sessions, their turns, and how their curation went."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from datetime import datetime

from hybridmem_local.errors import AlreadyCuratedError, DuplicateSessionError, DuplicateTurnError, NotFoundError
from hybridmem_local.schema import Session, SessionRecord, Turn, utcnow
from hybridmem_local.storage.connection import Database, chunks, inserted_id
from hybridmem_local.storage.events import EventLog
from hybridmem_local.storage.namespaces import Namespaces

#: A namespace's turns with their session id and start (``turn_rows``, ``turn_rows_by_id``).
_TURN_ROWS = (
    "SELECT t.id, t.position, t.turn_id, t.speaker, t.text, t.image_caption, s.session_id, s.started_at "
    "FROM turns t JOIN sessions s ON s.id = t.session_pk WHERE t.namespace = ?"
)


class Sessions:
    def __init__(self, db: Database, namespaces: Namespaces, events: EventLog):
        self.db = db
        self.namespaces = namespaces
        self.events = events

    def insert(
        self,
        session: Session,
        curation_status: str = "pending",
        prompt_version: str | None = None,
        curation_error: str | None = None,
    ) -> int:
        """Insert a session and its turns (inside the caller's transaction, if any)."""
        with self.db.transaction() as c:
            self.namespaces.ensure(session.namespace)
            if c.execute(
                "SELECT 1 FROM sessions WHERE namespace = ? AND session_id = ?",
                (session.namespace, session.session_id),
            ).fetchone():
                raise DuplicateSessionError(
                    f"session {session.session_id!r} already exists in namespace {session.namespace!r}"
                )
            clash = self.existing_turn_ids(session.namespace, [t.turn_id for t in session.turns])
            if clash:
                raise DuplicateTurnError(
                    f"session {session.session_id!r}: turn ids already used by another session of namespace "
                    f"{session.namespace!r}: {sorted(clash)[:5]}"
                )
            pk = inserted_id(
                c.execute(
                    "INSERT INTO sessions (namespace, session_id, started_at, created_at, curation_status, "
                    "prompt_version, curation_error) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        session.namespace,
                        session.session_id,
                        session.started_at.isoformat(),
                        utcnow().isoformat(),
                        curation_status,
                        prompt_version,
                        curation_error,
                    ),
                )
            )
            c.executemany(
                "INSERT INTO turns (session_pk, namespace, position, turn_id, speaker, text, image_caption) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (pk, session.namespace, i, t.turn_id, t.speaker, t.text, t.image_caption)
                    for i, t in enumerate(session.turns)
                ],
            )
            c.execute(
                "UPDATE namespaces SET sessions_since_consolidation = sessions_since_consolidation + 1 WHERE name = ?",
                (session.namespace,),
            )
            self.events.record(
                session.namespace, "add_session", None, None, None, {"session_id": session.session_id}, None
            )
        return pk

    def existing_turn_ids(self, namespace: str, turn_ids: Sequence[str]) -> set[str]:
        """The ones of ``turn_ids`` that turns of ``namespace`` already have."""
        found: set[str] = set()
        for chunk in chunks(turn_ids):
            marks = ",".join("?" * len(chunk))
            found.update(
                r[0]
                for r in self.db.conn.execute(
                    f"SELECT turn_id FROM turns WHERE namespace = ? AND turn_id IN ({marks})", (namespace, *chunk)
                )
            )
        return found

    def exists(self, namespace: str, session_id: str) -> bool:
        return bool(
            self.db.conn.execute(
                "SELECT 1 FROM sessions WHERE namespace = ? AND session_id = ?", (namespace, session_id)
            ).fetchone()
        )

    def set_curation_status(
        self,
        namespace: str,
        session_id: str,
        status: str,
        error: str | None = None,
        prompt_version: str | None = None,
        require_uncurated: bool = False,
    ) -> None:
        """Change a session's curation status; with ``require_uncurated``, AlreadyCuratedError
        (nothing changed) when it is curated already, so two curators cannot both store it."""
        sql = (
            "UPDATE sessions SET curation_status = ?, curation_error = ?, prompt_version = coalesce(?, prompt_version) "
            "WHERE namespace = ? AND session_id = ?"
        )
        if require_uncurated:
            sql += " AND curation_status != 'curated'"
        with self.db.transaction() as c:
            updated = c.execute(sql, (status, error, prompt_version, namespace, session_id)).rowcount
            if not updated:
                if require_uncurated and self.exists(namespace, session_id):
                    raise AlreadyCuratedError(f"session {session_id!r} of namespace {namespace!r} is already curated")
                raise NotFoundError(f"no session {session_id!r} in namespace {namespace!r}")

    def get(self, namespace: str, session_id: str) -> SessionRecord:
        row = self.db.conn.execute(
            "SELECT * FROM sessions WHERE namespace = ? AND session_id = ?", (namespace, session_id)
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no session {session_id!r} in namespace {namespace!r}")
        return self._record(row)

    def select(self, namespace: str | None = None, curation_status: str | None = None) -> Iterator[SessionRecord]:
        """Sessions of one namespace (or all) and one curation status (or any), in namespace and date order."""
        sql = "SELECT * FROM sessions WHERE 1=1"
        args: list[str] = []
        if namespace is not None:
            sql, args = sql + " AND namespace = ?", [*args, namespace]
        if curation_status is not None:
            sql, args = sql + " AND curation_status = ?", [*args, curation_status]
        for row in self.db.conn.execute(sql + " ORDER BY namespace, started_at, id", args).fetchall():
            yield self._record(row)

    def to_curate(
        self, statuses: Sequence[str], namespace: str | None = None, limit: int | None = None
    ) -> list[SessionRecord]:
        """Sessions with one of ``statuses``, oldest first (arrival order), of every namespace
        unless one is named; at most ``limit`` of them."""
        marks = ",".join("?" * len(statuses))
        sql = f"SELECT * FROM sessions WHERE curation_status IN ({marks})"
        args: list[str | int] = list(statuses)
        if namespace is not None:
            sql, args = sql + " AND namespace = ?", [*args, namespace]
        sql += " ORDER BY id"
        if limit is not None:
            sql, args = sql + " LIMIT ?", [*args, int(limit)]
        return [self._record(row) for row in self.db.conn.execute(sql, args).fetchall()]

    def count(self, curation_status: str) -> int:
        """Sessions with this curation status over all namespaces (the service's queue length)."""
        return self.db.conn.execute(
            "SELECT count(*) FROM sessions WHERE curation_status = ?", (curation_status,)
        ).fetchone()[0]

    def _record(self, row: sqlite3.Row) -> SessionRecord:
        turns = [
            Turn(turn_id=t["turn_id"], speaker=t["speaker"], text=t["text"], image_caption=t["image_caption"])
            for t in self.db.conn.execute(
                "SELECT turn_id, speaker, text, image_caption FROM turns WHERE session_pk = ? ORDER BY position",
                (row["id"],),
            )
        ]
        session = Session(
            session_id=row["session_id"],
            namespace=row["namespace"],
            started_at=datetime.fromisoformat(row["started_at"]),
            turns=turns,
        )
        return SessionRecord(
            session=session, curation_status=row["curation_status"], curation_error=row["curation_error"]
        )

    def turns_marker(self, namespace: str) -> tuple[int, int]:
        """(turns, highest turn row id) of a namespace: changes whenever it gains turns."""
        return tuple(
            self.db.conn.execute(
                "SELECT count(*), coalesce(max(id), 0) FROM turns WHERE namespace = ?", (namespace,)
            ).fetchone()
        )

    def turn_rows(self, namespace: str) -> list[sqlite3.Row]:
        """Every turn of a namespace with its session id and start, sessions in chronological order."""
        return self.db.conn.execute(
            f"{_TURN_ROWS} ORDER BY s.started_at, s.id, t.position",
            (namespace,),
        ).fetchall()

    def turn_rows_by_id(self, namespace: str, turn_ids: Sequence[str]) -> list[sqlite3.Row]:
        """The turns of a namespace with these turn ids, with ``turn_rows``' columns (ids it lacks are left out)."""
        rows: list[sqlite3.Row] = []
        for chunk in chunks(list(dict.fromkeys(turn_ids))):
            rows += self.db.conn.execute(
                f"{_TURN_ROWS} AND t.turn_id IN ({','.join('?' * len(chunk))})",
                (namespace, *chunk),
            ).fetchall()
        return rows
