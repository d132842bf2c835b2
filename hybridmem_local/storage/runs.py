"""The ``consolidation_runs`` table, and each namespace's count of sessions since its last run
(what ``consolidation.every_n_sessions`` schedules by)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from hybridmem_local.errors import NotFoundError
from hybridmem_local.schema import check_namespace, utcnow
from hybridmem_local.storage.connection import Database, inserted_id


class ConsolidationRuns:
    def __init__(self, db: Database):
        self.db = db

    def start(self, namespace: str, backend: str, params: dict[str, Any]) -> int:
        """A new run row, status 'applied' (it commits with the changes it makes)."""
        return inserted_id(
            self.db.conn.execute(
                "INSERT INTO consolidation_runs (namespace, started_at, status, backend, params) VALUES (?, ?, "
                "'applied', ?, ?)",
                (namespace, utcnow().isoformat(), backend, json.dumps(params)),
            )
        )

    def finish(self, run_id: int, namespace: str, report_json: str) -> None:
        """Store the run's report and restart the namespace's sessions-since-consolidation count."""
        with self.db.transaction() as c:
            c.execute(
                "UPDATE consolidation_runs SET finished_at = ?, report = ? WHERE id = ?",
                (utcnow().isoformat(), report_json, run_id),
            )
            c.execute("UPDATE namespaces SET sessions_since_consolidation = 0 WHERE name = ?", (namespace,))

    def get(self, run_id: int) -> sqlite3.Row:
        row = self.db.conn.execute("SELECT * FROM consolidation_runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no consolidation run with id {run_id}")
        return row

    def mark_undone(self, run_id: int) -> None:
        self.db.conn.execute("UPDATE consolidation_runs SET status = 'undone' WHERE id = ?", (run_id,))

    def sessions_since_last(self, namespace: str) -> int:
        """Sessions stored in ``namespace`` since its last consolidation run (or ever)."""
        row = self.db.conn.execute(
            "SELECT sessions_since_consolidation FROM namespaces WHERE name = ?", (check_namespace(namespace),)
        ).fetchone()
        return 0 if row is None else row[0]
