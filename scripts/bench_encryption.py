"""Encryption at rest, what it costs: the same store content with ``store.encryption`` none and
sqlcipher, measured in one run, side by side (issue #25; targets: search p95 ≤ 1.15×, ingest ≤ 1.3×).

* **ingest** — ``HybridMemory.add_memories`` in batches (``--batch``) into both stores, the two
  alternating batch by batch (drift on shared cores hits both alike). Every memory text is
  embedded once beforehand and served from memory to both stores, so the figure is the store's
  and the indexes' work (what encryption changes), not the model's.
* **search** — ``HybridMemory.search`` p50/p95 over ``--queries`` synthetic questions, the two
  stores alternating query by query; each query is embedded for real (MiniLM by default), as
  in use.
* **open** — a store of ``--memories`` memories: ``HybridMemory.open`` (connect, key, schema
  check), and open plus the first search (the indexes loaded from their files), medians of
  ``--opens`` tries.
* **disk** — the database, its WAL and the index folder after a clean close.

    python scripts/bench_encryption.py                                  # 10k memories, MiniLM
    python scripts/bench_encryption.py --embedder hashing --memories 2000 --queries 100
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from hybridmem_local.config import Config, EmbedderConfig, load_config
from hybridmem_local.embedding import build_embedder
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Episode, EpisodeDraft, RelationalTuple, TupleDraft
from hybridmem_local.storage import encryption

PEOPLE = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana"]
THINGS = [
    "a beagle puppy",
    "the Riverside 10K",
    "a pottery class",
    "a job in Lisbon",
    "her sister's wedding",
    "a used bicycle",
    "the night shift",
    "a Spanish course",
    "a knee operation",
    "a camping trip",
    "a new apartment",
    "the book club",
]
VERBS = ["talked about", "signed up for", "worried about", "finished", "planned", "cancelled", "paid for"]


class PreEmbedded:
    """The real embedder, with the memory texts embedded once up front and served from memory
    (queries, not among them, are embedded for real on every call)."""

    def __init__(self, inner, texts: list[str]):
        self.inner, self.model_id, self.dimension = inner, inner.model_id, inner.dimension
        self.vectors = dict(zip(texts, inner.embed(texts), strict=True))
        #: Texts embedded for real after the start (the queries; memory texts would be a bug here).
        self.misses = 0

    def embed(self, texts):
        missing = [text for text in texts if text not in self.vectors]
        self.misses += len(missing)
        fresh = dict(zip(missing, self.inner.embed(missing), strict=True)) if missing else {}
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([self.vectors[text] if text in self.vectors else fresh[text] for text in texts])


def synthetic_memories(n: int, rng: random.Random) -> list[EpisodeDraft | TupleDraft]:
    out: list[EpisodeDraft | TupleDraft] = []
    for i in range(n):
        person, thing, verb = rng.choice(PEOPLE), rng.choice(THINGS), rng.choice(VERBS)
        day = f"2023-{1 + i % 12:02d}-{1 + i % 28:02d}"
        if i % 3 == 0:
            out.append(
                EpisodeDraft(
                    title=f"{person} and {thing}",
                    summary=f"{person} {verb} {thing}",
                    details=f"On {day} {person} {verb} {thing} (note {i}).",
                    timestamp=day,
                )
            )
        else:
            out.append(TupleDraft(entity=person, relation=verb, object=f"{thing} #{i}", timestamp=day))
    return out


def questions(n: int, rng: random.Random) -> list[str]:
    return [f"What did {rng.choice(PEOPLE)} say about {rng.choice(THINGS)}? ({i})" for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def folder_bytes(db: Path) -> dict[str, int]:
    index_folder = Path(f"{db}.indexes")
    return {
        "database": db.stat().st_size
        + sum(Path(f"{db}{s}").stat().st_size for s in ("-wal",) if Path(f"{db}{s}").exists()),
        "indexes": sum(p.stat().st_size for p in index_folder.rglob("*") if p.is_file())
        if index_folder.exists()
        else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100, help="memories per add_memories call")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--opens", type=int, default=5)
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (see bench_search.py)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    if args.embedder == "minilm":
        import torch

        torch.set_num_threads(args.threads)

    rng = random.Random(25)
    memories = synthetic_memories(args.memories, rng)
    queries = questions(args.queries, rng)
    inner = build_embedder(EmbedderConfig(backend="hashing" if args.embedder == "hashing" else "sentence-transformers"))
    started = time.perf_counter()
    # The texts the store embeds: the stored form's index text.
    texts = [
        (Episode if isinstance(m, EpisodeDraft) else RelationalTuple)(namespace="bench", **m.model_dump()).index_text()
        for m in memories
    ]
    embedder = PreEmbedded(inner, texts)
    console = Console()
    console.print(f"pre-embedded {args.memories} texts with {inner.model_id} in {time.perf_counter() - started:.1f}s")

    with tempfile.TemporaryDirectory(prefix="bench_encryption_") as tmp:
        folder = Path(tmp)
        key_file = folder / "master.key"
        key_file.write_text(encryption.generate_master_key().hex())
        os.chmod(key_file, 0o600)
        base = {"embedder.backend": "hashing"} if args.embedder == "hashing" else {}
        configs: dict[str, Config] = {
            "none": load_config(None, base),
            "sqlcipher": load_config(None, {**base, "store.encryption": "sqlcipher", "store.key_file": str(key_file)}),
        }
        paths = {name: folder / name / "memory.db" for name in configs}
        for path in paths.values():
            path.parent.mkdir()
        figures: dict[str, dict[str, float]] = {name: {} for name in configs}

        # ingest, alternating batch by batch
        opened = {name: HybridMemory.open(paths[name], configs[name], embedder=embedder) for name in configs}
        seconds = dict.fromkeys(configs, 0.0)
        for number, start in enumerate(range(0, len(memories), args.batch)):
            batch = memories[start : start + args.batch]
            episodes = [m for m in batch if isinstance(m, EpisodeDraft)]
            tuples = [m for m in batch if isinstance(m, TupleDraft)]
            for name in list(configs)[:: 1 if number % 2 == 0 else -1]:
                t0 = time.perf_counter()
                opened[name].add_memories("bench", episodes=episodes, tuples=tuples)
                seconds[name] += time.perf_counter() - t0
        for name, memory in opened.items():
            t0 = time.perf_counter()
            memory.close()  # saves the indexes: part of ingest
            seconds[name] += time.perf_counter() - t0
            figures[name]["ingest s per 1k memories"] = seconds[name] * 1000 / len(memories)
        console.print(f"texts embedded during ingest (should be 0): {embedder.misses}")

        # open, and open + first search (indexes loaded from their files)
        opens: dict[str, list[float]] = {name: [] for name in configs}
        first: dict[str, list[float]] = {name: [] for name in configs}
        for name in configs:  # unmeasured: the first open after ingest pays for imports and cold caches
            with HybridMemory.open(paths[name], configs[name], embedder=embedder) as memory:
                memory.search(queries[0], namespace="bench")
        for attempt in range(args.opens):
            for name in list(configs)[:: 1 if attempt % 2 == 0 else -1]:
                t0 = time.perf_counter()
                memory = HybridMemory.open(paths[name], configs[name], embedder=embedder)
                t1 = time.perf_counter()
                memory.search(queries[0], namespace="bench")
                t2 = time.perf_counter()
                memory.close()
                opens[name].append((t1 - t0) * 1000)
                first[name].append((t2 - t0) * 1000)
        for name in configs:
            figures[name]["open ms (median)"] = statistics.median(opens[name])
            figures[name]["open + first search ms (median)"] = statistics.median(first[name])

        # search, alternating query by query
        opened = {name: HybridMemory.open(paths[name], configs[name], embedder=embedder) for name in configs}
        for memory in opened.values():
            for query in queries[:5]:
                memory.search(query, namespace="bench")
        latencies: dict[str, list[float]] = {name: [] for name in configs}
        for number, query in enumerate(queries):
            for name in list(configs)[:: 1 if number % 2 == 0 else -1]:
                t0 = time.perf_counter()
                opened[name].search(query, namespace="bench")
                latencies[name].append((time.perf_counter() - t0) * 1000)
        for name, memory in opened.items():
            memory.close()
            figures[name]["search p50 ms"] = percentile(latencies[name], 50)
            figures[name]["search p95 ms"] = percentile(latencies[name], 95)
            for part, size in folder_bytes(paths[name]).items():
                figures[name][f"disk {part} MB"] = size / 1e6

    targets = {"ingest s per 1k memories": "≤ 1.3", "search p95 ms": "≤ 1.15"}
    table = Table(
        "measure",
        "none",
        "sqlcipher",
        "ratio",
        "target",
        title=f"encryption at rest: {args.memories} memories, {args.queries} queries, {inner.model_id}",
    )
    for measure in figures["none"]:
        off, on = figures["none"][measure], figures["sqlcipher"][measure]
        table.add_row(measure, f"{off:.2f}", f"{on:.2f}", f"{on / off:.3f}" if off else "", targets.get(measure, ""))
    console.print(table)
    if args.out is not None:
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "figures": figures}, indent=2)
        )


if __name__ == "__main__":
    main()
