"""The ``api_keys`` table of ``hybridmem serve``: only a salted hash of each secret is kept, and
a revoked key stays (with ``revoked_at``) so the history of who could reach what is kept."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict

from hybridmem_local.errors import NotFoundError
from hybridmem_local.schema import utcnow
from hybridmem_local.storage.connection import Database
from hybridmem_local.storage.events import EventLog


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


class ApiKeys:
    def __init__(self, db: Database, events: EventLog):
        self.db = db
        self.events = events

    def insert(self, key: ApiKeyRow) -> None:
        """Store a new key and a ``key_created`` event in each of its namespaces (never the hash)."""
        with self.db.transaction() as c:
            c.execute(
                "INSERT INTO api_keys (key_id, salt, key_hash, role, namespaces, label, created_at, revoked_at) "
                "VALUES (:key_id, :salt, :key_hash, :role, :namespaces, :label, :created_at, NULL)",
                {
                    "key_id": key.key_id,
                    "salt": key.salt,
                    "key_hash": key.key_hash,
                    "role": key.role,
                    "namespaces": json.dumps(key.namespaces),
                    "label": key.label,
                    "created_at": key.created_at.isoformat(),
                },
            )
            self._key_events(key, "key_created")

    def get(self, key_id: str) -> ApiKeyRow | None:
        row = self.db.execute("SELECT * FROM api_keys WHERE key_id = :key_id", {"key_id": key_id}).first()
        return None if row is None else _row_to_api_key(row)

    def select(self) -> list[ApiKeyRow]:
        """Every key, revoked ones included, oldest first."""
        return [_row_to_api_key(r) for r in self.db.execute("SELECT * FROM api_keys ORDER BY created_at, key_id")]

    def revoke(self, key_id: str) -> ApiKeyRow:
        """Mark a key revoked (idempotent: a second revoke keeps the first time and logs nothing)."""
        with self.db.transaction() as c:
            key = self.get(key_id)
            if key is None:
                raise NotFoundError(f"no API key with id {key_id!r}")
            if key.revoked_at is None:
                now = utcnow()
                c.execute(
                    "UPDATE api_keys SET revoked_at = :revoked_at WHERE key_id = :key_id",
                    {"revoked_at": now.isoformat(), "key_id": key_id},
                )
                key = key.model_copy(update={"revoked_at": now})
                self._key_events(key, "key_revoked")
        return key

    def _key_events(self, key: ApiKeyRow, action: str) -> None:
        after = {"key_id": key.key_id, "role": key.role, "namespaces": key.namespaces, "label": key.label}
        for namespace in key.namespaces:
            self.events.record(namespace, action, None, None, None, after, None)


def _row_to_api_key(row: sa.Row[Any]) -> ApiKeyRow:
    return ApiKeyRow(
        key_id=row.key_id,
        salt=bytes(row.salt),
        key_hash=bytes(row.key_hash),
        role=row.role,
        namespaces=json.loads(row.namespaces),
        label=row.label,
        created_at=datetime.fromisoformat(row.created_at),
        revoked_at=datetime.fromisoformat(row.revoked_at) if row.revoked_at else None,
    )
