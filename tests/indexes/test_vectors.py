"""hnswlib index files: a save switches generations and clears out old orphans, never a fresh one."""

from __future__ import annotations

import os
import time

import numpy as np

from hybridmem_local.config import IndexConfig
from hybridmem_local.files.paths import ORPHAN_GRACE_S
from hybridmem_local.indexes.vectors import VectorIndex


def _index(directory, n: int = 50) -> tuple[VectorIndex, np.ndarray, np.ndarray]:
    vectors = np.random.default_rng(0).standard_normal((n, 16)).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.int64)
    index = VectorIndex(directory, "episode", "test-model", 16, IndexConfig())
    index.sync(ids, lambda wanted: vectors[wanted - 1])
    return index, ids, vectors


def test_an_index_caught_up_in_batches_answers_as_one_rebuilt_from_all_rows(tmp_path):
    """Ingest adds to the graph batch by batch; a missing or stale index is rebuilt from SQLite in
    one go. Both must answer every query alike, also where the beam search is approximate (a small
    ef) and where more memories tie (identical vectors) than k keeps: which tied one comes back
    depends on the graph, and threaded inserts build a different graph each time."""
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((3000, 16)).astype(np.float32)
    vectors[100:130] = vectors[99]  # 31 memories with one text
    ids = np.arange(1, len(vectors) + 1, dtype=np.int64)
    config = IndexConfig(ef_search=10)

    def vectors_for(wanted: np.ndarray) -> np.ndarray:
        return vectors[wanted - 1]

    caught_up = VectorIndex(tmp_path / "caught-up", "episode", "test-model", 16, config)
    for end in (700, 1500, 2200, len(ids)):
        caught_up.sync(ids[:end], vectors_for)
    rebuilt = VectorIndex(tmp_path / "rebuilt", "episode", "test-model", 16, config)
    assert rebuilt.sync(ids, vectors_for).rebuilt

    queries = [vectors[99], *rng.standard_normal((40, 16)).astype(np.float32)]
    assert [caught_up.search(q, 10) for q in queries] == [rebuilt.search(q, 10) for q in queries]
    assert [label for label, _ in rebuilt.search(vectors[99], 10)] == list(range(100, 110))  # the oldest of the tied


def _age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_save_removes_old_orphans_and_keeps_fresh_ones(tmp_path):
    index, ids, vectors = _index(tmp_path)
    index.save()
    # Left by a crashed save an hour ago, and by a save that may be in progress now.
    old = [
        tmp_path / "episode.0123456789ab.hnsw",
        tmp_path / "episode.0123456789ab.labels.npy",
        tmp_path / "episode.manifest.0123456789ab.tmp",
    ]
    fresh = tmp_path / "episode.ba9876543210.hnsw"
    for path in [*old, fresh]:
        path.write_bytes(b"partial")
    for path in old:
        _age(path, ORPHAN_GRACE_S + 60)
    index.remove([int(ids[0])])
    index.save()

    assert not any(path.exists() for path in old)
    assert fresh.exists()
    committed = [p for p in tmp_path.glob("episode.*.hnsw") if p != fresh]
    assert len(committed) == 1  # the generation this save replaced is gone too
    reloaded = VectorIndex(tmp_path, "episode", "test-model", 16, IndexConfig())
    report = reloaded.sync(ids[1:], lambda wanted: vectors[wanted - 1])
    assert not report.rebuilt and report.added == report.removed == 0
    assert reloaded.search(vectors[5], 1)[0][0] == 6
