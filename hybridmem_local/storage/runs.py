"""The ``consolidation_runs`` table, and each namespace's count of sessions since its last run
(what ``consolidation.every_n_sessions`` schedules by)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from hybridmem_local.errors import NotFoundError
from hybridmem_local.schema import check_namespace, utcnow
from hybridmem_local.storage.connection import Database, inserted_id


class ConsolidationRuns:
    def __init__(self, db: Database):
        self.db = db

    def start(self, namespace: str, backend: str, params: dict[str, Any]) -> int:
        """A new run row, status 'applied' (it commits with the changes it makes)."""
        with self.db.transaction() as c:
            return inserted_id(
                c.execute(
                    "INSERT INTO consolidation_runs (namespace, started_at, status, backend, params) "
                    "VALUES (:namespace, :started_at, 'applied', :backend, :params) RETURNING id",
                    {
                        "namespace": namespace,
                        "started_at": utcnow().isoformat(),
                        "backend": backend,
                        "params": json.dumps(params),
                    },
                )
            )

    def finish(self, run_id: int, namespace: str, report_json: str) -> None:
        """Store the run's report and restart the namespace's sessions-since-consolidation count."""
        with self.db.transaction() as c:
            c.execute(
                "UPDATE consolidation_runs SET finished_at = :finished_at, report = :report WHERE id = :run_id",
                {"finished_at": utcnow().isoformat(), "report": report_json, "run_id": run_id},
            )
            c.execute(
                "UPDATE namespaces SET sessions_since_consolidation = 0 WHERE name = :namespace",
                {"namespace": namespace},
            )

    def get(self, run_id: int) -> sa.Row[Any]:
        row = self.db.execute("SELECT * FROM consolidation_runs WHERE id = :run_id", {"run_id": run_id}).first()
        if row is None:
            raise NotFoundError(f"no consolidation run with id {run_id}")
        return row

    def select(self, namespace: str, limit: int, offset: int = 0) -> list[sa.Row[Any]]:
        """A page of a namespace's runs, newest first (``limit`` rows from ``offset``)."""
        return list(
            self.db.execute(
                "SELECT * FROM consolidation_runs WHERE namespace = :namespace ORDER BY id DESC "
                "LIMIT :limit OFFSET :offset",
                {"namespace": namespace, "limit": int(limit), "offset": int(offset)},
            ).fetchall()
        )

    def mark_undone(self, run_id: int) -> None:
        with self.db.transaction() as c:
            c.execute("UPDATE consolidation_runs SET status = 'undone' WHERE id = :run_id", {"run_id": run_id})

    def sessions_since_last(self, namespace: str) -> int:
        """Sessions stored in ``namespace`` since its last consolidation run (or ever)."""
        count = self.db.scalar(
            "SELECT sessions_since_consolidation FROM namespaces WHERE name = :namespace",
            {"namespace": check_namespace(namespace)},
        )
        return 0 if count is None else int(count)
