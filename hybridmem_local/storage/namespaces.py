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
        with self.db.transaction() as c:
            c.execute(
                "INSERT INTO namespaces (name, created_at) VALUES (:name, :created_at) ON CONFLICT DO NOTHING",
                {"name": namespace, "created_at": utcnow().isoformat()},
            )

    def names(self) -> list[str]:
        return [r.name for r in self.db.execute("SELECT name FROM namespaces ORDER BY name")]

    def record_export(self, namespace: str, path: Path) -> None:
        """Remember an export file so ``forget`` can remove it too."""
        with self.db.transaction() as c:
            c.execute(
                "INSERT INTO exports (namespace, path, created_at) VALUES (:namespace, :path, :created_at) "
                "ON CONFLICT (namespace, path) DO UPDATE SET created_at = excluded.created_at",
                {"namespace": namespace, "path": str(Path(path).resolve()), "created_at": utcnow().isoformat()},
            )

    def exports(self, namespace: str) -> list[Path]:
        return [
            Path(r.path)
            for r in self.db.execute("SELECT path FROM exports WHERE namespace = :namespace", {"namespace": namespace})
        ]
