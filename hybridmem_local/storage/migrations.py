"""The store's schema: one migration per version, applied in order when a store is opened.

``PRAGMA user_version`` holds the version a database file is at; a store opens files of this
version or older (migrating them in place, each step in one transaction) and refuses newer ones.
"""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 6

MIGRATIONS: dict[int, str] = {
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
    # The audit trail (storage/audit.py): a hash chain of who did what, ids only, never text.
    # Entries are never updated, and deleted only up to the anchor a trim leaves (the hash of
    # the last entry it removed, where verification starts).
    4: """
    CREATE TABLE audit_log (
        id INTEGER PRIMARY KEY,
        at TEXT NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        namespace TEXT,
        refs TEXT NOT NULL DEFAULT '{}',
        outcome TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL
    );
    CREATE INDEX audit_log_actor ON audit_log(actor, at);
    CREATE INDEX audit_log_namespace ON audit_log(namespace, at);
    CREATE TABLE audit_anchor (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        through_id INTEGER NOT NULL,
        hash TEXT NOT NULL,
        at TEXT NOT NULL
    );
    CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
    BEGIN
        SELECT RAISE(ABORT, 'the audit log is append-only');
    END;
    CREATE TRIGGER audit_log_trim_only BEFORE DELETE ON audit_log
    WHEN old.id > coalesce((SELECT through_id FROM audit_anchor WHERE id = 1), 0)
    BEGIN
        SELECT RAISE(ABORT, 'audit entries are removed only by a trim (hybridmem audit trim)');
    END;
    """,
    # Forget requests found in conversations (curation/forget.py): one row per redaction. ``request``
    # and ``summary`` are JSON without the removed text (what was asked, which turns and memories
    # changed); ``originals`` holds the removed text (the turns' texts before and after) so an admin
    # can undo, and is set to NULL when the redaction is confirmed (or undone).
    5: """
    CREATE TABLE redactions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL REFERENCES namespaces(name) ON DELETE CASCADE,
        session_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'confirmed', 'undone')),
        decided_at TEXT,
        request TEXT NOT NULL,
        summary TEXT NOT NULL,
        originals TEXT
    );
    CREATE INDEX redactions_ns ON redactions(namespace, status);
    """,
    # forget and purge delete memories; each deleted row's `superseded_by REFERENCES memories(id)`
    # is checked against every other row, a full scan without this index (O(n^2): 4.5 s for a
    # 3,000-memory namespace, 0.6 s with it).
    6: """
    CREATE INDEX memories_superseded_by ON memories(superseded_by);
    """,
}


def split_sql(script: str) -> list[str]:
    """The script's statements; a trigger's body (``BEGIN ...; END``) stays in its statement."""
    statements: list[str] = []
    current = ""
    for piece in script.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            if current.strip(" \n;"):
                statements.append(current.strip().removesuffix(";").strip())
            current = ""
    if current.strip(" \n;"):
        statements.append(current.strip().removesuffix(";").strip())
    return statements
