"""The ``namespaces`` and ``exports`` tables: which namespaces exist, and the export files
written of each (so ``forget`` can remove them too)."""

from __future__ import annotations

from pathlib import Path

from hybridmem_local.schema import check_namespace, utcnow
from hybridmem_local.storage.connection import Database


class Namespaces:
    def __init__(self, db: Database):
        self.db = db

    def ensure(self, namespace: str) -> None:
        check_namespace(namespace)
        self.db.conn.execute(
            "INSERT OR IGNORE INTO namespaces (name, created_at) VALUES (?, ?)",
            (namespace, utcnow().isoformat()),
        )

    def names(self) -> list[str]:
        return [r[0] for r in self.db.conn.execute("SELECT name FROM namespaces ORDER BY name")]

    def record_export(self, namespace: str, path: Path) -> None:
        """Remember an export file so ``forget`` can remove it too."""
        self.db.conn.execute(
            "INSERT OR REPLACE INTO exports (namespace, path, created_at) VALUES (?, ?, ?)",
            (namespace, str(Path(path).resolve()), utcnow().isoformat()),
        )

    def exports(self, namespace: str) -> list[Path]:
        return [Path(r[0]) for r in self.db.conn.execute("SELECT path FROM exports WHERE namespace = ?", (namespace,))]
