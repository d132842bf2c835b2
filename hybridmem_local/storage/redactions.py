"""The ``redactions`` table: content removed from a namespace at its user's request.

A redaction is ``pending`` while its ``originals`` (the turns' texts before and after) are kept
so an admin can undo it; ``confirmed`` once they are dropped (undo is then impossible), or
``undone``. ``request`` and ``summary`` never hold the removed text.

A turn's text is the one thing a redaction edits in place. A rewritten turn, and every other
turn of its session, gets a new row id (``rewrite_turns``): window ids are the row ids of their
first turns, so the indexes of every process see the old windows go and new ones come, as
they do for a new session, instead of keeping vectors of text that is no longer there.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from hybridmem_local.errors import InvalidInputError, NotFoundError
from hybridmem_local.results import Redaction, RedactionStatus
from hybridmem_local.schema import utcnow
from hybridmem_local.storage.connection import Database, chunks, inserted_id


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
        return inserted_id(
            self.db.conn.execute(
                "INSERT INTO redactions (namespace, session_id, created_at, status, request, summary, originals) "
                "VALUES (?, ?, ?, 'pending', ?, ?, ?)",
                (
                    namespace,
                    session_id,
                    utcnow().isoformat(),
                    json.dumps(list(requests)),
                    json.dumps(summary),
                    json.dumps(originals),
                ),
            )
        )

    def set_summary(self, redaction_id: int, summary: dict[str, Any]) -> None:
        self.db.conn.execute("UPDATE redactions SET summary = ? WHERE id = ?", (json.dumps(summary), redaction_id))

    def get(self, redaction_id: int) -> Redaction:
        return _row_to_redaction(self._row(redaction_id))

    def originals(self, redaction_id: int) -> dict[str, Any]:
        """The kept texts of a pending redaction; InvalidInputError once confirmed or undone."""
        row = self._row(redaction_id)
        if row["status"] != "pending" or row["originals"] is None:
            raise InvalidInputError(f"redaction {redaction_id} is {row['status']}; only a pending one can be undone")
        return json.loads(row["originals"])

    def summary(self, redaction_id: int) -> dict[str, Any]:
        return json.loads(self._row(redaction_id)["summary"])

    def _row(self, redaction_id: int) -> sqlite3.Row:
        row = self.db.conn.execute("SELECT * FROM redactions WHERE id = ?", (redaction_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no redaction with id {redaction_id}")
        return row

    def select(self, namespace: str, status: RedactionStatus | None = None) -> list[Redaction]:
        sql, args = "SELECT * FROM redactions WHERE namespace = ?", [namespace]
        if status is not None:
            sql, args = sql + " AND status = ?", [*args, status]
        return [_row_to_redaction(r) for r in self.db.conn.execute(sql + " ORDER BY id", args)]

    def asked_turn_ids(self, namespace: str, session_id: str) -> set[str]:
        """The turns whose forget requests a redaction of this session answered already, whatever
        became of it (an undone one was an admin's decision)."""
        rows = self.db.conn.execute(
            "SELECT request FROM redactions WHERE namespace = ? AND session_id = ?", (namespace, session_id)
        )
        return {request["turn_id"] for (requests,) in rows for request in json.loads(requests)}

    def pending_before(self, cutoff: datetime) -> list[int]:
        """Pending redactions (of every namespace) made before ``cutoff``, oldest first."""
        return [
            r[0]
            for r in self.db.conn.execute(
                "SELECT id FROM redactions WHERE status = 'pending' AND created_at < ? ORDER BY id",
                (cutoff.isoformat(),),
            )
        ]

    def decide(self, redaction_id: int, status: RedactionStatus) -> None:
        """Mark a pending redaction confirmed or undone and drop its originals (inside the caller's transaction)."""
        self.db.conn.execute(
            "UPDATE redactions SET status = ?, decided_at = ?, originals = NULL WHERE id = ?",
            (status, utcnow().isoformat(), redaction_id),
        )

    def turn_texts(self, namespace: str, turn_ids: Sequence[str]) -> dict[str, str]:
        texts: dict[str, str] = {}
        for chunk in chunks(list(turn_ids)):
            marks = ",".join("?" * len(chunk))
            texts.update(
                self.db.conn.execute(
                    f"SELECT turn_id, text FROM turns WHERE namespace = ? AND turn_id IN ({marks})", (namespace, *chunk)
                ).fetchall()
            )
        return texts

    def rewrite_turns(self, namespace: str, texts: Mapping[str, str]) -> None:
        """Give turns new texts, and each of their sessions' turns a new row id (see the module
        docstring), inside the caller's transaction."""
        if not texts:
            return
        sessions: set[int] = set()
        for chunk in chunks(sorted(texts)):
            marks = ",".join("?" * len(chunk))
            sessions.update(
                r[0]
                for r in self.db.conn.execute(
                    f"SELECT session_pk FROM turns WHERE namespace = ? AND turn_id IN ({marks})", (namespace, *chunk)
                )
            )
        next_id = self.db.conn.execute("SELECT coalesce(max(id), 0) + 1 FROM turns").fetchone()[0]
        for session_pk in sorted(sessions):
            rows = self.db.conn.execute(
                "SELECT id, turn_id, text FROM turns WHERE session_pk = ? ORDER BY position", (session_pk,)
            ).fetchall()
            for row in rows:
                self.db.conn.execute(
                    "UPDATE turns SET id = ?, text = ? WHERE id = ?",
                    (next_id, texts.get(row["turn_id"], row["text"]), row["id"]),
                )
                next_id += 1

    def delete_memories(self, namespace: str, ids: Sequence[int], text_hashes: Sequence[str]) -> dict[str, int]:
        """Physically delete memories, their events and the cached embeddings of ``text_hashes``
        (inside the caller's transaction). A kept row that points at a deleted one as its
        successor loses the pointer (it is retired already; its own history stays)."""
        counts = {"memories": 0, "events": 0, "embeddings": 0}
        for chunk in chunks(list(ids)):
            marks = ",".join("?" * len(chunk))
            self.db.conn.execute(f"UPDATE memories SET superseded_by = NULL WHERE superseded_by IN ({marks})", chunk)
            counts["events"] += self.db.conn.execute(f"DELETE FROM events WHERE memory_id IN ({marks})", chunk).rowcount
            counts["memories"] += self.db.conn.execute(
                f"DELETE FROM memories WHERE namespace = ? AND id IN ({marks})", (namespace, *chunk)
            ).rowcount
        for chunk in chunks(sorted(text_hashes)):
            marks = ",".join("?" * len(chunk))
            counts["embeddings"] += self.db.conn.execute(
                f"DELETE FROM embeddings WHERE namespace = ? AND text_hash IN ({marks})", (namespace, *chunk)
            ).rowcount
        return counts


def _row_to_redaction(row: sqlite3.Row) -> Redaction:
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
