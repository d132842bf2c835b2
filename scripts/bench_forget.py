"""What forget and sealed index files cost (issue #25), encryption off vs on, in one run.

* **forget**: a store of two namespaces of ``--memories`` memories each (1/3 episodes, 2/3
  tuples, hashing embedder, every index built and saved, a second connection left open as the
  service keeps it); ``HybridMemory.forget`` of one namespace, timed whole, and its store part
  (``MemoryStore.forget_namespace``: deletes + scrub) beside it. Store size before and after.
* **index files**: the library's ``VectorIndex`` (hnswlib, config defaults, 384-d) and
  ``LexicalIndex`` (BM25) of ``--memories`` documents, saved and loaded plaintext and sealed
  (AES-256-GCM, ``files.sealing``), median of ``--repeats``.

    python scripts/bench_forget.py --memories 3000
    python scripts/bench_forget.py --memories 10000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from hybridmem_local.config import IndexConfig, load_config
from hybridmem_local.embedding import build_embedder
from hybridmem_local.indexes.bm25 import LexicalIndex
from hybridmem_local.indexes.vectors import VectorIndex
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import EpisodeDraft, TupleDraft
from hybridmem_local.storage.encryption import KEY_ENV, StoreKeys, generate_master_key, parse_master_key
from hybridmem_local.storage.store import MemoryStore

WORDS = [
    "alice",
    "bob",
    "biscuit",
    "beagle",
    "marathon",
    "riverside",
    "oak",
    "avenue",
    "flat",
    "lake",
    "hike",
    "trip",
    "sister",
    "doctor",
    "insurance",
    "salary",
    "garden",
    "piano",
    "recipe",
    "birthday",
    "train",
    "office",
    "project",
    "holiday",
    "museum",
]


def text(rng: np.random.Generator, n_words: int) -> str:
    return " ".join(rng.choice(WORDS, n_words)) + f" {rng.integers(1 << 40):x}"


def fill(memory: HybridMemory, namespace: str, n: int, rng: np.random.Generator) -> None:
    for start in range(0, n, 300):
        count = min(300, n - start)
        episodes = [
            EpisodeDraft(title=text(rng, 3), summary=text(rng, 8), details=text(rng, 30), timestamp="2023-05-08")
            for _ in range(count // 3)
        ]
        tuples = [
            TupleDraft(entity=text(rng, 1), relation="mentioned", object=text(rng, 6), timestamp="2023-05-08")
            for _ in range(count - count // 3)
        ]
        memory.add_memories(namespace, episodes=episodes, tuples=tuples)
    memory.search("alice biscuit", namespace=namespace)  # builds and saves both kinds' indexes


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def bench_forget(n: int, encrypted: bool, embedder) -> dict:
    overrides = {"embedder.backend": "hashing"}
    if encrypted:
        overrides["store.encryption"] = "sqlcipher"
    config = load_config(None, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "memory.db"
        rng = np.random.default_rng(0)
        memory = HybridMemory.open(db, config, embedder=embedder)
        idle = MemoryStore.open(db, config.store)
        try:
            for namespace in ("gone", "kept"):
                fill(memory, namespace, n, rng)
            memory.flush()
            size_before = folder_bytes(Path(tmp))
            started = time.perf_counter()
            counts = memory.forget("gone")
            forget_s = time.perf_counter() - started
            size_after = folder_bytes(Path(tmp))
            # The store part alone, on the other namespace refilled: deletes + scrub.
            fill(memory, "again", n, rng)
            started = time.perf_counter()
            memory.store.forget_namespace("again")
            store_s = time.perf_counter() - started
        finally:
            idle.close()
            memory.close()
    assert counts["scrub_pending"] == 0
    return {
        "forget_s": round(forget_s, 3),
        "store_forget_s": round(store_s, 3),
        "folder_mb_before": round(size_before / 1e6, 2),
        "folder_mb_after": round(size_after / 1e6, 2),
    }


def timed(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 1)


def bench_indexes(n: int, repeats: int, key: bytes | None) -> dict:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((n, 384)).astype(np.float32)
    ids = np.arange(1, n + 1, dtype=np.int64)
    texts = [text(rng, 20) for _ in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "ns"
        dense = VectorIndex(directory, "episode", "bench", 384, IndexConfig(), key)
        dense.sync(ids, lambda wanted: vectors[wanted - 1])
        lexical = LexicalIndex(directory, "episode", "bench", key)
        lexical.build(ids, texts)

        def save_dense() -> None:
            dense._dirty = True
            dense.save()

        def load_dense() -> None:
            assert VectorIndex(directory, "episode", "bench", 384, IndexConfig(), key)._load() is None

        def save_lexical() -> None:
            lexical._dirty = True
            lexical.save()

        def load_lexical() -> None:
            assert LexicalIndex(directory, "episode", "bench", key)._load() is None

        out = {
            "hnsw_save_ms": timed(save_dense, repeats),
            "hnsw_load_ms": timed(load_dense, repeats),
            "bm25_save_ms": timed(save_lexical, repeats),
            "bm25_load_ms": timed(load_lexical, repeats),
            "files_mb": round(folder_bytes(directory) / 1e6, 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=3000, help="memories per namespace / documents per index")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault(KEY_ENV, generate_master_key().hex())
    keys = StoreKeys(parse_master_key(os.environ[KEY_ENV].encode(), KEY_ENV))
    embedder = build_embedder(load_config(None, {"embedder.backend": "hashing"}).embedder)
    results = {
        "memories": args.memories,
        "forget": {mode: bench_forget(args.memories, mode == "sqlcipher", embedder) for mode in ("none", "sqlcipher")},
        "index_files": {
            "plaintext": bench_indexes(args.memories, args.repeats, None),
            "sealed": bench_indexes(args.memories, args.repeats, keys.files),
        },
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
