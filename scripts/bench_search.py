"""Search latency and recall at 10k / 100k (1M behind a flag) memories, as ratios.

Two measurements per N, each against a reference timed in the same run (absolute times drift
on shared cores, ratios much less):

* **ANN vs exact** — the library's ``VectorIndex`` (hnswlib, config defaults M 16,
  ef_construction 200, ef_search 200) against exact search (numpy: one matrix-vector product
  and an argpartition) over the same normalised vectors: query p50/p95 at k = 10 (and at the
  hybrid candidate depth, 100), recall@10 of ANN against exact, speed-up exact / ANN, and
  recall and latency at ef_search 100 and 200 for comparison.
  Target: recall@10 ≥ 0.99 and ≥ 20× faster than exact at 100k.
* **End to end** — ``HybridMemory.search()`` (query embedding, hnswlib, BM25 and fusion in
  hybrid mode, fetch of the hits) against embedding the query alone, queries interleaved, in
  three settings (``SETTINGS``): dense over the memories (the paper's), hybrid over the
  memories, and hybrid over the memories and the evidence windows. Target: search p95 ≤
  1.25 × query-embedding p95. The same searches with the stores ranked one after the other
  on the calling thread (the search before its ranking threads) are the in-run reference for
  what the threads save. An instrumented ``Retriever`` (timers around the embedder, the index
  and BM25 lookups and the row fetch; nothing added to the library) splits the time.

Vectors: N synthetic 384-d unit vectors that look like MiniLM's — each is the real MiniLM
embedding of a LoCoMo turn plus gaussian noise (cosine ≈ 0.85 to its source: a paraphrase),
renormalised (``--distribution uniform`` gives structureless vectors, the hardest case for
HNSW). Queries are the real LoCoMo questions, embedded by MiniLM. The end-to-end store holds
N memories (1/3 episodes, 2/3 tuples) whose texts are the source turns and whose vectors are
put straight into the embedding cache, so nothing is embedded at build time; search then
runs exactly as in the library (the query is embedded for real). It also holds ``--turns``
(default N) raw turns, LoCoMo turns in sessions of 20, so ~0.9 N evidence windows, whose
vectors (the sum of their turns' paraphrase vectors) are cached the same way.

    python scripts/bench_search.py --sizes 10000 100000 --out runs/bench_search.json
    python scripts/bench_search.py --sizes 10000 --queries 50          # a quick look
    python scripts/bench_search.py --sizes 100000 --no-ann             # end to end only
    python scripts/bench_search.py --with-1m                           # adds N = 1,000,000 (long)

Threads: ``--threads 1`` (default) runs torch and BLAS on one thread. On 2 shared, busy cores
torch's 2-thread pool made a single MiniLM query ~30× slower (1.1 s vs 36 ms, measured while
other jobs ran); hnswlib answers one query on one thread anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"
DEFAULT_CACHE = REPO / "runs" / "bench_cache"
DIM = 384
#: Per-coordinate noise: cosine to the source ≈ 1 / sqrt(1 + 384 σ²) ≈ 0.85.
PARAPHRASE_SIGMA = 0.032
TARGET_RECALL = 0.99
#: Cosine slack of the near-tie recall: an ANN hit this close to the exact 10th score is as good.
NEAR_TIE = 0.01
TARGET_SPEEDUP = 20.0
TARGET_E2E_RATIO = 1.25

console = Console(width=170)


# --------------------------------------------------------------------------- shared by the bench_* scripts


def machine() -> dict:
    """Where and how a bench ran (recorded with every result)."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    packages = {}
    for name in ("torch", "sentence-transformers", "hnswlib", "bm25s", "numpy", "llama_cpp_python", "transformers"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    return {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": packages,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def set_threads(n: int) -> None:
    """torch intra-op threads and BLAS threads (numpy's exact search) to ``n``."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    threadpool_limits(n)


def summary(seconds: list[float]) -> dict:
    """p50 / p95 / mean in milliseconds."""
    ms = sorted(s * 1000 for s in seconds)
    return {"n": len(ms), "p50_ms": _pct(ms, 50), "p95_ms": _pct(ms, 95), "mean_ms": statistics.fmean(ms)}


def _pct(sorted_values: list[float], q: float) -> float:
    return float(np.percentile(sorted_values, q)) if sorted_values else float("nan")


def timed(fn: Callable, *args) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def write_json(path: Path | None, payload: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    console.print(f"wrote {path}")


def load_embedder():
    from hybridmem_local.config import EmbedderConfig
    from hybridmem_local.embedding import build_embedder

    return build_embedder(EmbedderConfig(device="cpu"))


def locomo_texts(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(speaker, text) of every LoCoMo turn, and every question, of the dev file."""
    from hybridmem_local.eval.locomo import load_locomo

    dataset = load_locomo(path)
    turns = [(t.speaker, t.text) for c in dataset.conversations for s in c.sessions for t in s.turns if t.text.strip()]
    questions = [q.question for c in dataset.conversations for q in c.questions]
    return turns, questions


def cached_embeddings(embedder, texts: list[str], cache_dir: Path, name: str) -> np.ndarray:
    """MiniLM vectors of ``texts``, kept in ``cache_dir`` between runs (embedding 5k texts takes a minute)."""
    cache = cache_dir / f"{name}.{embedder.model_id}.npz"
    if cache.exists():
        stored = np.load(cache, allow_pickle=False)
        if list(stored["texts"]) == texts:
            return stored["vectors"]
    vectors = embedder.embed(texts)
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.savez(cache, texts=np.array(texts), vectors=vectors)
    return vectors


# --------------------------------------------------------------------------- vectors


def synthetic_vectors(base: np.ndarray, n: int, distribution: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` unit vectors and the base row each one derives from (-1 for uniform)."""
    rng = np.random.default_rng(seed)
    if distribution == "uniform":
        vectors = rng.standard_normal((n, DIM)).astype(np.float32)
        sources = np.full(n, -1)
    else:
        sources = rng.integers(0, len(base), n)
        vectors = base[sources] + rng.normal(0, PARAPHRASE_SIGMA, (n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors, sources


def exact_top_k(matrix: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    scores = matrix @ query
    top = np.argpartition(-scores, k)[:k]
    return top[np.argsort(-scores[top])]


# --------------------------------------------------------------------------- ANN vs exact


def bench_ann(
    vectors: np.ndarray, queries: np.ndarray, k: int = 10, depth: int = 100, ef_sweep: tuple[int, ...] = (100, 200)
) -> dict:
    from hybridmem_local.config import IndexConfig
    from hybridmem_local.indexes.vectors import VectorIndex

    config = IndexConfig()
    with tempfile.TemporaryDirectory() as folder:
        index = VectorIndex(Path(folder), "tuple", "bench", DIM, config)
        ids = np.arange(len(vectors), dtype=np.int64)
        index.sync(np.array([], dtype=np.int64), lambda _: vectors[:0])  # an empty index
        start = time.perf_counter()
        for chunk in range(0, len(vectors), 10_000):  # as sync() adds: in batches, 2 hnswlib threads
            index.add(ids[chunk : chunk + 10_000], vectors[chunk : chunk + 10_000])
        build_s = time.perf_counter() - start
        ann_s, exact_s, deep_s, recalls, near = [], [], [], [], []
        for query in queries:
            t_exact, exact = timed(exact_top_k, vectors, query, k)
            t_ann, found = timed(index.search, query, k)
            t_deep, _ = timed(index.search, query, depth)
            exact_s.append(t_exact)
            ann_s.append(t_ann)
            deep_s.append(t_deep)
            recalls.append(len({i for i, _ in found} & set(exact.tolist())) / k)
            # Misses that are near-ties: ANN hits scoring within NEAR_TIE of the exact k-th score.
            kth = float(vectors[exact[-1]] @ query)
            near.append(sum(float(vectors[i] @ query) >= kth - NEAR_TIE for i, _ in found) / k)
        # What a larger ef_search (IndexConfig.ef_search) buys: recall@10 and latency.
        sweep = {}
        exact_ids = [set(exact_top_k(vectors, query, k).tolist()) for query in queries]
        for ef in ef_sweep:
            index.config = config.model_copy(update={"ef_search": ef})
            seconds, hits = [], []
            for query, truth in zip(queries, exact_ids, strict=True):
                t, found = timed(index.search, query, k)
                seconds.append(t)
                hits.append(len({i for i, _ in found} & truth) / k)
            sweep[ef] = {"recall_at_10": statistics.fmean(hits), **summary(seconds)}
    ann, exact, deep = summary(ann_s), summary(exact_s), summary(deep_s)
    return {
        "build_s": build_s,
        "ann_k10": ann,
        "ann_depth100": deep,
        "exact_k10": exact,
        "recall_at_10": statistics.fmean(recalls),
        "near_tie_recall_at_10": statistics.fmean(near),
        "ef_search": config.ef_search,
        "ef_sweep": sweep,
        "speedup_p50": exact["p50_ms"] / ann["p50_ms"],
        "speedup_p95": exact["p95_ms"] / ann["p95_ms"],
    }


# --------------------------------------------------------------------------- end to end


RELATIONS = ["mentioned", "talked about", "is interested in", "shared", "plans", "remembers", "enjoys", "worries about"]


def build_store(
    db: Path, model_id: str, turns: list[tuple[str, str]], vectors: np.ndarray, sources: np.ndarray
) -> dict:
    """A store of len(vectors) memories whose cached vectors are ``vectors`` (nothing embedded)."""
    from hybridmem_local.memory.writes import as_stored
    from hybridmem_local.schema import EpisodeDraft, TupleDraft
    from hybridmem_local.storage.store import MemoryStore

    drafts = []
    for i, source in enumerate(sources.tolist()):
        speaker, text = turns[source]
        # The suffix makes every text (and so every cache key) unique.
        if i % 3 == 0:
            drafts.append(
                EpisodeDraft(
                    title=f"{speaker}'s news",
                    summary=text[:80],
                    details=f"{text} [{i}]",
                    timestamp=f"2023-{1 + i % 12:02d}-{1 + i % 28:02d}",
                )
            )
        else:
            drafts.append(
                TupleDraft(
                    entity=speaker,
                    relation=RELATIONS[i % len(RELATIONS)],
                    object=f"{text[:120]} [{i}]",
                    timestamp=f"2023-{1 + i % 12:02d}-{1 + i % 28:02d}",
                    context="",
                )
            )
    texts = [as_stored(d, "bench").index_text() for d in drafts]
    store = MemoryStore(db)
    start = time.perf_counter()
    with store.transaction():
        store.memories.insert("bench", drafts)
        store.embedding_cache.put("bench", model_id, texts, vectors)
    seconds = time.perf_counter() - start
    store.close()
    return {"memories": len(drafts), "insert_s": seconds}


def build_turns(
    db: Path,
    model_id: str,
    turns: list[tuple[str, str]],
    base: np.ndarray,
    n: int,
    session_turns: int = 20,
    seed: int = 1,
) -> dict:
    """Add ``n`` raw turns (sessions of ``session_turns``) to the store, so it holds ~``n`` evidence
    windows of the default shape, and put a vector for each window's text in the embedding cache:
    the normalised sum of paraphrase vectors of its turns' LoCoMo sources (nothing embedded)."""
    from hybridmem_local.config import RetrievalConfig
    from hybridmem_local.indexes.windows import load_windows
    from hybridmem_local.schema import Session, Turn
    from hybridmem_local.storage.store import MemoryStore

    rng = np.random.default_rng(seed)
    sources = rng.integers(0, len(turns), n)
    turn_vectors = base[sources] + rng.normal(0, PARAPHRASE_SIGMA, (n, DIM)).astype(np.float32)
    start_date = datetime(2023, 1, 1, tzinfo=timezone.utc)
    store = MemoryStore(db)
    start = time.perf_counter()
    with store.transaction():
        for s, first in enumerate(range(0, n, session_turns)):
            store.sessions.insert(
                Session(
                    session_id=f"s{s}",
                    namespace="bench",
                    started_at=start_date + timedelta(hours=s),
                    turns=[
                        Turn(turn_id=f"t{i}", speaker=turns[j][0], text=f"{turns[j][1]} [{i}]")
                        for i, j in zip(
                            range(first, min(first + session_turns, n)),
                            sources[first : first + session_turns].tolist(),
                            strict=True,
                        )
                    ],
                )
            )
    shape = RetrievalConfig()
    windows = load_windows(store, "bench", shape.window_size, shape.window_stride)
    # A window's turns are consecutive rows of the turns table, so its first turn's key gives its rows.
    first_key = min(windows)
    vectors = np.stack(
        [turn_vectors[w.id - first_key : w.id - first_key + len(w.turns)].sum(axis=0) for w in windows.values()]
    )
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with store.transaction():
        store.embedding_cache.put("bench", model_id, [w.index_text() for w in windows.values()], vectors)
    seconds = time.perf_counter() - start
    store.close()
    return {"turns": n, "windows": len(windows), "insert_s": seconds}


class StageTimer:
    """Wraps the callables a Retriever is built from and records their time per query."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.current[name] = self.current.get(name, 0.0) + time.perf_counter() - start

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed_call(*args, **kwargs):
            with self.stage(name):
                return fn(*args, **kwargs)

        return timed_call


class _TimedSearch:
    """An index (hnswlib or BM25) whose ``search`` is timed; everything else passes through."""

    def __init__(self, inner, timer: StageTimer, name: str):
        self._inner, self.search = inner, timer.wrap(name, inner.search)

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


class _TimedStore:
    def __init__(self, inner, timer: StageTimer):
        self._inner, self.get_memories = inner, timer.wrap("sqlite_fetch", inner.get_memories)

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


class _TimedIndexes:
    def __init__(self, inner, timer: StageTimer):
        self._inner, self._timer = inner, timer
        self.embed_query = timer.wrap("embed", inner.embed_query)
        self.windows = timer.wrap("sqlite_fetch", inner.windows)

    def dense(self, namespace, kind):
        return _TimedSearch(self._inner.dense(namespace, kind), self._timer, "dense_index")

    def lexical(self, namespace, kind):
        return _TimedSearch(self._inner.lexical(namespace, kind), self._timer, "lexical_bm25")

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


def instrumented_retriever(memory, timer: StageTimer):
    from hybridmem_local.retrieval.retriever import Retriever

    return Retriever(_TimedStore(memory.store, timer), _TimedIndexes(memory.indexes, timer), memory.config.retrieval)


def one_by_one_retriever(memory):
    """The reference: a Retriever that ranks the stores one after the other on the calling
    thread, after the embedding (the library's search before its ranking threads)."""
    from hybridmem_local.retrieval.retriever import Retriever

    class OneByOne(Retriever):
        def _start(self, *args, **kwargs) -> None:  # nothing started: _rank ranks each store itself
            pass

    return OneByOne(memory.store, memory.indexes, memory.config.retrieval)


#: The end-to-end settings: the paper's dense search and hybrid search over the memories, and
#: hybrid search over the memories and the evidence windows (needs turns in the store).
SETTINGS = {
    "dense": {"retrieval.mode": "dense", "retrieval.sources": ["episodes", "tuples"]},
    "hybrid": {"retrieval.mode": "hybrid", "retrieval.sources": ["episodes", "tuples"]},
    "hybrid+windows": {"retrieval.mode": "hybrid", "retrieval.sources": ["episodes", "tuples", "windows"]},
}


def bench_end_to_end(db: Path, embedder, questions: list[str], setting: str) -> dict:
    from hybridmem_local.config import load_config
    from hybridmem_local.memory import HybridMemory

    config = load_config(overrides=SETTINGS[setting])
    with HybridMemory.open(db, config, embedder=embedder) as memory:
        # First search loads or builds every index it needs (hnswlib from cached vectors, BM25).
        first_s, _ = timed(memory.search, questions[0], "bench")
        k = config.retrieval.k
        one_by_one = one_by_one_retriever(memory)
        embed_s, search_s, one_by_one_s = [], [], []
        for i, question in enumerate(questions):
            calls = [
                (embed_s, memory.indexes.embed_query, (question,)),
                (search_s, memory.search, (question, "bench")),
                (one_by_one_s, one_by_one.search, (question, "bench", k, config.retrieval.tuple_multiplier * k)),
            ]
            for samples, fn, fn_args in calls[i % 3 :] + calls[: i % 3]:  # rotate: drift hits all alike
                samples.append(timed(fn, *fn_args)[0])
        timer = StageTimer()
        retriever = instrumented_retriever(memory, timer)
        stages: dict[str, list[float]] = {}
        for question in questions:
            timer.current = {}
            total, _ = timed(retriever.search, question, "bench", k, config.retrieval.tuple_multiplier * k)
            # The dense and BM25 rankings run on the retriever's threads, overlapping the
            # embedding and each other: "other" is the calling thread's remaining time
            # (waiting for rankings, fusion, building hits).
            timer.current["other"] = total - timer.current.get("embed", 0.0) - timer.current.get("sqlite_fetch", 0.0)
            timer.current["total"] = total
            for name, seconds in timer.current.items():
                stages.setdefault(name, []).append(seconds)
    embed, search, sequential = summary(embed_s), summary(search_s), summary(one_by_one_s)
    return {
        "setting": setting,
        "overrides": SETTINGS[setting],
        "first_search_s": first_s,
        "query_embedding": embed,
        "search": search,
        "ratio_p95": search["p95_ms"] / embed["p95_ms"],
        "ratio_p50": search["p50_ms"] / embed["p50_ms"],
        "one_by_one": sequential,
        "one_by_one_ratio_p95": sequential["p95_ms"] / embed["p95_ms"],
        "stages": {name: summary(values) for name, values in stages.items()},
    }


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--with-1m", action="store_true", help="also N = 1,000,000 (ANN only; long and ~4 GB)")
    parser.add_argument("--queries", type=int, default=200, help="LoCoMo questions used as queries")
    parser.add_argument("--distribution", choices=["paraphrase", "uniform"], default="paraphrase")
    parser.add_argument("--no-end-to-end", action="store_true", help="ANN vs exact only")
    parser.add_argument("--no-ann", action="store_true", help="end to end only")
    parser.add_argument(
        "--turns",
        type=int,
        default=None,
        help="raw turns in the end-to-end store, ~one evidence window each (default: N; 0: no windows)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (see the module docstring)")
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where base embeddings are kept between runs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    info = machine()
    set_threads(args.threads)
    embedder = load_embedder()
    turns, questions = locomo_texts(args.locomo)
    base = cached_embeddings(embedder, [t for _, t in turns], args.cache, "locomo_turns")
    rng = random.Random(0)
    questions = rng.sample(questions, min(args.queries, len(questions)))
    query_vectors = embedder.embed(questions)
    sizes = sorted(set(args.sizes + ([1_000_000] if args.with_1m else [])))
    results = {
        "machine": info,
        "threads": args.threads,
        "distribution": args.distribution,
        "queries": len(questions),
        "targets": {
            "recall_at_10": TARGET_RECALL,
            "speedup_at_100k": TARGET_SPEEDUP,
            "e2e_p95_over_embed_p95": TARGET_E2E_RATIO,
        },
        "sizes": {},
    }
    for n in sizes:
        console.print(f"[bold]N = {n:,}[/]")
        vectors, sources = synthetic_vectors(base, n, args.distribution)
        entry = results["sizes"][n] = {} if args.no_ann else {"ann": bench_ann(vectors, query_vectors)}
        if not args.no_end_to_end and n <= 100_000 and args.distribution == "paraphrase":
            with tempfile.TemporaryDirectory() as folder:
                db = Path(folder) / "bench.db"
                entry["store"] = build_store(db, embedder.model_id, turns, vectors, sources)
                n_turns = n if args.turns is None else args.turns
                settings = ["dense", "hybrid"]
                if n_turns:
                    entry["turns"] = build_turns(db, embedder.model_id, turns, base, n_turns)
                    settings.append("hybrid+windows")
                entry["end_to_end"] = {name: bench_end_to_end(db, embedder, questions, name) for name in settings}
        del vectors
    results["machine"]["load_average_at_end"] = os.getloadavg()
    print_tables(results)
    write_json(args.out, results)


def print_tables(results: dict) -> None:
    ann = Table(
        title=f"ANN (hnswlib via VectorIndex) vs exact numpy · {results['distribution']} vectors · "
        f"{results['queries']} LoCoMo questions · {results['threads']} thread(s)"
    )
    for column in (
        "N",
        "build s",
        "ANN p50 ms",
        "ANN p95 ms",
        "exact p50 ms",
        "exact p95 ms",
        "speed-up p50",
        "speed-up p95",
        "recall@10",
        "near-tie recall",
        "ANN@100 p95 ms",
        "ef 100: recall / p95",
        "ef 200: recall / p95",
    ):
        ann.add_column(column, justify="right")
    for n, entry in results["sizes"].items():
        if "ann" not in entry:
            continue
        a = entry["ann"]
        ann.add_row(
            f"{n:,}",
            f"{a['build_s']:.1f}",
            f"{a['ann_k10']['p50_ms']:.3f}",
            f"{a['ann_k10']['p95_ms']:.3f}",
            f"{a['exact_k10']['p50_ms']:.2f}",
            f"{a['exact_k10']['p95_ms']:.2f}",
            f"{a['speedup_p50']:.1f}×",
            f"{a['speedup_p95']:.1f}×",
            f"{a['recall_at_10']:.4f}",
            f"{a['near_tie_recall_at_10']:.4f}",
            f"{a['ann_depth100']['p95_ms']:.3f}",
            *(f"{a['ef_sweep'][ef]['recall_at_10']:.4f} / {a['ef_sweep'][ef]['p95_ms']:.3f}" for ef in (100, 200)),
        )
    if ann.row_count:
        console.print(ann)
    e2e = Table(title="HybridMemory.search() vs embedding the query alone (same run, interleaved)")
    for column in (
        "N",
        "setting",
        "embed p50",
        "embed p95",
        "search p50",
        "search p95",
        "p95 ratio",
        "target",
        "one by one p95 ratio",
        "embed",
        "dense index",
        "BM25",
        "row fetch",
        "other",
    ):
        e2e.add_column(column, justify="right")
    for n, entry in results["sizes"].items():
        for mode, r in entry.get("end_to_end", {}).items():
            stages = r["stages"]

            def share(name: str, stages: dict = stages) -> str:
                if name not in stages:
                    return "-"
                return (
                    f"{stages[name]['mean_ms']:.2f} ({100 * stages[name]['mean_ms'] / stages['total']['mean_ms']:.0f}%)"
                )

            e2e.add_row(
                f"{n:,}",
                mode,
                f"{r['query_embedding']['p50_ms']:.1f}",
                f"{r['query_embedding']['p95_ms']:.1f}",
                f"{r['search']['p50_ms']:.1f}",
                f"{r['search']['p95_ms']:.1f}",
                f"{r['ratio_p95']:.2f}×",
                "ok" if r["ratio_p95"] <= TARGET_E2E_RATIO else "MISS",
                f"{r['one_by_one_ratio_p95']:.2f}×",
                share("embed"),
                share("dense_index"),
                share("lexical_bm25"),
                share("sqlite_fetch"),
                share("other"),
            )
    if e2e.row_count:
        e2e.caption = (
            "times in ms; one by one: the stores ranked in turn on the calling thread (the reference, same run); "
            "stage columns: mean per stage (share of the mean total) from an instrumented Retriever; dense index and "
            "BM25 run on the ranking threads and overlap the embedding; other: the calling thread's wait for them, "
            "fusion and hits"
        )
        console.print(e2e)


if __name__ == "__main__":
    main()
