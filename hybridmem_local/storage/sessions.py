"""The ``sessions`` and ``turns`` tables: stored sessions, their turns, and how their curation went."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa

from hybridmem_local.errors import (
    AlreadyCuratedError,
    DuplicateSessionError,
    DuplicateTurnError,
    InvalidInputError,
    NotFoundError,
)
from hybridmem_local.schema import Session, SessionRecord, Turn, utcnow
from hybridmem_local.storage.connection import Database, chunks, inserted_id
from hybridmem_local.storage.events import EventLog
from hybridmem_local.storage.namespaces import Namespaces

#: A namespace's turns with their session id and start (``turn_rows``, ``turn_rows_by_id``).
_TURN_ROWS = (
    "SELECT t.id, t.position, t.turn_id, t.speaker, t.text, t.image_caption, s.session_id, s.started_at "
    "FROM turns t JOIN sessions s ON s.id = t.session_pk WHERE t.namespace = :namespace"
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
                "SELECT 1 FROM sessions WHERE namespace = :namespace AND session_id = :session_id",
                {"namespace": session.namespace, "session_id": session.session_id},
            ).first():
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
                    "prompt_version, curation_error) VALUES (:namespace, :session_id, :started_at, :created_at, "
                    ":curation_status, :prompt_version, :curation_error) RETURNING id",
                    {
                        "namespace": session.namespace,
                        "session_id": session.session_id,
                        "started_at": session.started_at.isoformat(),
                        "created_at": utcnow().isoformat(),
                        "curation_status": curation_status,
                        "prompt_version": prompt_version,
                        "curation_error": curation_error,
                    },
                )
            )
            c.executemany(
                "INSERT INTO turns (session_pk, namespace, position, turn_id, speaker, text, image_caption) "
                "VALUES (:session_pk, :namespace, :position, :turn_id, :speaker, :text, :image_caption)",
                [
                    {
                        "session_pk": pk,
                        "namespace": session.namespace,
                        "position": i,
                        "turn_id": t.turn_id,
                        "speaker": t.speaker,
                        "text": t.text,
                        "image_caption": t.image_caption,
                    }
                    for i, t in enumerate(session.turns)
                ],
            )
            c.execute(
                "UPDATE namespaces SET sessions_since_consolidation = sessions_since_consolidation + 1 "
                "WHERE name = :namespace",
                {"namespace": session.namespace},
            )
            self.events.record(
                session.namespace, "add_session", None, None, None, {"session_id": session.session_id}, None
            )
        return pk

    def existing_turn_ids(self, namespace: str, turn_ids: Sequence[str]) -> set[str]:
        """The ones of ``turn_ids`` that turns of ``namespace`` already have."""
        found: set[str] = set()
        for chunk in chunks(turn_ids):
            found.update(
                r.turn_id
                for r in self.db.execute(
                    "SELECT turn_id FROM turns WHERE namespace = :namespace AND turn_id IN :turn_ids",
                    {"namespace": namespace, "turn_ids": chunk},
                )
            )
        return found

    def exists(self, namespace: str, session_id: str) -> bool:
        return (
            self.db.execute(
                "SELECT 1 FROM sessions WHERE namespace = :namespace AND session_id = :session_id",
                {"namespace": namespace, "session_id": session_id},
            ).first()
            is not None
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
        """Change a session's curation status, which ends a worker's claim on it (``claim``); with
        ``require_uncurated``, AlreadyCuratedError (nothing changed) when it is curated already,
        so two curators cannot both store it."""
        sql = (
            "UPDATE sessions SET curation_status = :status, curation_error = :error, "
            "prompt_version = coalesce(:prompt_version, prompt_version), claimed_by = NULL, claim_expires_at = NULL "
            "WHERE namespace = :namespace AND session_id = :session_id"
        )
        if require_uncurated:
            sql += " AND curation_status != 'curated'"
        with self.db.transaction() as c:
            updated = c.execute(
                sql,
                {
                    "status": status,
                    "error": error,
                    "prompt_version": prompt_version,
                    "namespace": namespace,
                    "session_id": session_id,
                },
            ).rowcount
            if not updated:
                if require_uncurated and self.exists(namespace, session_id):
                    raise AlreadyCuratedError(f"session {session_id!r} of namespace {namespace!r} is already curated")
                raise NotFoundError(f"no session {session_id!r} in namespace {namespace!r}")

    def requeue_failed(self, namespace: str, session_id: str) -> None:
        """Put a ``curation_failed`` session back in the queue (``pending``, error cleared) for
        the curation worker, with a ``retry_curation`` event; InvalidInputError when it is not
        failed (curated, or pending already), NotFoundError when there is no such session."""
        with self.db.transaction() as c:
            updated = c.execute(
                "UPDATE sessions SET curation_status = 'pending', curation_error = NULL, claimed_by = NULL, "
                "claim_expires_at = NULL "
                "WHERE namespace = :namespace AND session_id = :session_id AND curation_status = 'curation_failed'",
                {"namespace": namespace, "session_id": session_id},
            ).rowcount
            if not updated:
                status = self.get(namespace, session_id).curation_status  # NotFoundError when missing
                raise InvalidInputError(
                    f"session {session_id!r} is {status}: only a session whose curation failed is queued again"
                )
            self.events.record(namespace, "retry_curation", None, None, None, {"session_id": session_id}, None)

    def get(self, namespace: str, session_id: str) -> SessionRecord:
        row = self.db.execute(
            "SELECT * FROM sessions WHERE namespace = :namespace AND session_id = :session_id",
            {"namespace": namespace, "session_id": session_id},
        ).first()
        if row is None:
            raise NotFoundError(f"no session {session_id!r} in namespace {namespace!r}")
        return self._record(row)

    def select(self, namespace: str | None = None, curation_status: str | None = None) -> Iterator[SessionRecord]:
        """Sessions of one namespace (or all) and one curation status (or any), in namespace and date order."""
        sql = "SELECT * FROM sessions WHERE 1=1"
        params: dict[str, Any] = {}
        if namespace is not None:
            sql, params["namespace"] = sql + " AND namespace = :namespace", namespace
        if curation_status is not None:
            sql, params["curation_status"] = sql + " AND curation_status = :curation_status", curation_status
        for row in self.db.execute(sql + " ORDER BY namespace, started_at, id", params).fetchall():
            yield self._record(row)

    def to_curate(
        self, statuses: Sequence[str], namespace: str | None = None, limit: int | None = None
    ) -> list[SessionRecord]:
        """Sessions with one of ``statuses``, oldest first (arrival order), of every namespace
        unless one is named; at most ``limit`` of them. Sessions a worker holds an unexpired
        claim on (``claim``) are left to it."""
        sql = (
            "SELECT * FROM sessions WHERE curation_status IN :statuses "
            "AND (claim_expires_at IS NULL OR claim_expires_at < :now)"
        )
        params: dict[str, Any] = {"statuses": list(statuses), "now": _instant(utcnow())}
        if namespace is not None:
            sql, params["namespace"] = sql + " AND namespace = :namespace", namespace
        sql += " ORDER BY id"
        if limit is not None:
            sql, params["limit"] = sql + " LIMIT :limit", int(limit)
        return [self._record(row) for row in self.db.execute(sql, params).fetchall()]

    def claim(self, worker: str, limit: int, lease_s: float) -> list[SessionRecord]:
        """Claim up to ``limit`` pending sessions of every namespace, oldest first (arrival order),
        for ``worker`` until ``lease_s`` from now. Sessions another worker holds an unexpired claim
        on are skipped, and on PostgreSQL so are rows another worker is claiming at this moment
        (``FOR UPDATE SKIP LOCKED``); a claim whose lease ran out (its worker died) is anyone's.
        Storing a session's curation or its failure (``set_curation_status``) ends the claim."""
        now = utcnow()
        with self.db.transaction(claim=True) as c:
            rows = c.execute(
                "SELECT * FROM sessions WHERE curation_status = 'pending' "
                "AND (claimed_by IS NULL OR claimed_by = :worker OR claim_expires_at < :now) "
                f"ORDER BY id LIMIT :limit{self.db.backend.skip_locked}",
                {"worker": worker, "now": _instant(now), "limit": int(limit)},
            ).fetchall()
            if rows:
                c.execute(
                    "UPDATE sessions SET claimed_by = :worker, claim_expires_at = :expires WHERE id IN :ids",
                    {
                        "worker": worker,
                        "expires": _instant(now + timedelta(seconds=lease_s)),
                        "ids": [r.id for r in rows],
                    },
                )
        return [self._record(row) for row in rows]

    def renew_claims(self, worker: str, lease_s: float) -> int:
        """Extend ``worker``'s claims on the sessions still pending to ``lease_s`` from now (its
        heartbeat while a batch runs); returns how many."""
        with self.db.transaction(claim=True) as c:
            return c.execute(
                "UPDATE sessions SET claim_expires_at = :expires "
                "WHERE claimed_by = :worker AND curation_status = 'pending'",
                {"worker": worker, "expires": _instant(utcnow() + timedelta(seconds=lease_s))},
            ).rowcount

    def release_claims(self, worker: str) -> int:
        """End every claim of ``worker`` (its batch stopped or failed): the sessions still pending
        are any worker's again at once; returns how many."""
        with self.db.transaction(claim=True) as c:
            return c.execute(
                "UPDATE sessions SET claimed_by = NULL, claim_expires_at = NULL WHERE claimed_by = :worker",
                {"worker": worker},
            ).rowcount

    def count(self, curation_status: str) -> int:
        """Sessions with this curation status over all namespaces (the service's queue length)."""
        return int(
            self.db.scalar(
                "SELECT count(*) FROM sessions WHERE curation_status = :curation_status",
                {"curation_status": curation_status},
            )
        )

    def _record(self, row: sa.Row[Any]) -> SessionRecord:
        turns = [
            Turn(turn_id=t.turn_id, speaker=t.speaker, text=t.text, image_caption=t.image_caption)
            for t in self.db.execute(
                "SELECT turn_id, speaker, text, image_caption FROM turns WHERE session_pk = :session_pk "
                "ORDER BY position",
                {"session_pk": row.id},
            )
        ]
        session = Session(
            session_id=row.session_id,
            namespace=row.namespace,
            started_at=datetime.fromisoformat(row.started_at),
            turns=turns,
        )
        return SessionRecord(session=session, curation_status=row.curation_status, curation_error=row.curation_error)

    def turns_marker(self, namespace: str) -> tuple[int, int]:
        """(turns, highest turn row id) of a namespace: changes whenever it gains turns."""
        row = self.db.execute(
            "SELECT count(*) AS turns, coalesce(max(id), 0) AS highest FROM turns WHERE namespace = :namespace",
            {"namespace": namespace},
        ).one()
        return int(row.turns), int(row.highest)

    def turn_rows(self, namespace: str) -> list[sa.Row[Any]]:
        """Every turn of a namespace with its session id and start, sessions in chronological order."""
        return list(
            self.db.execute(
                f"{_TURN_ROWS} ORDER BY s.started_at, s.id, t.position", {"namespace": namespace}
            ).fetchall()
        )

    def turn_rows_by_id(self, namespace: str, turn_ids: Sequence[str]) -> list[sa.Row[Any]]:
        """The turns of a namespace with these turn ids, with ``turn_rows``' columns (ids it lacks are left out)."""
        rows: list[sa.Row[Any]] = []
        for chunk in chunks(list(dict.fromkeys(turn_ids))):
            rows += self.db.execute(
                f"{_TURN_ROWS} AND t.turn_id IN :turn_ids", {"namespace": namespace, "turn_ids": chunk}
            ).fetchall()
        return rows


def _instant(moment: datetime) -> str:
    """A claim's time as stored: ISO 8601 in UTC, always with microseconds, so that text order is time order."""
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")
