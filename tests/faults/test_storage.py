"""A full disk, a read-only file system, a missing directory: a clear error, nothing corrupted,
and the store works again once the cause is gone.

"Full" is real SQLite behaviour twice over: ``PRAGMA max_page_count`` (any machine) and a
small tmpfs filling up (needs root to mount; skipped otherwise). "Read-only" is a tmpfs
remounted read-only as root, or a file without write permission for other users.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from hybridmem_local.cli.main import app
from hybridmem_local.errors import StoreError
from hybridmem_local.memory import HybridMemory
from tests.faults.corpus import QUERIES, curated_sessions, write_jsonl
from tests.faults.invariants import assert_integrity, session_states


def rows(db: Path) -> dict[str, list]:
    """Every row of the tables that hold user data (compared before and after a fault)."""
    conn = sqlite3.connect(db)
    try:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
            for table in ("sessions", "turns", "memories", "events", "embeddings")
        }
    finally:
        conn.close()


def squash(text: str) -> str:
    """Text without whitespace: rich wraps (and folds long paths in) the CLI's 80-column output."""
    return "".join(text.split())


def _add(memory: HybridMemory, item) -> list[int]:
    return memory.add_memories(item.session.namespace, episodes=item.episodes, tuples=item.tuples, session=item.session)


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs, or a skip where mounting is not allowed (not root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


# --------------------------------------------------------------------------- full


def _full_store(tmp_path, hashing_embedder):
    """A store holding one session whose database may not grow by a single page."""
    items = curated_sessions("alice", 3, seed=11)
    memory = HybridMemory.open(tmp_path / "m.db", embedder=hashing_embedder)
    _add(memory, items[0])
    memory.store.sqlite.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pages = memory.store.sqlite.execute("PRAGMA page_count").fetchone()[0]
    memory.store.sqlite.execute(f"PRAGMA max_page_count = {pages}")
    big = items[1].model_copy(deep=True)
    big.session.turns[0].text = "x" * 90_000  # needs pages the database may not grow to
    return memory, items[0], big


def test_a_full_database_refuses_the_session_whole_and_accepts_it_once_there_is_room(tmp_path, hashing_embedder):
    memory, first, big = _full_store(tmp_path, hashing_embedder)
    db = memory.store.path
    with memory:
        before_search = memory.search(QUERIES[0], namespace="alice")
        before = rows(db)
        with pytest.raises(sa.exc.OperationalError, match="database or disk is full"):
            _add(memory, big)
        assert memory.store.integrity_check() == "ok"
        assert not memory.store.in_transaction
        assert not memory.store.sessions.exists("alice", big.session.session_id)
        assert memory.search(QUERIES[0], namespace="alice") == before_search  # nothing half-indexed
        assert rows(db) == before

        memory.store.sqlite.execute("PRAGMA max_page_count = 1073741823")
        _add(memory, big)
    assert_integrity(db)
    assert set(session_states(db, [first, big]).values()) == {"present"}


def test_a_filling_disk_stops_ingest_with_sqlites_error_and_keeps_every_committed_session(tmpfs, hashing_embedder):
    db = tmpfs / "m.db"
    items = curated_sessions("alice", 200, seed=12)
    written = []
    with HybridMemory.open(db, embedder=hashing_embedder) as memory:
        with pytest.raises(sa.exc.OperationalError, match="database or disk is full"):
            for item in items:
                _add(memory, item)
                written.append(item)
        assert memory.store.integrity_check() == "ok"
    assert 0 < len(written) < len(items)
    states = session_states(db, items)
    assert [states[("alice", c.session.session_id)] for c in items] == ["present"] * len(written) + ["absent"] * (
        len(items) - len(written)
    )


def test_the_cli_reports_a_full_disk_in_one_line(tmpfs, tmp_path):
    sessions = write_jsonl([c.session for c in curated_sessions("alice", 400, seed=13, turns=8)], tmp_path / "s.jsonl")
    result = CliRunner().invoke(app, ["ingest", str(sessions), "--no-curate", "--db", str(tmpfs / "m.db")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    assert squash("database or disk is full") in squash(result.output)


# --------------------------------------------------------------------------- read-only


@pytest.fixture
def read_only_store(tmp_path, hashing_embedder, request):
    """A store with one session, made read-only: (db, items, make_writable)."""
    items = curated_sessions("alice", 2, seed=14)
    root = os.geteuid() == 0
    folder = request.getfixturevalue("tmpfs") if root else tmp_path / "ro"
    folder.mkdir(exist_ok=True)
    db = folder / "m.db"
    with HybridMemory.open(db, embedder=hashing_embedder) as memory:
        _add(memory, items[0])
    writable = {"done": False}

    def make_writable():
        if not writable["done"]:
            if root:
                subprocess.run(["mount", "-o", "remount,rw", str(folder)], check=True)
            else:
                folder.chmod(0o700)
                for path in folder.iterdir():
                    path.chmod(0o600)
            writable["done"] = True

    if root:
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    else:
        for path in folder.iterdir():
            path.chmod(0o400)
        folder.chmod(0o500)
    yield db, items, make_writable
    make_writable()


def test_a_read_only_store_is_a_clear_error_and_stays_intact(read_only_store, hashing_embedder):
    db, items, make_writable = read_only_store
    with (
        pytest.raises((StoreError, OSError), match=r"(?i)read-only|permission denied|readonly") as caught,
        HybridMemory.open(db, embedder=hashing_embedder) as memory,
    ):
        _add(memory, items[1])
    assert str(db) in str(caught.value) or getattr(caught.value, "filename", None) == str(db)
    make_writable()
    assert_integrity(db)
    assert set(session_states(db, items[:1]).values()) == {"present"}
    assert session_states(db, items[1:]) == {("alice", items[1].session.session_id): "absent"}


def test_the_cli_reports_a_read_only_store_in_one_line(read_only_store, tmp_path):
    db, items, _ = read_only_store
    sessions = write_jsonl([items[1].session], tmp_path / "s.jsonl")
    result = CliRunner().invoke(app, ["ingest", str(sessions), "--no-curate", "--db", str(db)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    assert "read-only" in squash(result.output).lower() or "permission" in squash(result.output).lower()


# --------------------------------------------------------------------------- missing directory


def test_a_missing_directory_is_a_clear_error_and_creates_nothing(tmp_path):
    sessions = write_jsonl([curated_sessions("alice", 1, seed=15)[0].session], tmp_path / "s.jsonl")
    missing = tmp_path / "no" / "such" / "dir"
    result = CliRunner().invoke(app, ["ingest", str(sessions), "--no-curate", "--db", str(missing / "m.db")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    assert squash(f"directory {missing} does not exist") in squash(result.output)
    assert not (tmp_path / "no").exists()
