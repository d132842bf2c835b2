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

A part's write that is called inside ``store.transaction()`` joins it as a savepoint, so a
session and its memories are written together or not at all. What spans every table (counts,
forgetting a namespace, purging memories) is a method of the store itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from hybridmem_local.errors import (
    AlreadyCuratedError,
    DuplicateSessionError,
    DuplicateTurnError,
    NotFoundError,
    StoreError,
)
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    Provenance,
    RelationalTuple,
    Session,
    SessionRecord,
    TupleDraft,
    Turn,
    check_namespace,
    combine_provenance,
    provenance_of,
    utcnow,
)

SCHEMA_VERSION = 3

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE namespaces (
        name TEXT PRIMARY KEY,
        created_at TEXT NOT NULL,
        sessions_since_consolidation INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        namespace TEXT NOT NULL REFERENCES namespaces(name) ON DELETE CASCADE,
        session_id TEXT NOT NULL,
        started_at TEXT NOT NULL,
        created_at TEXT NOT NULL,
        curation_status TEXT NOT NULL DEFAULT 'pending'
            CHECK (curation_status IN ('pending', 'curated', 'curation_failed')),
        curation_error TEXT,
        prompt_version TEXT,
        UNIQUE (namespace, session_id)
    );
    CREATE TABLE turns (
        id INTEGER PRIMARY KEY,
        session_pk INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        namespace TEXT NOT NULL,
        position INTEGER NOT NULL,
        turn_id TEXT NOT NULL,
        speaker TEXT NOT NULL,
        text TEXT NOT NULL,
        image_caption TEXT,
        UNIQUE (namespace, turn_id)
    );
    CREATE INDEX turns_session ON turns(session_pk, position);
    CREATE TABLE memories (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL REFERENCES namespaces(name) ON DELETE CASCADE,
        kind TEXT NOT NULL CHECK (kind IN ('episode', 'tuple')),
        title TEXT, summary TEXT, details TEXT,
        entity TEXT, relation TEXT, object TEXT, context TEXT,
        timestamp TEXT NOT NULL,
        source_session_id TEXT,
        source_turn_ids TEXT NOT NULL DEFAULT '[]',
        created_at TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'superseded', 'deleted')),
        superseded_by INTEGER REFERENCES memories(id),
        status_reason TEXT,
        CHECK (kind != 'episode' OR (title IS NOT NULL AND summary IS NOT NULL AND details IS NOT NULL)),
        CHECK (kind != 'tuple' OR (entity IS NOT NULL AND relation IS NOT NULL AND object IS NOT NULL))
    );
    CREATE INDEX memories_ns ON memories(namespace, kind, status);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL,
        at TEXT NOT NULL,
        action TEXT NOT NULL,
        memory_id INTEGER,
        run_id INTEGER,
        before TEXT,
        after TEXT,
        reason TEXT
    );
    CREATE INDEX events_memory ON events(memory_id);
    CREATE INDEX events_run ON events(run_id);
    CREATE TABLE embeddings (
        namespace TEXT NOT NULL REFERENCES namespaces(name) ON DELETE CASCADE,
        model_id TEXT NOT NULL,
        text_hash TEXT NOT NULL,
        dim INTEGER NOT NULL,
        vector BLOB NOT NULL,
        PRIMARY KEY (namespace, model_id, text_hash)
    );
    CREATE TABLE consolidation_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL REFERENCES namespaces(name) ON DELETE CASCADE,
        started_at TEXT NOT NULL,
        finished_at TEXT,
        status TEXT NOT NULL CHECK (status IN ('applied', 'undone')),
        backend TEXT,
        params TEXT NOT NULL DEFAULT '{}',
        report TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE exports (
        namespace TEXT NOT NULL REFERENCES namespaces(name) ON DELETE CASCADE,
        path TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (namespace, path)
    );
    """,
    # API keys of `hybridmem serve`. Only a salted hash of the secret is kept; ``namespaces`` is a
    # JSON list where ["*"] means every namespace. Revoked keys stay (with ``revoked_at``) so the
    # history of who could reach what is kept.
    2: """
    CREATE TABLE api_keys (
        key_id TEXT PRIMARY KEY,
        salt BLOB NOT NULL,
        key_hash BLOB NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('read', 'write', 'admin')),
        namespaces TEXT NOT NULL,
        label TEXT,
        created_at TEXT NOT NULL,
        revoked_at TEXT
    );
    """,
    # How each memory's source turns were obtained (schema.Provenance): rows that have turns
    # were written with ids their writer cited. The index serves the write-time duplicate guard
    # (same namespace, kind and timestamp).
    3: """
    ALTER TABLE memories ADD COLUMN provenance TEXT CHECK (provenance IN ('cited', 'aligned'));
    UPDATE memories SET provenance = 'cited' WHERE source_turn_ids != '[]';
    CREATE INDEX memories_timestamp ON memories(namespace, kind, timestamp);
    """,
}

_MEMORY_COLUMNS = (
    "id, namespace, kind, title, summary, details, entity, relation, object, context, timestamp, "
    "source_session_id, source_turn_ids, provenance, created_at, status, superseded_by"
)


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    namespace: str
    at: datetime
    action: str
    memory_id: int | None
    run_id: int | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    reason: str | None


class ApiKeyRow(BaseModel):
    """One stored API key: what it may reach, and the salted hash its secret is checked against."""

    model_config = ConfigDict(extra="forbid")

    key_id: str
    salt: bytes
    key_hash: bytes
    role: str
    namespaces: list[str]
    label: str | None
    created_at: datetime
    revoked_at: datetime | None


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _owner_only(path: Path) -> None:
    """Database files hold private conversations: readable by their owner alone."""
    for suffix in ("", "-wal", "-shm"):
        candidate = Path(str(path) + suffix)
        if candidate.exists():
            os.chmod(candidate, 0o600)


#: A namespace's turns with their session id and start (``turn_rows``, ``turn_rows_by_id``).
_TURN_ROWS = (
    "SELECT t.id, t.position, t.turn_id, t.speaker, t.text, t.image_caption, s.session_id, s.started_at "
    "FROM turns t JOIN sessions s ON s.id = t.session_pk WHERE t.namespace = ?"
)


class MemoryStore:
    """Typed access to one SQLite database file (``":memory:"`` works for throwaway use)."""

    def __init__(self, path: str | Path, busy_timeout_ms: int = 30_000):
        super().__init__(path, busy_timeout_ms)
        self.namespaces = Namespaces(self)
        self.events = EventLog(self)
        self.sessions = Sessions(self, self.namespaces, self.events)
        self.memories = Memories(self, self.namespaces, self.events)
        self.runs = ConsolidationRuns(self)
        self.api_keys = ApiKeys(self, self.events)
        self.embedding_cache = EmbeddingCache(self, self.namespaces)

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
        """Physically remove every row of a namespace (memories, sessions, turns, history, vectors)."""
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
        # Freed pages would otherwise still hold the forgotten text on disk.
        self.vacuum()
        return counts

    # ------------------------------------------------------------------ sessions and turns

    def insert_session(
        self,
        session: Session,
        curation_status: str = "pending",
        prompt_version: str | None = None,
        curation_error: str | None = None,
    ) -> int:
        """Insert a session and its turns (inside the caller's transaction, if any)."""
        with self.transaction() as c:
            self.ensure_namespace(session.namespace)
            if c.execute(
                "SELECT 1 FROM sessions WHERE namespace = ? AND session_id = ?",
                (session.namespace, session.session_id),
            ).fetchone():
                raise DuplicateSessionError(
                    f"session {session.session_id!r} already exists in namespace {session.namespace!r}"
                )
            clash = self._existing_turn_ids(session.namespace, [t.turn_id for t in session.turns])
            if clash:
                raise DuplicateTurnError(
                    f"session {session.session_id!r}: turn ids already used by another session of namespace "
                    f"{session.namespace!r}: {sorted(clash)[:5]}"
                )
            pk = _inserted_id(
                c.execute(
                    "INSERT INTO sessions (namespace, session_id, started_at, created_at, curation_status, "
                    "prompt_version, curation_error) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        session.namespace,
                        session.session_id,
                        session.started_at.isoformat(),
                        utcnow().isoformat(),
                        curation_status,
                        prompt_version,
                        curation_error,
                    ),
                )
            )
            c.executemany(
                "INSERT INTO turns (session_pk, namespace, position, turn_id, speaker, text, image_caption) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (pk, session.namespace, i, t.turn_id, t.speaker, t.text, t.image_caption)
                    for i, t in enumerate(session.turns)
                ],
            )
            c.execute(
                "UPDATE namespaces SET sessions_since_consolidation = sessions_since_consolidation + 1 WHERE name = ?",
                (session.namespace,),
            )
            self._event(session.namespace, "add_session", None, None, None, {"session_id": session.session_id}, None)
        return pk

    def _existing_turn_ids(self, namespace: str, turn_ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for chunk in _chunks(turn_ids):
            marks = ",".join("?" * len(chunk))
            found.update(
                r[0]
                for r in self.conn.execute(
                    f"SELECT turn_id FROM turns WHERE namespace = ? AND turn_id IN ({marks})", (namespace, *chunk)
                )
            )
        return found

    def has_session(self, namespace: str, session_id: str) -> bool:
        return bool(
            self.conn.execute(
                "SELECT 1 FROM sessions WHERE namespace = ? AND session_id = ?", (namespace, session_id)
            ).fetchone()
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
        """Change a session's curation status; with ``require_uncurated``, AlreadyCuratedError
        (nothing changed) when it is curated already, so two curators cannot both store it."""
        sql = (
            "UPDATE sessions SET curation_status = ?, curation_error = ?, prompt_version = coalesce(?, prompt_version) "
            "WHERE namespace = ? AND session_id = ?"
        )
        if require_uncurated:
            sql += " AND curation_status != 'curated'"
        with self.transaction() as c:
            updated = c.execute(sql, (status, error, prompt_version, namespace, session_id)).rowcount
            if not updated:
                if require_uncurated and self.has_session(namespace, session_id):
                    raise AlreadyCuratedError(f"session {session_id!r} of namespace {namespace!r} is already curated")
                raise NotFoundError(f"no session {session_id!r} in namespace {namespace!r}")

    def get_session(self, namespace: str, session_id: str) -> SessionRecord:
        row = self.conn.execute(
            "SELECT * FROM sessions WHERE namespace = ? AND session_id = ?", (namespace, session_id)
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no session {session_id!r} in namespace {namespace!r}")
        return self._session_record(row)

    def iter_sessions(
        self, namespace: str | None = None, curation_status: str | None = None
    ) -> Iterator[SessionRecord]:
        sql = "SELECT * FROM sessions WHERE 1=1"
        args: list[str] = []
        if namespace is not None:
            sql, args = sql + " AND namespace = ?", [*args, namespace]
        if curation_status is not None:
            sql, args = sql + " AND curation_status = ?", [*args, curation_status]
        for row in self.conn.execute(sql + " ORDER BY namespace, started_at, id", args).fetchall():
            yield self._session_record(row)

    def sessions_to_curate(
        self, statuses: Sequence[str], namespace: str | None = None, limit: int | None = None
    ) -> list[SessionRecord]:
        """Sessions with one of ``statuses``, oldest first (arrival order), of every namespace
        unless one is named; at most ``limit`` of them."""
        marks = ",".join("?" * len(statuses))
        sql = f"SELECT * FROM sessions WHERE curation_status IN ({marks})"
        args: list[str | int] = list(statuses)
        if namespace is not None:
            sql, args = sql + " AND namespace = ?", [*args, namespace]
        sql += " ORDER BY id"
        if limit is not None:
            sql, args = sql + " LIMIT ?", [*args, int(limit)]
        return [self._session_record(row) for row in self.conn.execute(sql, args).fetchall()]

    def count_sessions(self, curation_status: str) -> int:
        """Sessions with this curation status over all namespaces (the service's queue length)."""
        return self.conn.execute(
            "SELECT count(*) FROM sessions WHERE curation_status = ?", (curation_status,)
        ).fetchone()[0]

    def _session_record(self, row: sqlite3.Row) -> SessionRecord:
        turns = [
            Turn(turn_id=t["turn_id"], speaker=t["speaker"], text=t["text"], image_caption=t["image_caption"])
            for t in self.conn.execute(
                "SELECT turn_id, speaker, text, image_caption FROM turns WHERE session_pk = ? ORDER BY position",
                (row["id"],),
            )
        ]
        session = Session(
            session_id=row["session_id"],
            namespace=row["namespace"],
            started_at=datetime.fromisoformat(row["started_at"]),
            turns=turns,
        )
        return SessionRecord(
            session=session, curation_status=row["curation_status"], curation_error=row["curation_error"]
        )

    def turns_marker(self, namespace: str) -> tuple[int, int]:
        """(turns, highest turn row id) of a namespace: changes whenever it gains turns."""
        return tuple(
            self.conn.execute(
                "SELECT count(*), coalesce(max(id), 0) FROM turns WHERE namespace = ?", (namespace,)
            ).fetchone()
        )

    def turn_rows(self, namespace: str) -> list[sqlite3.Row]:
        """Every turn of a namespace with its session id and start, sessions in chronological order."""
        return self.conn.execute(
            f"{_TURN_ROWS} ORDER BY s.started_at, s.id, t.position",
            (namespace,),
        ).fetchall()

    def turn_rows_by_id(self, namespace: str, turn_ids: Sequence[str]) -> list[sqlite3.Row]:
        """The turns of a namespace with these turn ids, with ``turn_rows``' columns (ids it lacks are left out)."""
        rows: list[sqlite3.Row] = []
        for chunk in _chunks(list(dict.fromkeys(turn_ids))):
            rows += self.conn.execute(
                f"{_TURN_ROWS} AND t.turn_id IN ({','.join('?' * len(chunk))})",
                (namespace, *chunk),
            ).fetchall()
        return rows

    # ------------------------------------------------------------------ memories

    def insert_memories(
        self,
        namespace: str,
        memories: Iterable[EpisodeDraft | TupleDraft | Episode | RelationalTuple],
        source_session_id: str | None = None,
        run_id: int | None = None,
        action: str = "add",
        before: dict[str, Any] | None = None,
    ) -> list[int]:
        """Insert new active memories and their ``action`` events (with ``before``, the row a
        memory replaces, when there is one); returns the new ids."""
        ids: list[int] = []
        now = utcnow().isoformat()
        with self.transaction() as c:
            self.ensure_namespace(namespace)
            for memory in memories:
                data = _memory_columns(memory)
                session_id = getattr(memory, "source_session_id", None) or source_session_id
                memory_id = _inserted_id(
                    c.execute(
                        "INSERT INTO memories (namespace, kind, title, summary, details, entity, relation, object, "
                        "context, "
                        "timestamp, source_session_id, source_turn_ids, provenance, created_at) "
                        "VALUES (:namespace, :kind, :title, :summary, :details, :entity, :relation, :object, :context, "
                        ":timestamp, :source_session_id, :source_turn_ids, :provenance, :created_at)",
                        {**data, "namespace": namespace, "source_session_id": session_id, "created_at": now},
                    )
                )
                ids.append(memory_id)
                self._event(namespace, action, memory_id, run_id, before, self._memory_json(memory_id), None)
        return ids

    def set_status(
        self,
        memory_id: int,
        status: MemoryStatus,
        reason: str | None = None,
        superseded_by: int | None = None,
        run_id: int | None = None,
        action: str | None = None,
    ) -> None:
        """Change one memory's status (the only mutation a memory ever sees), with an event."""
        with self.transaction() as c:
            before = self._memory_json(memory_id)
            c.execute(
                "UPDATE memories SET status = ?, superseded_by = ?, status_reason = ? WHERE id = ?",
                (MemoryStatus(status).value, superseded_by, reason, memory_id),
            )
            self._event(
                before["namespace"],
                action or MemoryStatus(status).value,
                memory_id,
                run_id,
                before,
                self._memory_json(memory_id),
                reason,
            )

    def duplicate_candidates(
        self, namespace: str, kind: MemoryKind, timestamp: str, session_id: str | None
    ) -> list[Episode | RelationalTuple]:
        """Active memories of ``kind`` that a new memory could repeat: those with its timestamp,
        and those of its session (a model restating a memory of the session under another date)."""
        return [
            _row_to_memory(r)
            for r in self.conn.execute(
                f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = ? AND kind = ? AND status = 'active' "
                "AND (timestamp = ? OR source_session_id = ?) ORDER BY id",
                (namespace, kind, timestamp, session_id),
            )
        ]

    def add_source_turns(
        self, memory_id: int, turn_ids: Sequence[str], provenance: Provenance | None, reason: str
    ) -> None:
        """Give a memory more source turns (a union, in order: old ones first) and the combined
        provenance, with a ``duplicate`` event; nothing else of it changes."""
        with self.transaction() as c:
            before = self._memory_json(memory_id)
            old = json.loads(before["source_turn_ids"])
            union = list(dict.fromkeys([*old, *turn_ids]))
            combined = combine_provenance([before["provenance"] if old else None, provenance if turn_ids else None])
            c.execute(
                "UPDATE memories SET source_turn_ids = ?, provenance = ? WHERE id = ?",
                (json.dumps(union), combined, memory_id),
            )
            self._event(before["namespace"], "duplicate", memory_id, None, before, self._memory_json(memory_id), reason)

    def supersede(
        self,
        namespace: str,
        source_ids: Sequence[int],
        memory: Episode | RelationalTuple,
        reason: str,
        action: str,
        run_id: int | None = None,
    ) -> int:
        """Store ``memory`` as the active successor of ``source_ids`` (an update: one source; a
        consolidation merge: several) and mark each source superseded by it, every change an
        event. The new row's ``action`` event carries, for one source, that source's row as
        ``before``. Returns the new id."""
        with self.transaction():
            before = self._memory_json(source_ids[0]) if len(source_ids) == 1 else None
            (new_id,) = self.insert_memories(namespace, [memory], run_id=run_id, action=action, before=before)
            for source_id in source_ids:
                self.set_status(source_id, MemoryStatus.superseded, reason=reason, superseded_by=new_id, run_id=run_id)
        return new_id

    def not_active(self, ids: Sequence[int]) -> list[int]:
        """The ids that are no longer active memories (changed or purged)."""
        rows = self.status_rows(ids)
        return [i for i in ids if i not in rows or rows[i]["status"] != MemoryStatus.active.value]

    def _memory_json(self, memory_id: int) -> dict[str, Any]:
        row = self.conn.execute(
            f"SELECT {_MEMORY_COLUMNS}, status_reason FROM memories WHERE id = ?", (memory_id,)
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no memory with id {memory_id}")
        return dict(zip(row.keys(), row, strict=True))  # a sqlite3.Row iterates over values, not keys

    def get_memory(self, memory_id: int) -> Episode | RelationalTuple:
        row = self.conn.execute(f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id = ?", (memory_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no memory with id {memory_id}")
        return _row_to_memory(row)

    def get_memories(self, ids: Sequence[int]) -> dict[int, Episode | RelationalTuple]:
        out: dict[int, Episode | RelationalTuple] = {}
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            for row in self.conn.execute(f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE id IN ({marks})", chunk):
                out[row["id"]] = _row_to_memory(row)
        return out

    def list_memories(
        self,
        namespace: str,
        kind: MemoryKind | None = None,
        status: MemoryStatus | None = MemoryStatus.active,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Episode | RelationalTuple]:
        """Memories in id order; ``limit``/``offset`` page through them (ids never move, so pages are stable)."""
        sql = f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = ?"
        args: list[str | int] = [namespace]
        if kind is not None:
            sql, args = sql + " AND kind = ?", [*args, kind]
        if status is not None:
            sql, args = sql + " AND status = ?", [*args, MemoryStatus(status).value]
        sql += " ORDER BY id"
        if limit is not None or offset:
            # SQLite needs a LIMIT for an OFFSET; -1 means no limit.
            sql, args = sql + " LIMIT ? OFFSET ?", [*args, -1 if limit is None else int(limit), int(offset)]
        return [_row_to_memory(r) for r in self.conn.execute(sql, args)]

    def active_ids(self, namespace: str, kind: MemoryKind) -> np.ndarray:
        rows = self.conn.execute(
            "SELECT id FROM memories WHERE namespace = ? AND kind = ? AND status = 'active' ORDER BY id",
            (namespace, kind),
        ).fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

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

    # ------------------------------------------------------------------ API keys

    def insert_api_key(self, key: ApiKeyRow) -> None:
        """Store a new key and a ``key_created`` event in each of its namespaces (never the hash)."""
        with self.transaction() as c:
            c.execute(
                "INSERT INTO api_keys (key_id, salt, key_hash, role, namespaces, label, created_at, revoked_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
                (
                    key.key_id,
                    key.salt,
                    key.key_hash,
                    key.role,
                    json.dumps(key.namespaces),
                    key.label,
                    key.created_at.isoformat(),
                ),
            )
            self._key_events(key, "key_created")

    def get_api_key(self, key_id: str) -> ApiKeyRow | None:
        row = self.conn.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return None if row is None else _row_to_api_key(row)

    def list_api_keys(self) -> list[ApiKeyRow]:
        return [_row_to_api_key(r) for r in self.conn.execute("SELECT * FROM api_keys ORDER BY created_at, key_id")]

    def revoke_api_key(self, key_id: str) -> ApiKeyRow:
        """Mark a key revoked (idempotent: a second revoke keeps the first time and logs nothing)."""
        with self.transaction() as c:
            key = self.get_api_key(key_id)
            if key is None:
                raise NotFoundError(f"no API key with id {key_id!r}")
            if key.revoked_at is None:
                now = utcnow()
                c.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (now.isoformat(), key_id))
                key = key.model_copy(update={"revoked_at": now})
                self._key_events(key, "key_revoked")
        return key

    def _key_events(self, key: ApiKeyRow, action: str) -> None:
        after = {"key_id": key.key_id, "role": key.role, "namespaces": key.namespaces, "label": key.label}
        for namespace in key.namespaces:
            self._event(namespace, action, None, None, None, after, None)

    # ------------------------------------------------------------------ history

    def _event(
        self,
        namespace: str,
        action: str,
        memory_id: int | None,
        run_id: int | None,
        before: dict | None,
        after: dict | None,
        reason: str | None,
    ) -> None:
        self.conn.execute(
            "INSERT INTO events (namespace, at, action, memory_id, run_id, before, after, reason) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                namespace,
                utcnow().isoformat(),
                action,
                memory_id,
                run_id,
                json.dumps(before) if before is not None else None,
                json.dumps(after) if after is not None else None,
                reason,
            ),
        )

    def history(self, memory_id: int) -> list[Event]:
        return [
            _row_to_event(r)
            for r in self.conn.execute("SELECT * FROM events WHERE memory_id = ? ORDER BY id", (memory_id,))
        ]

    def run_events(self, run_id: int) -> list[Event]:
        return [
            _row_to_event(r) for r in self.conn.execute("SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,))
        ]

    # ------------------------------------------------------------------ consolidation runs

    def start_consolidation_run(self, namespace: str, backend: str, params: dict[str, Any]) -> int:
        """A new run row, status 'applied' (it commits with the changes it makes)."""
        return _inserted_id(
            self.conn.execute(
                "INSERT INTO consolidation_runs (namespace, started_at, status, backend, params) VALUES (?, ?, "
                "'applied', ?, ?)",
                (namespace, utcnow().isoformat(), backend, json.dumps(params)),
            )
        )

    def finish_consolidation_run(self, run_id: int, namespace: str, report_json: str) -> None:
        """Store the run's report and restart the namespace's sessions-since-consolidation count."""
        with self.transaction() as c:
            c.execute(
                "UPDATE consolidation_runs SET finished_at = ?, report = ? WHERE id = ?",
                (utcnow().isoformat(), report_json, run_id),
            )
            c.execute("UPDATE namespaces SET sessions_since_consolidation = 0 WHERE name = ?", (namespace,))

    def consolidation_run(self, run_id: int) -> sqlite3.Row:
        row = self.conn.execute("SELECT * FROM consolidation_runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no consolidation run with id {run_id}")
        return row

    def mark_consolidation_run_undone(self, run_id: int) -> None:
        self.conn.execute("UPDATE consolidation_runs SET status = 'undone' WHERE id = ?", (run_id,))

    def sessions_since_consolidation(self, namespace: str) -> int:
        row = self.conn.execute(
            "SELECT sessions_since_consolidation FROM namespaces WHERE name = ?", (check_namespace(namespace),)
        ).fetchone()
        return 0 if row is None else row[0]

    def status_rows(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """id → {status, superseded_by, status_reason} for the ids that exist."""
        rows: dict[int, dict[str, Any]] = {}
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            for r in self.conn.execute(
                f"SELECT id, status, superseded_by, status_reason FROM memories WHERE id IN ({marks})", chunk
            ):
                rows[r["id"]] = dict(r)
        return rows

    def events_after(self, memory_ids: Sequence[int], event_id: int) -> list[Event]:
        """Events of ``memory_ids`` recorded after event ``event_id``, oldest first."""
        events: list[Event] = []
        for chunk in _chunks(memory_ids):
            marks = ",".join("?" * len(chunk))
            events += [
                _row_to_event(r)
                for r in self.conn.execute(
                    f"SELECT * FROM events WHERE memory_id IN ({marks}) AND id > ? ORDER BY id", (*chunk, event_id)
                )
            ]
        return sorted(events, key=lambda e: e.id)

    # ------------------------------------------------------------------ purge

    def retired_before(self, namespace: str, cutoff: datetime) -> set[int]:
        """Non-active memories whose last change (or creation) is older than ``cutoff``."""
        return {
            r[0]
            for r in self.conn.execute(
                "SELECT m.id, coalesce(max(e.at), m.created_at) AS changed_at FROM memories m "
                "LEFT JOIN events e ON e.memory_id = m.id "
                "WHERE m.namespace = ? AND m.status != 'active' GROUP BY m.id HAVING changed_at < ?",
                (namespace, cutoff.isoformat()),
            )
        }

    def superseded_pointers(self, namespace: str) -> dict[int, int]:
        """memory id → the id of the memory that superseded it."""
        return dict(
            self.conn.execute(
                "SELECT id, superseded_by FROM memories WHERE namespace = ? AND superseded_by IS NOT NULL", (namespace,)
            ).fetchall()
        )

    def delete_memories(
        self, namespace: str, ids: Sequence[int], text_hashes: Sequence[str], record: dict[str, Any], reason: str
    ) -> tuple[int, int]:
        """Physically delete memories, their events and the cached embeddings of ``text_hashes``,
        recording one 'purge' event with ``record``; returns (events, embeddings) deleted."""
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

    def vacuum(self) -> None:
        """Checkpoint the WAL and rewrite the file, so freed pages keep no deleted text."""
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.execute("VACUUM")

    # ------------------------------------------------------------------ embedding cache

    def get_embeddings(self, namespace: str, model_id: str, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Cached vectors by text hash (missing texts are simply absent)."""
        hashes = sorted({text_hash(t) for t in texts})
        found: dict[str, np.ndarray] = {}
        for chunk in _chunks(hashes):
            marks = ",".join("?" * len(chunk))
            for h, dim, blob in self.conn.execute(
                "SELECT text_hash, dim, vector FROM embeddings WHERE namespace = ? AND model_id = ? AND text_hash "
                f"IN ({marks})",
                (namespace, model_id, *chunk),
            ):
                found[h] = np.frombuffer(blob, dtype=np.float32, count=dim)
        return found

    def put_embeddings(self, namespace: str, model_id: str, texts: Sequence[str], vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        with self.transaction() as c:
            self.ensure_namespace(namespace)
            c.executemany(
                "INSERT OR REPLACE INTO embeddings (namespace, model_id, text_hash, dim, vector) VALUES (?, ?, ?, ?, "
                "?)",
                [
                    (namespace, model_id, text_hash(t), vectors.shape[1], v.tobytes())
                    for t, v in zip(texts, vectors, strict=True)
                ],
            )


def _inserted_id(cursor: sqlite3.Cursor) -> int:
    """The rowid of the row an INSERT just wrote (sqlite3 types ``lastrowid`` optional)."""
    if cursor.lastrowid is None:
        raise StoreError("SQLite reported no rowid for an INSERT")
    return cursor.lastrowid


def _chunks(ids: Sequence[Any], size: int = 500) -> Iterator[list[Any]]:
    """SQLite limits the host parameters of one statement; ``IN (...)`` lists go in slices."""
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _memory_columns(memory: EpisodeDraft | TupleDraft) -> dict[str, Any]:
    kind = "episode" if isinstance(memory, EpisodeDraft) else "tuple"
    fields = ("title", "summary", "details", "entity", "relation", "object", "context")
    data = {f: getattr(memory, f, None) for f in fields}
    data.update(
        kind=kind,
        timestamp=memory.timestamp,
        source_turn_ids=json.dumps(list(memory.source_turn_ids)),
        provenance=memory.provenance,
    )
    return data


def _row_to_memory(row: sqlite3.Row) -> Episode | RelationalTuple:
    # Rows were validated on their way in (insert_memories takes drafts), so they are built
    # without validating again: ~13 µs a row instead of ~30, ~0.5 ms of a 30-hit search.
    turn_ids = json.loads(row["source_turn_ids"])
    common = dict(
        id=row["id"],
        namespace=row["namespace"],
        timestamp=row["timestamp"],
        source_session_id=row["source_session_id"],
        source_turn_ids=turn_ids,
        # Rows older than the provenance column hold NULL: their turns were cited.
        provenance=provenance_of(turn_ids, row["provenance"]),
        created_at=datetime.fromisoformat(row["created_at"]),
        status=MemoryStatus(row["status"]),
        superseded_by=row["superseded_by"],
    )
    if row["kind"] == "episode":
        return Episode.model_construct(title=row["title"], summary=row["summary"], details=row["details"], **common)
    return RelationalTuple.model_construct(
        entity=row["entity"], relation=row["relation"], object=row["object"], context=row["context"] or "", **common
    )


def _row_to_api_key(row: sqlite3.Row) -> ApiKeyRow:
    return ApiKeyRow(
        key_id=row["key_id"],
        salt=row["salt"],
        key_hash=row["key_hash"],
        role=row["role"],
        namespaces=json.loads(row["namespaces"]),
        label=row["label"],
        created_at=datetime.fromisoformat(row["created_at"]),
        revoked_at=datetime.fromisoformat(row["revoked_at"]) if row["revoked_at"] else None,
    )


def _row_to_event(row: sqlite3.Row) -> Event:
    return Event(
        id=row["id"],
        namespace=row["namespace"],
        at=datetime.fromisoformat(row["at"]),
        action=row["action"],
        memory_id=row["memory_id"],
        run_id=row["run_id"],
        before=json.loads(row["before"]) if row["before"] else None,
        after=json.loads(row["after"]) if row["after"] else None,
        reason=row["reason"],
    )
