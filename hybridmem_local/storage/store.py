"""SQLite store: the single source of truth for sessions, memories, history and embeddings.

Everything else (hnswlib and lexical indexes, LLM caches, reports) can be rebuilt from this
file. :class:`MemoryStore` is one connection (:class:`~hybridmem_local.storage.connection.Database`:
pragmas, migrations, nested transactions) with one part per table, all over that connection::

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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridmem_local.config import StoreConfig
from hybridmem_local.schema import check_namespace
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
    """Typed access to one SQLite database file (``":memory:"`` works for throwaway use)."""

    def __init__(self, path: str | Path, busy_timeout_ms: int = 30_000, keys: StoreKeys | None = None):
        super().__init__(path, busy_timeout_ms, keys)
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
    def open(cls, path: str | Path, config: StoreConfig) -> MemoryStore:
        """The store at ``path`` as ``config`` says: its busy timeout, and its master key when
        ``store.encryption`` is ``sqlcipher`` (``storage.encryption.load_keys``)."""
        return cls(path, config.busy_timeout_ms, load_keys(config))

    def close(self) -> None:
        self.audit.close()  # what is queued is stored first
        super().close()

    def fingerprint(self, namespace: str) -> tuple[int, int, int]:
        """(sessions, memories, highest memory id): changes whenever the namespace gains either."""
        return tuple(
            self.conn.execute(
                "SELECT (SELECT count(*) FROM sessions WHERE namespace = ?), count(*), coalesce(max(id), 0) "
                "FROM memories WHERE namespace = ?",
                (namespace, namespace),
            ).fetchone()
        )

    def counts(self, namespace: str | None = None) -> dict[str, int]:
        where, args = ("WHERE namespace = ?", [namespace]) if namespace else ("", [])
        out = {
            f"{kind}s_{status}": n
            for kind, status, n in self.conn.execute(
                f"SELECT kind, status, count(*) FROM memories {where} GROUP BY kind, status", args
            )
        }
        out["sessions"] = self.conn.execute(f"SELECT count(*) FROM sessions {where}", args).fetchone()[0]
        out["turns"] = self.conn.execute(f"SELECT count(*) FROM turns {where}", args).fetchone()[0]
        for status, n in self.conn.execute(
            f"SELECT curation_status, count(*) FROM sessions {where} GROUP BY curation_status", args
        ):
            out[f"sessions_{status}"] = n
        return out

    def forget_namespace(self, namespace: str) -> dict[str, int]:
        """Physically remove every row of a namespace (memories, sessions, turns, history, vectors),
        then scrub the file (``Database.scrub``); ``scrub_pending`` is 1 when another connection's
        read kept the deleted rows in the WAL for now (retried later), else 0."""
        check_namespace(namespace)
        counts: dict[str, int] = {}
        with self.transaction() as c:
            for table in ("memories", "sessions", "events", "embeddings", "consolidation_runs"):
                counts[table] = c.execute(f"SELECT count(*) FROM {table} WHERE namespace = ?", (namespace,)).fetchone()[
                    0
                ]
            # Superseded pointers reference rows of the same namespace; clear them before delete.
            c.execute("UPDATE memories SET superseded_by = NULL WHERE namespace = ?", (namespace,))
            c.execute("DELETE FROM events WHERE namespace = ?", (namespace,))
            c.execute("DELETE FROM turns WHERE namespace = ?", (namespace,))
            c.execute("DELETE FROM namespaces WHERE name = ?", (namespace,))
        # The WAL and freed pages would otherwise still hold the forgotten text on disk.
        counts["scrub_pending"] = int(not self.scrub().done)
        return counts

    def delete_memories(
        self, namespace: str, ids: Sequence[int], text_hashes: Sequence[str], record: dict[str, Any], reason: str
    ) -> tuple[int, int]:
        """Physically delete memories, their events and the cached embeddings of ``text_hashes``,
        recording one 'purge' event with ``record``; returns (events, embeddings) deleted.
        Usually called inside the caller's transaction: the caller scrubs after it commits."""
        events = embeddings = 0
        with self.transaction() as c:
            for chunk in chunks(ids):
                marks = ",".join("?" * len(chunk))
                events += c.execute(f"DELETE FROM events WHERE memory_id IN ({marks})", chunk).rowcount
                c.execute(f"DELETE FROM memories WHERE id IN ({marks})", chunk)
            for chunk in chunks(sorted(text_hashes)):
                marks = ",".join("?" * len(chunk))
                embeddings += c.execute(
                    f"DELETE FROM embeddings WHERE namespace = ? AND text_hash IN ({marks})", (namespace, *chunk)
                ).rowcount
            if ids:
                self.events.record(namespace, "purge", None, None, None, record, reason)
        return events, embeddings
