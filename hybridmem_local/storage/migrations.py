"""The store's schema: one migration per version, applied in order when a store is opened, the
same history on every backend.

Each step is written with Alembic's operations (``op.create_table`` and friends), which render
the DDL of the connection's dialect: SQLite and PostgreSQL get one schema from one text. Only
what has no portable form (the audit log's append-only triggers) is given per dialect. The
backend records the version (``PRAGMA user_version`` in a SQLite file, as every store written
before PostgreSQL existed has it; a ``schema_version`` row on PostgreSQL). A store opens
databases of this version or older (``Database`` migrates them in one transaction under the
writer lock, so two replicas starting together migrate once) and refuses newer ones.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations

from hybridmem_local.errors import StoreError

SCHEMA_VERSION = 8

#: A row id: BIGINT (identity) on PostgreSQL; exactly ``INTEGER PRIMARY KEY`` (the rowid) in SQLite.
RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _id() -> sa.Column:
    return sa.Column("id", RowId, primary_key=True)


def _namespace_ref() -> sa.Column:
    return sa.Column("namespace", sa.Text, sa.ForeignKey("namespaces.name", ondelete="CASCADE"), nullable=False)


def _v1(op: Operations) -> None:
    op.create_table(
        "namespaces",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("sessions_since_consolidation", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "sessions",
        _id(),
        _namespace_ref(),
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("started_at", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("curation_status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("curation_error", sa.Text),
        sa.Column("prompt_version", sa.Text),
        sa.CheckConstraint("curation_status IN ('pending', 'curated', 'curation_failed')"),
        sa.UniqueConstraint("namespace", "session_id"),
    )
    op.create_table(
        "turns",
        _id(),
        sa.Column("session_pk", RowId, sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("namespace", sa.Text, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("turn_id", sa.Text, nullable=False),
        sa.Column("speaker", sa.Text, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("image_caption", sa.Text),
        sa.UniqueConstraint("namespace", "turn_id"),
    )
    op.create_index("turns_session", "turns", ["session_pk", "position"])
    op.create_table(
        "memories",
        _id(),
        _namespace_ref(),
        sa.Column("kind", sa.Text, nullable=False),
        *(sa.Column(name, sa.Text) for name in ("title", "summary", "details", "entity", "relation", "object")),
        sa.Column("context", sa.Text),
        sa.Column("timestamp", sa.Text, nullable=False),
        sa.Column("source_session_id", sa.Text),
        sa.Column("source_turn_ids", sa.Text, nullable=False, server_default="[]"),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="active"),
        sa.Column("superseded_by", RowId, sa.ForeignKey("memories.id")),
        sa.Column("status_reason", sa.Text),
        sa.CheckConstraint("kind IN ('episode', 'tuple')"),
        sa.CheckConstraint("status IN ('active', 'superseded', 'deleted')"),
        sa.CheckConstraint("kind != 'episode' OR (title IS NOT NULL AND summary IS NOT NULL AND details IS NOT NULL)"),
        sa.CheckConstraint("kind != 'tuple' OR (entity IS NOT NULL AND relation IS NOT NULL AND object IS NOT NULL)"),
        sqlite_autoincrement=True,
    )
    op.create_index("memories_ns", "memories", ["namespace", "kind", "status"])
    op.create_table(
        "events",
        _id(),
        sa.Column("namespace", sa.Text, nullable=False),
        sa.Column("at", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("memory_id", RowId),
        sa.Column("run_id", RowId),
        sa.Column("before", sa.Text),
        sa.Column("after", sa.Text),
        sa.Column("reason", sa.Text),
        sqlite_autoincrement=True,
    )
    op.create_index("events_memory", "events", ["memory_id"])
    op.create_index("events_run", "events", ["run_id"])
    op.create_table(
        "embeddings",
        _namespace_ref(),
        sa.Column("model_id", sa.Text, nullable=False),
        sa.Column("text_hash", sa.Text, nullable=False),
        sa.Column("dim", sa.Integer, nullable=False),
        sa.Column("vector", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "model_id", "text_hash"),
    )
    op.create_table(
        "consolidation_runs",
        _id(),
        _namespace_ref(),
        sa.Column("started_at", sa.Text, nullable=False),
        sa.Column("finished_at", sa.Text),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("backend", sa.Text),
        sa.Column("params", sa.Text, nullable=False, server_default="{}"),
        sa.Column("report", sa.Text, nullable=False, server_default="{}"),
        sa.CheckConstraint("status IN ('applied', 'undone')"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "exports",
        _namespace_ref(),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "path"),
    )


def _v2(op: Operations) -> None:
    # API keys of `hybridmem serve`. Only a salted hash of the secret is kept; ``namespaces`` is a
    # JSON list where ["*"] means every namespace. Revoked keys stay (with ``revoked_at``) so the
    # history of who could reach what is kept.
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Text, primary_key=True),
        sa.Column("salt", sa.LargeBinary, nullable=False),
        sa.Column("key_hash", sa.LargeBinary, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("namespaces", sa.Text, nullable=False),
        sa.Column("label", sa.Text),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("revoked_at", sa.Text),
        sa.CheckConstraint("role IN ('read', 'write', 'admin')"),
    )


def _v3(op: Operations) -> None:
    # How each memory's source turns were obtained (schema.Provenance): rows that have turns
    # were written with ids their writer cited. The index serves the write-time duplicate guard
    # (same namespace, kind and timestamp).
    op.add_column(
        "memories", sa.Column("provenance", sa.Text, sa.CheckConstraint("provenance IN ('cited', 'aligned')"))
    )
    op.execute("UPDATE memories SET provenance = 'cited' WHERE source_turn_ids != '[]'")
    op.create_index("memories_timestamp", "memories", ["namespace", "kind", "timestamp"])


#: The audit log is append-only, and entries are deleted only up to the anchor a trim leaves.
#: Triggers have no portable form: one text per dialect.
AUDIT_TRIGGERS: dict[str, list[str]] = {
    "sqlite": [
        """CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        BEGIN
            SELECT RAISE(ABORT, 'the audit log is append-only');
        END""",
        """CREATE TRIGGER audit_log_trim_only BEFORE DELETE ON audit_log
        WHEN old.id > coalesce((SELECT through_id FROM audit_anchor WHERE id = 1), 0)
        BEGIN
            SELECT RAISE(ABORT, 'audit entries are removed only by a trim (hybridmem audit trim)');
        END""",
    ],
    "postgresql": [
        """CREATE FUNCTION audit_log_no_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'the audit log is append-only';
        END $$""",
        """CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        FOR EACH ROW EXECUTE FUNCTION audit_log_no_update()""",
        """CREATE FUNCTION audit_log_trim_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF old.id > coalesce((SELECT through_id FROM audit_anchor WHERE id = 1), 0) THEN
                RAISE EXCEPTION 'audit entries are removed only by a trim (hybridmem audit trim)';
            END IF;
            RETURN old;
        END $$""",
        """CREATE TRIGGER audit_log_trim_only BEFORE DELETE ON audit_log
        FOR EACH ROW EXECUTE FUNCTION audit_log_trim_only()""",
    ],
}


def _v4(op: Operations) -> None:
    # The audit trail (storage/audit.py): a hash chain of who did what, ids only, never text.
    op.create_table(
        "audit_log",
        _id(),
        sa.Column("at", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("namespace", sa.Text),
        sa.Column("refs", sa.Text, nullable=False, server_default="{}"),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("prev_hash", sa.Text, nullable=False),
        sa.Column("hash", sa.Text, nullable=False),
    )
    op.create_index("audit_log_actor", "audit_log", ["actor", "at"])
    op.create_index("audit_log_namespace", "audit_log", ["namespace", "at"])
    op.create_table(
        "audit_anchor",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("through_id", RowId, nullable=False),
        sa.Column("hash", sa.Text, nullable=False),
        sa.Column("at", sa.Text, nullable=False),
        sa.CheckConstraint("id = 1"),
    )
    for statement in AUDIT_TRIGGERS[op.get_context().dialect.name]:
        op.execute(statement)


def _v5(op: Operations) -> None:
    # Forget requests found in conversations (curation/redaction.py): one row per redaction.
    # ``request`` and ``summary`` are JSON without the removed text (what was asked, which turns
    # and memories changed); ``originals`` holds the removed text (the turns' texts before and
    # after) so an admin can undo, and is set to NULL when the redaction is confirmed (or undone).
    op.create_table(
        "redactions",
        _id(),
        _namespace_ref(),
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("decided_at", sa.Text),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("originals", sa.Text),
        sa.CheckConstraint("status IN ('pending', 'confirmed', 'undone')"),
        sqlite_autoincrement=True,
    )
    op.create_index("redactions_ns", "redactions", ["namespace", "status"])


def _v6(op: Operations) -> None:
    # forget and purge delete memories; each deleted row's `superseded_by REFERENCES memories(id)`
    # is checked against every other row, a full scan without this index (O(n^2): 4.5 s for a
    # 3,000-memory namespace, 0.6 s with it).
    op.create_index("memories_superseded_by", "memories", ["superseded_by"])


def _v7(op: Operations) -> None:
    # Several curation workers on one database (service/worker.py): a worker claims a session
    # for a lease; a claim whose lease ran out (its worker died) is anyone's again.
    op.add_column("sessions", sa.Column("claimed_by", sa.Text))
    op.add_column("sessions", sa.Column("claim_expires_at", sa.Text))
    op.create_index("sessions_queue", "sessions", ["curation_status", "id"])
    # One counter every PostgreSQL commit moves (backends.PostgresBackend.before_commit): how a
    # replica knows its indexes are behind. SQLite has PRAGMA data_version instead; the table is
    # created on both so the schema is one.
    op.create_table("store_changes", sa.Column("version", sa.BigInteger, nullable=False))
    op.execute("INSERT INTO store_changes (version) VALUES (0)")
    # One row per forget: what each replica still has to remove of that namespace on its own
    # host (index files, LLM cache entries, export files at these paths). Names and paths only.
    op.create_table(
        "forgotten_namespaces",
        _id(),
        sa.Column("namespace", sa.Text, nullable=False),
        sa.Column("at", sa.Text, nullable=False),
        sa.Column("exports", sa.Text, nullable=False, server_default="[]"),
        sqlite_autoincrement=True,
    )


def _v8(op: Operations) -> None:
    # The console on a namespace of 100,000 memories (scripts/bench_console.py): a page of
    # memories in id order walked memories_timestamp and sorted every row of the namespace
    # (120 ms for the first page, 640 ms at offset 99,950); in (namespace, id) order it stops
    # after the page. A namespace's last activity is then its newest event, found in the index.
    op.create_index("memories_ns_id", "memories", ["namespace", "id"])
    op.create_index("events_ns_at", "events", ["namespace", "at"])


MIGRATIONS: dict[int, Callable[[Operations], None]] = {
    1: _v1,
    2: _v2,
    3: _v3,
    4: _v4,
    5: _v5,
    6: _v6,
    7: _v7,
    8: _v8,
}


def upgrade(conn: sa.Connection, version: int) -> None:
    """Apply every step after ``version`` on ``conn`` (inside the caller's transaction)."""
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"store schema version {version} is newer than this library ({SCHEMA_VERSION}); upgrade hybridmem-local"
        )
    operations = Operations(MigrationContext.configure(connection=conn))
    for target in range(version + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[target](operations)
