"""API keys: only a salted hash is stored, checks fail closed, revocation is immediate, every
change is an event (without the secret), and the ``hybridmem keys`` commands drive it."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from typer.testing import CliRunner

from hybridmem_local.cli.main import app
from hybridmem_local.errors import NotFoundError
from hybridmem_local.service.keys import ApiKey, KeyRing, Role
from hybridmem_local.storage.migrations import MIGRATIONS, SCHEMA_VERSION
from hybridmem_local.storage.store import MemoryStore

runner = CliRunner()


@pytest.fixture
def store(tmp_path):
    s = MemoryStore(tmp_path / "memory.db")
    yield s
    s.close()


def test_a_created_key_authenticates_and_only_its_hash_is_stored(store, tmp_path):
    key, token = KeyRing(store).create(["alice", "bob"], "write", label="agent 7")
    assert token.startswith(f"hm_{key.key_id}_") and len(token) > 50
    assert KeyRing(store).authenticate(token) == key
    assert key.namespaces == ["alice", "bob"] and key.role is Role.write and key.label == "agent 7"
    secret = token.split("_", 2)[2].encode()
    files = [tmp_path / "memory.db", tmp_path / "memory.db-wal"]
    raw = b"".join(f.read_bytes() for f in files if f.exists())  # the WAL holds the fresh rows
    store.close()
    raw += (tmp_path / "memory.db").read_bytes()  # and the file, once checkpointed
    assert key.key_id.encode() in raw and secret not in raw


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # one character of the secret changed
        lambda t: t.replace("hm_", "hx_", 1),  # wrong prefix
        lambda t: "hm_00000000_" + t.split("_", 2)[2],  # unknown key id, right secret
        lambda t: t[:12],  # truncated
        lambda t: "",  # empty
        lambda t: t + "\x00",  # trailing NUL
    ],
)
def test_anything_but_the_exact_token_is_refused(store, mangle):
    _, token = KeyRing(store).create(["alice"], "read")
    assert KeyRing(store).authenticate(mangle(token)) is None


def test_revocation_is_immediate_and_idempotent(store):
    ring = KeyRing(store)
    key, token = ring.create(["alice"], "admin")
    revoked = ring.revoke(key.key_id)
    assert revoked.revoked_at is not None and ring.authenticate(token) is None
    assert ring.revoke(key.key_id).revoked_at == revoked.revoked_at
    assert not revoked.allows("alice", Role.read)
    with pytest.raises(NotFoundError, match="ffffffff"):
        ring.revoke("ffffffff")


def test_roles_are_ordered_and_namespaces_bound_a_key():
    key = ApiKey(key_id="0badcafe", role=Role.write, namespaces=["alice"], created_at="2023-01-01T00:00:00Z")
    assert key.allows("alice", Role.read) and key.allows("alice", Role.write)
    assert not key.allows("alice", Role.admin) and not key.allows("bob", Role.read)
    everywhere = key.model_copy(update={"namespaces": ["*"], "role": Role.read})
    assert everywhere.allows("anything", Role.read) and not everywhere.allows("anything", Role.write)


@pytest.mark.parametrize(
    "namespaces, role, problem",
    [
        ([], "read", "namespaces"),
        (["../etc"], "read", "invalid namespace"),
        (["*", "alice"], "read", "cannot be combined"),
        (["alice"], "owner", "role"),
    ],
)
def test_bad_key_requests_are_refused_and_store_nothing(store, namespaces, role, problem):
    with pytest.raises(ValueError, match=problem):
        KeyRing(store).create(namespaces, role)
    assert KeyRing(store).list() == []


def test_key_changes_are_events_without_secrets(store):
    ring = KeyRing(store)
    key, token = ring.create(["alice", "bob"], "read", label="dashboard")
    ring.revoke(key.key_id)
    rows = store.execute("SELECT namespace, action, memory_id, after FROM events ORDER BY id").fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        ("alice", "key_created"),
        ("bob", "key_created"),
        ("alice", "key_revoked"),
        ("bob", "key_revoked"),
    ]
    for row in rows:
        assert row[2] is None
        assert json.loads(row[3]) == {
            "key_id": key.key_id,
            "role": "read",
            "namespaces": ["alice", "bob"],
            "label": "dashboard",
        }
        assert token.split("_", 2)[2] not in row[3]


def test_a_version_1_store_gains_the_keys_table(tmp_path):
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        MIGRATIONS[1](Operations(MigrationContext.configure(connection=conn)))
        conn.execute(sa.text("INSERT INTO namespaces (name, created_at) VALUES ('alice', '2023-01-01T00:00:00+00:00')"))
        conn.exec_driver_sql("PRAGMA user_version = 1")
    engine.dispose()
    store = MemoryStore(path)
    try:
        assert store.scalar("PRAGMA user_version") == SCHEMA_VERSION  # migrated through every version since
        assert store.namespaces.names() == ["alice"]
        _, token = KeyRing(store).create(["alice"], "read")
        assert KeyRing(store).authenticate(token) is not None
    finally:
        store.close()


def test_keys_commands_create_list_and_revoke(tmp_path):
    db = str(tmp_path / "memory.db")
    created = runner.invoke(
        app,
        [
            "keys",
            "create",
            "--namespace",
            "alice",
            "--namespace",
            "bob",
            "--role",
            "write",
            "--label",
            "ci",
            "--db",
            db,
        ],
    )
    assert created.exit_code == 0, created.output
    token = created.output.strip().splitlines()[-1]
    key_id = token.split("_")[1]
    listed = runner.invoke(app, ["keys", "list", "--json", "--db", db])
    assert listed.exit_code == 0, listed.output
    [entry] = json.loads(listed.output)
    assert entry["key_id"] == key_id and entry["namespaces"] == ["alice", "bob"] and entry["revoked_at"] is None
    assert token not in listed.output
    revoked = runner.invoke(app, ["keys", "revoke", key_id, "--db", db])
    assert revoked.exit_code == 0 and f"revoked key {key_id}" in revoked.output
    store = MemoryStore(db)
    try:
        assert KeyRing(store).authenticate(token) is None
    finally:
        store.close()


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--namespace", "alice", "--role", "superuser"], "role"),
        (["--namespace", "../../etc", "--role", "read"], "invalid namespace"),
    ],
)
def test_keys_create_refuses_bad_input_with_one_clear_line(tmp_path, args, problem):
    result = runner.invoke(app, ["keys", "create", *args, "--db", str(tmp_path / "memory.db")])
    assert result.exit_code == 1 and problem in result.output
    assert "Traceback" not in result.output


def test_keys_revoke_of_an_unknown_key_fails_clearly(tmp_path):
    result = runner.invoke(app, ["keys", "revoke", "deadbeef", "--db", str(tmp_path / "memory.db")])
    assert result.exit_code == 1 and "no API key with id 'deadbeef'" in result.output
