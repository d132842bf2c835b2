"""Where the store's tests open their stores: ``store_location`` runs a test once on a SQLite
file and once on a fresh PostgreSQL database of the throwaway cluster (``postgres_url``; that
run skips where PostgreSQL is absent), so one test states one behaviour of both backends."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from hybridmem_local.config import Config, load_config
from hybridmem_local.storage.store import MemoryStore

#: The backends, as the ids of ``store_location``'s runs; the PostgreSQL one is marked ``postgres``
#: (``-m "not postgres"`` leaves it out) as the tests that name ``postgres_url`` are.
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@dataclass(frozen=True)
class StoreLocation:
    """One store as a test opens it: ``location`` is the SQLite file or the PostgreSQL URL;
    ``local_dir`` is where a PostgreSQL store's local files (index files, LLM cache) go on this
    "host" (None for SQLite: they lie beside the file)."""

    backend: str
    location: str | Path
    local_dir: Path | None
    #: A folder of this test's own, for whatever else it writes (exports, configs).
    tmp: Path

    @property
    def postgres(self) -> bool:
        return self.backend == "postgresql"

    def open(self, **kwargs: Any) -> MemoryStore:
        """A new connection to the store (``MemoryStore`` keyword arguments pass through)."""
        return MemoryStore(self.location, local_dir=self.local_dir, **kwargs)

    def config(self, overrides: Mapping[str, Any] | None = None) -> Config:
        """The defaults with ``overrides`` (dotted keys) and, on PostgreSQL, ``store.url`` and
        ``store.local_dir`` set, so ``HybridMemory.open(location.location, config)`` opens this store."""
        settings = dict(overrides or {})
        if self.postgres:
            settings.update({"store.url": str(self.location), "store.local_dir": str(self.local_dir)})
        return load_config(None, settings)

    def cli_args(self) -> list[str]:
        """The options that point a ``hybridmem`` command at this store."""
        if not self.postgres:
            return ["--db", str(self.location)]
        return [
            "--db",
            str(self.tmp / "unused.db"),
            "--set",
            f"store.url={self.location}",
            "--set",
            f"store.local_dir={self.local_dir}",
        ]

    def replica(self, name: str) -> StoreLocation:
        """The same store seen from another "host": on PostgreSQL another local folder (its own
        index files and caches); a SQLite file has one place for them, beside it."""
        if not self.postgres:
            return self
        return StoreLocation(self.backend, self.location, self.tmp / name, self.tmp)

    def engine(self) -> sa.Engine:
        """A plain SQLAlchemy engine on the database, outside the store (for what a test checks or
        tampers with behind the store's back); dispose it after use."""
        if self.postgres:
            return sa.create_engine(str(self.location), poolclass=sa.pool.NullPool)
        return sa.create_engine(f"sqlite:///{self.location}", poolclass=sa.pool.NullPool)


@pytest.fixture(params=BACKENDS)
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> StoreLocation:
    """Where this run of the test keeps its store: ``sqlite`` (a file in ``tmp_path``) or
    ``postgresql`` (a fresh database, local files under ``tmp_path/local``)."""
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
        return StoreLocation("postgresql", url, tmp_path / "local", tmp_path)
    return StoreLocation("sqlite", tmp_path / "m.db", None, tmp_path)
