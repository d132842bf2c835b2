"""The store: the single source of truth for sessions, memories, history and embeddings, in a
SQLite file or a PostgreSQL database (``storage/backends.py``).

Everything else (hnswlib and lexical indexes, LLM caches, reports) can be rebuilt from the
database. :class:`MemoryStore` is one connection (:class:`~hybridmem_local.storage.connection.Database`:
backend settings, migrations, nested transactions) with one part per table, all over that connection::

    store.sessions          sessions and their turns        (storage/sessions.py)
    store.memories          episodes and tuples             (storage/memories.py)
    store.events            the append-only history         (storage/events.py)
    store.runs              consolidation runs              (storage/runs.py)
    store.api_keys          keys of ``hybridmem serve``     (storage/api_keys.py)
    store.embedding_cache   vectors by text hash            (storage/embedding_cache.py)
    store.namespaces        namespaces and export files     (storage/namespaces.py)
    store.audit             the audit trail, a hash chain   (storage/audit.py)
    store.redactions        content removed on request      (storage/redactions.py)

A part's write that is called inside ``store.transaction()`` joins it as a savepoint, so a
session and its memories are written together or not at all. What spans every table (counts,
forgetting a namespace, purging memories) is a method of the store itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridmem_local.config import StoreConfig
from hybridmem_local.schema import check_namespace, utcnow
from hybridmem_local.storage.api_keys import ApiKeys
from hybridmem_local.storage.audit import AuditLog
from hybridmem_local.storage.connection import Database, chunks
from hybridmem_local.storage.embedding_cache import EmbeddingCache
from hybridmem_local.storage.encryption import StoreKeys, load_keys
from hybridmem_local.storage.events import EventLog
from hybridmem_local.storage.memories import Memories
from hybridmem_local.storage.namespaces import Namespaces
from hybridmem_local.storage.redactions import Redactions
from hybridmem_local.storage.runs import ConsolidationRuns
from hybridmem_local.storage.sessions import Sessions


class MemoryStore(Database):
    """Typed access to one store: a SQLite file (``":memory:"`` works for throwaway use) or a
    PostgreSQL database (a ``postgresql://`` URL; ``storage/backends.py``)."""

    def __init__(
        self,
        location: str | Path,
        busy_timeout_ms: int = 30_000,
        keys: StoreKeys | None = None,
        local_dir: Path | None = None,
    ):
        super().__init__(location, busy_timeout_ms, keys, local_dir)
        self.namespaces = Namespaces(self)
        self.events = EventLog(self)
        self.sessions = Sessions(self, self.namespaces, self.events)
        self.memories = Memories(self, self.namespaces, self.events)
        self.runs = ConsolidationRuns(self)
        self.api_keys = ApiKeys(self, self.events)
        self.embedding_cache = EmbeddingCache(self, self.namespaces)
        self.audit = AuditLog(self)
        self.redactions = Redactions(self)

    @classmethod
    def open(cls, location: str | Path, config: StoreConfig) -> MemoryStore:
        """The store at ``location`` (a SQLite path or a ``postgresql://`` URL; ``store.url``,
        when set, instead) as ``config`` says: its busy timeout, its master key when
        ``store.encryption`` is ``sqlcipher`` (``storage.encryption.load_keys``), and where a
        PostgreSQL store keeps its local files."""
        return cls(config.url or location, config.busy_timeout_ms, load_keys(config), config.local_dir)

    def close(self) -> None:
        self.audit.close()  # what is queued is stored first
        super().close()

    def fingerprint(self, namespace: str) -> tuple[int, int, int]:
        """(sessions, memories, highest memory id): changes whenever the namespace gains either."""
        row = self.execute(
            "SELECT (SELECT count(*) FROM sessions WHERE namespace = :namespace) AS sessions, count(*) AS memories, "
            "coalesce(max(id), 0) AS highest FROM memories WHERE namespace = :namespace",
            {"namespace": namespace},
        ).one()
        return int(row.sessions), int(row.memories), int(row.highest)

    def counts(self, namespace: str | None = None) -> dict[str, int]:
        where, params = ("WHERE namespace = :namespace", {"namespace": namespace}) if namespace else ("", {})
        out = {
            f"{row.kind}s_{row.status}": int(row.n)
            for row in self.execute(
                f"SELECT kind, status, count(*) AS n FROM memories {where} GROUP BY kind, status", params
            )
        }
        out["sessions"] = int(self.scalar(f"SELECT count(*) FROM sessions {where}", params))
        out["turns"] = int(self.scalar(f"SELECT count(*) FROM turns {where}", params))
        for row in self.execute(
            f"SELECT curation_status, count(*) AS n FROM sessions {where} GROUP BY curation_status", params
        ):
            out[f"sessions_{row.curation_status}"] = int(row.n)
        return out

    def forget_namespace(self, namespace: str) -> dict[str, int]:
        """Physically remove every row of a namespace (memories, sessions, turns, history, vectors),
        leaving a tombstone (``forgotten``) that tells every other process on the store to remove
        its own local copies, then scrub the file (``Database.scrub``); ``scrub_pending`` is 1
        when another connection's read kept the deleted rows in the WAL for now (retried
        later), else 0."""
        check_namespace(namespace)
        counts: dict[str, int] = {}
        params = {"namespace": namespace}
        with self.transaction() as c:
            c.execute(
                "INSERT INTO forgotten_namespaces (namespace, at, exports) VALUES (:namespace, :at, :exports)",
                {
                    "namespace": namespace,
                    "at": utcnow().isoformat(),
                    "exports": json.dumps([str(path) for path in self.namespaces.exports(namespace)]),
                },
            )
            for table in ("memories", "sessions", "events", "embeddings", "consolidation_runs"):
                counts[table] = int(c.scalar(f"SELECT count(*) FROM {table} WHERE namespace = :namespace", params))
            # Superseded pointers reference rows of the same namespace; clear them before delete.
            c.execute("UPDATE memories SET superseded_by = NULL WHERE namespace = :namespace", params)
            c.execute("DELETE FROM events WHERE namespace = :namespace", params)
            c.execute("DELETE FROM turns WHERE namespace = :namespace", params)
            c.execute("DELETE FROM namespaces WHERE name = :namespace", params)
        # The WAL and freed pages would otherwise still hold the forgotten text on disk.
        counts["scrub_pending"] = int(not self.scrub().done)
        return counts

    def forgotten(self, after_id: int) -> list[tuple[int, str, list[Path]]]:
        """The forgets recorded after tombstone ``after_id``: (id, namespace, export paths), oldest first."""
        rows = self.execute(
            "SELECT id, namespace, exports FROM forgotten_namespaces WHERE id > :after ORDER BY id", {"after": after_id}
        )
        return [(row.id, row.namespace, [Path(p) for p in json.loads(row.exports)]) for row in rows]

    def delete_memories(
        self, namespace: str, ids: Sequence[int], text_hashes: Sequence[str], record: dict[str, Any], reason: str
    ) -> tuple[int, int]:
        """Physically delete memories, their events and the cached embeddings of ``text_hashes``,
        recording one 'purge' event with ``record``; returns (events, embeddings) deleted.
        Usually called inside the caller's transaction: the caller scrubs after it commits."""
        events = embeddings = 0
        with self.transaction() as c:
            for chunk in chunks(ids):
                events += c.execute("DELETE FROM events WHERE memory_id IN :ids", {"ids": chunk}).rowcount
                c.execute("DELETE FROM memories WHERE id IN :ids", {"ids": chunk})
            for chunk in chunks(sorted(text_hashes)):
                embeddings += c.execute(
                    "DELETE FROM embeddings WHERE namespace = :namespace AND text_hash IN :text_hashes",
                    {"namespace": namespace, "text_hashes": chunk},
                ).rowcount
            if ids:
                self.events.record(namespace, "purge", None, None, None, record, reason)
        return events, embeddings
