"""API keys of ``hybridmem serve``: who may reach which namespaces, and with which role.

A key reads ``hm_<key_id>_<secret>``: the 8-hex-character ``key_id`` finds the stored row, the
secret (``secrets.token_urlsafe(32)``, 256 random bits) is checked against a salted SHA-256 of
it. The secret is shown once, at creation, and never stored. A slow KDF (scrypt, argon2) exists
to protect guessable passwords; a 256-bit random secret cannot be guessed, so one hash suffices
and keeps authentication cheap on every request.

Checking costs the same whether the key is malformed, unknown, revoked or valid: always one
hash and one ``hmac.compare_digest``, so timing does not tell an attacker which part was wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from datetime import datetime
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hybridmem_local.errors import NotFoundError
from hybridmem_local.schema import check_namespace, utcnow
from hybridmem_local.storage.api_keys import ApiKeyRow
from hybridmem_local.storage.store import MemoryStore

#: A key reaching every namespace (only an all-namespace admin can create one).
ALL_NAMESPACES = "*"

KEY_PATTERN = re.compile(r"^hm_([0-9a-f]{8})_([A-Za-z0-9_-]{20,128})$")

# Compared against when the key is malformed or unknown, so that path costs what a real check costs.
_DUMMY_SALT = secrets.token_bytes(16)
_DUMMY_HASH = hashlib.sha256(_DUMMY_SALT + b"no such key").digest()


class Role(str, Enum):
    """What a key may do; each role includes the ones before it (read < write < admin)."""

    read = "read"
    write = "write"
    admin = "admin"

    @property
    def rank(self) -> int:
        return list(Role).index(self)


class ApiKey(BaseModel):
    """A stored key as anyone may see it: no secret, no hash."""

    model_config = ConfigDict(extra="forbid")

    key_id: str
    role: Role
    namespaces: list[str] = Field(description='namespaces the key reaches; ["*"] means all')
    label: str | None = None
    created_at: datetime
    revoked_at: datetime | None = None

    def covers(self, namespace: str) -> bool:
        return ALL_NAMESPACES in self.namespaces or namespace in self.namespaces

    def allows(self, namespace: str, role: Role) -> bool:
        """May this key act on ``namespace`` with at least ``role``? (Never, once revoked.)"""
        return self.revoked_at is None and self.covers(namespace) and Role(self.role).rank >= Role(role).rank


class KeyRequest(BaseModel):
    """What a new key may reach (the body of ``POST /v1/keys`` and ``hybridmem keys create``)."""

    model_config = ConfigDict(extra="forbid")

    namespaces: list[str] = Field(min_length=1, max_length=100, description='namespaces to reach; ["*"] for all')
    role: Role
    label: str | None = Field(default=None, max_length=200)

    @field_validator("namespaces")
    @classmethod
    def _valid_namespaces(cls, namespaces: list[str]) -> list[str]:
        if ALL_NAMESPACES in namespaces:
            if len(namespaces) > 1:
                raise ValueError('"*" (all namespaces) cannot be combined with named namespaces')
            return namespaces
        for namespace in namespaces:
            check_namespace(namespace)
        return sorted(set(namespaces))


def _hash(salt: bytes, secret: str) -> bytes:
    return hashlib.sha256(salt + secret.encode("utf-8")).digest()


def _public(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        key_id=row.key_id,
        role=Role(row.role),
        namespaces=row.namespaces,
        label=row.label,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


class KeyRing:
    """Creates, checks, lists and revokes the API keys kept in one store."""

    def __init__(self, store: MemoryStore):
        self.store = store
        # Request threads share this store's one connection: two threads on it would share (or
        # collide on) one transaction, so every use of it is serialized.
        self._lock = threading.Lock()

    def create(self, namespaces: list[str], role: Role | str, label: str | None = None) -> tuple[ApiKey, str]:
        """A new key and its full token (``hm_<key_id>_<secret>``): the only time the secret is seen."""
        request = KeyRequest.model_validate({"namespaces": namespaces, "role": role, "label": label})
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        while True:  # 2^32 ids: a clash is rare but must not overwrite or fail
            key_id = secrets.token_hex(4)
            with self._lock:
                if self.store.api_keys.get(key_id) is None:
                    break
        row = ApiKeyRow(
            key_id=key_id,
            salt=salt,
            key_hash=_hash(salt, secret),
            role=request.role.value,
            namespaces=request.namespaces,
            label=request.label,
            created_at=utcnow(),
            revoked_at=None,
        )
        with self._lock:
            self.store.api_keys.insert(row)
        return _public(row), f"hm_{key_id}_{secret}"

    def authenticate(self, token: str) -> ApiKey | None:
        """The key ``token`` names if its secret matches and it is not revoked, else None."""
        match = KEY_PATTERN.match(token)
        with self._lock:
            row = self.store.api_keys.get(match.group(1)) if match else None
        salt, expected = (row.salt, row.key_hash) if row is not None else (_DUMMY_SALT, _DUMMY_HASH)
        secret = match.group(2) if match else token
        matches = hmac.compare_digest(_hash(salt, secret), expected)
        if row is None or not matches or row.revoked_at is not None:
            return None
        return _public(row)

    def get(self, key_id: str) -> ApiKey:
        with self._lock:
            row = self.store.api_keys.get(key_id)
        if row is None:
            raise NotFoundError(f"no API key with id {key_id!r}")
        return _public(row)

    def list(self) -> list[ApiKey]:
        with self._lock:
            rows = self.store.api_keys.select()
        return [_public(row) for row in rows]

    def revoke(self, key_id: str) -> ApiKey:
        with self._lock:
            row = self.store.api_keys.revoke(key_id)
        return _public(row)
