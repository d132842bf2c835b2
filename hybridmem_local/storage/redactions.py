"""The ``redactions`` table: content removed from a namespace at its user's request.

A redaction is ``pending`` while its ``originals`` (the turns' texts before and after) are kept
so an admin can undo it; ``confirmed`` once they are dropped (undo is then impossible), or
``undone``. ``request`` and ``summary`` never hold the removed text.

A turn's text is the one thing a redaction edits rather than supersedes. A rewritten turn, and
every other turn of its session, is stored again under a new row id (``rewrite_turns``): window
ids are the row ids of their first turns, so the indexes of every process see the old windows go
and new ones come, as they do for a new session, instead of keeping vectors of text that is no
longer there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hybridmem_local.errors import InvalidInputError, NotFoundError
from hybridmem_local.results import Redaction, RedactionStatus
from hybridmem_local.schema import utcnow
from hybridmem_local.storage.connection import Database, chunks, inserted_id

#: Where ``rewrite_turns`` moves a session's old turn rows until their copies are in: no
#: namespace has this name (``check_namespace`` wants 1-64 characters), so their
#: (namespace, turn_id) keys clash with nothing.
_ASIDE = ""


class Redactions:
    def __init__(self, db: Database):
        self.db = db

    def create(
        self,
        namespace: str,
        session_id: str,
        requests: Sequence[dict[str, Any]],
        summary: dict[str, Any],
        originals: dict[str, Any],
    ) -> int:
        """A pending redaction (inside the caller's transaction)."""
        with self.db.transaction() as c:
            return inserted_id(
                c.execute(
                    "INSERT INTO redactions (namespace, session_id, created_at, status, request, summary, originals) "
                    "VALUES (:namespace, :session_id, :created_at, 'pending', :request, :summary, :originals) "
                    "RETURNING id",
                    {
                        "namespace": namespace,
                        "session_id": session_id,
                        "created_at": utcnow().isoformat(),
                        "request": json.dumps(list(requests)),
                        "summary": json.dumps(summary),
                        "originals": json.dumps(originals),
                    },
                )
            )

    def set_summary(self, redaction_id: int, summary: dict[str, Any]) -> None:
        with self.db.transaction() as c:
            c.execute(
                "UPDATE redactions SET summary = :summary WHERE id = :id",
                {"summary": json.dumps(summary), "id": redaction_id},
            )

    def get(self, redaction_id: int) -> Redaction:
        return _row_to_redaction(self._row(redaction_id))

    def originals(self, redaction_id: int) -> dict[str, Any]:
        """The kept texts of a pending redaction; InvalidInputError once confirmed or undone."""
        row = self._row(redaction_id)
        if row.status != "pending" or row.originals is None:
            raise InvalidInputError(f"redaction {redaction_id} is {row.status}; only a pending one can be undone")
        return json.loads(row.originals)

    def summary(self, redaction_id: int) -> dict[str, Any]:
        return json.loads(self._row(redaction_id).summary)

    def _row(self, redaction_id: int) -> sa.Row[Any]:
        row = self.db.execute("SELECT * FROM redactions WHERE id = :id", {"id": redaction_id}).fetchone()
        if row is None:
            raise NotFoundError(f"no redaction with id {redaction_id}")
        return row

    def select(self, namespace: str, status: RedactionStatus | None = None) -> list[Redaction]:
        sql, params = "SELECT * FROM redactions WHERE namespace = :namespace", {"namespace": namespace}
        if status is not None:
            sql, params["status"] = sql + " AND status = :status", status
        return [_row_to_redaction(r) for r in self.db.execute(sql + " ORDER BY id", params)]

    def asked_turn_ids(self, namespace: str, session_id: str) -> set[str]:
        """The turns whose forget requests a redaction of this session answered already, whatever
        became of it (an undone one was an admin's decision)."""
        rows = self.db.execute(
            "SELECT request FROM redactions WHERE namespace = :namespace AND session_id = :session_id",
            {"namespace": namespace, "session_id": session_id},
        )
        return {request["turn_id"] for (requests,) in rows for request in json.loads(requests)}

    def pending_before(self, cutoff: datetime) -> list[int]:
        """Pending redactions (of every namespace) made before ``cutoff``, oldest first."""
        return [
            r.id
            for r in self.db.execute(
                "SELECT id FROM redactions WHERE status = 'pending' AND created_at < :cutoff ORDER BY id",
                {"cutoff": cutoff.isoformat()},
            )
        ]

    def decide(self, redaction_id: int, status: RedactionStatus) -> None:
        """Mark a pending redaction confirmed or undone and drop its originals (inside the caller's transaction)."""
        with self.db.transaction() as c:
            c.execute(
                "UPDATE redactions SET status = :status, decided_at = :decided_at, originals = NULL WHERE id = :id",
                {"status": status, "decided_at": utcnow().isoformat(), "id": redaction_id},
            )

    def turn_texts(self, namespace: str, turn_ids: Sequence[str]) -> dict[str, str]:
        texts: dict[str, str] = {}
        for chunk in chunks(list(turn_ids)):
            texts.update(
                (r.turn_id, r.text)
                for r in self.db.execute(
                    "SELECT turn_id, text FROM turns WHERE namespace = :namespace AND turn_id IN :turn_ids",
                    {"namespace": namespace, "turn_ids": chunk},
                )
            )
        return texts

    def rewrite_turns(self, namespace: str, texts: Mapping[str, str]) -> None:
        """Give turns new texts, and each of their sessions' turns a new row id (see the module
        docstring), inside the caller's transaction.

        Each turn of such a session is inserted again, in position order, with the id the
        database assigns (SQLite: one above the table's largest; PostgreSQL: the id sequence's
        next), and its old row deleted after: the copies are inserted while the old rows still
        exist, so SQLite never hands out an id again that a window was named by (``turns`` has
        no AUTOINCREMENT). Meanwhile the old rows stand aside under :data:`_ASIDE`, which frees
        their (namespace, turn_id) for the copies."""
        if not texts:
            return
        with self.db.transaction() as c:
            sessions: set[int] = set()
            for chunk in chunks(sorted(texts)):
                sessions.update(
                    r.session_pk
                    for r in c.execute(
                        "SELECT session_pk FROM turns WHERE namespace = :namespace AND turn_id IN :turn_ids",
                        {"namespace": namespace, "turn_ids": chunk},
                    )
                )
            for session_pk in sorted(sessions):
                rows = c.execute(
                    "SELECT namespace, position, turn_id, speaker, text, image_caption FROM turns "
                    "WHERE session_pk = :session_pk ORDER BY position",
                    {"session_pk": session_pk},
                ).fetchall()
                c.execute(
                    "UPDATE turns SET namespace = :aside WHERE session_pk = :session_pk",
                    {"aside": _ASIDE, "session_pk": session_pk},
                )
                c.executemany(
                    "INSERT INTO turns (session_pk, namespace, position, turn_id, speaker, text, image_caption) "
                    "VALUES (:session_pk, :namespace, :position, :turn_id, :speaker, :text, :image_caption)",
                    [
                        {**row._mapping, "session_pk": session_pk, "text": texts.get(row.turn_id, row.text)}
                        for row in rows
                    ],
                )
                c.execute(
                    "DELETE FROM turns WHERE session_pk = :session_pk AND namespace = :aside",
                    {"aside": _ASIDE, "session_pk": session_pk},
                )

    def delete_memories(self, namespace: str, ids: Sequence[int], text_hashes: Sequence[str]) -> dict[str, int]:
        """Physically delete memories, their events and the cached embeddings of ``text_hashes``
        (inside the caller's transaction). A kept row that points at a deleted one as its
        successor loses the pointer (it is retired already; its own history stays)."""
        counts = {"memories": 0, "events": 0, "embeddings": 0}
        with self.db.transaction() as c:
            for chunk in chunks(list(ids)):
                c.execute("UPDATE memories SET superseded_by = NULL WHERE superseded_by IN :ids", {"ids": chunk})
                counts["events"] += c.execute("DELETE FROM events WHERE memory_id IN :ids", {"ids": chunk}).rowcount
                counts["memories"] += c.execute(
                    "DELETE FROM memories WHERE namespace = :namespace AND id IN :ids",
                    {"namespace": namespace, "ids": chunk},
                ).rowcount
            for chunk in chunks(sorted(text_hashes)):
                counts["embeddings"] += c.execute(
                    "DELETE FROM embeddings WHERE namespace = :namespace AND text_hash IN :text_hashes",
                    {"namespace": namespace, "text_hashes": chunk},
                ).rowcount
        return counts


def _row_to_redaction(result_row: sa.Row[Any]) -> Redaction:
    row = result_row._mapping
    summary = json.loads(row["summary"])
    return Redaction(
        id=row["id"],
        namespace=row["namespace"],
        session_id=row["session_id"],
        created_at=datetime.fromisoformat(row["created_at"]),
        status=row["status"],
        decided_at=datetime.fromisoformat(row["decided_at"]) if row["decided_at"] else None,
        requests=json.loads(row["request"]),
        turn_ids=summary.get("turn_ids", []),
        rewritten={int(k): v for k, v in summary.get("rewritten", {}).items()},
        deleted=summary.get("deleted", []),
        retired=summary.get("retired", []),
        spans=summary.get("spans", 0),
        undoable=row["originals"] is not None,
    )
