"""What must hold after any fault: checked on the database file, and on search through the
indexes a later open repairs."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from hybridmem_local.config import load_config
from hybridmem_local.memory import HybridMemory
from hybridmem_local.storage.embedding_cache import text_hash
from tests.faults.corpus import QUERIES, CuratedSession


def connect(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    return conn


def assert_integrity(db: Path) -> None:
    conn = connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()


def session_states(db: Path, expected: Sequence[CuratedSession]) -> dict[tuple[str, str], str]:
    """``present`` or ``absent`` per session; fails unless each one is whole or wholly missing:
    session row ⇔ every one of its turns ⇔ every one of its memories (vectors: assert_consistent)."""
    conn = connect(db)
    states = {}
    try:
        for item in expected:
            s = item.session
            row = conn.execute(
                "SELECT id, curation_status FROM sessions WHERE namespace = ? AND session_id = ?",
                (s.namespace, s.session_id),
            ).fetchone()
            turn_ids = [t.turn_id for t in s.turns]
            marks = ",".join("?" * len(turn_ids))
            turns = conn.execute(
                f"SELECT count(*) FROM turns WHERE namespace = ? AND turn_id IN ({marks})", (s.namespace, *turn_ids)
            ).fetchone()[0]
            memories = conn.execute(
                "SELECT count(*) FROM memories WHERE namespace = ? AND source_session_id = ?",
                (s.namespace, s.session_id),
            ).fetchone()[0]
            got = (row is not None, turns, memories)
            if row is None:
                assert got == (False, 0, 0), (
                    f"{s.session_id}: no session row, yet {turns} turns and {memories} memories"
                )
                states[(s.namespace, s.session_id)] = "absent"
            else:
                assert got == (True, len(turn_ids), item.n_memories), f"{s.session_id}: partly written {got}"
                assert row["curation_status"] == "curated"
                states[(s.namespace, s.session_id)] = "present"
    finally:
        conn.close()
    return states


def assert_consistent(db: Path, model_id: str) -> None:
    """Store-wide rules: nothing half-consolidated, every live memory has its cached vector."""
    conn = connect(db)
    try:
        runs = {r["id"]: r for r in conn.execute("SELECT * FROM consolidation_runs")}
        for run in runs.values():
            assert run["finished_at"] is not None, f"run {run['id']} committed without finishing"
        for r in conn.execute("SELECT id, status, superseded_by FROM memories"):
            if r["status"] == "superseded":
                target = conn.execute("SELECT status FROM memories WHERE id = ?", (r["superseded_by"],)).fetchone()
                assert target is not None, f"memory {r['id']} superseded by missing row {r['superseded_by']}"
        for r in conn.execute("SELECT DISTINCT run_id FROM events WHERE run_id IS NOT NULL"):
            assert r["run_id"] in runs, f"events of run {r['run_id']} without its run row"
        cached = {
            (r[0], r[1])
            for r in conn.execute("SELECT namespace, text_hash FROM embeddings WHERE model_id = ?", (model_id,))
        }
    finally:
        conn.close()
    with HybridMemory.open(db, load_config()) as memory:
        for namespace in memory.store.namespaces.names():
            for m in memory.list(namespace):
                assert (namespace, text_hash(m.index_text())) in cached, f"memory {m.id} has no cached vector"


def search_snapshot(db: Path, embedder, namespaces: Iterable[str], mode: str, queries: Sequence[str] = QUERIES) -> list:
    config = load_config(overrides={"retrieval.mode": mode})
    with HybridMemory.open(db, config, embedder=embedder) as memory:
        return [
            [(h.memory.id, round(h.score, 5)) for h in result.episodes + result.tuples]
            for ns in sorted(namespaces)
            for result in (memory.search(q, namespace=ns) for q in queries)
        ]


def copy_without_indexes(db: Path, target: Path) -> Path:
    """A consistent copy of the database alone (SQLite's backup API reads through the WAL)."""
    src, dst = sqlite3.connect(db), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    shutil.rmtree(Path(str(target) + ".indexes"), ignore_errors=True)
    return target


def assert_search_matches_rebuild(db: Path, embedder, namespaces: Iterable[str], workdir: Path) -> None:
    """Opening ``db`` repairs its index files: results equal those of indexes built from scratch."""
    namespaces = sorted(namespaces)
    for mode in ("dense", "hybrid"):
        repaired = search_snapshot(db, embedder, namespaces, mode)
        fresh = copy_without_indexes(db, workdir / f"fresh-{mode}.db")
        assert search_snapshot(fresh, embedder, namespaces, mode) == repaired, f"{mode} search differs from a rebuild"
        for suffix in ("", "-wal", "-shm", ".indexes", ".llm_cache.sqlite"):
            path = Path(str(fresh) + suffix)
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
